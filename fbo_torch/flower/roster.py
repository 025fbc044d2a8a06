r"""Which node plays which agent: agents bound to the public keys of authenticated SuperNodes.

A SuperNode says which agent it plays with its ``partition-id`` node config —
a claim anyone can make. With SuperNode authentication on (``flower-superlink
--enable-supernode-auth``; every node's key registered with ``flwr supernode
register``), each node the ServerApp sees comes with the public key it proved
it holds (``grid.get_nodes()``). An :class:`AgentRoster` maps those keys to
agents, so the server decides who plays agent ``n``: a node whose key is not
on the roster is never sent a message, and a reply that claims another agent
than its key's is rejected (and counted against the key's agent).

The roster is server-side configuration: a JSON file ``{"0": "ecdsa-sha2-nistp384
AAAA...", "1": ..., ...}`` (agent id → OpenSSH public key, the ``.pub`` file
registered for that node), named by the ``FBO_AGENT_ROSTER`` environment
variable of the SuperLink that starts the ServerApp. Keys are compared as
DER ``SubjectPublicKeyInfo``, whatever their text format. Needs ``cryptography``
(installed with ``flwr``); nothing here imports ``flwr``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: The environment variable that names the roster file.
ROSTER_ENV = "FBO_AGENT_ROSTER"
#: Set (to anything but 0) to make a ServerApp refuse to run without a roster.
REQUIRE_ROSTER_ENV = "FBO_REQUIRE_ROSTER"


def key_id(public_key: bytes | str) -> bytes:
    """A public key (OpenSSH line or PEM) as DER ``SubjectPublicKeyInfo`` bytes; ``ValueError`` if unreadable."""
    from cryptography.hazmat.primitives import serialization

    data = public_key.encode() if isinstance(public_key, str) else bytes(public_key)
    text = data.strip()
    try:
        if text.startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(text)
        else:
            key = serialization.load_ssh_public_key(b" ".join(text.split()[:2]))
    except Exception as err:
        raise ValueError(f"not a public key in OpenSSH or PEM format ({type(err).__name__}: {err})") from None
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


class AgentRoster:
    r"""Agents bound to node public keys.

    Args:
        keys: ``{agent id: public key}`` (OpenSSH or PEM), one distinct key per agent.
        num_agents: If given, every agent id must lie in ``0..num_agents-1``.
    """

    def __init__(self, keys: Mapping[Any, bytes | str], num_agents: int | None = None) -> None:
        self._agent_of: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        for agent, key in keys.items():
            try:
                n = int(agent)
            except (TypeError, ValueError):
                raise ValueError(f"roster: agent id {agent!r} is not an integer.") from None
            if num_agents is not None and not 0 <= n < num_agents:
                raise ValueError(f"roster: agent {n} is outside 0..{num_agents - 1}.")
            try:
                kid = key_id(key)
            except ValueError as err:
                raise ValueError(f"roster: agent {n}'s key is {err}.") from None
            if kid in self._agent_of:
                raise ValueError(f"roster: agents {self._agent_of[kid]} and {n} have the same key.")
            if n in self._key_of:
                raise ValueError(f"roster: agent {n} is listed twice.")
            self._agent_of[kid], self._key_of[n] = n, kid
        self.agents = sorted(self._agent_of.values())

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], num_agents: int | None = None) -> AgentRoster:
        """Read a roster JSON file (one-line ``ValueError`` naming the file if it is not one)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"agent roster {path}: unreadable ({err}).") from None
        if not isinstance(data, dict):
            raise ValueError(f"agent roster {path}: expected a JSON object {{agent id: public key}}.")
        try:
            return cls(data, num_agents)
        except ValueError as err:
            raise ValueError(f"agent roster {path}: {err}") from None

    @classmethod
    def from_env(cls, num_agents: int | None = None) -> AgentRoster | None:
        """The roster named by ``$FBO_AGENT_ROSTER``, or ``None`` when it is unset or empty."""
        path = os.environ.get(ROSTER_ENV, "").strip()
        return cls.from_file(path, num_agents) if path else None

    def agent(self, public_key: bytes | str | None) -> int | None:
        """The agent a key plays, or ``None`` (no key, an unreadable key, or a key not on the roster)."""
        if not public_key:
            return None
        try:
            return self._agent_of.get(key_id(public_key))
        except ValueError:
            return None

    def public_key(self, agent: int) -> bytes | None:
        """Agent ``agent``'s public key as DER ``SubjectPublicKeyInfo``, or ``None`` when it is not on the roster."""
        return self._key_of.get(int(agent))

    def bind(self, nodes: Iterable[Any]) -> tuple[dict[int, int], list[int]]:
        r"""``({node id: agent}, [node ids not on the roster])`` for Flower ``NodeInfo`` records
        (``node_id`` and ``public_key``)."""
        bound, strangers = {}, []
        for info in nodes:
            agent = self.agent(getattr(info, "public_key", None))
            if agent is None:
                strangers.append(int(info.node_id))
            else:
                bound[int(info.node_id)] = agent
        return bound, strangers


