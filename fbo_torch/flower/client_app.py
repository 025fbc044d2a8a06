r"""The ClientApp: one agent per SuperNode, kept in the node's state between messages.

A SuperNode started with ``--node-config partition-id=n`` is agent ``n``. In a
federation of node-local objectives (run config ``objective = '{"type": "node",
...}'``) its node config also names its own black box, ``objective=
"package.module:ClassName"`` (``objective.KEY=...``: keyword arguments), which
it builds, checks against the federation's domain and evaluates; a node whose
objective does not fit is refused by the server for good
(:class:`~fbo_torch.flower.config.ObjectiveMismatch`). Its
data (observations), objective and models never leave it: the agent's state is
an ``ArrayRecord`` in ``context.state`` (local to the node; a process that
handles several messages also keeps the node itself, see
:class:`~fbo_torch.flower.agent_node.LiveNodes`), and a reply
carries only ``ω`` (when the server asks), the feature map's fingerprint and
a few metrics. A server whose feature map differs from the agent's is refused
(:class:`~fbo_torch.flower.agent_node.FeatureMapMismatch`, which Flower returns
to the server as an error reply).

With ``aggregation = "secure"`` the reply carries no ``ω`` at all: the agent
turns it into its integer vector with its own noise share
(:meth:`~fbo_torch.federation.secure.SecureMechanism.contributions`, the
simulator's function, from the agent's own secret, drawn from the OS at its
first round and kept in the node's state) and sends it only masked, through
the SecAgg+ stages (``train.share_keys``, ``train.masked_vector``,
``train.consistency``, ``train.unmask``;
:class:`~fbo_torch.flower.secagg.SecAggClient`), its keys signed with its
SuperNode key (:mod:`~fbo_torch.flower.identity`). The mechanism's constants
(lattice, modulus, noise) come from the agent's own run config, never from
the server, which sends only the agent's coin and weight ratios (clamped to
``[0, 1]``).

**What the node owns.** Before anything else the node checks the run config
against its own privacy floor (:mod:`~fbo_torch.flower.floor`, node config
``privacy.*``) and refuses a run below it. And it answers each round at most
once: its noise share and rounding coins are a function of (its secret, the
round), so two answers for one round — one with its Poisson coin up, one
without — would differ by its noise-free vector. The last round it answered
is kept with its secret in the node state, and a request for that round or an
earlier one, or for a round past ``num-rounds``, is refused
(:class:`ReplayRefused`).

Run it the Flower way: ``clientapp = "fbo_torch.flower.client_app:app"`` in the
app's ``pyproject.toml``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from flwr.app import ConfigRecord, ConfigRecordValues, Context, Message
from flwr.clientapp import ClientApp

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.federation.release import get_release
from fbo_torch.federation.secure import SecureMechanism
from fbo_torch.flower.agent_node import FeatureMapMismatch, LiveNodes
from fbo_torch.flower.config import FlowerRunConfig, allowed_objectives
from fbo_torch.flower.floor import PrivacyFloor
from fbo_torch.flower.identity import NodeIdentity
from fbo_torch.flower.records import (
    AGENT_STATE,
    SECAGG,
    parse_secagg,
    record_to_state,
    records_to_plan,
    records_to_secagg_cohort,
    reply_to_records,
    secagg_reply,
    state_to_record,
)
from fbo_torch.flower.secagg import SecAggClient
from fbo_torch.utils.secure_random import check_secret, new_secret

#: Node-state records: the agent's own secret (with the last round it answered), and its side of the running
#: SecAgg+ round.
AGENT_SECRET, SECAGG_STATE = "fbo.agent-secret", "fbo.secagg-state"
#: The key of :data:`AGENT_SECRET` that holds the last round the node answered.
ANSWERED = "answered-round"

app = ClientApp()
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


def _secagg_client(context: Context) -> SecAggClient:
    if SECAGG_STATE not in context.state.config_records:
        raise ValueError("a SecAgg+ stage arrived, but this node has no secure round in progress.")
    return SecAggClient.from_state(dict(context.state.config_records[SECAGG_STATE]))


def _secagg_stage(msg: Message, context: Context, stage: str) -> Message:
    """One SecAgg+ stage on this node (checked; a malformed or out-of-order request raises: an error reply)."""
    request = parse_secagg(stage, msg.content)
    client = _secagg_client(context)
    identity = None
    if client.signature:  # it signed its keys: it checks everything the server relays against its roster
        identity = NodeIdentity.from_node_config(context.node_config, client.agent_id)
    if stage == "share_keys":
        ids = request["node-ids"]
        keys = {int(i): (a, b) for i, a, b in zip(ids, request["pk1"], request["pk2"], strict=True)}
        agents = dict(zip(ids, request["agent-ids"], strict=True))
        signatures = dict(zip(ids, request["signatures"], strict=True))
        dests, cts, commit = client.share_keys(
            request["round"], keys, request["threshold"], agents, signatures, identity
        )
        reply = secagg_reply(destinations=dests, ciphertexts=cts, commitment=commit)
    elif stage == "masked_vector":
        masked = client.masked_vector(request["round"], request["sources"], request["ciphertexts"])
        reply = secagg_reply(masked=masked.astype("<i8").tobytes())
    elif stage == "consistency":
        reply = secagg_reply(signature=client.consistency(request["round"], request["survivors"], identity))
    else:
        confirmations = {
            int(n): (int(a), sig)
            for n, a, sig in zip(request["signers"], request["signer-agents"], request["signatures"], strict=True)
        }
        ids, shares = client.unmask(request["round"], confirmations, identity)
        fields: dict[str, ConfigRecordValues] = {"node-ids": ids, "shares": shares}  # "node-ids" is no identifier
        reply = secagg_reply(**fields)
    context.state[SECAGG_STATE] = ConfigRecord(client.to_state())
    return Message(reply, reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of this node's agent: the server's plan in, the agent's reply out."""
    return handle_round(msg, context)


@app.train("share_keys")
def share_keys(msg: Message, context: Context) -> Message:
    """SecAgg+ stage 1: shares of this node's secrets, encrypted for its neighbours."""
    return _secagg_stage(msg, context, "share_keys")


@app.train("masked_vector")
def masked_vector(msg: Message, context: Context) -> Message:
    """SecAgg+ stage 2: this agent's noisy integer vector, masked."""
    return _secagg_stage(msg, context, "masked_vector")


@app.train("consistency")
def consistency(msg: Message, context: Context) -> Message:
    """SecAgg+ stage 3: this node's signature of the survivor set."""
    return _secagg_stage(msg, context, "consistency")


@app.train("unmask")
def unmask(msg: Message, context: Context) -> Message:
    """SecAgg+ stage 4: shares of the survivors' seeds and of the dropped nodes' keys."""
    return _secagg_stage(msg, context, "unmask")
