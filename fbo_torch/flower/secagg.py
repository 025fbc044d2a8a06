r"""SecAgg+ for DP-FTS-DE's integer vectors on Flower's Message API, from Flower's own primitives.

The server of a secure round (``aggregation = "secure"``,
:mod:`fbo_torch.federation.secure`) must learn the sum of the surviving
agents' integer vectors modulo ``m`` and nothing else. This module is the
secure aggregation protocol of Bonawitz et al. (2017) with the sparse
neighbourhoods of Bell et al. (2020, SecAgg+), as Flower implements it —
four stages, each one message to every live node:

0. **setup** (riding on the round's exchange): each node makes two key pairs
   (P-384) and sends the public keys;
1. **share keys**: each node gets its neighbours' public keys, draws its
   private mask seed ``b`` (OS randomness), splits ``b`` and its first secret
   key into Shamir shares (threshold ``t``), and sends each neighbour its
   shares encrypted (Fernet, keyed by ECDH with the second keys); it also
   commits to ``b`` (SHA-256), so a wrong reconstruction is caught;
2. **masked vectors**: each node gets the encrypted shares addressed to it
   and sends ``y + PRG(b) + Σ_j ±PRG(s_ij) mod m``, ``s_ij`` the ECDH secret of
   its first key with neighbour ``j``'s (the pairwise masks cancel in the sum);
3. **unmask**: each survivor sends, for each neighbour, the share of ``b``
   if that neighbour survived and the share of its secret key if it dropped
   after stage 1 (never both for one node); the server reconstructs and
   removes the masks.

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

Security model: the server is **honest but curious** for the protocol (it
follows it and looks at everything it receives). A malicious server could
substitute public keys (they are not signed: SuperNode authentication binds
nodes to the SuperLink, not SecAgg keys to each other) or tell nodes
inconsistent dropout sets (there is no consistency round) and so unmask a
single vector — which still carries that agent's own noise share. Nodes
may be hostile: they can drop out, send garbage (dropped) or in-range
garbage (bounded damage, :mod:`fbo_torch.federation.secure`), or corrupt a
reconstruction (caught by the commitment or the public key; the round then
fails and stays charged). Nothing here imports the rest of Flower's runtime.
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

from fbo_torch.utils.secure_random import secret_bits

STAGES = ("share_keys", "masked_vector", "unmask")


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
    """

    node_id: int
    round: int
    modulus: int
    vector: np.ndarray
    sk1: bytes = b""
    pk1: bytes = b""
    sk2: bytes = b""
    pk2: bytes = b""
    seed: bytes = b""
    threshold: int = 0
    stage: str = "setup"
    public_keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    seed_shares: dict[int, bytes] = field(default_factory=dict)
    key_shares: dict[int, bytes] = field(default_factory=dict)
    sources: list[int] = field(default_factory=list)

    @classmethod
    def setup(cls, node_id: int, round: int, modulus: int, vector: np.ndarray) -> SecAggClient:
        """Stage 0: fresh key pairs for this round."""
        client = cls(int(node_id), int(round), int(modulus), np.asarray(vector, dtype=np.int64))
        sk1, pk1 = generate_key_pairs()
        sk2, pk2 = generate_key_pairs()
        client.sk1, client.pk1 = private_key_to_bytes(sk1), public_key_to_bytes(pk1)
        client.sk2, client.pk2 = private_key_to_bytes(sk2), public_key_to_bytes(pk2)
        return client

    def _expect(self, stage: str, round: int) -> None:
        order = ("setup",) + STAGES
        if int(round) != self.round or self.stage != order[order.index(stage) - 1]:
            raise SecAggError(
                f"node {self.node_id}: stage {stage!r} of round {round} arrived after stage "
                f"{self.stage!r} of round {self.round}; refusing it."
            )
        self.stage = stage

    def share_keys(
        self, round: int, public_keys: dict[int, tuple[bytes, bytes]], threshold: int
    ) -> tuple[list[int], list[bytes], bytes]:
        r"""Stage 1: shares of the mask seed and of the first secret key, encrypted for each neighbour.

        Returns:
            ``(destinations, ciphertexts, commitment to the seed)``.
        """
        self._expect("share_keys", round)
        if public_keys.get(self.node_id) != (self.pk1, self.pk2):
            raise SecAggError(f"node {self.node_id}: the server did not relay this node's own public keys.")
        flat = [k for pair in public_keys.values() for k in pair]
        if len(set(flat)) != len(flat):
            raise SecAggError(f"node {self.node_id}: two neighbours have the same public key.")
        threshold = int(threshold)
        if not 2 <= threshold <= len(public_keys):
            raise SecAggError(f"node {self.node_id}: threshold {threshold} with {len(public_keys)} neighbours.")
        self.public_keys, self.threshold = dict(public_keys), threshold
        self.seed = os.urandom(32)
        ids = sorted(public_keys)
        seed_shares = create_shares(self.seed, threshold, len(ids))
        key_shares = create_shares(self.sk1, threshold, len(ids))
        dests, cts = [], []
        for nid, b_share, sk_share in zip(ids, seed_shares, key_shares, strict=True):
            if nid == self.node_id:
                self.seed_shares[nid], self.key_shares[nid] = b_share, sk_share
                continue
            key = generate_shared_key(bytes_to_private_key(self.sk2), bytes_to_public_key(public_keys[nid][1]))
            dests.append(nid)
            cts.append(encrypt(key, share_keys_plaintext_concat(self.node_id, nid, b_share, sk_share)))
        return dests, cts, commitment(self.seed)

    def masked_vector(self, round: int, sources: list[int], ciphertexts: list[bytes]) -> np.ndarray:
        """Stage 2: store the shares addressed to this node; the vector masked with ``b`` and the pairwise masks."""
        self._expect("masked_vector", round)
        if len(sources) != len(ciphertexts) or len(set(sources)) != len(sources):
            raise SecAggError(f"node {self.node_id}: malformed list of encrypted shares.")
        if len(sources) + 1 < self.threshold:
            raise SecAggError(
                f"node {self.node_id}: {len(sources)} neighbours left, below the threshold {self.threshold}."
            )
        for src, ct in zip(sources, ciphertexts, strict=True):
            if src not in self.public_keys or src == self.node_id:
                raise SecAggError(f"node {self.node_id}: a share from {src}, not a neighbour.")
            key = generate_shared_key(bytes_to_private_key(self.sk2), bytes_to_public_key(self.public_keys[src][1]))
            actual, dst, b_share, sk_share = share_keys_plaintext_separate(decrypt(key, ct))
            if (actual, dst) != (src, self.node_id):
                raise SecAggError(f"node {self.node_id}: a share claiming {actual} -> {dst} arrived as {src}.")
            self.seed_shares[src], self.key_shares[src] = b_share, sk_share
        self.sources = list(sources)
        m, d = self.modulus, len(self.vector)
        out = np.remainder(self.vector, m) + mask(self.seed, "self", self.round, d, m)
        for src in sources:
            pairwise = mask(_pairwise_seed(self.sk1, self.public_keys[src][0]), "pair", self.round, d, m)
            out = out + _sign(self.node_id, src) * pairwise
        return np.remainder(out, m)

    def unmask(self, round: int, active: list[int], dead: list[int]) -> tuple[list[int], list[bytes]]:
        """Stage 3: shares of the survivors' seeds and of the dropped nodes' keys — never both for one node."""
        self._expect("unmask", round)
        active, dead = [int(n) for n in active], [int(n) for n in dead]
        if set(active) & set(dead) or len(set(active)) != len(active) or len(set(dead)) != len(dead):
            raise SecAggError(f"node {self.node_id}: a node is both alive and dropped in the unmask request.")
        if self.node_id not in active or len(active) < self.threshold:
            raise SecAggError(f"node {self.node_id}: {len(active)} survivors, below the threshold {self.threshold}.")
        known = set(self.sources) | {self.node_id}
        if not set(active) <= known or not set(dead) <= known:
            raise SecAggError(f"node {self.node_id}: asked to unmask nodes it holds no share of.")
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
            "stage": self.stage,
            "vector": self.vector.astype("<i8").tobytes(),
            "sk1": self.sk1,
            "pk1": self.pk1,
            "sk2": self.sk2,
            "pk2": self.pk2,
            "seed": self.seed,
            "threshold": self.threshold,
            "keys-ids": ids,
            "keys-1": [self.public_keys[i][0] for i in ids],
            "keys-2": [self.public_keys[i][1] for i in ids],
            "shares-ids": sorted(self.seed_shares),
            "seed-shares": [self.seed_shares[i] for i in sorted(self.seed_shares)],
            "key-shares": [self.key_shares[i] for i in sorted(self.seed_shares)],
            "sources": list(self.sources),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> SecAggClient:
        c = cls(
            int(state["node-id"]),
            int(state["round"]),
            int(state["modulus"]),
            np.frombuffer(state["vector"], dtype="<i8").astype(np.int64),
        )
        c.sk1, c.pk1, c.sk2, c.pk2, c.seed = state["sk1"], state["pk1"], state["sk2"], state["pk2"], state["seed"]
        c.threshold, c.stage = int(state["threshold"]), str(state["stage"])
        c.public_keys = {
            int(i): (a, b) for i, a, b in zip(state["keys-ids"], state["keys-1"], state["keys-2"], strict=True)
        }
        ids = [int(i) for i in state["shares-ids"]]
        c.seed_shares = dict(zip(ids, state["seed-shares"], strict=True))
        c.key_shares = dict(zip(ids, state["key-shares"], strict=True))
        c.sources = [int(i) for i in state["sources"]]
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
    ) -> None:
        self.round, self.dim, self.modulus = int(round), int(dim), int(modulus)
        self.public_keys = dict(cohort)
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
    def unmask_requests(self) -> dict[int, tuple[list[int], list[int]]]:
        """For each survivor: ``(surviving, dropped)`` neighbours it holds shares of."""
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
        requests = self.unmask_requests()
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


def default_threshold(num_shares: int, num_agents: int, min_survivors: int) -> int:
    r"""The Shamir threshold ``t``: with every pair (``k ≥ N``), ``t = k_min``, so any ``k_min`` survivors
    can unmask and ``t − 1`` nodes colluding with the server learn no node's secret; with a ring of
    ``k < N`` (SecAgg+), a majority of the ring, ``⌊k/2⌋ + 1`` (a neighbourhood that loses more
    cannot unmask, and the round fails)."""
    k = int(num_shares)
    if k >= int(num_agents):
        return max(2, int(min_survivors))
    return max(2, k // 2 + 1)


__all__ = ["STAGES", "SecAggClient", "SecAggError", "SecAggServer", "commitment", "default_threshold", "mask"]
