r"""The deployment's messages as Flower records (``RecordDict`` of typed records).

Server → agent (one message per agent and exchange, type ``"train"``):

* ``"fbo.round"`` (``ConfigRecord``): ``round``, ``p``, ``omega-round``, ``fingerprint``;
* ``"fbo.features"`` (``ConfigRecord``): the feature map's constructor arguments
  (:meth:`~fbo_torch.features.RandomFourierFeatures.config`);
* ``"fbo.broadcast"`` (``ArrayRecord``, rounds with a release): ``broadcast``
  (``P x M``) and ``region-bounds`` (``P x 2 x d``).

Agent → server:

* ``"fbo.reply"`` (``ConfigRecord``): ``agent-id``, ``fingerprint``, ``round``;
* ``"fbo.omega"`` (``ArrayRecord``, when asked): ``omega`` (``M``);
* ``"fbo.metrics"`` (``MetricRecord``): ``num-observations``, ``used-broadcast``,
  ``failed``, and ``best-value`` with ``report-best``.

With secure aggregation (:mod:`fbo_torch.flower.secagg`) no ``"fbo.omega"``
is ever sent. The exchange that asks for round ``t``'s vectors carries, per
agent, ``"fbo.secagg"`` (``ConfigRecord``: ``sampled``, that agent's own
Poisson coin, and ``ratios``, its ``P`` weight ratios), and the reply carries
``"fbo.secagg"`` with the node's two public keys (``pk1``, ``pk2``) and its
``signature`` of them. Then four messages of types ``"train.share_keys"``,
``"train.masked_vector"``, ``"train.consistency"`` and ``"train.unmask"`` carry
the SecAgg+ stages, each a ``"fbo.secagg"`` ``ConfigRecord``
(:mod:`~fbo_torch.flower.secagg_records`: their builders and parser).

This module imports ``flwr``; the rest of :mod:`fbo_torch.flower` does not.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, ConfigRecordValues, MetricRecord, MetricRecordValues, RecordDict
from flwr.common.serde import recorddict_to_proto
from torch import Tensor

from fbo_torch.flower.agent_node import AgentReply
from fbo_torch.flower.coordinator import InvalidReply, RoundPlan
from fbo_torch.flower.secagg_records import SECAGG

ROUND, FEATURES, BROADCAST = "fbo.round", "fbo.features", "fbo.broadcast"
REPLY, OMEGA, METRICS = "fbo.reply", "fbo.omega", "fbo.metrics"
AGENT_STATE = "fbo.agent"


def plan_to_records(plan: RoundPlan) -> RecordDict:
    """A :class:`RoundPlan` as the content of a server message."""
    content = RecordDict()
    content[ROUND] = ConfigRecord(
        {
            "round": plan.round,
            "p": float(plan.p),
            "omega-round": plan.omega_round,
            "fingerprint": plan.fingerprint,
        }
    )
    content[FEATURES] = ConfigRecord(dict(plan.features))
    if plan.broadcast is not None:
        if plan.region_bounds is None:
            raise ValueError("a plan with a broadcast must carry its region bounds (P x 2 x d).")
        content[BROADCAST] = ArrayRecord(
            {
                "broadcast": plan.broadcast.detach().cpu().contiguous(),
                "region-bounds": plan.region_bounds.detach().cpu().contiguous(),
            }
        )
    return content


def records_to_plan(content: RecordDict) -> RoundPlan:
    """The :class:`RoundPlan` a server message carries (checked: a malformed plan raises ``ValueError``)."""
    try:
        r = content.config_records[ROUND]
        t, p, omega_round, fingerprint = r["round"], r["p"], r["omega-round"], r["fingerprint"]
        released: tuple[Tensor, Tensor] | None = None
        if BROADCAST in content.array_records:
            arrays = content.array_records[BROADCAST].to_torch_state_dict()
            released = arrays["broadcast"], arrays["region-bounds"]
        feats = dict(content.config_records[FEATURES]) if FEATURES in content.config_records else {}
    except Exception as err:
        raise ValueError(f"malformed message from the server ({type(err).__name__}: {err}).") from None
    t, omega_round = _round_number("round", t), _round_number("omega-round", omega_round)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"the server's `p` is {p!r}, not a probability.")
    broadcast = region_bounds = None
    if released is not None:
        broadcast, region_bounds = released
        if (
            broadcast.dtype != torch.float64
            or broadcast.ndim != 2
            or region_bounds.ndim != 3
            or region_bounds.shape[0] != broadcast.shape[0]
            or region_bounds.shape[1] != 2
        ):
            raise ValueError(
                f"the server's broadcast ({broadcast.dtype} {tuple(broadcast.shape)}) and region bounds "
                f"({tuple(region_bounds.shape)}) are not P x M float64 and P x 2 x d."
            )
        if not (torch.isfinite(broadcast).all() and torch.isfinite(region_bounds).all()):
            raise ValueError("the server's broadcast holds non-finite values; refusing to follow it.")
    return RoundPlan(t, float(p), broadcast, region_bounds, omega_round, str(fingerprint), feats)


def _round_number(name: str, v: ConfigRecordValues) -> int:
    """A round number of the server's message, checked: an integer ``>= 0``."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"the server's `{name}` is {v!r}, not an integer >= 0.")
    return v


