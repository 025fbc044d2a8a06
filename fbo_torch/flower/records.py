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

This module imports ``flwr``; the rest of :mod:`fbo_torch.flower` does not.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import Tensor

from fbo_torch.flower.agent_node import AgentReply
from fbo_torch.flower.coordinator import RoundPlan

ROUND, FEATURES, BROADCAST = "fbo.round", "fbo.features", "fbo.broadcast"
REPLY, OMEGA, METRICS = "fbo.reply", "fbo.omega", "fbo.metrics"
AGENT_STATE = "fbo.agent"


def plan_to_records(plan: RoundPlan) -> RecordDict:
    """A :class:`RoundPlan` as the content of a server message."""
    content = RecordDict()
    content[ROUND] = ConfigRecord({
        "round": plan.round, "p": float(plan.p), "omega-round": plan.omega_round, "fingerprint": plan.fingerprint,
    })
    content[FEATURES] = ConfigRecord(dict(plan.features))
    if plan.broadcast is not None:
        content[BROADCAST] = ArrayRecord({
            "broadcast": plan.broadcast.detach().cpu().contiguous(),
            "region-bounds": plan.region_bounds.detach().cpu().contiguous(),
        })
    return content


def records_to_plan(content: RecordDict) -> RoundPlan:
    """The :class:`RoundPlan` a server message carries."""
    r = content.config_records[ROUND]
    broadcast = region_bounds = None
    if BROADCAST in content.array_records:
        arrays = content.array_records[BROADCAST].to_torch_state_dict()
        broadcast, region_bounds = arrays["broadcast"], arrays["region-bounds"]
    feats = dict(content.config_records[FEATURES]) if FEATURES in content.config_records else {}
    return RoundPlan(int(r["round"]), float(r["p"]), broadcast, region_bounds, int(r["omega-round"]),
                     str(r["fingerprint"]), feats)


def reply_to_records(reply: AgentReply, report_best: bool) -> RecordDict:
    """An :class:`AgentReply` as the content of a reply message."""
    content = RecordDict()
    content[REPLY] = ConfigRecord({"agent-id": reply.agent_id, "fingerprint": reply.fingerprint})
    if reply.omega is not None:
        content[OMEGA] = ArrayRecord({"omega": reply.omega.detach().cpu().contiguous()})
    metrics = {"num-observations": reply.num_observations, "used-broadcast": int(reply.used_broadcast),
               "failed": int(reply.failed)}
    if report_best:
        metrics["best-value"] = float(reply.best_value)
    content[METRICS] = MetricRecord(metrics)
    return content


def records_to_reply(content: RecordDict) -> tuple[int, str, Tensor | None, float | None, int | None]:
    """``(agent_id, fingerprint, omega or None, best value or None, observations or None)`` of a reply."""
    r = content.config_records[REPLY]
    omega = None
    if OMEGA in content.array_records:
        omega = content.array_records[OMEGA].to_torch_state_dict()["omega"]
    metrics = content.metric_records.get(METRICS, {})
    best, n_obs = metrics.get("best-value"), metrics.get("num-observations")
    return (int(r["agent-id"]), str(r["fingerprint"]), omega, None if best is None else float(best),
            None if n_obs is None else int(n_obs))


def state_to_record(state: dict[str, Tensor]) -> ArrayRecord:
    return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in state.items()})


def record_to_state(record: ArrayRecord) -> dict[str, Tensor]:
    return dict(record.to_torch_state_dict())
