"""An in-process Flower Grid for tests: messages go straight to ClientApp handlers.

Each node has its own ``Context`` (node config, node state), as a SuperNode
keeps it (``node_configs``: more node config keys per node), and optionally a public
key (``node_keys``: what SuperNode authentication proves, reported by ``get_nodes`` as
Flower's ``NodeInfo``); the ClientApp is called the way Flower's runtime calls it, and an
exception becomes an error reply as Flower makes it. ``deliver(round, node)``
and ``drop_reply(round, node)`` decide which messages and replies get lost;
``tamper(message, reply)`` may replace a reply (or drop it: ``None``), and
``received`` keeps every reply the ServerApp pulled (what it sees).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity


class InProcessGrid(Grid):
    def __init__(
        self,
        client_app: Any,
        run_config: dict,
        num_nodes: int,
        node_run_configs: dict[int, dict] | None = None,
        deliver: Callable[[int, int], bool] | None = None,
        drop_reply: Callable[[int, int], bool] | None = None,
        node_keys: dict[int, bytes] | None = None,
        node_configs: dict[int, dict] | None = None,
        tamper: Callable[[Message, Message], Message | None] | None = None,
    ) -> None:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = (
            1,
            1,
            1,
        )  # what Flower's runtime sets in a ServerApp process
        self.client_app = client_app
        self.contexts = {
            100 + n: Context(
                run_id=1,
                node_id=100 + n,
                state=RecordDict(),
                node_config={"partition-id": n, **(node_configs or {}).get(n, {})},
                run_config=dict((node_run_configs or {}).get(n, run_config)),
            )
            for n in range(num_nodes)
        }
        self.node_keys = {100 + n: k for n, k in (node_keys or {}).items()}  # PEM public keys
        self.deliver = deliver or (lambda t, n: True)
        self.drop_reply = drop_reply or (lambda t, n: False)
        self.tamper = tamper
        self.received: list[Message] = []
        self._replies: dict[str, Message] = {}
        self._count = 0
        self._run = None

    # ------------------------------------------------------------------ Grid
    def set_run(self, run: Any) -> None:
        self._run = run

    @property
    def run(self) -> Any:
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def get_nodes(self) -> Iterable[Any]:
        return [SimpleNamespace(node_id=nid, public_key=self.node_keys.get(nid, b"")) for nid in self.contexts]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            self._count += 1
            msg.metadata.__dict__["_message_id"] = mid = f"msg-{self._count}"
            ids.append(mid)
            node = msg.metadata.dst_node_id
            t, n = int(msg.metadata.group_id), self.contexts[node].node_config["partition-id"]
            if not self.deliver(t, n):
                continue
            try:
                reply = self.client_app(msg, self.contexts[node])
            except Exception:
                reply = Message(Error(code=1, reason=traceback.format_exc()), reply_to=msg)
            if self.tamper is not None:
                reply = self.tamper(msg, reply)
            if reply is not None and not self.drop_reply(t, n):
                self._replies[mid] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        out = [self._replies.pop(m) for m in list(message_ids) if m in self._replies]
        self.received.extend(out)
        return out

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))


def node_identities(folder: Any, num_nodes: int) -> tuple[list[bytes], list[str], dict[int, dict]]:
    """SuperNode keys for ``num_nodes`` agents written to ``folder``, as a deployment has them: each node's
    private key (OpenSSH, mode 0600) and one agent roster (``{agent: OpenSSH public key}``).

    Returns:
        ``(PEM public keys, OpenSSH public keys, node configs)``: the node configs name each node's key and
        the roster (``secagg.private-key``, ``secagg.roster``), for ``InProcessGrid(node_configs=...)``.
    """
    import json
    import os
    from pathlib import Path

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    keys = [ec.generate_private_key(ec.SECP384R1()) for _ in range(num_nodes)]
    spki = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    pem = [k.public_key().public_bytes(*spki) for k in keys]
    ssh = [
        k.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
        for k in keys
    ]
    configs = {}
    roster = folder / "roster.json"
    roster.write_text(json.dumps({str(n): ssh[n] for n in range(num_nodes)}))
    for n, key in enumerate(keys):
        path = folder / f"node-{n}"
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
            )
        )
        os.chmod(path, 0o600)
        configs[n] = {"secagg.private-key": str(path), "secagg.roster": str(roster)}
    return pem, ssh, configs
