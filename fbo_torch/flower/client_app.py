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

Run it the Flower way: ``clientapp = "fbo_torch.flower.client_app:app"`` in the
app's ``pyproject.toml``.
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.flower.agent_node import FeatureMapMismatch, LiveNodes
from fbo_torch.flower.config import FlowerRunConfig, allowed_objectives
from fbo_torch.flower.records import AGENT_STATE, record_to_state, records_to_plan, reply_to_records, state_to_record

app = ClientApp()
#: The agents this process plays, kept between messages (a node starts once per run).
live_nodes = LiveNodes()


def agent_id_of(context: Context) -> int:
    """The agent a node plays: its ``partition-id`` node config."""
    if "partition-id" not in context.node_config:
        raise ValueError("this SuperNode has no `partition-id` in its node config (--node-config partition-id=n).")
    return int(context.node_config["partition-id"])


def handle_round(msg: Message, context: Context) -> Message:
    r"""Take the round the server's message opens and reply (``ω`` when asked)."""
    config = FlowerRunConfig.from_run_config(context.run_config)
    config.check_objective(allowed_objectives(context.node_config))  # before any of its code is imported
    plan = records_to_plan(msg.content)
    if plan.features and RandomFourierFeatures.from_config(plan.features).fingerprint != plan.fingerprint:
        raise FeatureMapMismatch(
            f"the server's feature-map arguments {plan.features} do not give its fingerprint {plan.fingerprint!r}."
        )
    state = None
    if AGENT_STATE in context.state.array_records:
        state = record_to_state(context.state.array_records[AGENT_STATE])
    node = live_nodes.get(context.run_id, context.node_id, config, agent_id_of(context), state, context.node_config)
    node.check_features(plan.fingerprint)
    reply = node.step(plan.round, plan.p, plan.broadcast, plan.region_bounds, plan.omega_round)
    context.state[AGENT_STATE] = state_to_record(node.state_dict())
    return Message(reply_to_records(reply, config.report_best), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return handle_round(msg, context)
