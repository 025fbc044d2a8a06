"""The ServerApp's transport: replies attributed to the node they were sent to, a late reply left out, a reply
Flower cannot rebuild costing only its own node, and waiting for nodes."""

from types import SimpleNamespace

import pytest

pytest.importorskip("flwr")

from fbo_torch.flower.transport import Transport, wait_for_nodes


class FakeGrid:
    """Replies ``"reply to <node>"`` to every message, except the nodes in ``silent``; pulling a reply of a node
    in ``broken`` raises, as Flower does for a reply whose objects it cannot rebuild."""

    def __init__(self, nodes=(1, 2, 3), silent=(), broken=()):
        self.nodes, self.silent, self.broken = list(nodes), set(silent), set(broken)
        self.sent = {}

    def get_node_ids(self):
        return self.nodes

    def push_messages(self, messages):
        ids = []
        for i, m in enumerate(messages):
            self.sent[f"m{i}"] = m.metadata.dst_node_id
            ids.append(f"m{i}")
        return ids

    def pull_messages(self, ids):
        ids = list(ids)
        if any(self.sent[i] in self.broken for i in ids):
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return [
            SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i), content=f"reply to {self.sent[i]}")
            for i in ids
            if self.sent[i] not in self.silent
        ]


def _messages(nodes):
    return [SimpleNamespace(metadata=SimpleNamespace(dst_node_id=n)) for n in nodes]


def test_each_reply_is_attributed_to_the_node_its_message_went_to_and_a_silent_node_times_out():
    replies, unreadable = Transport(FakeGrid(silent={2}), poll_interval=0.0).exchange(_messages([1, 2, 3]), 0.05)
    assert sorted((n, r.content) for n, r in replies) == [(1, "reply to 1"), (3, "reply to 3")]
    assert unreadable == []


def test_a_reply_flower_cannot_rebuild_costs_only_its_node_and_later_pulls_go_one_by_one():
    transport = Transport(FakeGrid(broken={3}), poll_interval=0.0)
    replies, unreadable = transport.exchange(_messages([1, 2, 3]), 1.0)
    assert sorted(n for n, _ in replies) == [1, 2]
    assert [n for n, _ in unreadable] == [3] and "UnicodeDecodeError" in unreadable[0][1]
    assert transport.one_by_one


def test_waiting_for_nodes_returns_those_there_are_after_the_timeout():
    assert wait_for_nodes(FakeGrid(nodes=[3, 1]), 2, timeout=1.0) == [1, 3]
    assert wait_for_nodes(FakeGrid(nodes=[1]), 2, timeout=0.0, poll_interval=0.0) == [1]
