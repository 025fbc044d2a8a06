r"""The ServerApp: the DP-FTS-DE server of one federation over Flower's Grid.

It holds the sub-region partition, the region weights, the
:class:`~fbo_torch.federation.DPAggregator` and the privacy ledger (in a
:class:`~fbo_torch.flower.coordinator.Coordinator`; our accountants are the
source of truth for ε — Flower's DP wrappers clip model updates for FedAvg and
do not describe DP-FTS-DE's release). It never sees an agent's data or models:
only the ``ω`` vectors agents send and their metrics. Around the coordinator it
adds the network's part: which node plays which agent
(:class:`~fbo_torch.flower.roster.NodeBinding`), pushing and pulling messages
so that no reply can stop it (:class:`Transport`), and its server-side
configuration, read from the environment it inherits from the SuperLink:
``FBO_SERVER_STATE`` (:mod:`~fbo_torch.flower.server_state`), ``FBO_AGENT_ROSTER``
and ``FBO_REQUIRE_ROSTER`` (:mod:`~fbo_torch.flower.roster`).

With ``aggregation = "secure"`` each round's vectors go through SecAgg+
(:func:`run_secure_round`, :mod:`fbo_torch.flower.secagg`): the ServerApp
then receives public keys, encrypted shares it cannot read, masked vectors
that are uniform whatever the agents' ``ω``, and the shares that remove the
masks from the sum — never an ``ω``.

Run it the Flower way: ``serverapp = "fbo_torch.flower.server_app:app"`` in the
app's ``pyproject.toml``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecordValues, Context, Message, RecordDict
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from fbo_torch.flower.agent_node import REFUSALS
from fbo_torch.flower.config import FlowerRunConfig, allowed_objectives
from fbo_torch.flower.coordinator import Coordinator, RoundPlan
from fbo_torch.flower.records import (
    SECAGG,
    masked_from_bytes,
    parse_secagg,
    payload_bytes,
    plan_to_records,
    records_to_reply,
    reply_agent_id,
    reply_public_keys,
    secagg_cohort_record,
    secagg_request,
)
from fbo_torch.flower.roster import REQUIRE_ROSTER_ENV, ROSTER_ENV, AgentRoster, NodeBinding
from fbo_torch.flower.secagg import SecAggError, SecAggServer
from fbo_torch.flower.server_state import STATE_ENV, ServerState
from fbo_torch.report.flower import flower_html
from fbo_torch.utils.files import write_atomic

app = ServerApp()

#: Seconds between two pulls of replies (``Grid.send_and_receive`` waits 3 s).
POLL_INTERVAL = 0.2


def _info(text: str) -> None:
    log(INFO, "%s", text)


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


def run_federation(
    grid: Grid,
    config: FlowerRunConfig,
    echo: Callable[[str], None] = _info,
    poll_interval: float = POLL_INTERVAL,
    state: ServerState | None = None,
    secret: bytes | None = None,
    roster: AgentRoster | None = None,
) -> Coordinator:
    r"""Run ``config.num_rounds`` rounds with the agents on ``grid``; returns the coordinator (its logs).

    Args:
        grid: Flower's ``Grid`` the agents' nodes are reached through.
        config: The run config.
        echo: Where the server's log lines go.
        poll_interval: Seconds between two looks for replies.
        state: The server's state folder (secret, ledger, rounds; see
            :mod:`fbo_torch.flower.server_state`), written before every
            exchange; ``None`` keeps everything in memory.
        secret: The server's secret (default: the state's, or a fresh one).
        roster: Agents bound to node keys (:mod:`fbo_torch.flower.roster`); without one,
            a node plays the agent it first claims (insecure: any node can claim any agent).

    Returns:
        The :class:`~fbo_torch.flower.coordinator.Coordinator` of the run (its logs).

    Replies that do not arrive within ``round-timeout`` seconds, error replies,
    refused agents and invalid replies are left out of the round's release
    (see :mod:`fbo_torch.flower.coordinator` for why the accounting stays
    valid); no reply can stop the server.
    """
    config.check_objective(allowed_objectives())  # the server's own allow-list, before any of its code is imported
    check_summary_path(config.summary_path)  # on the server's disk: refused before anything runs, not at the end
    objective = config.build_objective()  # only its domain (bounds, dimension) is used here
    coord = Coordinator(config, objective.bounds, objective.dim, secret=secret, state=state)
    try:
        _run(grid, config, coord, echo, poll_interval, roster)
    finally:
        coord.close()
    if config.summary_path:
        record = summary(coord)
        write_atomic(config.summary_path, json.dumps(record, indent=1).encode())
        write_atomic(report_path(config.summary_path), flower_html(record).encode())
    return coord


def _run(
    grid: Grid,
    config: FlowerRunConfig,
    coord: Coordinator,
    echo: Callable[[str], None],
    poll_interval: float,
    roster: AgentRoster | None,
) -> None:
    nodes = wait_for_nodes(grid, config.num_agents, config.min_nodes_timeout)
    if len(nodes) < config.num_agents:
        log(WARNING, "only %d of %d nodes connected; running with them", len(nodes), config.num_agents)
    binding = NodeBinding(roster, config.num_agents)
    transport = Transport(grid, poll_interval)
    s = coord.settings
    resumed = f"; resumed at round {coord.round} (epsilon {coord.epsilon:.4g})" if coord.resumed else ""
    echo(
        f"federation: {config.method}, N={config.num_agents}, T={s.num_iterations}, q={s.sample_rate}, "
        f"z={s.noise_multiplier}, S={s.clip_norm}, P={s.num_regions}; feature map {coord.fingerprint}{resumed}"
    )
    if not s.is_private and s.method.federated():
        echo(
            "the releases are not private (noise-multiplier = 0): every agent's clipped omega enters the broadcast "
            "without noise; set noise-multiplier (and clip-norm) for differential privacy"
        )
    if roster is None:
        echo(
            "no agent roster: an agent is whichever node first claims its partition-id; deploy with TLS, "
            f"SuperNode authentication and {ROSTER_ENV} to bind agents to node keys"
        )
    while not coord.done:
        plan = coord.plan()  # written to the state folder before it is sent
        targets, strangers = binding.nodes(grid)
        for nid in strangers:
            coord.refused_nodes[nid] = "its key is not on the agent roster"
            echo(f"round {plan.round}: node {nid}: its key is not on the agent roster; never contacted")
        messages = [
            Message(
                _plan_content(plan, binding.agent_of.get(nid)),
                dst_node_id=nid,
                message_type="train",
                group_id=str(plan.round),
            )
            for nid in targets
            if nid not in coord.refused_nodes and binding.agent_of.get(nid) not in coord.refused
        ]
        # a secure round's cohort: the nodes already bound to an agent, sent that agent's own coin
        cohort = {m.metadata.dst_node_id for m in messages if SECAGG in m.content.config_records}
        replies, unreadable = transport.exchange(messages, config.round_timeout)
        keys: dict[int, tuple[bytes, bytes, bytes]] = {}  # node -> signed public keys, of the cohort's valid replies
        for nid, why in unreadable:
            coord.reject(binding.agent_of.get(nid))
            echo(
                f"round {plan.round}: node {nid} (agent {binding.agent_of.get(nid, '?')}): unreadable reply left "
                f"out ({why})"
            )
        for nid, rep in sorted(replies, key=lambda r: r[0]):  # an order independent of arrival
            try:
                agent = _take_reply(coord, rep, nid, plan, binding, echo)
                if nid in cohort and agent is not None and agent not in coord.refused:  # sent a coin: keys due
                    keys[nid] = reply_public_keys(rep.content, agent)
            except Exception as err:
                coord.reject(binding.agent_of.get(nid))
                echo(
                    f"round {plan.round}: node {nid} (agent {binding.agent_of.get(nid, '?')}): invalid reply "
                    f"left out ({type(err).__name__}: {str(err)[:300]})"
                )
        if coord.secure and plan.omega_round:
            run_secure_round(transport, coord, plan, keys, binding, config, echo)
        if plan.round >= 1 and coord.logs and coord.logs[-1].round == plan.round:
            rec = coord.logs[-1]
            eps = "n/a" if math.isnan(rec.epsilon) else f"{rec.epsilon:.4f}"
            best = " ".join(f"{n}:{v:.4f}" for n, v in sorted(rec.best_values.items()))
            why = f" ({rec.reason})" if rec.reason and not rec.released else ""
            if coord.secure:
                eps += "" if math.isnan(rec.epsilon_server) else f" epsilon_server={rec.epsilon_server:.4f}"
                eps += f" epsilon_malicious={rec.epsilon_malicious:.4f}"
            echo(
                f"round {rec.round}: released={rec.released}{why} reported={rec.num_reported}/{config.num_agents} "
                f"invalid={rec.num_invalid} epsilon={eps} replies={len(replies)}/{len(messages)} best[{best}]"
            )
    coord.finish()


def _plan_content(plan: RoundPlan, agent: int | None) -> RecordDict:
    """The exchange's records for one node: the plan, and in a secure round that agent's own coin and ratios."""
    content = plan_to_records(plan)
    cohort = None if agent is None else plan.cohort_of(agent)
    if cohort is not None:
        content[SECAGG] = secagg_cohort_record(*cohort)
    return content


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
        replies = stage(
            "share_keys",
            {
                nid: {
                    "node-ids": list(ks),
                    "agent-ids": [server.agents[j] for j in ks],
                    "pk1": [ks[j][0] for j in ks],
                    "pk2": [ks[j][1] for j in ks],
                    "signatures": [server.signatures[j] for j in ks],
                    "threshold": server.threshold,
                }
                for nid, ks in requests.items()
            },
        )
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


def _take_reply(
    coord: Coordinator, rep: Message, nid: int, plan: RoundPlan, binding: NodeBinding, echo: Callable[[str], None]
) -> int | None:
    """Hand one reply to the coordinator (returns its agent, or ``None``); raises for a reply it cannot use."""
    if rep.has_error():
        reason = (rep.error.reason or "").strip()
        agent = binding.agent_of.get(nid)
        who = f"round {plan.round}: node {nid} (agent {'?' if agent is None else agent})"
        if any(name in reason for name in REFUSALS):  # refused for good: another feature map or domain
            coord.refused_nodes[nid] = reason.splitlines()[-1][-500:]
            echo(f"{who} failed and is refused for good: {coord.refused_nodes[nid]}")
            if agent is not None:
                coord.refuse(agent, coord.refused_nodes[nid])
            return None
        echo(f"{who} failed: {reason[-300:]}")
        return None
    claimed = reply_agent_id(rep.content)
    agent = binding.agent(nid, claimed)
    if agent is None:
        echo(
            f"round {plan.round}: node {nid} claims agent {claimed}, played by node {binding.node_of.get(claimed)}; "
            "ignored (each SuperNode needs its own partition-id)"
        )
        return None
    _, fingerprint, omega, best, n_obs = records_to_reply(rep.content)  # a bad reply counts against its agent
    coord.receive(agent, fingerprint, omega, best, n_obs)
    return agent


def check_summary_path(path: str) -> None:
    """Refuse a run config ``summary-path`` whose folder does not exist (or is not a writable folder) on the
    server, before the run starts rather than after its last round."""
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(
            f"run config `summary-path` = {path!r}: its folder {folder} does not exist on the server or is not "
            'writable; create it, or give another path ("": no summary file).'
        )


def report_path(summary_path: str) -> str:
    """Where the federation report (:func:`~fbo_torch.report.flower.flower_html`) of a run with ``summary-path``
    goes: beside the summary, with the suffix ``.html``."""
    return str(Path(summary_path).with_suffix(".html"))


def summary(coord: Coordinator) -> dict[str, Any]:
    """The run's record as JSON-able data."""
    return {
        "method": coord.config.method,
        "num_agents": coord.config.num_agents,
        "privacy": {"accountant": coord.ledger.mechanism if coord.ledger else None, "delta": coord.config.ledger_delta},
        "fingerprint": coord.fingerprint,
        "refused_agents": {str(k): v for k, v in coord.refused.items()},
        "refused_nodes": {str(k): v for k, v in coord.refused_nodes.items()},
        "invalid_replies": {str(k): v for k, v in sorted(coord.invalid.items())},
        "rounds": [r.to_dict() for r in coord.logs],
    }


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The ServerApp: the run config's federation on ``grid`` (roster and state folder from the environment)."""
    config = FlowerRunConfig.from_run_config(context.run_config)
    roster = AgentRoster.from_env(config.num_agents)
    if roster is None and os.environ.get(REQUIRE_ROSTER_ENV, "").strip() not in ("", "0"):
        raise RuntimeError(
            f"{REQUIRE_ROSTER_ENV} is set but {ROSTER_ENV} names no agent roster: refusing to run "
            "without binding agents to node keys."
        )
    state = ServerState.for_federation(config.fingerprint())
    log(INFO, "server state (secret, ledger, rounds): %s", state.folder)
    if not os.environ.get(STATE_ENV, "").strip():
        for line in other_federations(state):
            log(WARNING, "%s", line)
    run_federation(grid, config, state=state, roster=roster)


def other_federations(state: ServerState) -> list[str]:
    """Warnings about the other federations this server's default folder holds (their ε add up if they
    involved the same agents: each federation is accounted on its own)."""
    root = ServerState.default_root()
    out = []
    for folder in sorted(p for p in root.glob("*") if p.is_dir() and p != state.folder):
        try:
            saved = json.loads((folder / "server.json").read_text())
        except (OSError, ValueError):
            continue
        out.append(
            f"this server also ran federation {folder.name} (epsilon {saved.get('epsilon')}, "
            f"{'finished' if saved.get('finished') else 'unfinished'}): each federation has its own ledger; "
            "if both involve the same agents, their privacy losses add up"
        )
    return out
