r"""A node's identity in secure rounds: its SuperNode key signs what it says, its own roster says whose key is whose.

SecAgg+ against a malicious server (Bonawitz et al. 2017, §6 "active
security"; Bell et al. 2020, the malicious variant of SecAgg+) rests on a
public-key infrastructure the server does not control: every node signs its
fresh SecAgg+ public keys, and later the set of survivors it saw, with a
long-term key, and checks the other nodes' signatures against keys it holds
itself. Then the server can neither substitute keys nor invent nodes (it holds
no roster key), nor tell two nodes two different survivor sets (every honest
node signs one set per round, and a node reveals shares only for a set signed
by a majority of the federation).

The long-term key is the SuperNode's authentication key (the private key of
``flower-supernode --auth-supernode-private-key``, EC P-384 in OpenSSH or PEM
format; its public key is the one registered with ``flwr supernode register``),
and the roster is the federation's agent roster (the JSON ``{agent id: public
key}`` the server reads from ``FBO_AGENT_ROSTER``, :mod:`~fbo_torch.flower.roster`),
a copy of which every node keeps. Both are named in the node's *own* node
config, never in the run config:

============================  ==========================================================
``secagg.private-key``        path of the node's SuperNode private key
``secagg.roster``             path of the node's copy of the agent roster
``secagg.trust-server``       ``true``: take part in secure rounds without signatures (the
                              server is trusted to follow SecAgg+: honest but curious)
============================  ==========================================================

A node without a key and a roster refuses secure rounds unless its owner set
``secagg.trust-server = true``. Signatures are ECDSA with SHA-384 over
length-prefixed statements that name the federation (its run config's
fingerprint), the round, the node and its agent (:func:`keys_statement`,
:func:`survivors_statement`), so no signature can be replayed in another
round, federation or role. Needs ``cryptography`` (installed with ``flwr``);
nothing here imports ``flwr``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fbo_torch.flower.roster import AgentRoster

#: Node config keys of a node's identity (see the module docstring).
PRIVATE_KEY_KEY, ROSTER_KEY, TRUST_SERVER_KEY = "secagg.private-key", "secagg.roster", "secagg.trust-server"
_DOMAIN = b"fbo-torch/secagg-identity/v1"


class IdentityError(ValueError):
    """A node's identity cannot be used (missing, unreadable, not on its roster); the message says why."""


def _int(value: int) -> bytes:
    """A signed integer in 16 bytes (Flower's node ids are unsigned 64-bit; agent ids may be -1)."""
    return int(value).to_bytes(16, "little", signed=True)


def _encode(*parts: str | bytes | int | Iterable[int]) -> bytes:
    """Length-prefixed encoding of a statement's fields (no two statements share an encoding)."""
    out = [_DOMAIN]
    for p in parts:
        if isinstance(p, int):
            data = b"i" + _int(p)
        elif isinstance(p, (bytes, str)):
            raw = p.encode() if isinstance(p, str) else p
            data = b"b" + struct.pack("<I", len(raw)) + raw
        else:
            ints = [int(v) for v in p]
            data = b"l" + struct.pack("<I", len(ints)) + b"".join(_int(v) for v in ints)
        out.append(data)
    return b"".join(out)


def keys_statement(federation: str, round: int, node_id: int, agent_id: int, pk1: bytes, pk2: bytes) -> bytes:
    """What a node signs for its SecAgg+ public keys of ``round``."""
    return _encode("keys", federation, int(round), int(node_id), int(agent_id), pk1, pk2)


def survivors_statement(federation: str, round: int, node_id: int, agent_id: int, survivors: Iterable[int]) -> bytes:
    """What a node signs in the consistency stage: the (sorted) survivor set it was told of."""
    return _encode("survivors", federation, int(round), int(node_id), int(agent_id), sorted(int(n) for n in survivors))


