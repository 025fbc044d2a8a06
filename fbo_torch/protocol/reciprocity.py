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

``reciprocity_signal: ranks`` rests on the same scores, made hard to game and kept across rounds:
each receiver's scores become ranks among the peers it received (:func:`peer_ratings`: 1 the best,
0 the worst), so what a receiver reports only orders its peers — every receiver's ratings average
``1/2``, and one that lies can move reputation between its peers but not lower them all; a sender's
mean rating in each round (:func:`round_ratings`) accumulates over the rounds, weighted by how much
the receivers' scores rest on (:func:`rating_record`), and :func:`flag_low_rated` flags a sender
whose mean rating is below :data:`RATING_THRESHOLD` with confidence (its upper bound
``mean + z·sd/√rounds`` below it). The threshold is absolute, not relative to the median sender, so
``k`` of a sender's ``m`` receivers that rank it last lower its mean rating by at most ``k/m`` (on
average to ``(1 - k/m)`` of its honest mean: an honest sender rated 0.55 stays above
:data:`RATING_THRESHOLD` with up to a quarter of its receivers lying), and ``k`` colluders that rank a
free-rider first raise its mean by at most ``k/m``. Where ratings cannot tell: early rounds, when no
receiver's few observations rank a message (honest senders then score like noise), and a free-rider
that forwards an honest peer's message (it ranks as that peer does).

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
#: What reciprocity rests on: the follow and improvement counts' test, the receivers' scores of each message
#: (this round, relative to the median sender), or the receivers' ranks of each message accumulated over rounds.
RECIPROCITY_SIGNALS = ("improvements", "scores", "ranks")
#: ``reciprocity_signal: ranks``: a sender whose mean rank among its receivers' peers (0 worst, 1 best) is below
#: this, with confidence, is flagged (:func:`flag_low_rated`).
RATING_THRESHOLD = 0.4
#: Standard errors by which the mean rating must be below :data:`RATING_THRESHOLD` (one-sided, about 2.3 %).
RATING_Z = 2.0
#: Fewest rated rounds before a sender can be flagged by :func:`flag_low_rated`.
RATING_MIN_ROUNDS = 3


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


def peer_ratings(scores: Tensor, receives: Tensor) -> Tensor:
    r"""Each receiver's rank of every sender it received, as a quantile: ``1`` its best-scored peer,
    ``0`` its worst, ties sharing their mean rank.

    Args:
        scores: ``batch_shape x A x A`` receiver ``a``'s score of sender ``j``'s message (entry ``[..., a, j]``;
            larger is more helpful, e.g. :func:`~fbo_torch.protocol.fidelity.fidelity_scores`).
        receives: ``batch_shape x A x A`` booleans: ``a`` receives ``j``'s message (a peer, not itself).

    Returns:
        ``batch_shape x A x A`` float64 ratings in ``[0, 1]``: ``(#lower + #tied / 2) / (K - 1)`` among the
        ``K`` senders ``a`` received (``1/2`` where ``K = 1``), NaN where ``a`` does not receive ``j``. Every
        receiver's ratings average ``1/2``.
    """
    recv = receives.to(torch.bool)
    s = torch.where(recv, scores.to(torch.float64).nan_to_num(0.0, 0.0, 0.0), math.inf)  # finite, unreceived last
    ordered = s.sort(-1).values.contiguous()
    lower = torch.searchsorted(ordered, s.contiguous(), right=False).to(torch.float64)
    tied = torch.searchsorted(ordered, s.contiguous(), right=True).to(torch.float64) - lower - 1
    K = recv.sum(-1, keepdim=True).to(torch.float64)
    q = torch.where(K > 1, (lower + tied / 2) / (K - 1).clamp_min(1), 0.5)
    return torch.where(recv, q, math.nan)


