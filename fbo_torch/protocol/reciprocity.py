r"""Who sends nothing useful: the free-rider test, and reciprocity built on it.

A peer whose messages are constant, noise, stale or copied sends its followers to points that
rarely beat what they already have. :func:`flag_free_riders` tests each peer's improvement rate
``k/n`` (follows of its messages that improved the follower's incumbent) against the pooled
rate ``p₀`` of the other peers of its federation, one-sided: ``P(X ≤ k)`` with
``X ~ Binomial(n, p₀)``. The report (:mod:`fbo_torch.experiments.accounting`) applies it to a
finished run's records; the FTS simulator applies it every round under ``reciprocity: true``
(:class:`~fbo_torch.simulate.fts.FTSRunner`): an agent may follow a peer's message only while
it is not flagged itself, from the federation's follow and improvement counts so far.

That test needs many follows per peer (a free-rider whose followers never improve is flagged only
after ``n ≥ ln α / ln(1 - p₀)`` follows, over a hundred where peers improve a follower in a few percent
of follows). ``reciprocity_signal: scores`` grounds reciprocity in what a peer *sends* instead: every
receiver already scores every peer's message on its own observations (learned ``P_N``'s fidelity
score, :mod:`~fbo_torch.protocol.fidelity`); :func:`sender_usefulness` averages the receivers'
posteriors that the message is helpful, and :func:`reciprocal_share` turns a sender's usefulness,
relative to its federation's median sender, into the probability that it may follow a peer this
round — help received in proportion to help given.

Every function takes ``batch_shape x J`` tensors (``J`` peers of a federation, a batch of
federations), so all federations of a simulation are tested at once.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: Significance level of :func:`flag_free_riders`' one-sided binomial test.
FREE_RIDER_ALPHA = 0.01
#: Fewest times a peer's messages must have been followed before it can be flagged.
FREE_RIDER_MIN_FOLLOWS = 8
#: What reciprocity rests on: the follow and improvement counts' test, or the receivers' scores of each message.
RECIPROCITY_SIGNALS = ("improvements", "scores")


def binomial_cdf(k: Tensor, n: Tensor, p: Tensor) -> Tensor:
    r"""``P(X ≤ k)`` for ``X ~ Binomial(n, p)``, elementwise over ``batch_shape`` tensors (float64)."""
    k, n, p = (torch.as_tensor(v, dtype=torch.float64) for v in (k, n, p))
    k, n, p = torch.broadcast_tensors(k, n, p)
    i = torch.arange(int(n.max().item()) + 1 if n.numel() else 1, dtype=torch.float64, device=n.device)
    shape = (*n.shape, i.numel())
    i = i.expand(shape)
    nn, pp = n.unsqueeze(-1).expand(shape), p.unsqueeze(-1).clamp(1e-300, 1 - 1e-16).expand(shape)
    log_pmf = (
        torch.lgamma(nn + 1)
        - torch.lgamma(i + 1)
        - torch.lgamma((nn - i).clamp_min(0) + 1)
        + i * pp.log()
        + (nn - i) * torch.log1p(-pp)
    )
    keep = (i <= k.unsqueeze(-1)) & (i <= nn)
    return torch.where(keep, log_pmf.exp(), 0.0).sum(-1).clamp(max=1.0)


def flag_free_riders(
    follows: Tensor, wins: Tensor, alpha: float = FREE_RIDER_ALPHA, min_follows: int = FREE_RIDER_MIN_FOLLOWS
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Peers whose messages improve their followers' incumbents significantly less often than the others'.

    For every peer ``j`` followed ``n_j`` times, ``k_j`` of them improving the follower's incumbent, the
    one-sided binomial test of ``k_j`` against the pooled rate ``p_0`` of all other peers of its
    federation (the last dimension): ``P(X ≤ k_j)`` with ``X ~ Binomial(n_j, p_0)``. A constant, noisy,
    stale or copied message sends its followers to points that rarely beat what they have, so its rate
    falls below ``p_0``.

    Args:
        follows: ``batch_shape x J`` times each peer's messages were followed.
        wins: ``batch_shape x J`` times following them improved the follower's incumbent.
        alpha: Significance level.
        min_follows: Peers followed fewer times are never flagged (too little evidence).

    Returns:
        ``batch_shape x J`` booleans (flagged), p-values (NaN where untested) and pooled rates ``p_0``.
    """
    follows, wins = follows.to(torch.float64), wins.to(torch.float64)
    others_n = follows.sum(-1, keepdim=True) - follows
    others_k = wins.sum(-1, keepdim=True) - wins
    p0 = torch.where(others_n > 0, others_k / others_n.clamp_min(1), math.nan)
    tested = (follows >= min_follows) & (others_n >= min_follows) & torch.isfinite(p0)
    pvalue = torch.where(tested, binomial_cdf(wins, follows, p0.nan_to_num(0.5)), math.nan)
    return tested & (pvalue < alpha), pvalue, p0


def sender_usefulness(helpful: Tensor, receives: Tensor) -> Tensor:
    r"""How useful each sender's message is to its receivers: the mean of their helpful posteriors.

    Args:
        helpful: ``batch_shape x A x A`` ``P(helpful)`` of sender ``j``'s message as receiver ``a`` scores it
            on its own observations (entry ``[..., a, j]``;
            :func:`~fbo_torch.protocol.fidelity.helpful_posterior`).
        receives: ``batch_shape x A x A`` booleans: ``a`` receives ``j``'s message (a peer, not itself).

    Returns:
        ``batch_shape x A`` usefulness in ``[0, 1]`` of each sender (``1/2``, no evidence, for a sender
        nobody receives).
    """
    w = receives.to(torch.float64)
    total = (helpful.to(torch.float64) * w).sum(-2)
    count = w.sum(-2)
    return torch.where(count > 0, total / count.clamp_min(1), 0.5)


def reciprocal_share(usefulness: Tensor) -> Tensor:
    r"""``min(1, u_j / median_k u_k)``: the probability that sender ``j`` may follow a peer this round.

    A sender at least as useful as its federation's median sender (the last dimension) keeps every
    follow; one whose messages nobody finds helpful (``u_j → 0``) loses them in proportion. Before any
    evidence every ``u = 1/2`` and every share is 1.

    Args:
        usefulness: ``batch_shape x A`` :func:`sender_usefulness`.

    Returns:
        ``batch_shape x A`` shares in ``[0, 1]`` (1 where the median is 0).
    """
    u = usefulness.to(torch.float64)
    median = u.median(dim=-1, keepdim=True).values
    return torch.where(median > 0, (u / median.clamp_min(1e-300)).clamp(0, 1), 1.0)


__all__ = [
    "FREE_RIDER_ALPHA",
    "FREE_RIDER_MIN_FOLLOWS",
    "RECIPROCITY_SIGNALS",
    "binomial_cdf",
    "flag_free_riders",
    "reciprocal_share",
    "sender_usefulness",
]
