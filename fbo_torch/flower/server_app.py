r"""The ServerApp: the DP-FTS-DE server of one federation over Flower's Grid.

It holds the sub-region partition, the region weights, the
:class:`~fbo_torch.federation.DPAggregator` and the privacy ledger (in a
:class:`~fbo_torch.flower.coordinator.Coordinator`; our accountants are the
source of truth for ε — Flower's DP wrappers clip model updates for FedAvg and
do not describe DP-FTS-DE's release). It never sees an agent's data or models:
only the ``ω`` vectors agents send and their metrics.

Run it the Flower way: ``serverapp = "fbo_torch.flower.server_app:app"`` in the
app's ``pyproject.toml``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from logging import INFO, WARNING

from flwr.app import Context, Message
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.flower.coordinator import Coordinator
from fbo_torch.flower.records import plan_to_records, records_to_reply, reply_agent_id
from fbo_torch.flower.roster import ROSTER_ENV, AgentRoster, NodeBinding
from fbo_torch.flower.server_state import ServerState

app = ServerApp()

#: Seconds between two pulls of replies (``Grid.send_and_receive`` waits 3 s).
POLL_INTERVAL = 0.2


def _info(text: str) -> None:
    log(INFO, "%s", text)


def exchange(grid: Grid, messages: list[Message], timeout: float, poll_interval: float = POLL_INTERVAL) -> list[Message]:
    """Push ``messages`` and pull replies until all arrived or ``timeout`` seconds passed."""
    pending = {m for m in grid.push_messages(messages) if m}
    end = time.monotonic() + timeout
    replies: list[Message] = []
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending -= {m.metadata.reply_to_message_id for m in got}
        if not pending or time.monotonic() >= end:
            break
        time.sleep(poll_interval)
    return replies


def wait_for_nodes(grid: Grid, num_nodes: int, timeout: float, poll_interval: float = 0.2) -> list[int]:
    """The connected nodes' ids once ``num_nodes`` are connected (those there are after ``timeout`` s)."""
    end = time.monotonic() + timeout
    while True:
        ids = sorted(grid.get_node_ids())
        if len(ids) >= num_nodes or time.monotonic() >= end:
            return ids
        time.sleep(poll_interval)