def round_ratings(ratings: Tensor, receives: Tensor) -> tuple[Tensor, Tensor]:
    r"""Each sender's mean rating over its receivers in one round, and how many rated it.

    Args:
        ratings: ``batch_shape x A x A`` :func:`peer_ratings` (``[..., a, j]``: ``a``'s rating of ``j``).
        receives: ``batch_shape x A x A`` booleans: ``a`` receives ``j``'s message.

    Returns:
        ``(mean, count)``, ``batch_shape x A`` each (float64): the mean over ``j``'s receivers (NaN for a
        sender nobody received) and their number.
    """
    recv = receives.to(torch.bool)
    count = recv.to(torch.float64).sum(-2)
    total = torch.where(recv, ratings.to(torch.float64), 0.0).sum(-2)
    return torch.where(count > 0, total / count.clamp_min(1), math.nan), count


def rating_record(mean: Tensor, count: Tensor, weight: Tensor) -> Tensor:
    r"""One round's contribution to a sender's rating record: ``5 x batch_shape`` rows ``(w, w·r, w·r², w², w·m)``.

    Args:
        mean: ``batch_shape`` the round's mean ratings (:func:`round_ratings`; NaN where nobody rated).
        count: ``batch_shape`` their receivers ``m``.
        weight: ``batch_shape`` the round's weight ``w > 0``: how much its ratings tell (in the FTS simulator
            the receivers' mean number of observations minus one: a rank score's signal-to-noise ratio grows
            like the square root of the observations it rests on, so its information like their number).

    Returns:
        ``5 x batch_shape`` float64, zeros where nobody rated; records add up over rounds.
    """
    w = torch.where(count > 0, weight.to(torch.float64), 0.0)
    r = torch.where(count > 0, mean.to(torch.float64), 0.0)
    return torch.stack([w, w * r, w * r.square(), w.square(), w * count.to(torch.float64)])


def flag_low_rated(
    record: Tensor, threshold: float = RATING_THRESHOLD, z: float = RATING_Z, min_rounds: float = RATING_MIN_ROUNDS
) -> tuple[Tensor, Tensor]:
    r"""Senders rated below ``threshold`` with confidence, from their rating record so far.

    A sender's per-round mean ratings ``r_t`` (:func:`round_ratings`), weighted by ``w_t``
    (:func:`rating_record`), have the weighted mean ``r̄``, the weighted standard deviation ``s`` and the
    effective number of rounds ``n = (Σ w)² / Σ w²`` (the ratings of one round share the message, so the
    rounds, not the ratings, are the independent units). ``s`` is floored at ``1/√(12 m̄)``, the spread of a
    mean of ``m̄`` uniform ratings (``m̄`` receivers per round; a sender rated alike in a few rounds is not
    certain from them). Flagged where ``n ≥ min_rounds`` and ``r̄ + z·s/√n < threshold``.

    Args:
        record: ``5 x batch_shape`` sums of :func:`rating_record` over the rounds so far.
        threshold: :data:`RATING_THRESHOLD`.
        z: :data:`RATING_Z`.
        min_rounds: :data:`RATING_MIN_ROUNDS`, on the effective number of rounds.

    Returns:
        ``(flags, upper)``: ``batch_shape`` booleans and the upper bounds ``r̄ + z·s/√n`` (NaN before any
        rated round).
    """
    w, wr, wr2, w2, wm = record.to(torch.float64).unbind(0)
    rated = w > 0
    w1 = w.clamp_min(1e-300)
    mean = wr / w1
    var = (wr2 / w1 - mean.square()).clamp_min(0)
    n = torch.where(rated, w.square() / w2.clamp_min(1e-300), 0.0)
    var = var * n / (n - 1).clamp_min(1)  # the weighted variance's small-sample correction
    floor = 1.0 / (12.0 * (wm / w1).clamp_min(1))
    upper = torch.where(rated, mean + z * (torch.maximum(var, floor) / n.clamp_min(1)).sqrt(), math.nan)
    return (n >= min_rounds) & (upper < threshold), upper


__all__ = [
    "FREE_RIDER_ALPHA",
    "FREE_RIDER_MIN_FOLLOWS",
    "RATING_MIN_ROUNDS",
    "RATING_THRESHOLD",
    "RATING_Z",
    "RECIPROCITY_SIGNALS",
    "binomial_cdf",
    "flag_free_riders",
    "flag_low_rated",
    "peer_ratings",
    "rating_record",
    "reciprocal_share",
    "round_ratings",
    "sender_usefulness",
]
