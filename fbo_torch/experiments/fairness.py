r"""Fairness of a federation's outcome across its agents: fair regret and simpler indices.

Every index takes per-agent numbers (regrets, gains from federating) as one tensor whose last
dimension is the agents, ``batch_shape x N``, so a method's, a round's or a repetition's
indices are one call.

* :func:`fair_regret` is the fair regret of Sim, Zhang, Low & Jaillet (ICML 2021,
  "Collaborative Bayesian Optimization with Fair Regret"): the Gini social-evaluation function
  ``G_ρ(u) = Σ_i ρ^(i-1) u_(i)`` (utilities sorted from the worst-off up, ``0 ≤ ρ ≤ 1``) of the
  agents' utilities, here the negated per-agent regrets (each agent's regret against its own
  optimum, so the ideal outcome has ``G_ρ = 0``). ``ρ = 1`` is the total regret (efficiency alone);
  ``ρ → 0`` the worst agent's regret (the egalitarian end); in between, an agent further behind weighs
  more.
* :func:`fairness_indices` adds the simpler indices a reader checks first: the worst agent's regret,
  the spread of the per-agent gains from federating, and the share of agents that lost by federating.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

#: The ``ρ`` values of :func:`fair_regret` every report gives: efficiency, a middle ground, the worst agent.
REPORTED_RHOS = (1.0, 0.5, 0.0)


def fair_regret(regret: Tensor, rho: float) -> Tensor:
    r"""Sim et al.'s fair regret ``Σ_i ρ^(i-1) R_(i)`` of per-agent regrets ``R`` sorted from the largest down.

    Args:
        regret: ``batch_shape x N`` per-agent regrets (non-negative: each agent's regret against its own
            optimum; ``+inf`` for an agent none of whose evaluations succeeded; NaN is refused).
        rho: ``0 ≤ ρ ≤ 1``; ``1`` gives the total regret, ``0`` the largest.

    Returns:
        ``batch_shape`` fair regrets (float64).
    """
    if not (isinstance(rho, (int, float)) and 0.0 <= float(rho) <= 1.0):
        raise ValueError(f"`rho` must be a number in [0, 1], got {rho!r}.")
    regret = torch.as_tensor(regret, dtype=torch.float64)
    if regret.ndim < 1 or regret.shape[-1] < 1:
        raise ValueError(f"`regret` must be batch_shape x N with N >= 1, got shape {tuple(regret.shape)}.")
    if bool(regret.isnan().any()) or bool((regret == -torch.inf).any()):
        raise ValueError("`regret` must be finite or +inf (an agent without a valid evaluation), not NaN or -inf.")
    ordered = regret.sort(dim=-1, descending=True).values
    i = torch.arange(regret.shape[-1], dtype=torch.float64, device=regret.device)
    weights = torch.where(i == 0, 1.0, float(rho) ** i)  # ρ^0 = 1, also for ρ = 0
    # a zero weight ignores its agent, an infinite regret too (inf * 0 would be NaN)
    return torch.where(weights > 0, ordered * weights, 0.0).sum(-1)


def fairness_indices(
    regret: Tensor,
    cumulative_regret: Tensor | None = None,
    gain: Tensor | None = None,
    gain_stderr: Tensor | None = None,
) -> dict[str, Any]:
    r"""The fairness of one outcome across ``N`` agents, as JSON-able numbers.

    Args:
        regret: ``N`` per-agent final regrets (mean over the agent's runs).
        cumulative_regret: ``N`` per-agent regrets summed over the rounds (the fair regret's utility);
            default: ``regret``.
        gain: ``N`` per-agent gains from federating (the local counterfactual's regret minus this one's;
            positive: federating helped), ``None`` without a counterfactual.
        gain_stderr: ``N`` standard errors of ``gain`` (NaN where an agent has a single run).

    Returns:
        ``worst_regret``, ``mean_regret``, ``worst_agent`` (its position), ``fair_regret`` (``{ρ: value}``
        for :data:`REPORTED_RHOS`, on ``cumulative_regret``), and with ``gain``: ``gain_mean``,
        ``gain_std`` (spread across agents), ``gain_min``, ``gain_max``, ``share_lost`` (agents whose mean
        gain is negative) and ``share_lost_significantly`` (gain + 2 s.e. < 0; ``None`` without standard
        errors).
    """
    regret = torch.as_tensor(regret, dtype=torch.float64).reshape(-1)
    if regret.numel() == 0:
        raise ValueError("`regret` must hold at least one agent's regret.")
    cum = regret if cumulative_regret is None else torch.as_tensor(cumulative_regret, dtype=torch.float64)
    out: dict[str, Any] = {
        "num_agents": int(regret.numel()),
        "worst_regret": float(regret.max()),
        "worst_agent": int(regret.argmax()),
        "mean_regret": float(regret.mean()),
        "fair_regret": {str(rho): float(fair_regret(cum.reshape(-1), rho)) for rho in REPORTED_RHOS},
    }
    if gain is None:
        return out
    gain = torch.as_tensor(gain, dtype=torch.float64).reshape(-1)
    if gain.shape != regret.shape:
        raise ValueError(f"`gain` must hold one value per agent ({regret.numel()}), got {gain.numel()}.")
    out.update(
        gain_mean=float(gain.mean()),
        gain_std=float(gain.std()) if gain.numel() > 1 else 0.0,
        gain_min=float(gain.min()),
        gain_max=float(gain.max()),
        share_lost=float((gain < 0).double().mean()),
        share_lost_significantly=None,
    )
    if gain_stderr is not None:
        se = torch.as_tensor(gain_stderr, dtype=torch.float64).reshape(-1)
        if bool(torch.isfinite(se).all()):
            out["share_lost_significantly"] = float((gain + 2 * se < 0).double().mean())
    return out


__all__ = ["REPORTED_RHOS", "fair_regret", "fairness_indices"]
