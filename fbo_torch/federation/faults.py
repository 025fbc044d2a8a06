r"""Faults a federation must survive: failed evaluations and agents that drop out.

Real agents fail: a training run diverges (NaN), a job crashes, a phone goes
offline before it reports. :func:`evaluate_agents` evaluates every agent's
query and turns failures into NaN observations (which
:meth:`~fbo_torch.federation.agents.Agents.observe` records and keeps out of
the models) instead of stopping the run; :class:`FaultInjector` injects both
kinds of faults at given rates, from the agents' keyed streams, so robustness
can be studied and tested reproducibly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.validation import check_probability


@dataclass
class FaultInjector:
    r"""Independent per-agent, per-round faults.

    Attributes:
        eval_failure_rate: Probability that an agent's evaluation fails (returns NaN).
        dropout_rate: Probability that an agent's message does not reach the server.
    """

    eval_failure_rate: float = 0.0
    dropout_rate: float = 0.0

    def __post_init__(self) -> None:
        check_probability("eval_failure_rate", self.eval_failure_rate, open_right=True)
        check_probability("dropout_rate", self.dropout_rate, open_right=True)

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


def evaluate_agents(
    objective, X: Tensor, agents: Tensor, keys: Tensor | None = None, noiseless: bool = False
) -> tuple[Tensor, Tensor]:
    r"""Observe ``y_bj = f_{agents[b]}(X[b, j])`` for every agent, surviving failures.

    The batch is evaluated in one call; if that raises, agents are evaluated
    one by one and those that raise get NaN. Non-finite values are returned as
    they are (the caller treats them as failures).

    Args:
        objective: An :class:`~fbo_torch.objectives.base.Objective`.
        X: ``B x d`` (or ``B x q x d``) queries. agents: ``B`` agent indices.
        keys: ``B`` observation-noise keys.
        noiseless: Evaluate the noiseless values (``objective.evaluate_true``) instead.

    Returns:
        ``(y, raised)``: ``B`` (or ``B x q``) values and ``B`` booleans (the evaluation raised).
    """
    single = X.ndim == 2
    Xq = X.unsqueeze(1) if single else X

    def call(Xb: Tensor, ab: Tensor, kb: Tensor | None) -> Tensor:
        if noiseless:
            return objective.evaluate_true(Xb, agents=ab, validate=False)
        return objective(Xb, agents=ab, keys=kb, validate=False)

    try:
        y = call(Xq, agents, keys)
        raised = torch.zeros(y.shape[0], dtype=torch.bool, device=y.device)
    except Exception:  # noqa: BLE001 - any failure of user code is an agent's failure
        out, flags = [], []
        for b in range(Xq.shape[0]):
            try:
                yb = call(Xq[b : b + 1], agents[b : b + 1], None if keys is None else keys[b : b + 1])
                out.append(yb.reshape(1, -1).to(device=X.device, dtype=X.dtype))
                flags.append(False)
            except Exception:  # noqa: BLE001
                out.append(torch.full((1, Xq.shape[1]), torch.nan, dtype=X.dtype, device=X.device))
                flags.append(True)
        y, raised = torch.cat(out), torch.tensor(flags, device=X.device)
    return (y.squeeze(-1) if single else y), raised
