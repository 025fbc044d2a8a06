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
(:class:`~fbo_torch.flower.client_round.ReplayRefused`).

**A process per message.** Flower's deployment engine starts a ClientApp process for every
message (``flwr-clientapp``), so what this module imports is paid by each of a round's five
messages on every device. It imports only ``flwr``, NumPy and the SecAgg+ modules
(:mod:`~fbo_torch.flower.secagg`, :mod:`~fbo_torch.flower.secagg_records`): the four SecAgg+
stages run without torch, BoTorch, GPyTorch or Opacus, and the round's own message imports them
with its handler (:mod:`~fbo_torch.flower.client_round`) on first use.

Run it the Flower way: ``clientapp = "fbo_torch.flower.client_app:app"`` in the
app's ``pyproject.toml``.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, ConfigRecordValues, Context, Message
from flwr.clientapp import ClientApp

from fbo_torch.flower.identity import NodeIdentity
from fbo_torch.flower.secagg import SecAggClient
from fbo_torch.flower.secagg_records import SECAGG_STATE, parse_secagg, secagg_reply

app = ClientApp()


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
    from fbo_torch.flower.client_round import handle_round  # torch and the models: only for this message

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
