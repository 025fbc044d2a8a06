r"""The ServerApp's side of the network: push an exchange's messages, pull the replies, wait for nodes.

:class:`Transport` pushes the messages of one exchange and pulls the replies
whatever they hold, so that no reply can stop the server; :func:`wait_for_nodes`
waits for the federation's nodes to connect. Both take Flower's ``Grid``.
"""

from __future__ import annotations

import time
from logging import WARNING

from flwr.app import Message
from flwr.common import log
from flwr.serverapp import Grid

#: Seconds between two pulls of replies (``Grid.send_and_receive`` waits 3 s).
POLL_INTERVAL = 0.2


class Transport:
    r"""Pushes an exchange's messages and pulls the replies, whatever the replies hold.

    Each reply is attributed to the node its message was *sent to* (a reply
    answers one message; its claimed source is not trusted). Flower rebuilds
    every pulled reply on the ServerApp's side; a reply whose objects cannot be
    rebuilt makes a batch pull raise, so after the first such failure replies
    are pulled one by one for the rest of the run, and an unreadable one costs
    only its own node's round.
    """

    def __init__(self, grid: Grid, poll_interval: float = POLL_INTERVAL) -> None:
        self.grid, self.poll_interval = grid, poll_interval
        self.one_by_one = False

    def exchange(
        self, messages: list[Message], timeout: float
    ) -> tuple[list[tuple[int, Message]], list[tuple[int, str]]]:
        r"""``([(node, reply)], [(node, why unreadable)])`` within ``timeout`` seconds."""
        ids = list(self.grid.push_messages(messages))
        node_of = {mid: m.metadata.dst_node_id for mid, m in zip(ids, messages, strict=True) if mid}
        pending = set(node_of)
        end = time.monotonic() + timeout
        replies: list[tuple[int, Message]] = []
        unreadable: list[tuple[int, str]] = []
        while pending:
            got: list[Message] = []
            if not self.one_by_one:
                try:
                    got = list(self.grid.pull_messages(sorted(pending)))
                except Exception as err:
                    self.one_by_one = True
                    log(
                        WARNING,
                        "a reply could not be read (%s: %s); pulling replies one by one from now on",
                        type(err).__name__,
                        str(err)[:200],
                    )
            if self.one_by_one:
                for mid in sorted(pending):
                    try:
                        got.extend(self.grid.pull_messages([mid]))
                    except Exception as err:
                        pending.discard(mid)
                        unreadable.append((node_of[mid], f"{type(err).__name__}: {str(err)[:200]}"))
            for rep in got:
                mid = rep.metadata.reply_to_message_id
                if mid in pending:
                    pending.discard(mid)
                    replies.append((node_of[mid], rep))
            if not pending or time.monotonic() >= end:
                break
            time.sleep(self.poll_interval)
        return replies, unreadable


def wait_for_nodes(grid: Grid, num_nodes: int, timeout: float, poll_interval: float = 0.2) -> list[int]:
    """The connected nodes' ids once ``num_nodes`` are connected (those there are after ``timeout`` s)."""
    end = time.monotonic() + timeout
    while True:
        ids = sorted(grid.get_node_ids())
        if len(ids) >= num_nodes or time.monotonic() >= end:
            return ids
        time.sleep(poll_interval)


__all__ = ["POLL_INTERVAL", "Transport", "wait_for_nodes"]
