r"""Faults a federation must survive: failed evaluations, agents that drop out, hostile agents.

Real agents fail: a training run diverges (NaN), a job crashes, a phone goes
offline before it reports — and some are hostile. :func:`evaluate_agents`
evaluates every agent's query and turns failures into NaN observations (which
:meth:`~fbo_torch.federation.agents.Agents.observe` records and keeps out of
the models) instead of stopping the run; :class:`FaultInjector` injects each
kind of fault at a given rate, from the agents' keyed streams, so robustness
can be studied and tested reproducibly:

* ``eval_failure_rate``: an agent's evaluation fails in a round;
* ``dropout_rate``: an agent's message is lost in a round;
* ``byzantine_rate`` / ``byzantine_kind``: an agent is hostile for the whole
  run and every message it sends is replaced by an attack — ``"nan"`` (one
  entry NaN), ``"inf"`` (one entry +inf), ``"huge"`` (its ``ω`` times 1e300:
  finite, with a norm that overflows) or ``"random"`` (a random vector with
  entries of size 1e6). The server must drop the non-finite ones and clip the
  others (:class:`~fbo_torch.federation.DPAggregator`); a hostile agent still
  runs its own search honestly.

The injector's coins come from the agents' own keys, so the simulator and a
deployed agent (:mod:`fbo_torch.flower`) inject the same faults.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fbo_torch.federation import evaluation_failures as failures
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.validation import check_probability

if TYPE_CHECKING:
    from fbo_torch.objectives.base import Objective

#: What a hostile agent sends instead of its ``ω`` (see the module docstring).
BYZANTINE_KINDS = ("nan", "inf", "huge", "random")


@dataclass
class FaultInjector:
    r"""Independent per-agent faults (the ``faults:`` section of a method's settings).

    Attributes:
        eval_failure_rate: Probability that an agent's evaluation fails (returns NaN) in a round.
        dropout_rate: Probability that an agent's message does not reach the server in a round.
        byzantine_rate: Probability that an agent is hostile (for the whole run).
        byzantine_kind: What hostile agents send, one of :data:`BYZANTINE_KINDS`.
    """

    eval_failure_rate: float = 0.0
    dropout_rate: float = 0.0
    byzantine_rate: float = 0.0
    byzantine_kind: str = "nan"

    def __post_init__(self) -> None:
        check_probability("faults.eval_failure_rate", self.eval_failure_rate, open_right=True)
        check_probability("faults.dropout_rate", self.dropout_rate, open_right=True)
        check_probability("faults.byzantine_rate", self.byzantine_rate, open_right=True)
        if self.byzantine_kind not in BYZANTINE_KINDS:
            raise ValueError(
                f"`faults.byzantine_kind` must be one of {list(BYZANTINE_KINDS)}, got {self.byzantine_kind!r}."
            )

    @classmethod
    def from_config(cls, faults: Any) -> FaultInjector:
        """From a ``faults:`` mapping (``None``: no faults); unknown keys are an error naming them."""
        faults = {} if faults is None else faults
        names = [f.name for f in fields(cls)]
        if not isinstance(faults, dict):
            raise ValueError(f"`faults` must be a mapping with keys among {names}, got {faults!r}.")
        unknown = sorted(set(faults) - set(names))
        if unknown:
            raise ValueError(f"`faults` has unknown key(s) {unknown}; allowed: {', '.join(names)}.")
        return cls(**faults)

    @property
    def affects_messages(self) -> bool:
        """Whether some messages may be lost or hostile."""
        return self.dropout_rate > 0 or self.byzantine_rate > 0

    def _coin(self, keys: Tensor, round: int, purpose: str, rate: float) -> Tensor:
        if rate <= 0:
            return torch.zeros(keys.shape, dtype=torch.bool, device=keys.device)
        return kr.uniform(kr.fold(kr.fold(keys, round), purpose), 1).squeeze(-1) < rate

    def failed(self, keys: Tensor, round: int) -> Tensor:
        """``B`` booleans: the agents whose evaluation fails in ``round``."""
        return self._coin(keys, round, "fault-evaluation", self.eval_failure_rate)

    def dropped(self, keys: Tensor, round: int) -> Tensor:
        """``B`` booleans: the agents whose message is lost in ``round``."""
        return self._coin(keys, round, "fault-dropout", self.dropout_rate)

    def byzantine(self, keys: Tensor) -> Tensor:
        """``B`` booleans: the hostile agents (the same in every round)."""
        return self._coin(keys, 0, "fault-byzantine", self.byzantine_rate)

    def corrupt(self, omegas: Tensor, keys: Tensor, round: int) -> Tensor:
        r"""``B x M`` messages as sent: hostile agents' ``ω`` replaced by their attack of ``round``."""
        if self.byzantine_rate <= 0:
            return omegas
        hostile = self.byzantine(keys).unsqueeze(-1)  # B x 1
        B, M = omegas.shape
        k = kr.fold(kr.fold(keys, round), "fault-byzantine-message")
        if self.byzantine_kind in ("nan", "inf"):
            entry = (kr.uniform(k, 1) * M).long().clamp_max(M - 1)  # B x 1: which entry is poisoned
            bad = torch.arange(M, device=omegas.device) == entry
            value = torch.nan if self.byzantine_kind == "nan" else torch.inf
            attack = torch.where(bad, value, omegas)
        elif self.byzantine_kind == "huge":
            attack = omegas * 1e300
        else:  # random
            attack = 1e6 * kr.normal(k, M, dtype=omegas.dtype)
        return torch.where(hostile, attack, omegas)


def evaluate_agents(objective: Objective, X: Tensor, agents: Tensor, keys: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""Observe ``y_bj = f_{agents[b]}(X[b, j]) + noise`` for every agent, surviving failures.

    The batch is evaluated in one call of
    :meth:`~fbo_torch.objectives.base.Objective.observe` (each query once: the
    noiseless value comes with the observation); if that raises, agents are
    evaluated one by one and those that raise get NaN. Non-finite values are
    returned as they are (the caller treats them as failures). Every call is
    noted in the active :class:`~fbo_torch.federation.evaluation_failures.EvaluationFailures`
    log (which counts the failures, reports the first of each kind and stops a
    run that fails too often; its values are read on the host only when the log
    is flushed, so a round stays free of host synchronization); without one, an
    exception is reported as an
    :class:`~fbo_torch.federation.evaluation_failures.EvaluationFailureWarning`.

    Args:
        objective: An :class:`~fbo_torch.objectives.base.Objective`.
        X: ``B x d`` (or ``B x q x d``) queries.
        agents: ``B`` agent indices.
        keys: ``B`` observation-noise keys.

    Returns:
        ``(y, f, raised)``: ``B`` (or ``B x q``) observations, their noiseless
        values (for the records; NaN where the evaluation raised) and ``B``
        booleans (the evaluation raised).

    Raises:
        ValueError: The objective returned values of another shape than ``B x q``
            (naming the objective): a bug in it, not a failed evaluation.
    """
    single = X.ndim == 2
    Xq = X.unsqueeze(1) if single else X
    errors: dict[int, BaseException] = {}
    try:
        y, f = objective.observe(Xq, keys, agents=agents, validate=False)
    except Exception:
        ys, fs = [], []
        for b in range(Xq.shape[0]):
            try:
                yb, fb = objective.observe(Xq[b : b + 1], keys[b : b + 1], agents=agents[b : b + 1], validate=False)
            except Exception as err:
                errors[b] = err
                ys.append(torch.full((1, Xq.shape[1]), torch.nan, dtype=X.dtype, device=X.device))
                fs.append(ys[-1])
                continue
            _check_shape(objective, yb, fb, (1, Xq.shape[1]))
            ys.append(yb.to(device=X.device, dtype=X.dtype))
            fs.append(fb.to(device=X.device, dtype=X.dtype))
        y, f = torch.cat(ys), torch.cat(fs)
    else:
        _check_shape(objective, y, f, tuple(Xq.shape[:2]))
    raised = torch.zeros(Xq.shape[0], dtype=torch.bool, device=y.device)
    if errors:
        raised[list(errors)] = True
    log = failures.active()
    if log is not None:
        log.add(agents, y, f, errors)
    else:
        for first in {type(e): e for e in errors.values()}.values():  # one warning per kind
            warnings.warn(
                f"objective {failures.objective_name(objective)} raised {failures.describe(first)}; the "
                "evaluation is a failed (NaN) observation, left out of the models",
                failures.EvaluationFailureWarning,
                stacklevel=2,
            )
    if single:
        y, f = y.squeeze(-1), f.squeeze(-1)
    return y, f, raised


def _check_shape(objective: Objective, y: Tensor, f: Tensor, shape: tuple[int, ...]) -> None:
    """A ``ValueError`` naming the objective when its values are not ``shape`` (one per agent and point)."""
    for name, value in (("observations", y), ("noiseless values", f)):
        if not isinstance(value, Tensor) or tuple(value.shape) != shape:
            got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(
                f"objective {failures.objective_name(objective)} returned {name} of shape {got} for {shape[0]} "
                f"agent(s) x {shape[1]} point(s); expected {shape} (k x q values for X of k x q x d: one per agent "
                "and point)."
            )
