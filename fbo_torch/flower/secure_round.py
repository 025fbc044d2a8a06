r"""A secure round over Flower: SecAgg+ with the nodes of one exchange, for a release whose server sees only a sum.

When the settings' release mechanism does not let the server see an agent's
``ω`` (``aggregation = "secure"``, :mod:`fbo_torch.federation.release`), the
exchange that asks for round ``t``'s vectors carries each agent's coin and
weight ratios and brings back its signed public keys; :func:`run_secure_round`
then runs SecAgg+ (:mod:`fbo_torch.flower.secagg`) with those nodes, before
the next exchange. The ServerApp receives public keys, encrypted shares it
cannot read, masked vectors that are uniform whatever the agents' ``ω``, and
the shares that remove the masks from the sum — never an ``ω``. The
coordinator charges the round (:meth:`~fbo_torch.flower.coordinator.Coordinator.commit_secure`)
before the sum is unmasked and keeps the decoded release
(:meth:`~fbo_torch.flower.coordinator.Coordinator.reveal_secure`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecordValues, Message

from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.flower.coordinator import Coordinator, RoundPlan
from fbo_torch.flower.records import payload_bytes
from fbo_torch.flower.roster import NodeBinding
from fbo_torch.flower.secagg import SecAggError, SecAggServer
from fbo_torch.flower.secagg_records import masked_from_bytes, parse_secagg, secagg_request
from fbo_torch.flower.transport import Transport


def run_secure_round(
    transport: Transport,
    coord: Coordinator,
    plan: RoundPlan,
    keys: dict[int, tuple[bytes, bytes, bytes]],
    binding: NodeBinding,
    config: FlowerRunConfig,
    echo: Callable[[str], None],
) -> None:
    r"""SecAgg+ over the nodes that replied to the exchange with their signed public keys, for round
    ``plan.omega_round``: share keys, masked vectors, commit (the ledgers are charged and written down
    here), consistency, unmask; the decoded release is kept for the next exchange. A node whose message is
    malformed, or that does not reply in time, is dropped from the round like a dropout (and counted
    invalid when malformed); the round releases only with ``min_survivors`` vectors in the sum."""
    mech = coord.mechanism
    if mech is None:
        raise RuntimeError("run_secure_round() needs a coordinator that aggregates securely.")
    t, started = plan.omega_round, time.monotonic()
    stats: dict[str, float] = {"bytes_sent": 0, "bytes_received": 0, "cohort": len(keys)}
    agent_of = binding.agent_of

    def stage(name: str, requests: dict[int, dict[str, ConfigRecordValues]]) -> dict[int, dict[str, Any]]:
        messages = [
            Message(
                secagg_request(t, **payload), dst_node_id=nid, message_type=f"train.{name}", group_id=str(plan.round)
            )
            for nid, payload in requests.items()
        ]
        stats["bytes_sent"] += sum(payload_bytes(m.content) for m in messages)
        replies, unreadable = transport.exchange(messages, config.round_timeout)
        out: dict[int, dict[str, Any]] = {}
        for nid, rep in replies:
            if rep.has_error():
                echo(
                    f"round {t} secagg {name}: node {nid} (agent {agent_of.get(nid, '?')}) failed: "
                    f"{(rep.error.reason or '').strip()[-200:]}"
                )
                continue
            stats["bytes_received"] += payload_bytes(rep.content)
            try:
                out[nid] = parse_secagg(f"{name}-reply", rep.content)
            except ValueError as err:
                coord.reject(agent_of.get(nid))
                echo(f"round {t} secagg {name}: node {nid} (agent {agent_of.get(nid, '?')}): {err}")
        for nid, why in unreadable:
            coord.reject(agent_of.get(nid))
            echo(f"round {t} secagg {name}: node {nid}: unreadable reply ({why})")
        return out

    def dropped(why: dict[int, str], name: str) -> None:
        for nid, reason in sorted(why.items()):
            if not reason.startswith("no "):  # it replied, with what the protocol does not allow
                coord.reject(agent_of.get(nid))
            echo(f"round {t} secagg {name}: node {nid} (agent {agent_of.get(nid, '?')}) dropped: {reason}")

    def enough(name: str) -> bool:
        if len(server.alive) >= mech.min_survivors:
            return True
        echo(
            f"round {t} secagg {name}: {len(server.alive)} nodes left, fewer than min_survivors = "
            f"{mech.min_survivors}: the round releases nothing and costs nothing"
        )
        return False

    num_shares, threshold = config.secagg_neighbours, config.secure_threshold()
    try:
        if len(keys) < mech.min_survivors:
            echo(
                f"round {t} secagg: {len(keys)} nodes replied with keys, fewer than min_survivors = "
                f"{mech.min_survivors}: the round releases nothing and costs nothing"
            )
            return
        server = SecAggServer(
            t,
            {nid: (pk1, pk2) for nid, (pk1, pk2, _) in keys.items()},
            mech.dim,
            mech.modulus,
            num_shares,
            threshold,
            agents={nid: agent_of[nid] for nid in keys},
            signatures={nid: sig for nid, (_, _, sig) in keys.items()},
        )
        requests, why = server.share_keys_requests()
        dropped(why, "share_keys")
        replies = stage("share_keys", {nid: server.share_keys_content(nid) for nid in requests})
        dropped(
            server.receive_shares(
                {nid: (r["destinations"], r["ciphertexts"], r["commitment"]) for nid, r in replies.items()}
            ),
            "share_keys",
        )
        if not enough("share_keys"):
            return
        masked_requests = server.masked_vector_requests()
        replies = stage(
            "masked_vector",
            {nid: {"sources": src, "ciphertexts": cts} for nid, (src, cts) in masked_requests.items()},
        )
        vectors: dict[int, np.ndarray] = {}
        for nid, r in replies.items():
            try:
                vectors[nid] = masked_from_bytes(r["masked"], mech.dim)
            except ValueError as err:
                coord.reject(agent_of.get(nid))
                echo(f"round {t} secagg masked_vector: node {nid}: {err}")
        dropped(server.receive_masked(vectors), "masked_vector")
        if not coord.commit_secure([agent_of[nid] for nid in server.survivors]):
            echo(
                f"round {t} secagg: {len(server.survivors)} vectors, fewer than min_survivors = "
                f"{mech.min_survivors}: the round releases nothing and costs nothing"
            )
            return
        replies = stage("consistency", {nid: {"survivors": s} for nid, s in server.consistency_requests().items()})
        for nid, reason in sorted(server.receive_consistency({n: r["signature"] for n, r in replies.items()}).items()):
            if not reason.startswith("no "):
                coord.reject(agent_of.get(nid))
            echo(f"round {t} secagg consistency: node {nid} (agent {agent_of.get(nid, '?')}) reveals nothing: {reason}")
        replies = stage(
            "unmask",
            {
                nid: {
                    "signers": list(signed),
                    "signer-agents": [a for a, _ in signed.values()],
                    "signatures": [sig for _, sig in signed.values()],
                }
                for nid, signed in server.unmask_requests().items()
            },
        )
        total = None
        try:
            total = server.unmask({nid: (r["node-ids"], r["shares"]) for nid, r in replies.items()})
        except SecAggError as err:
            echo(f"round {t} secagg unmask failed ({err}): nothing is released; the round stays charged")
        stats["seconds"] = time.monotonic() - started
        coord.reveal_secure(None if total is None else torch.from_numpy(total), stats)
    finally:
        stats.setdefault("seconds", time.monotonic() - started)
        coord.note_secagg(stats)


__all__ = ["run_secure_round"]
