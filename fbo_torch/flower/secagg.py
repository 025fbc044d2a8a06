r"""SecAgg+ for DP-FTS-DE's integer vectors on Flower's Message API, from Flower's own primitives.

The server of a secure round (``aggregation = "secure"``,
:mod:`fbo_torch.federation.secure`) must learn the sum of the surviving
agents' integer vectors modulo ``m`` and nothing else. This module is the
secure aggregation protocol of Bonawitz et al. (2017) with the sparse
neighbourhoods of Bell et al. (2020, SecAgg+), as Flower implements it —
five stages, each one message to every live node:

0. **setup** (riding on the round's exchange): each node makes two key pairs
   (P-384) and sends the public keys, signed with its SuperNode key
   (:mod:`fbo_torch.flower.identity`);
1. **share keys**: each node gets its neighbours' public keys with their
   signatures and checks each against its own roster (a substituted or invented
   key is refused, and so is a threshold of at most half of its neighbourhood),
   draws its private mask seed ``b`` (OS randomness), splits ``b`` and its
   first secret key into Shamir shares (threshold ``t``), and sends each
   neighbour its shares encrypted (Fernet, keyed by ECDH with the second keys);
   it also commits to ``b`` (SHA-256), so a wrong reconstruction is caught;
2. **masked vectors**: each node gets the encrypted shares addressed to it
   and sends ``y + PRG(b) + Σ_j ±PRG(s_ij) mod m``, ``s_ij`` the ECDH secret of
   its first key with neighbour ``j``'s (the pairwise masks cancel in the sum);
3. **consistency** (Bonawitz et al.'s active-security round): each survivor is
   told the survivor set and signs it; a node signs one set per round;
4. **unmask**: each survivor gets the others' signatures and reveals shares
   only if a majority of the federation's agents signed the set it signed;
   then, for each neighbour, the share of ``b`` if that neighbour is in the set
   and the share of its secret key if it is not (never both for one node); the
   server reconstructs and removes the masks.

The cryptography is Flower's (``flwr.common.secure_aggregation.crypto``: key
agreement, Fernet, Shamir sharing; ``flwr.supercore.primitives.asymmetric``:
keys); the protocol's state and checks are here because Flower 1.41 offers
them only as a legacy workflow that does not serve: ``SecAggPlusWorkflow``
needs a ``LegacyContext`` inside ``DefaultWorkflow`` and ``secaggplus_mod``
intercepts legacy fit messages (no Message-API mod exists); it quantizes
floats itself with ``np.random`` and silently clips them to ±8, adds no noise,
and expands every mask with ``secaggplus_utils.pseudo_rand_gen``, which seeds
numpy's Mersenne Twister with the **XOR of the seed's 4-byte words** — a
32-bit seed, so a pairwise mask is one of 2³² streams, which a server can
search. Here every mask is SHAKE-256 of the full 256-bit seed
(:func:`mask`), the vectors arrive already as integers with their noise
(:meth:`~fbo_torch.federation.secure.SecureMechanism.contributions`), and
every message is checked: a malformed one drops its sender from the round,
like a dropout, and never stops the server.

Security model: the server may be **malicious** (Bell et al. 2020's malicious
variant): with every node holding an identity (its SuperNode key and a roster,
:mod:`fbo_torch.flower.identity`) it can neither substitute keys nor invent
nodes, and it cannot tell two honest nodes two survivor sets: two sets each
signed by a majority of the agents share an honest signer, who signs once.
So all honest nodes reveal for one survivor set, and each node's threshold is
more than half of its neighbourhood: no node's seed and key are both
reconstructed. What such a server still learns is the sum of a set of at
least ``t`` vectors of its choosing per round (each node answers a round once:
:mod:`fbo_torch.flower.client_app`); :mod:`fbo_torch.flower.floor` accounts
for it. A node whose owner set ``secagg.trust-server`` takes part without
signatures: then the server is trusted to follow the protocol (honest but
curious). Nodes may be hostile: they can drop out, send garbage (dropped) or
in-range garbage (bounded damage, :mod:`fbo_torch.federation.secure`), or
corrupt a reconstruction (caught by the commitment or the public key; the
round then fails and stays charged). Nothing here imports the rest of
Flower's runtime.
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_concat, share_keys_plaintext_separate
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
)

from fbo_torch.flower.identity import NodeIdentity, keys_statement, survivors_statement
from fbo_torch.utils.secure_random import secret_bits

STAGES = ("share_keys", "masked_vector", "consistency", "unmask")


class SecAggError(ValueError):
    """A SecAgg+ message that cannot be used, or a round that cannot finish; the message says why."""


def mask(seed: bytes, purpose: str, round: int, dim: int, modulus: int) -> np.ndarray:
    r"""``dim`` residues modulo ``modulus`` (a power of two) from the SHAKE-256 stream of a 32-byte seed."""
    return (secret_bits(seed, ("secagg-mask", purpose, int(round)), dim) & np.uint64(modulus - 1)).astype(np.int64)


def _pairwise_seed(private_key_pem: bytes, public_key_pem: bytes) -> bytes:
    """The 32-byte secret two nodes share (ECDH + HKDF, Flower's ``generate_shared_key``)."""
    return base64.urlsafe_b64decode(
        generate_shared_key(bytes_to_private_key(private_key_pem), bytes_to_public_key(public_key_pem))
    )


def commitment(seed: bytes) -> bytes:
    """SHA-256 commitment to a node's private mask seed (the seed is 256 random bits: it hides it)."""
    return hashlib.sha256(b"fbo-torch/secagg-commit/v1" + seed).digest()


def _sign(me: int, other: int) -> int:
    """The pairwise mask is added by the node with the larger id and subtracted by the other (Flower's rule)."""
    return 1 if me > other else -1


# --------------------------------------------------------------------------- the node's side
@dataclass
class SecAggClient:
    r"""One node's side of one secure round (its state lives in the node's ``context.state``).

    Attributes:
        node_id: This node's id (Flower's node id).
        round: The DP-FTS-DE round the vector is for.
        modulus: ``m``.
        vector: The node's ``d`` int64 entries (its integer vector with its noise share).
        agent_id: The agent this node plays (signed with its keys).
        federation: The federation's fingerprint (signed with everything, so no signature serves twice).
        min_threshold: The fewest shares this node lets reconstruct a secret (its floor).
        num_agents: ``N``: a survivor set must be signed by more than half of the agents.
    """

    node_id: int
    round: int
    modulus: int
    vector: np.ndarray
    agent_id: int = -1
    federation: str = ""
    min_threshold: int = 2
    num_agents: int = 0
    sk1: bytes = b""
    pk1: bytes = b""
    sk2: bytes = b""
    pk2: bytes = b""
    signature: bytes = b""
    seed: bytes = b""
    threshold: int = 0
    stage: str = "setup"
    public_keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    agents: dict[int, int] = field(default_factory=dict)
    seed_shares: dict[int, bytes] = field(default_factory=dict)
    key_shares: dict[int, bytes] = field(default_factory=dict)
    sources: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)

    @classmethod
    def setup(
        cls,
        node_id: int,
        round: int,
        modulus: int,
        vector: np.ndarray,
        *,
        agent_id: int = -1,
        federation: str = "",
        min_threshold: int = 2,
        num_agents: int = 0,
        identity: NodeIdentity | None = None,
    ) -> SecAggClient:
        """Stage 0: fresh key pairs for this round, signed with ``identity`` (if any)."""
        client = cls(
            int(node_id),
            int(round),
            int(modulus),
            np.asarray(vector, dtype=np.int64),
            int(agent_id),
            str(federation),
            max(2, int(min_threshold)),
            int(num_agents),
        )
        sk1, pk1 = generate_key_pairs()
        sk2, pk2 = generate_key_pairs()
        client.sk1, client.pk1 = private_key_to_bytes(sk1), public_key_to_bytes(pk1)
        client.sk2, client.pk2 = private_key_to_bytes(sk2), public_key_to_bytes(pk2)
        if identity is not None:
            client.signature = identity.sign(client._keys_statement(client.node_id, client.agent_id))
        return client

    def _keys_statement(self, node: int, agent: int) -> bytes:
        pk1, pk2 = (self.pk1, self.pk2) if node == self.node_id else self.public_keys[node]
        return keys_statement(self.federation, self.round, node, agent, pk1, pk2)

    def _refuse(self, why: str) -> SecAggError:
        return SecAggError(f"node {self.node_id} (agent {self.agent_id}), round {self.round}: {why}")

    def _expect(self, stage: str, round: int) -> None:
        order = ("setup",) + STAGES
        if int(round) != self.round or self.stage != order[order.index(stage) - 1]:
            raise SecAggError(
                f"node {self.node_id}: stage {stage!r} of round {round} arrived after stage "
                f"{self.stage!r} of round {self.round}; refusing it."
            )
        self.stage = stage

    def share_keys(
        self,
        round: int,
        public_keys: dict[int, tuple[bytes, bytes]],
        threshold: int,
        agents: Mapping[int, int] | None = None,
        signatures: Mapping[int, bytes] | None = None,
        identity: NodeIdentity | None = None,
    ) -> tuple[list[int], list[bytes], bytes]:
        r"""Stage 1: shares of the mask seed and of the first secret key, encrypted for each neighbour.

        Args:
            round: The round (a request of another round is refused).
            public_keys: ``{node: (pk1, pk2)}`` of the neighbourhood, this node included.
            threshold: ``t``: more than half of the neighbourhood and at least :attr:`min_threshold`.
            agents / signatures: ``{node: agent}`` and ``{node: signature of its keys}``; with an
                ``identity`` every neighbour's keys must be signed by its agent's roster key.
            identity: This node's :class:`~fbo_torch.flower.identity.NodeIdentity` (its signing key
                and the roster), or ``None`` (nothing signed or checked).

        Returns:
            ``(destinations, ciphertexts, commitment to the seed)``.
        """
        self._expect("share_keys", round)
        if public_keys.get(self.node_id) != (self.pk1, self.pk2):
            raise self._refuse("the server did not relay this node's own public keys.")
        flat = [k for pair in public_keys.values() for k in pair]
        if len(set(flat)) != len(flat):
            raise self._refuse("two neighbours have the same public key.")
        t, k = int(threshold), len(public_keys)
        if not (t >= self.min_threshold and k < 2 * t <= 2 * k):
            raise self._refuse(
                f"threshold {t} with {k} neighbours; this node needs more than half of its neighbourhood and at "
                f"least {self.min_threshold} (with fewer, a server that lies about who dropped out can reconstruct "
                "both secrets of one node and unmask its vector)."
            )
        self.public_keys, self.threshold = dict(public_keys), t
        self.agents = {int(n): int(a) for n, a in (agents or {}).items()}
        if identity is not None:
            self._check_signed_keys(signatures or {}, identity)
        self.seed = os.urandom(32)
        ids = sorted(public_keys)
        seed_shares = create_shares(self.seed, t, len(ids))
        key_shares = create_shares(self.sk1, t, len(ids))
        dests, cts = [], []
        for nid, b_share, sk_share in zip(ids, seed_shares, key_shares, strict=True):
            if nid == self.node_id:
                self.seed_shares[nid], self.key_shares[nid] = b_share, sk_share
                continue
            key = generate_shared_key(bytes_to_private_key(self.sk2), bytes_to_public_key(public_keys[nid][1]))
            dests.append(nid)
            cts.append(encrypt(key, share_keys_plaintext_concat(self.node_id, nid, b_share, sk_share)))
        return dests, cts, commitment(self.seed)

    def _check_signed_keys(self, signatures: Mapping[int, bytes], identity: NodeIdentity) -> None:
        """Every neighbour is a distinct agent of the federation whose keys its roster key signed."""
        if self.agents.get(self.node_id) != self.agent_id:
            raise self._refuse(f"the server relayed this node as agent {self.agents.get(self.node_id)}.")
        seen: set[int] = set()
        for nid in sorted(self.public_keys):
            agent = self.agents.get(nid)
            if agent is None or not 0 <= agent < self.num_agents or agent in seen:
                raise self._refuse(f"neighbour {nid} is not a distinct agent of the federation ({agent!r}).")
            seen.add(agent)
            if nid != self.node_id and not identity.verify(
                agent, self._keys_statement(nid, agent), signatures.get(nid, b"")
            ):
                raise self._refuse(
                    f"the public keys of node {nid} are not signed by agent {agent}'s roster key: refusing a "
                    "substituted or invented key."
                )

    def masked_vector(self, round: int, sources: list[int], ciphertexts: list[bytes]) -> np.ndarray:
        """Stage 2: store the shares addressed to this node; the vector masked with ``b`` and the pairwise masks."""
        self._expect("masked_vector", round)
        if len(sources) != len(ciphertexts) or len(set(sources)) != len(sources):
            raise self._refuse("malformed list of encrypted shares.")
        if len(sources) + 1 < self.threshold:
            raise self._refuse(f"{len(sources)} neighbours left, below the threshold {self.threshold}.")
        for src, ct in zip(sources, ciphertexts, strict=True):
            if src not in self.public_keys or src == self.node_id:
                raise self._refuse(f"a share from {src}, not a neighbour.")
            key = generate_shared_key(bytes_to_private_key(self.sk2), bytes_to_public_key(self.public_keys[src][1]))
            actual, dst, b_share, sk_share = share_keys_plaintext_separate(decrypt(key, ct))
            if (actual, dst) != (src, self.node_id):
                raise self._refuse(f"a share claiming {actual} -> {dst} arrived as {src}.")
            self.seed_shares[src], self.key_shares[src] = b_share, sk_share
        self.sources = list(sources)
        m, d = self.modulus, len(self.vector)
        out = np.remainder(self.vector, m) + mask(self.seed, "self", self.round, d, m)
        for src in sources:
            pairwise = mask(_pairwise_seed(self.sk1, self.public_keys[src][0]), "pair", self.round, d, m)
            out = out + _sign(self.node_id, src) * pairwise
        return np.remainder(out, m)

    @property
    def _known(self) -> set[int]:
        """The nodes this node holds shares of: itself and the neighbours whose shares arrived."""
        return set(self.sources) | {self.node_id}

    def consistency(self, round: int, survivors: list[int], identity: NodeIdentity | None = None) -> bytes:
        r"""Stage 3: sign the survivor set (the nodes whose masked vectors are in the sum); this node
        signs one set per round. Returns the signature (``b""`` without an identity)."""
        self._expect("consistency", round)
        surv = [int(n) for n in survivors]
        if len(set(surv)) != len(surv) or self.node_id not in surv:
            raise self._refuse("the survivor set repeats a node or leaves this node out.")
        if len(self._known & set(surv)) < self.threshold:
            raise self._refuse(f"fewer than the threshold {self.threshold} of its neighbours survived.")
        self.survivors = sorted(surv)
        if identity is None:
            return b""
        return identity.sign(survivors_statement(self.federation, self.round, self.node_id, self.agent_id, surv))

    def unmask(
        self,
        round: int,
        signatures: Mapping[int, tuple[int, bytes]] | None = None,
        identity: NodeIdentity | None = None,
    ) -> tuple[list[int], list[bytes]]:
        r"""Stage 4: shares of the survivors' seeds and of the dropped nodes' keys — never both for one
        node — for the survivor set this node signed, and only once a majority of the agents (and at least
        ``t``) signed that same set.

        Args:
            round: The round (a request of another round is refused).
            signatures: ``{node: (agent, signature of the survivor set)}`` of the other survivors.
            identity: This node's :class:`~fbo_torch.flower.identity.NodeIdentity`: with one, every
                signature must verify against the roster.

        Returns:
            ``(nodes, shares)``: for each node in ``nodes`` this node's share of its seed (a survivor) or of its key
            (a dropped node).
        """
        self._expect("unmask", round)
        if identity is not None:
            signed = {self.agent_id}
            need = max(self.threshold, self.num_agents // 2 + 1)
            for nid, (agent, sig) in sorted((signatures or {}).items()):
                if len(signed) >= need:  # enough: the rest need not be verified
                    break
                if (
                    nid in self.survivors
                    and isinstance(agent, int)
                    and 0 <= agent < self.num_agents
                    and agent not in signed
                    and identity.verify(
                        agent, survivors_statement(self.federation, self.round, nid, agent, self.survivors), sig
                    )
                ):
                    signed.add(agent)
            if len(signed) < need:
                raise self._refuse(
                    f"{len(signed)} agents confirmed the survivor set this node signed, {need} needed: the server "
                    "may be telling nodes different sets; revealing nothing."
                )
        active = sorted(self._known & set(self.survivors))
        dead = sorted(self._known - set(self.survivors))
        self.vector = np.zeros(0, dtype=np.int64)  # done with it
        return active + dead, [self.seed_shares[n] for n in active] + [self.key_shares[n] for n in dead]

    # -------------------------------------------------------------- node state
    def to_state(self) -> dict[str, Any]:
        """A flat dict of ints, bytes and lists (a Flower ``ConfigRecord``)."""
        ids = sorted(self.public_keys)
        return {
            "node-id": self.node_id,
            "round": self.round,
            "modulus": self.modulus,
            "agent-id": self.agent_id,
            "federation": self.federation,
            "min-threshold": self.min_threshold,
            "num-agents": self.num_agents,
            "stage": self.stage,
            "vector": self.vector.astype("<i8").tobytes(),
            "sk1": self.sk1,
            "pk1": self.pk1,
            "sk2": self.sk2,
            "pk2": self.pk2,
            "signature": self.signature,
            "seed": self.seed,
            "threshold": self.threshold,
            "keys-ids": ids,
            "keys-1": [self.public_keys[i][0] for i in ids],
            "keys-2": [self.public_keys[i][1] for i in ids],
            "agents-ids": sorted(self.agents),
            "agents": [self.agents[i] for i in sorted(self.agents)],
            "shares-ids": sorted(self.seed_shares),
            "seed-shares": [self.seed_shares[i] for i in sorted(self.seed_shares)],
            "key-shares": [self.key_shares[i] for i in sorted(self.seed_shares)],
            "sources": list(self.sources),
            "survivors": list(self.survivors),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> SecAggClient:
        c = cls(
            int(state["node-id"]),
            int(state["round"]),
            int(state["modulus"]),
            np.frombuffer(state["vector"], dtype="<i8").astype(np.int64),
            int(state["agent-id"]),
            str(state["federation"]),
            int(state["min-threshold"]),
            int(state["num-agents"]),
        )
        c.sk1, c.pk1, c.sk2, c.pk2, c.seed = state["sk1"], state["pk1"], state["sk2"], state["pk2"], state["seed"]
        c.signature = state["signature"]
        c.threshold, c.stage = int(state["threshold"]), str(state["stage"])
        c.public_keys = {
            int(i): (a, b) for i, a, b in zip(state["keys-ids"], state["keys-1"], state["keys-2"], strict=True)
        }
        c.agents = {int(i): int(a) for i, a in zip(state["agents-ids"], state["agents"], strict=True)}
        ids = [int(i) for i in state["shares-ids"]]
        c.seed_shares = dict(zip(ids, state["seed-shares"], strict=True))
        c.key_shares = dict(zip(ids, state["key-shares"], strict=True))
        c.sources = [int(i) for i in state["sources"]]
        c.survivors = [int(i) for i in state["survivors"]]
        return c


# --------------------------------------------------------------------------- the server's side
class SecAggServer:
    r"""The server's side of one secure round over the nodes of ``cohort``.

    Args:
        round: The DP-FTS-DE round.
        cohort: ``node id -> (pk1, pk2)`` from the setup replies.
        dim / modulus: The vectors' length and ``m``.
        num_shares: Neighbours of each node, itself included (``≥`` the cohort: every
            pair, Bonawitz et al.'s SecAgg; fewer: a ring of that many, SecAgg+).
        threshold: ``t``, shares needed to reconstruct a secret (``2 ≤ t ≤`` neighbours).
        agents / signatures: ``node id -> agent`` and ``node id -> signature of its keys``
            (relayed to its neighbours, who check them against their rosters).

    Each ``receive_*`` method takes the stage's replies as ``{node: payload}``,
    keeps the nodes whose payload checks out and returns ``{node: why}`` for
    the others (dropped from the round, like dropouts).
    """

    def __init__(
        self,
        round: int,
        cohort: dict[int, tuple[bytes, bytes]],
        dim: int,
        modulus: int,
        num_shares: int,
        threshold: int,
        agents: Mapping[int, int] | None = None,
        signatures: Mapping[int, bytes] | None = None,
    ) -> None:
        self.round, self.dim, self.modulus = int(round), int(dim), int(modulus)
        self.public_keys = dict(cohort)
        self.agents = {int(n): int(a) for n, a in (agents or {}).items()}
        self.signatures = dict(signatures or {})
        ids = sorted(self.public_keys)
        n = len(ids)
        k = min(int(num_shares), n)
        if k < n and k % 2 == 0:
            k += 1  # a ring has an odd number of members per neighbourhood
        self.num_shares = k
        self.threshold = max(2, min(int(threshold), k))
        order = list(ids)
        random.SystemRandom().shuffle(order)  # the server's ring (any order gives the same sum)
        half = k // 2
        self.neighbours = {
            nid: ({order[(i + o) % n] for o in range(-half, half + 1)} if k < n else set(ids))
            for i, nid in enumerate(order)
        }
        self.alive = set(ids)  # nodes still in the protocol
        self.shared: set[int] = set()  # nodes that finished stage 1
        self.commitments: dict[int, bytes] = {}
        self.forward: dict[int, list[tuple[int, bytes]]] = {}
        self.masked: dict[int, np.ndarray] = {}
        self.sources: dict[int, list[int]] = {}
        self.requested: dict[int, dict[int, tuple[bytes, bytes]]] = {}
        self.confirmations: dict[int, bytes] = {}  # survivor -> its signature of the survivor set

    def _drop(self, nodes: Iterable[int], why: dict[int, str], reason: str) -> None:
        for nid in nodes:
            if nid in self.alive:
                self.alive.discard(nid)
                why.setdefault(nid, reason)

    # stage 1
    def share_keys_requests(self) -> tuple[dict[int, dict[int, tuple[bytes, bytes]]], dict[int, str]]:
        """For each live node: its live neighbours' public keys (its own included); and the nodes dropped
        because their public key is not theirs alone (a copied key)."""
        why: dict[int, str] = {}
        count: dict[bytes, int] = {}
        for pair in self.public_keys.values():
            for key in pair:
                count[key] = count.get(key, 0) + 1
        self._drop(
            [nid for nid, pair in self.public_keys.items() if any(count[k] > 1 for k in pair)],
            why,
            "its public key is also another node's",
        )
        self.requested = {
            nid: {j: self.public_keys[j] for j in sorted(self.neighbours[nid] & self.alive)}
            for nid in sorted(self.alive)
        }
        return self.requested, why

    def share_keys_content(self, nid: int) -> dict[str, Any]:
        """The share-keys request of node ``nid`` (after :meth:`share_keys_requests`): its live neighbours'
        node and agent ids, their public keys and signatures, and the threshold, as the request's values.

        Args:
            nid: A live node.

        Returns:
            The values of its stage-1 request (:func:`~fbo_torch.flower.secagg_records.secagg_request`).
        """
        keys = self.requested[nid]
        return {
            "node-ids": list(keys),
            "agent-ids": [self.agents[j] for j in keys],
            "pk1": [keys[j][0] for j in keys],
            "pk2": [keys[j][1] for j in keys],
            "signatures": [self.signatures[j] for j in keys],
            "threshold": self.threshold,
        }

    def receive_shares(self, replies: dict[int, tuple[list[int], list[bytes], bytes]]) -> dict[int, str]:
        """Stage 1's replies: ``{node: (destinations, ciphertexts, commitment)}``."""
        why: dict[int, str] = {}
        for nid in sorted(self.alive):
            if nid not in replies:
                self._drop([nid], why, "no reply to share-keys")
                continue
            dests, cts, commit = replies[nid]
            expected = sorted(set(self.requested[nid]) - {nid})
            if (
                sorted(dests) != expected
                or len(dests) != len(cts)
                or not isinstance(commit, bytes)
                or len(commit) != 32
                or not all(isinstance(c, bytes) for c in cts)
            ):
                self._drop([nid], why, "malformed share-keys reply (destinations must be its neighbours)")
                continue
            self.commitments[nid] = commit
            for dst, ct in zip(dests, cts, strict=True):
                self.forward.setdefault(dst, []).append((nid, ct))
        self.shared = set(self.alive)
        return why

    # stage 2
    def masked_vector_requests(self) -> dict[int, tuple[list[int], list[bytes]]]:
        """For each live node: the encrypted shares addressed to it by nodes that finished stage 1."""
        out = {}
        for nid in sorted(self.alive):
            pairs = sorted((src, ct) for src, ct in self.forward.get(nid, []) if src in self.shared)
            self.sources[nid] = [s for s, _ in pairs]
            out[nid] = ([s for s, _ in pairs], [c for _, c in pairs])
        return out

    def receive_masked(self, replies: dict[int, np.ndarray]) -> dict[int, str]:
        """Stage 2's replies: ``{node: d int64 residues}``."""
        why: dict[int, str] = {}
        for nid in sorted(self.alive):
            v = replies.get(nid)
            if v is None:
                self._drop([nid], why, "no masked vector")
            elif v.dtype != np.int64 or v.shape != (self.dim,) or (v < 0).any() or (v >= self.modulus).any():
                self._drop([nid], why, f"masked vector is not {self.dim} residues in [0, {self.modulus})")
            else:
                self.masked[nid] = v
        return why

    @property
    def survivors(self) -> list[int]:
        """Nodes whose masked vector is in the sum."""
        return sorted(self.masked)

    # stage 3
    def consistency_requests(self) -> dict[int, list[int]]:
        """For each survivor: the survivor set, to sign."""
        return {nid: self.survivors for nid in self.survivors}

    def receive_consistency(self, replies: Mapping[int, Any]) -> dict[int, str]:
        """Stage 3's replies: ``{node: signature of the survivor set}`` (a survivor that does not confirm
        stays in the sum but reveals nothing)."""
        why: dict[int, str] = {}
        for nid in self.survivors:
            sig = replies.get(nid)
            if sig is None:
                why[nid] = "no reply to consistency"
            elif not isinstance(sig, bytes) or len(sig) > 1024:
                why[nid] = "malformed consistency reply"
            else:
                self.confirmations[nid] = sig
        return why

    # stage 4
    def unmask_requests(self) -> dict[int, dict[int, tuple[int, bytes]]]:
        """For each survivor that confirmed: every confirmation ``{node: (agent, signature)}``."""
        signed = {nid: (self.agents.get(nid, -1), sig) for nid, sig in self.confirmations.items()}
        return {nid: signed for nid in sorted(self.confirmations)}

    def _reveal_sets(self) -> dict[int, tuple[list[int], list[int]]]:
        """For each survivor: ``(surviving, dropped)`` nodes it holds shares of (what it may reveal)."""
        surv = set(self.masked)
        dead = self.shared - surv
        out = {}
        for nid in sorted(surv):
            known = set(self.sources.get(nid, [])) | {nid}
            out[nid] = (sorted(known & surv), sorted(known & dead))
        return out

    def unmask(self, replies: dict[int, tuple[list[int], list[bytes]]]) -> np.ndarray:
        r"""Stage 3's replies: ``{node: (owners, shares)}``; returns the sum of the survivors' vectors mod ``m``.

        Raises:
            SecAggError: A secret has fewer than ``t`` shares, or its reconstruction does not
                match the node's commitment or public key.
        """
        surv, dead = set(self.masked), self.shared - set(self.masked)
        requests = self._reveal_sets()
        shares: dict[int, list[bytes]] = {}
        for nid, reply in replies.items():
            if nid not in requests:
                continue
            owners, got = reply
            allowed = set(requests[nid][0]) | set(requests[nid][1])
            # a hostile reply's lists may differ in length: what pairs up is checked below, the rest ignored
            for owner, share in zip(owners, got, strict=False):
                if int(owner) in allowed and isinstance(share, bytes):
                    shares.setdefault(int(owner), []).append(share)
        m = self.modulus
        total = np.zeros(self.dim, dtype=np.int64)
        for v in self.masked.values():
            total = np.remainder(total + v, m)
        for nid in sorted(surv):
            seed = self._reconstruct(nid, shares.get(nid, []))
            if commitment(seed) != self.commitments.get(nid):
                raise SecAggError(f"the reconstructed mask seed of node {nid} does not match its commitment.")
            total = np.remainder(total - mask(seed, "self", self.round, self.dim, m), m)
        for j in sorted(dead):
            sk1 = self._reconstruct(j, shares.get(j, []))
            try:
                ok = public_key_to_bytes(bytes_to_private_key(sk1).public_key()) == self.public_keys[j][0]
            except (ValueError, TypeError):
                ok = False
            if not ok:
                raise SecAggError(f"the reconstructed key of dropped node {j} does not match its public key.")
            for i in sorted(surv):
                if j in self.sources.get(i, []):  # i added ±PRG(s_ij): take it out
                    pairwise = mask(_pairwise_seed(sk1, self.public_keys[i][0]), "pair", self.round, self.dim, m)
                    total = np.remainder(total - _sign(i, j) * pairwise, m)
        return total

    def _reconstruct(self, owner: int, shares: list[bytes]) -> bytes:
        if len(shares) < self.threshold:
            raise SecAggError(f"{len(shares)} shares of node {owner}'s secret arrived, {self.threshold} needed.")
        try:
            return combine_shares(shares[: self.threshold])
        except Exception as err:
            raise SecAggError(f"the shares of node {owner}'s secret do not combine ({type(err).__name__}).") from None


__all__ = ["STAGES", "SecAggClient", "SecAggError", "SecAggServer", "commitment", "mask"]