class NodeBinding:
    r"""The server's map between transport nodes and agents, kept for one run.

    With a :class:`AgentRoster`, a node plays the agent its key is bound to and
    nothing else; nodes whose key is not on the roster are never contacted.
    Without one (an insecure deployment), a node plays the agent it first
    claims, and a later claim of that agent by another node is ignored.

    Args:
        roster: The roster, or ``None``.
        num_agents: ``N``.
    """

    def __init__(self, roster: AgentRoster | None, num_agents: int) -> None:
        self.roster, self.num_agents = roster, int(num_agents)
        self.agent_of: dict[int, int] = {}  # node -> agent
        self.node_of: dict[int, int] = {}  # agent -> node
        self.strangers: set[int] = set()  # nodes whose key is not on the roster

    def nodes(self, grid: Any) -> tuple[list[int], list[int]]:
        r"""``(nodes to contact, newly seen strangers)`` among the nodes connected to ``grid`` now."""
        if self.roster is None:
            return sorted(set(self.agent_of) | set(int(n) for n in grid.get_node_ids())), []
        bound, strangers = self.roster.bind(grid.get_nodes())
        for node, agent in bound.items():
            old = self.node_of.get(agent)
            if old is not None and old != node:  # the key's holder reconnected as a new node
                self.agent_of.pop(old, None)
            self.agent_of[node], self.node_of[agent] = agent, node
        new = sorted(set(strangers) - self.strangers)
        self.strangers.update(strangers)
        return sorted(bound), new

    def agent(self, node: int, claimed: int) -> int | None:
        r"""The agent a reply from ``node`` that claims ``claimed`` counts for, or ``None`` to ignore it.

        Raises:
            ValueError: With a roster, a claim that is not the node's key's agent
                (the reply then counts against the key's agent).
        """
        if self.roster is not None:
            agent = self.agent_of.get(node)
            if agent is None:
                return None
            if claimed != agent:
                raise ValueError(f"node {node} holds agent {agent}'s key but claims agent {claimed}")
            return agent
        if not 0 <= claimed < self.num_agents:
            raise ValueError(f"reply from agent {claimed}, not an agent id in 0..{self.num_agents - 1}")
        bound = self.agent_of.get(node)
        if bound is not None:  # a node plays the agent it first claimed, and no other
            if claimed != bound:
                raise ValueError(f"node {node} plays agent {bound} but claims agent {claimed}")
            return bound
        if self.node_of.get(claimed, node) != node:  # another node plays it
            return None
        self.agent_of[node], self.node_of[claimed] = claimed, node
        return claimed


__all__ = ["REQUIRE_ROSTER_ENV", "ROSTER_ENV", "AgentRoster", "NodeBinding", "key_id"]
