r"""The ServerApp's loop: the federation's exchanges with the agents' nodes, round by round.

:func:`run_federation` is the whole run on Flower's ``Grid``. It holds the
:class:`~fbo_torch.flower.coordinator.Coordinator` (the DP-FTS-DE server, its
release mechanism and ledger; our accountants are the source of truth for ε —
Flower's DP wrappers clip model updates for FedAvg and do not describe
DP-FTS-DE's release) and adds the network's part: which node plays which agent
(:class:`~fbo_torch.flower.roster.NodeBinding`), pushing and pulling messages
so that no reply can stop it (:class:`~fbo_torch.flower.transport.Transport`),
and, for a release whose server sees only a sum, the SecAgg+ round of each
exchange (:func:`~fbo_torch.flower.secure_round.run_secure_round`). It never
sees an agent's data or models: only the ``ω`` vectors agents send (or their
secure sum) and their metrics.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import Message, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from fbo_torch.flower.agent_node import REFUSALS
from fbo_torch.flower.config import FlowerRunConfig, allowed_objectives
from fbo_torch.flower.coordinator import Coordinator, RoundPlan
from fbo_torch.flower.records import (
    plan_to_records,
    records_to_reply,
    reply_agent_id,
    reply_public_keys,
    secagg_cohort_record,
)
from fbo_torch.flower.roster import ROSTER_ENV, AgentRoster, NodeBinding
from fbo_torch.flower.secagg_records import SECAGG
from fbo_torch.flower.secure_round import run_secure_round
from fbo_torch.flower.server_state import ServerState
from fbo_torch.flower.transport import POLL_INTERVAL, Transport, wait_for_nodes
from fbo_torch.report.flower import flower_html
from fbo_torch.utils.files import write_atomic


def _info(text: str) -> None:
    log(INFO, "%s", text)


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
        run_rounds(grid, config, coord, echo, poll_interval, roster)
    finally:
        coord.close()
    if config.summary_path:
        record = summary(coord)
        write_atomic(config.summary_path, json.dumps(record, indent=1).encode())
        write_atomic(report_path(config.summary_path), flower_html(record).encode())
    return coord


def run_rounds(
    grid: Grid,
    config: FlowerRunConfig,
    coord: Coordinator,
    echo: Callable[[str], None],
    poll_interval: float,
    roster: AgentRoster | None,
) -> None:
    r"""The exchanges of a run, from the first to the last (see :func:`run_federation`): each plans the round,
    sends the plan to every node bound to an agent, hands the replies to the coordinator and, for a release whose
    server sees only a sum, runs that round's SecAgg+.

    Args:
        grid: Flower's ``Grid``.
        config: The run config.
        coord: The run's coordinator.
        echo: Where the server's log lines go.
        poll_interval: Seconds between two looks for replies.
        roster: Agents bound to node keys, or ``None``.
    """
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
                plan_content(plan, binding.agent_of.get(nid)),
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
                agent = take_reply(coord, rep, nid, plan, binding, echo)
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


def plan_content(plan: RoundPlan, agent: int | None) -> RecordDict:
    """The exchange's records for one node: the plan, and in a secure round that agent's own coin and ratios."""
    content = plan_to_records(plan)
    cohort = None if agent is None else plan.cohort_of(agent)
    if cohort is not None:
        content[SECAGG] = secagg_cohort_record(*cohort)
    return content


def take_reply(
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


__all__ = ["check_summary_path", "plan_content", "report_path", "run_federation", "run_rounds", "summary", "take_reply"]
