r"""The ClientApp's round: the server's plan in, the agent's step, its reply out.

:func:`handle_round` answers a round's message (type ``"train"``) of
:mod:`~fbo_torch.flower.client_app`, which imports this module on the first such message of
its process: the SecAgg+ stages that follow in their own processes never import it, nor torch,
BoTorch, GPyTorch or Opacus with it. What the handler checks and in which order — the
objective allowed by the node, the node's privacy floor, the feature map, the round claimed once
in the node state before anything is computed (:class:`ReplayRefused`) — is described in
:mod:`~fbo_torch.flower.client_app`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from flwr.app import ConfigRecord, ConfigRecordValues, Context, Message

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.federation.release import get_release
from fbo_torch.federation.secure import SecureMechanism
from fbo_torch.flower.agent_node import FeatureMapMismatch, LiveNodes
from fbo_torch.flower.config import FlowerRunConfig, allowed_objectives
from fbo_torch.flower.floor import PrivacyFloor
from fbo_torch.flower.identity import NodeIdentity
from fbo_torch.flower.records import (
    AGENT_STATE,
    record_to_state,
    records_to_plan,
    records_to_secagg_cohort,
    reply_to_records,
    state_to_record,
)
from fbo_torch.flower.secagg import SecAggClient
from fbo_torch.flower.secagg_records import AGENT_SECRET, ANSWERED, SECAGG, SECAGG_STATE
from fbo_torch.utils.secure_random import check_secret, new_secret

#: The agents this process plays, kept between messages (a node starts once per run).
live_nodes = LiveNodes()


def agent_id_of(context: Context) -> int:
    """The agent a node plays: its ``partition-id`` node config."""
    if "partition-id" not in context.node_config:
        raise ValueError("this SuperNode has no `partition-id` in its node config (--node-config partition-id=n).")
    return int(context.node_config["partition-id"])


class ReplayRefused(ValueError):
    """The server asked this node again for a round it already answered (or for one past the run's end)."""


#: Run configs (and floors) this process has checked against its node's floor: the check computes ε.
_floors_checked: set[str] = set()


def check_floor(config: FlowerRunConfig, node_config: Mapping[str, Any], agent_id: int) -> PrivacyFloor:
    r"""The node's :class:`~fbo_torch.flower.floor.PrivacyFloor`, after refusing ``config`` if it is below it
    (:class:`~fbo_torch.flower.floor.PrivacyFloorError`)."""
    floor = PrivacyFloor.from_node_config(node_config)
    key = json.dumps([config.to_run_config(), dataclasses.asdict(floor), int(agent_id)], sort_keys=True)
    if key not in _floors_checked:
        floor.check(config, agent_id)
        _floors_checked.add(key)
    return floor


def claim_round(context: Context, agent_id: int, omega_round: int, num_rounds: int) -> None:
    r"""Record in the node state that this node answers round ``omega_round`` — before it computes
    anything for it; refuse a round it already answered, an earlier one, or one past ``num_rounds``."""
    record = context.state.config_records.get(AGENT_SECRET)
    last = record.get(ANSWERED, 0) if record is not None else 0
    if isinstance(last, bool) or not isinstance(last, int):
        raise ReplayRefused(f"agent {agent_id}: its node state's last answered round is {last!r}, not a round.")
    if not last < omega_round <= num_rounds:
        raise ReplayRefused(
            f"agent {agent_id} refuses to answer round {omega_round}: it answered round {last} last and the run has "
            f"{num_rounds} rounds; a node answers each round once (two answers for one round would differ by its "
            "noise-free vector)."
        )
    fields: dict[str, ConfigRecordValues] = dict(record) if record is not None else {"secret": new_secret()}
    fields[ANSWERED] = int(omega_round)
    context.state[AGENT_SECRET] = ConfigRecord(fields)


def handle_round(msg: Message, context: Context) -> Message:
    r"""Take the round the server's message opens and reply (``ω`` when asked)."""
    config = FlowerRunConfig.from_run_config(context.run_config)
    config.check_objective(allowed_objectives(context.node_config))  # before any of its code is imported
    agent = agent_id_of(context)
    floor = check_floor(config, context.node_config, agent)
    plan = records_to_plan(msg.content)
    if plan.features and RandomFourierFeatures.from_config(plan.features).fingerprint != plan.fingerprint:
        raise FeatureMapMismatch(
            f"the server's feature-map arguments {plan.features} do not give its fingerprint {plan.fingerprint!r}."
        )
    settings = config.dp_settings()
    secure_sum = not get_release(settings.aggregation).sees_messages  # the agent sends its integer vector
    secure = secure_sum and settings.method.federated() and plan.omega_round > 0
    cohort = records_to_secagg_cohort(msg.content, settings.num_regions) if secure else None  # checked first
    identity = NodeIdentity.from_node_config(context.node_config, agent) if cohort else None
    if plan.omega_round > 0:
        claim_round(context, agent, plan.omega_round, config.num_rounds)
    state = None
    if AGENT_STATE in context.state.array_records:
        state = record_to_state(context.state.array_records[AGENT_STATE])
    node = live_nodes.get(context.run_id, context.node_id, config, agent, state, context.node_config)
    node.check_features(plan.fingerprint)
    reply = node.step(plan.round, plan.p, plan.broadcast, plan.region_bounds, plan.omega_round)
    context.state[AGENT_STATE] = state_to_record(node.state_dict())
    if not secure:
        return Message(reply_to_records(reply, config.report_best), reply_to=msg)
    if cohort is None:  # not in this round's secure aggregation: nothing of ω is sent
        return Message(reply_to_records(replace(reply, omega=None), config.report_best), reply_to=msg)
    if reply.omega is None:
        raise RuntimeError(f"agent {reply.agent_id} drew no ω for round {plan.omega_round}.")
    sampled, ratios = cohort
    mechanism = SecureMechanism.from_settings(settings, config.num_agents)
    y, _ = mechanism.contributions(
        reply.omega.unsqueeze(0),
        torch.tensor([sampled]),
        ratios.unsqueeze(0),
        [agent_secret_of(context)],
        plan.omega_round,
    )
    client = SecAggClient.setup(
        context.node_id,
        plan.omega_round,
        mechanism.modulus,
        y[0].numpy(),
        agent_id=agent,
        federation=config.fingerprint(),
        min_threshold=floor.required_threshold(config),
        num_agents=config.num_agents,
        identity=identity,
    )
    context.state[SECAGG_STATE] = ConfigRecord(client.to_state())
    content = reply_to_records(replace(reply, omega=None), config.report_best)
    content[SECAGG] = ConfigRecord({"pk1": client.pk1, "pk2": client.pk2, "signature": client.signature})
    return Message(content, reply_to=msg)


def agent_secret_of(context: Context) -> bytes:
    """The agent's own 32-byte secret (its rounding coins and noise shares): from the node's state, or
    drawn from the OS and kept there at the first secure round."""
    if AGENT_SECRET not in context.state.config_records:
        context.state[AGENT_SECRET] = ConfigRecord({"secret": new_secret()})
    return check_secret(context.state.config_records[AGENT_SECRET]["secret"], "agent secret")


__all__ = [
    "ReplayRefused",
    "agent_id_of",
    "agent_secret_of",
    "check_floor",
    "claim_round",
    "handle_round",
    "live_nodes",
]
