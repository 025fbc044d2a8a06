r"""Fair help: agents whose incumbents are behind their federation's follow peers more, and the leaders.

FTS spends a federation's help evenly: every agent follows a peer with probability ``1 - p_t`` and
picks it from ``P_N`` whatever its standing. ``fairness: λ`` (``λ ≥ 0``) tilts both towards the agents
that are behind, trading the federation's total regret for its worst agents' (Sim et al.'s fair
regret, :mod:`fbo_torch.experiments.fairness`):

* :func:`behind_ranks`: each agent's standing in its federation, from the incumbents (best observed
  values) the agents share as a rank: ``b = 0`` for the best, ``1`` for the worst, ties averaged;
* :func:`fair_follow_probability`: the probability of following a peer,
  ``q' = clamp((1 - p_t)(1 + λ(2b - 1)), 0, 1)``: the median agent keeps the schedule, an agent behind
  follows more, a leader less (``λ = 1``: the best never follows, the worst follows twice as often);
* :func:`fair_peer_weights`: ``P_N'(j) ∝ P_N(j)·exp(-2λ b_j)``: the peer followed is drawn towards the
  leaders (``λ = 1``: the best peer ``e² ≈ 7.4`` times as likely as the worst).

``λ = 0`` is FTS as it was (the runner skips both). The ranks compare incumbents across agents, so they
assume the agents' objectives share a scale (near-copies, one tuning task's variants).
"""

from __future__ import annotations

import torch
from torch import Tensor


def behind_ranks(incumbents: Tensor) -> Tensor:
    r"""Each agent's standing among its federation's agents (the last dimension): 0 best, 1 worst.

    Args:
        incumbents: ``batch_shape x A`` best observed values (larger is better).

    Returns:
        ``batch_shape x A`` ``(#better + #tied/2) / (A - 1)`` (0 for a federation of one agent).
    """
    v = incumbents.to(torch.float64)
    a, b = v.unsqueeze(-1), v.unsqueeze(-2)  # [..., i, k]: agent i against agent k
    better = (b > a).to(torch.float64).sum(-1)
    tied = (b == a).to(torch.float64).sum(-1) - 1  # itself excluded
    A = v.shape[-1]
    return (better + tied / 2) / max(A - 1, 1)


def fair_follow_probability(p_t: float | Tensor, behind: Tensor, strength: float) -> Tensor:
    r"""``p_t'`` whose ``1 - p_t' = clamp((1 - p_t)(1 + λ(2b - 1)), 0, 1)``.

    Args:
        p_t: The schedule's probability of the own acquisition (a float or ``batch_shape``).
        behind: ``batch_shape`` :func:`behind_ranks` of each run's agent.
        strength: ``λ ≥ 0``.

    Returns:
        ``batch_shape`` probabilities of the own acquisition (float64).
    """
    p = torch.as_tensor(p_t, dtype=torch.float64, device=behind.device)
    follow = (1 - p) * (1 + strength * (2 * behind.to(torch.float64) - 1))
    return 1 - follow.clamp(0, 1)


def fair_peer_weights(probs: Tensor, peer_behind: Tensor, strength: float) -> Tensor:
    r"""``P_N'(j) ∝ P_N(j)·exp(-2λ b_j)``, renormalized (rows of zeros stay zero).

    Args:
        probs: ``batch_shape x A`` ``P_N``.
        peer_behind: ``batch_shape x A`` :func:`behind_ranks` of the peers.
        strength: ``λ ≥ 0``.

    Returns:
        ``batch_shape x A`` probabilities (float64).
    """
    w = probs.to(torch.float64) * torch.exp(-2 * strength * peer_behind.to(torch.float64))
    total = w.sum(-1, keepdim=True)
    return torch.where(total > 0, w / total.clamp_min(1e-300), 0.0)


__all__ = ["behind_ranks", "fair_follow_probability", "fair_peer_weights"]