def run_federation(grid: Grid, config: FlowerRunConfig, echo: Callable[[str], None] = _info,
                   poll_interval: float = POLL_INTERVAL, state: ServerState | None = None,
                   secret: bytes | None = None, roster: AgentRoster | None = None) -> Coordinator:
    r"""Run ``config.num_rounds`` rounds with the agents on ``grid``; returns the coordinator (its logs).

    Args:
        state: The server's state folder (secret, ledger, rounds; see
            :mod:`fbo_torch.flower.server_state`), written before every
            exchange; ``None`` keeps everything in memory.
        secret: The server's secret (default: the state's, or a fresh one).
        roster: Agents bound to node keys (:mod:`fbo_torch.flower.roster`); without one,
            a node plays the agent it first claims (insecure: any node can claim any agent).

    Replies that do not arrive within ``round-timeout`` seconds, error replies,
    refused agents and invalid replies are left out of the round's release
    (see :mod:`fbo_torch.flower.coordinator` for why the accounting stays
    valid); no reply can stop the server.
    """
    objective = config.build_objective()  # only its domain (bounds, dimension) is used here
    coord = Coordinator(config, objective.bounds, objective.dim, secret=secret, state=state)
    nodes = wait_for_nodes(grid, config.num_agents, config.min_nodes_timeout)
    if len(nodes) < config.num_agents:
        log(WARNING, "only %d of %d nodes connected; running with them", len(nodes), config.num_agents)
    binding = NodeBinding(roster, config.num_agents)
    resumed = f"; resumed at round {coord.round} (epsilon {coord.epsilon:.4g})" if coord.resumed else ""
    echo(f"federation: {config.method}, N={config.num_agents}, T={config.num_rounds}, q={config.sample_rate}, "
         f"z={config.noise_multiplier}, S={config.clip_norm}, P={config.num_regions}; feature map "
         f"{coord.fingerprint}{resumed}")
    if roster is None:
        echo("no agent roster: an agent is whichever node first claims its partition-id; deploy with TLS, "
             f"SuperNode authentication and {ROSTER_ENV} to bind agents to node keys")
    while not coord.done:
        plan = coord.plan()  # written to the state folder before it is sent
        targets, strangers = binding.nodes(grid)
        for nid in strangers:
            coord.refused_nodes[nid] = "its key is not on the agent roster"
            echo(f"round {plan.round}: node {nid}: its key is not on the agent roster; never contacted")
        messages = [Message(plan_to_records(plan), dst_node_id=nid, message_type="train", group_id=str(plan.round))
                    for nid in targets
                    if nid not in coord.refused_nodes and binding.agent_of.get(nid) not in coord.refused]
        replies = exchange(grid, messages, config.round_timeout, poll_interval)
        for rep in sorted(replies, key=lambda m: m.metadata.src_node_id):  # an order independent of arrival
            nid = rep.metadata.src_node_id
            try:
                _take_reply(coord, rep, nid, plan, binding, echo)
            except Exception as err:  # noqa: BLE001 - a reply harms only its sender, never the server
                coord.reject(binding.agent_of.get(nid))
                echo(f"round {plan.round}: node {nid} (agent {binding.agent_of.get(nid, '?')}): invalid reply "
                     f"left out ({type(err).__name__}: {str(err)[:300]})")
        if plan.round >= 1 and coord.logs and coord.logs[-1].round == plan.round:
            rec = coord.logs[-1]
            eps = "n/a" if math.isnan(rec.epsilon) else f"{rec.epsilon:.4f}"
            best = " ".join(f"{n}:{v:.4f}" for n, v in sorted(rec.best_values.items()))
            why = f" ({rec.reason})" if rec.reason and not rec.released else ""
            echo(f"round {rec.round}: released={rec.released}{why} reported={rec.num_reported}/{config.num_agents} "
                 f"invalid={rec.num_invalid} epsilon={eps} replies={len(replies)}/{len(messages)} best[{best}]")
    coord.finish()
    if config.summary_path:
        with open(config.summary_path, "w") as fh:
            json.dump(summary(coord), fh, indent=1)
    return coord


def _take_reply(coord: Coordinator, rep: Message, nid: int, plan, binding: NodeBinding,
                echo: Callable[[str], None]) -> None:
    """Hand one reply to the coordinator; raises for a reply it cannot use."""
    if rep.has_error():
        reason = rep.error.reason or ""
        agent = binding.agent_of.get(nid)
        echo(f"round {plan.round}: node {nid} (agent {'?' if agent is None else agent}) failed: "
             f"{reason.strip()[-300:]}")
        if "FeatureMapMismatch" in reason:  # refused for good: its vectors mean other functions
            coord.refused_nodes[nid] = reason.strip().splitlines()[-1]
            if agent is not None:
                coord.refuse(agent, coord.refused_nodes[nid])
        return
    claimed = reply_agent_id(rep.content)
    agent = binding.agent(nid, claimed)
    if agent is None:
        echo(f"round {plan.round}: node {nid} claims agent {claimed}, played by node {binding.node_of.get(claimed)}; "
             "ignored (each SuperNode needs its own partition-id)")
        return
    _, fingerprint, omega, best, n_obs = records_to_reply(rep.content)  # a bad reply counts against its agent
    coord.receive(agent, fingerprint, omega, best, n_obs)


def summary(coord: Coordinator) -> dict:
    """The run's record as JSON-able data."""
    return {
        "fingerprint": coord.fingerprint,
        "refused_agents": {str(k): v for k, v in coord.refused.items()},
        "refused_nodes": {str(k): v for k, v in coord.refused_nodes.items()},
        "invalid_replies": {str(k): v for k, v in sorted(coord.invalid.items())},
        "rounds": [r.to_dict() for r in coord.logs],
    }


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = FlowerRunConfig.from_run_config(context.run_config)
    state = ServerState.for_federation(config.fingerprint())
    log(INFO, "server state (secret, ledger, rounds): %s", state.folder)
    run_federation(grid, config, state=state, roster=AgentRoster.from_env(config.num_agents))


