r"""Failed evaluations of an objective: counted, shown once per kind, and bounded.

An objective's evaluation fails when it raises or returns a non-finite value
(NaN, ``±inf``). :func:`~fbo_torch.federation.faults.evaluate_agents` turns
such an evaluation into a NaN observation, which the agents keep out of their
models, and reports it to the :class:`EvaluationFailures` log that is active
(:func:`recording`):

* every evaluation and every failure is counted, per agent and round, and by
  kind (the exception's class, ``"NaN"`` or ``"inf"``);
* the first failure of each kind is reported once (``report``), with a summary
  of where it was raised;
* when more than ``max_failed_fraction`` of the evaluations so far failed
  (with the default ``1``: when every one did), the log raises
  :class:`EvaluationError`, one line naming the objective and the first
  failure, and the run stops.

Faults injected by ``faults.eval_failure_rate``
(:class:`~fbo_torch.federation.faults.FaultInjector`) are not failures of the
objective and are not counted here. Without an active log (a runner used from
Python), :func:`~fbo_torch.federation.faults.evaluate_agents` issues a
:class:`EvaluationFailureWarning` per kind instead.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

#: Frames of a traceback kept in the record (the innermost ones).
TRACEBACK_FRAMES = 5


class EvaluationError(RuntimeError):
    """Too many evaluations of the objective failed; the message is one line naming the objective and the first
    failure."""


class EvaluationFailureWarning(RuntimeWarning):
    """An objective's evaluation failed (raised or returned a non-finite value) where no
    :class:`EvaluationFailures` log is active; the evaluation is a NaN observation."""


def objective_name(objective: Any) -> str:
    r"""``module:Class`` of an objective (of the object a wrapped objective wraps)."""
    inner = getattr(objective, "inner", objective)
    cls = type(inner)
    return f"{cls.__module__}:{cls.__qualname__}"


def frames(err: BaseException, most: int = TRACEBACK_FRAMES) -> list[str]:
    r"""The innermost ``most`` frames of ``err``'s traceback, innermost last, each as
    ``"file:line in function: source"``."""
    out = []
    for fr in traceback.extract_tb(err.__traceback__)[-most:]:
        line = f"{fr.filename}:{fr.lineno} in {fr.name}"
        out.append(f"{line}: {fr.line.strip()}" if fr.line else line)
    return out


def describe(err: BaseException) -> str:
    r"""An exception on one line: ``"RuntimeError: message (at file.py:12 in _evaluate)"``."""
    text = " ".join(str(err).split()) or "(no message)"
    tb = traceback.extract_tb(err.__traceback__)
    where = f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno} in {tb[-1].name})" if tb else ""
    return f"{type(err).__name__}: {text}{where}"


class EvaluationFailures:
    r"""The failed evaluations of one run (a method, or the other agents' histories).

    Args:
        objective: What messages call the objective, e.g. ``"objective my_module:MySim"``.
        max_failed_fraction: Stop (:class:`EvaluationError`) when more than this fraction of the
            evaluations so far failed; ``1`` (default): only when every one did. In ``(0, 1]``.
        report: Called with one line for the first failure of each kind (default: nothing is reported).
        what: What the evaluations belong to, for messages (e.g. ``"method 'TS'"``).
        reported: Kinds already reported (shared by the logs of one run, so each kind is reported once per
            run); the kinds this log reports are added to it.

    Attributes:
        evaluations: Evaluations so far (points evaluated).
        failed: Failed evaluations so far.
        round: The round the next evaluations belong to (0: the initial points); the caller advances it.
        counts: ``(agent, round) -> failed evaluations``; ``round`` is ``None`` where unknown.
        kinds: ``kind -> {"count", "first": {...}}`` in the order the kinds first occurred.
    """

    def __init__(
        self,
        objective: str,
        max_failed_fraction: float = 1.0,
        report: Callable[[str], None] | None = None,
        what: str = "the run",
        reported: set[str] | None = None,
    ) -> None:
        f = max_failed_fraction
        if isinstance(f, bool) or not (isinstance(f, (int, float)) and math.isfinite(f) and 0 < f <= 1):
            raise ValueError(f"`max_failed_fraction` must be a number in (0, 1], got {f!r}.")
        self.objective = objective
        self.max_failed_fraction = float(f)
        self.report = report
        self.what = what
        self.reported = set() if reported is None else reported
        self.round: int | None = 0
        self.evaluations = 0
        self.failed = 0
        self.counts: dict[tuple[int, int | None], int] = {}
        self.kinds: dict[str, dict[str, Any]] = {}
        self._pending: list[tuple[Tensor, Tensor, Tensor, dict[int, BaseException], int | None]] = []

    def add(self, agents: Tensor, values: Tensor, noiseless: Tensor, raised: dict[int, BaseException]) -> None:
        r"""Note one evaluation call, without reading its values on the host (:meth:`flush` does).

        Args:
            agents: ``B`` agent indices, one per row of the call.
            values: ``B x q`` observations.
            noiseless: ``B x q`` noiseless values.
            raised: Row -> the exception its evaluation raised (every point of the row failed).
        """
        nan = torch.isnan(values) | torch.isnan(noiseless)
        bad = ~(torch.isfinite(values) & torch.isfinite(noiseless))
        self._pending.append((agents, nan, bad, dict(raised), self.round))

    def flush(self) -> None:
        r"""Count the evaluations noted since the last flush, report the first failure of each new kind, and
        apply the bound.

        Raises:
            EvaluationError: More than ``max_failed_fraction`` of the evaluations so far failed.
        """
        pending, self._pending = self._pending, []
        for agents, nan, bad, raised, rnd in pending:
            points = nan.shape[-1]
            self.evaluations += nan.numel()
            # only the rows with a failure are read one by one (a round of 100,000 agents mostly has none)
            rows = sorted(set(raised) | set(bad.any(-1).nonzero().view(-1).tolist()))
            if not rows:
                continue
            index = torch.tensor(rows, device=bad.device)
            ids = agents.reshape(-1)[index].tolist()
            n_nan, n_bad = nan[index].sum(-1).tolist(), bad[index].sum(-1).tolist()
            for i, (row, agent) in enumerate(zip(rows, ids, strict=True)):
                err = raised.get(row)
                if err is not None:
                    self._add(agent, rnd, points, type(err).__name__, self._first_raised(err))
                    continue
                if n_nan[i]:
                    self._add(agent, rnd, n_nan[i], "NaN", {"message": "a NaN value"})
                if n_bad[i] > n_nan[i]:
                    self._add(agent, rnd, n_bad[i] - n_nan[i], "inf", {"message": "an infinite value"})
        too_many = self.failed > self.max_failed_fraction * self.evaluations
        if self.failed and (self.failed == self.evaluations or too_many):
            raise EvaluationError(self._stop_line())

    def _add(self, agent: int, rnd: int | None, n: int, kind: str, first: dict[str, Any]) -> None:
        self.failed += n
        key = (int(agent), rnd)
        self.counts[key] = self.counts.get(key, 0) + n
        entry = self.kinds.get(kind)
        if entry is not None:
            entry["count"] += n
            return
        info = {"agent": int(agent), "round": rnd, **first}
        self.kinds[kind] = {"count": n, "first": info}
        if self.report is not None and kind not in self.reported:
            self.report(self._first_line(kind, info))
        self.reported.add(kind)

    @staticmethod
    def _first_raised(err: BaseException) -> dict[str, Any]:
        return {"message": describe(err), "traceback": frames(err)}

    def _where(self, info: dict[str, Any]) -> str:
        rnd = "round unknown" if info["round"] is None else f"round {info['round']}"
        return f"agent {info['agent']}, {rnd}"

    def _first_line(self, kind: str, info: dict[str, Any]) -> str:
        verb = "returned" if kind in ("NaN", "inf") else "raised"
        return (
            f"warning: {self.objective} {verb} {info['message']} ({self._where(info)}, {self.what}); a failed "
            f"evaluation is left out of the models and counted in results.json (evaluation_failures, with its "
            f"traceback); further {kind} failures are counted, not shown"
        )

    def _stop_line(self) -> str:
        kind, entry = next(iter(self.kinds.items()))
        first = entry["first"]
        if self.failed == self.evaluations:
            bound, advice = "every evaluation so far failed", "fix the objective"
        else:
            bound = f"more than max_failed_fraction = {self.max_failed_fraction:g} of its evaluations failed"
            advice = "fix the objective, or raise `max_failed_fraction`"
        return (
            f"{self.objective}: {bound} ({self.failed} of {self.evaluations}, {self.what}); the first: "
            f"{first['message']} ({self._where(first)}); the run stops: {advice}"
        )

    def summary(self) -> dict[str, Any]:
        r"""The JSON record: ``evaluations``, ``failed``, ``kinds`` (count and first failure of each) and
        ``by_agent_round`` (``[agent, round, failed]`` triples, ``round`` ``null`` where unknown)."""
        return {
            "evaluations": self.evaluations,
            "failed": self.failed,
            "kinds": {k: {"count": v["count"], "first": dict(v["first"])} for k, v in self.kinds.items()},
            "by_agent_round": [[a, r, n] for (a, r), n in self.counts.items()],
        }

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (:meth:`summary` and the current round), after a :meth:`flush`."""
        self.flush()
        return {**self.summary(), "round": self.round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (a resumed run keeps the counts of its earlier part)."""
        self.evaluations = int(state["evaluations"])
        self.failed = int(state["failed"])
        self.kinds = {k: {"count": int(v["count"]), "first": dict(v["first"])} for k, v in state["kinds"].items()}
        self.counts = {(int(a), None if r is None else int(r)): int(n) for a, r, n in state["by_agent_round"]}
        self.round = state.get("round", self.round)


_ACTIVE: contextvars.ContextVar[EvaluationFailures | None] = contextvars.ContextVar("evaluation_failures", default=None)


def active() -> EvaluationFailures | None:
    """The log evaluations are reported to now (:func:`recording`), if any."""
    return _ACTIVE.get()


@contextlib.contextmanager
def recording(log: EvaluationFailures) -> Iterator[EvaluationFailures]:
    r"""Report every evaluation made inside the block (by :func:`~fbo_torch.federation.faults.evaluate_agents`)
    to ``log``."""
    token = _ACTIVE.set(log)
    try:
        yield log
    finally:
        _ACTIVE.reset(token)