def reply_to_records(reply: AgentReply, report_best: bool) -> RecordDict:
    """An :class:`AgentReply` as the content of a reply message."""
    content = RecordDict()
    content[REPLY] = ConfigRecord({"agent-id": reply.agent_id, "fingerprint": reply.fingerprint})
    if reply.omega is not None:
        content[OMEGA] = ArrayRecord({"omega": reply.omega.detach().cpu().contiguous()})
    metrics: dict[str, MetricRecordValues] = {
        "num-observations": reply.num_observations,
        "used-broadcast": int(reply.used_broadcast),
        "failed": int(reply.failed),
    }
    if report_best:
        metrics["best-value"] = float(reply.best_value)
    content[METRICS] = MetricRecord(metrics)
    return content


def reply_agent_id(content: RecordDict) -> int:
    """The agent id a reply claims (raises :class:`~fbo_torch.flower.coordinator.InvalidReply` if unreadable)."""
    try:
        agent_id = content.config_records[REPLY].get("agent-id")
    except Exception:
        raise InvalidReply(f"the reply has no {REPLY!r} record") from None
    if isinstance(agent_id, bool) or not isinstance(agent_id, int):
        raise InvalidReply(f"the reply's agent-id is {agent_id!r}, not an integer")
    return agent_id


def records_to_reply(content: RecordDict) -> tuple[int, str, Tensor | None, float | None, int | None]:
    r"""``(agent_id, fingerprint, omega or None, best value or None, observations or None)`` of a reply.

    The types are checked here (the values by the coordinator); anything else
    raises :class:`~fbo_torch.flower.coordinator.InvalidReply` with the reason.
    """
    agent_id = reply_agent_id(content)
    try:
        fingerprint = content.config_records[REPLY].get("fingerprint")
        omega = None
        if OMEGA in content.array_records:
            arrays = content.array_records[OMEGA].to_torch_state_dict()
            if set(arrays) != {"omega"}:
                raise InvalidReply(f"agent {agent_id}: the {OMEGA!r} record holds {sorted(arrays)}, not 'omega'")
            omega = arrays["omega"]
        metrics: Mapping[str, MetricRecordValues] = content.metric_records.get(METRICS, {})
        best, n_obs = metrics.get("best-value"), metrics.get("num-observations")
    except InvalidReply:
        raise
    except Exception as err:
        raise InvalidReply(f"agent {agent_id}: unreadable reply ({type(err).__name__}: {err})") from None
    if not isinstance(fingerprint, str):
        raise InvalidReply(f"agent {agent_id}: the reply's fingerprint is {fingerprint!r}, not a string")
    if best is not None and (isinstance(best, bool) or not isinstance(best, (int, float))):
        raise InvalidReply(f"agent {agent_id}: best-value {best!r} is not a number")
    if n_obs is not None and (isinstance(n_obs, bool) or not isinstance(n_obs, int)):
        raise InvalidReply(f"agent {agent_id}: num-observations {n_obs!r} is not an integer")
    return agent_id, fingerprint, omega, None if best is None else float(best), n_obs


# --------------------------------------------------------------------------- secure aggregation
def secagg_cohort_record(sampled: bool, ratios: Tensor) -> ConfigRecord:
    """Agent ``n``'s part of a secure round's exchange: its own coin and its ``P`` weight ratios."""
    return ConfigRecord({"sampled": bool(sampled), "ratios": [float(r) for r in ratios.tolist()]})


def records_to_secagg_cohort(content: RecordDict, num_regions: int) -> tuple[bool, Tensor] | None:
    """``(sampled, ratios)`` of a server message, ``None`` when it has none (the node is not in this
    secure round: without a roster a node is bound to its agent only by its first reply); checked:
    a malformed one raises ``ValueError``."""
    if SECAGG not in content.config_records:
        return None
    try:
        r = content.config_records[SECAGG]
        sampled, ratios = r["sampled"], r["ratios"]
    except Exception as err:
        raise ValueError(f"malformed secure-round message from the server ({type(err).__name__}: {err}).") from None
    if (
        not isinstance(sampled, bool)
        or not isinstance(ratios, list)
        or len(ratios) != num_regions
        or not all(isinstance(v, float) for v in ratios)
    ):
        raise ValueError(
            f"the server's secure-round record is not (bool, {num_regions} floats): {sampled!r}, {ratios!r}."
        )
    return sampled, torch.tensor(ratios, dtype=torch.float64)


def reply_public_keys(content: RecordDict, agent_id: int) -> tuple[bytes, bytes, bytes]:
    """The two public keys and their signature a secure round's reply carries
    (:class:`~fbo_torch.flower.coordinator.InvalidReply` if not)."""
    try:
        r = content.config_records[SECAGG]
        pk1, pk2, signature = r["pk1"], r["pk2"], r["signature"]
    except Exception:
        raise InvalidReply(f"agent {agent_id}: the reply has no {SECAGG!r} record with its signed keys") from None
    if not (
        isinstance(pk1, bytes)
        and isinstance(pk2, bytes)
        and isinstance(signature, bytes)
        and 0 < len(pk1) <= 1024
        and 0 < len(pk2) <= 1024
        and len(signature) <= 1024
    ):
        raise InvalidReply(f"agent {agent_id}: the reply's public keys and signature are not bytes")
    return pk1, pk2, signature


def payload_bytes(content: RecordDict) -> int:
    """The size of a message's content as Flower serializes it (protobuf bytes)."""
    return int(recorddict_to_proto(content).ByteSize())


def state_to_record(state: dict[str, Tensor]) -> ArrayRecord:
    """A state dict as a Flower ``ArrayRecord`` (tensors detached, on the CPU, contiguous)."""
    return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in state.items()})


def record_to_state(record: ArrayRecord) -> dict[str, Tensor]:
    """The state dict an ``ArrayRecord`` holds (the inverse of :func:`state_to_record`)."""
    return dict(record.to_torch_state_dict())