def _truthy(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise IdentityError(f"node config `{key}` must be true or false, got {value!r}.")


def load_private_key(path: str | Path, key: str = PRIVATE_KEY_KEY) -> Any:
    """An EC private key from an OpenSSH or PEM file (one-line :class:`IdentityError` naming ``key`` otherwise)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        data = Path(path).expanduser().read_bytes()
    except OSError as err:
        raise IdentityError(f"node config `{key}`: cannot read {path} ({err.strerror or err}).") from None
    private: Any
    try:
        if data.lstrip().startswith(b"-----BEGIN OPENSSH"):
            private = serialization.load_ssh_private_key(data, password=None)
        else:
            private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as err:
        raise IdentityError(f"node config `{key}`: {path} is not an unencrypted private key ({err}).") from None
    if not isinstance(private, ec.EllipticCurvePrivateKey):
        raise IdentityError(
            f"node config `{key}`: {path} holds a {type(private).__name__}; SuperNode keys are EC (P-384)."
        )
    return private


class NodeIdentity:
    r"""Agent ``agent_id``'s signing key and its roster of the federation's public keys.

    Args:
        private_key: The node's EC private key (``cryptography``).
        roster: The federation's agents and their public keys.
        agent_id: The agent this node plays; its key must be that agent's on ``roster``.

    Raises:
        IdentityError: The node's key is not ``agent_id``'s on the roster.
    """

    def __init__(self, private_key: Any, roster: AgentRoster, agent_id: int) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        self.agent_id, self.roster, self._private = int(agent_id), roster, private_key
        mine = private_key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        if roster.public_key(self.agent_id) != mine:
            raise IdentityError(
                f"node config `{PRIVATE_KEY_KEY}`: this node's key is not agent {self.agent_id}'s on its roster "
                f"(`{ROSTER_KEY}`); give the key registered for partition-id {self.agent_id}."
            )
        self._public: dict[int, ec.EllipticCurvePublicKey] = {}

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any], agent_id: int) -> NodeIdentity | None:
        r"""The identity a node config names, or ``None`` when its owner trusts the server
        (``secagg.trust-server = true``).

        Raises:
            IdentityError: Neither an identity nor ``secagg.trust-server`` is configured, or the
                key or roster cannot be used (one line naming the node config key).
        """
        trust = _truthy(node_config.get(TRUST_SERVER_KEY, False), TRUST_SERVER_KEY)
        key, roster = node_config.get(PRIVATE_KEY_KEY), node_config.get(ROSTER_KEY)
        if trust and not key and not roster:
            return None
        if not key or not roster:
            raise IdentityError(
                f"this node takes part in secure rounds only with an identity the server cannot forge: set node config "
                f"`{PRIVATE_KEY_KEY}` (its SuperNode private key) and `{ROSTER_KEY}` (its copy of the agent roster), "
                f"or `{TRUST_SERVER_KEY} = true` to trust the server to follow SecAgg+."
            )
        try:
            ros = AgentRoster.from_file(str(roster))
        except ValueError as err:
            raise IdentityError(f"node config `{ROSTER_KEY}`: {err}") from None
        return cls(load_private_key(str(key)), ros, agent_id)

    def sign(self, statement: bytes) -> bytes:
        """An ECDSA (SHA-384) signature of ``statement`` with the node's key."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        return bytes(self._private.sign(statement, ec.ECDSA(hashes.SHA384())))

    def verify(self, agent: int, statement: bytes, signature: bytes) -> bool:
        """Whether ``signature`` is agent ``agent``'s (its roster key) on ``statement``."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        if not isinstance(signature, bytes) or not signature or isinstance(agent, bool):
            return False
        key = self._public.get(int(agent))
        if key is None:
            der = self.roster.public_key(int(agent))
            loaded = None if der is None else serialization.load_der_public_key(der)
            if not isinstance(loaded, ec.EllipticCurvePublicKey):
                return False
            key = self._public[int(agent)] = loaded
        try:
            key.verify(signature, statement, ec.ECDSA(hashes.SHA384()))
        except (InvalidSignature, ValueError):
            return False
        return True


__all__ = [
    "PRIVATE_KEY_KEY",
    "ROSTER_KEY",
    "TRUST_SERVER_KEY",
    "IdentityError",
    "NodeIdentity",
    "keys_statement",
    "load_private_key",
    "survivors_statement",
]
