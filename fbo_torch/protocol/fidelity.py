r"""Learned ``P_N``: how well each peer's message predicts an agent's own observations.

FTS draws the message it follows from a distribution ``P_N`` over the other
agents; the paper used a uniform ``P_N`` and names learning it from "the
similarity between each agent and the target agent (i.e., the fidelity of each
agent)" as future work. This module scores that fidelity from what an agent
holds anyway — the peers' messages ``ω_n`` and its own observations
``(X, y)`` — and turns the scores into ``P_N``:

* **Score** (:func:`fidelity_scores`): Kendall's rank correlation ``τ_n``
  between the agent's observations ``y_i`` and the peer's predictions
  ``φ(x_i)ᵀω_n`` at the same inputs (RGPE ranks its base models by the same
  pairwise ranking loss: ``τ = 1 - 2·(misranked pairs)/(pairs)``). Ranks are
  what Thompson sampling acts on — it queries the argmax — and they make the
  score invariant to any increasing transform of either side, so a peer whose
  function has another offset or scale (another output unit, a standardized
  ``y``) is not penalized. The score is ``z_n = τ_n / s(n)``, where
  ``s(n)² = 2(2n + 5) / (9n(n - 1))`` is the variance of ``τ`` between ``n``
  independent pairs (Kendall, 1938): ``z_n ≈ N(0, 1)`` for a peer unrelated
  to the agent, whatever ``n``, and grows like ``√n`` for a related one.
* **Weights** (:func:`fidelity_weights`): ``P_N ∝ exp(z_n)``, i.e. a softmax of
  ``τ_n`` at temperature ``s(n)``: uniform while the agent has fewer than two
  observations, sharper as they accumulate. A peer identical to the agent gets
  the largest weight; an adversarial peer (``-f``) has ``τ_n → -1`` and its
  weight falls like ``exp(-1.5√n)``.
* **Near-duplicates** (:func:`redundancy`): peers whose messages are copies of
  one another are one source of evidence, not several. A peer that copies a
  helpful message and adds a spike where the agent has not looked scores
  exactly what the copied peer scores (they agree at every observation), so
  ``k`` such sybils would take ``k/(k+1)`` of the helpful peer's mass and steer
  the agent early. Each peer's weight is divided by its soft count of
  near-duplicates, ``c_n = Σ_m clamp((ρ_nm - ρ_0) / (1 - ρ_0), 0, 1)`` over the
  peers received, with ``ρ_nm = cos(ω_n, ω_m)``: a cluster of copies weighs
  about as much as one peer, whatever its size. Under the shared feature map
  ``ω_nᵀω_m`` is the (approximate) RKHS inner product of the two sampled
  functions, so ``ρ`` is their correlation; like the score, it does not change
  when a message is scaled by a positive factor (a copy cannot hide by
  rescaling). Two honest agents' posterior draws differ in every direction their
  data do not pin down: ``ρ ≤ 0.4`` between honest peers in
  ``benchmarks/sybil_study.py``, against ``ρ ≈ 0.95`` for a spiked copy;
  ``ρ_0 = 0.5`` (:data:`DUPLICATE_CORRELATION`). A copy can escape the count
  only by adding independent variation of an honest draw's size, which is a
  function of its own away from the agent's data (see ``docs/security.md``
  for what this does not stop).
* **Corroborated weights** (``agent_weights: corroborated``, what the recommended
  ``algorithm: transfer`` configuration uses;
  :func:`corroborated_counts`): against sybils that escape the message count
  (decorrelated in the null space of the agent's observed features, so their
  messages look unrelated while every one peaks at the attacker's point), two
  more rules on a fixed set of reference points (:func:`reference_points`: a
  finite domain's candidates, else a scrambled Sobol set of a box from a fixed
  seed): peers whose maximizers over the set coincide (kernel correlation
  above :data:`COINCIDE_CORRELATION`) count as one peer
  (:func:`coinciding_maximizers`), and each peer's maximizer is cross-checked by
  the peers outside its group (:func:`cross_check`: a factor
  ``exp(-β · mean outside (1 - quantile))``). ``docs/security.md`` measures what
  it stops (10 decorrelated sybils of 20 peers: 7.4% of ``P_N`` instead of 41.7%),
  what it does not (sybils whose points are 1.3 lengthscales apart: 34%) and
  what it costs.
* **Trust** (:func:`peer_trust`): the ``P_N``-weighted posterior that the
  drawn peer is helpful (a two-point test of ``τ = τ_h`` against ``τ = 0``),
  which may scale the probability of following a peer:
  ``p_t' = 1 - (1 - p_t)·g`` (:func:`trusted_p_t`). With few observations
  ``g = 1`` (the schedule is kept); as observations accumulate an agent whose
  peers are all unrelated or adversarial falls back to its own GP, and one
  with a helpful peer keeps the schedule.

Everything is batched over ``batch_shape`` (runs or agents) and over peers:
one ``batch x N x n x n`` comparison per update, no Python loop.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch.quasirandom import SobolEngine

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.utils.batch_invariant import matmul

if TYPE_CHECKING:  # pragma: no cover
    from fbo_torch.protocol.schedules import AgentDistribution

#: Observations below which an agent cannot rank anything (``τ`` needs a pair).
MIN_OBSERVATIONS = 2

#: Rank agreement ``τ_h`` of a "helpful" peer in :func:`peer_trust` (a peer counts as helpful once
#: the evidence says its ``τ`` exceeds ``τ_h / 2``).
TAU_HELPFUL = 0.5

#: ``ρ_0`` of :func:`redundancy`: messages less correlated than this count as unrelated, a copy as 1.
DUPLICATE_CORRELATION = 0.5

#: Kernel correlation of two peers' maximizers above which :func:`coinciding_maximizers` counts them as
#: one peer (about 1.2 lengthscales apart for a squared-exponential kernel).
COINCIDE_CORRELATION = 0.5

#: ``β`` of :func:`cross_check` in ``agent_weights: corroborated``.
CROSS_CHECK_STRENGTH = 8.0

#: Size of the fixed Sobol set :func:`reference_points` puts on a box.
REFERENCE_POINTS = 4096

#: Seed of that Sobol set (fixed: every agent, run and round uses the same points).
REFERENCE_SEED = 0

#: Choices of ``agent_weights``.
AGENT_WEIGHTS = ("uniform", "learned", "corroborated")

#: The choices that learn ``P_N`` from the fidelity scores.
LEARNED_WEIGHTS = ("learned", "corroborated")


def peer_predictions(features: RandomFourierFeatures, omegas: Tensor, X: Tensor) -> Tensor:
    r"""Each peer's sampled function at the agent's own inputs: ``φ(x_i)ᵀω_n``.

    Args:
        features: The shared feature map.
        omegas: ``batch_shape x N x M`` messages (or ``N x M``, shared by the batch).
        X: ``batch_shape x n x d`` the agent's inputs.

    Returns:
        ``batch_shape x N x n`` predictions.
    """
    phi = features(X)  # batch x n x M
    return matmul(omegas, phi.to(omegas.dtype).mT)  # batch x K x n


def kendall_tau(predictions: Tensor, y: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    r"""Kendall's ``τ_a`` between ``y`` and each row of ``predictions``, over the valid observations.

    Args:
        predictions: ``batch_shape x N x n`` each peer's predictions.
        y: ``batch_shape x n`` the agent's observations.
        mask: Optional ``batch_shape x n`` booleans, the valid observations
            (failed evaluations are left out); default: ``y`` is finite.

    Returns:
        ``(tau, num_valid)``: ``batch_shape x N`` correlations in ``[-1, 1]``
        (0 when fewer than two observations are valid; tied pairs count 0) and
        ``batch_shape`` numbers of valid observations.
    """
    if mask is None:
        mask = torch.isfinite(y)
    y = torch.where(mask, y, torch.zeros_like(y))
    pair = torch.triu(mask.unsqueeze(-1) & mask.unsqueeze(-2), diagonal=1)  # batch x n x n
    # sign(y_i - y_j) on valid pairs i < j, 0 elsewhere; then one product-sum per peer
    dy = torch.sign(y.unsqueeze(-1) - y.unsqueeze(-2)).mul_(pair).unsqueeze(-3)  # batch x 1 x n x n
    dp = torch.sign(predictions.unsqueeze(-1) - predictions.unsqueeze(-2))  # batch x N x n x n
    concordance = dp.mul_(dy).sum((-1, -2))
    num_valid = mask.sum(-1)
    num_pairs = (num_valid * (num_valid - 1) / 2).to(concordance.dtype).unsqueeze(-1)
    tau = torch.where(num_pairs > 0, concordance / num_pairs.clamp_min(1), torch.zeros_like(concordance))
    return tau, num_valid


def null_std(num_valid: Tensor) -> Tensor:
    r"""Standard deviation of Kendall's ``τ`` between ``n`` independent pairs:
    ``√(2(2n + 5) / (9n(n - 1)))`` (``inf`` for ``n < 2``)."""
    n = num_valid.to(torch.float64)
    var = 2 * (2 * n + 5) / (9 * n * (n - 1)).clamp_min(1e-300)
    return torch.where(n >= MIN_OBSERVATIONS, var.sqrt(), torch.full_like(n, math.inf))


def fidelity_scores(predictions: Tensor, y: Tensor, mask: Tensor | None = None) -> Tensor:
    r"""``z_n = τ_n / s(n)``: each peer's rank agreement with the agent, in units of its null spread.

    Args:
        predictions: ``batch_shape x N x n`` peers' predictions at the agent's inputs
            (:func:`peer_predictions`).
        y: ``batch_shape x n`` the agent's observations.
        mask: Optional ``batch_shape x n`` valid observations.

    Returns:
        ``batch_shape x N`` scores (0 where the agent has fewer than two valid observations).
    """
    tau, num_valid = kendall_tau(predictions, y, mask)
    return tau / null_std(num_valid).to(tau.dtype).unsqueeze(-1)


def near_copies(messages: Tensor, threshold: float = DUPLICATE_CORRELATION) -> Tensor:
    r"""``batch_shape x N x N`` ``clamp((ρ_nm - ρ_0) / (1 - ρ_0), 0, 1)``, ``ρ_nm = cos(ω_n, ω_m)``, between the
    ``batch_shape x N x M`` ``messages`` (float64): how much each message is a copy of each other one."""
    w = messages.to(torch.float64)
    unit = w / w.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    rho = matmul(unit, unit.transpose(-1, -2))  # batch x N x N
    return ((rho - threshold) / (1 - threshold)).clamp(0, 1)


def redundancy(messages: Tensor, support: Tensor | None = None, threshold: float = DUPLICATE_CORRELATION) -> Tensor:
    r"""Each peer's soft count of near-duplicates: ``c_n = Σ_m clamp((ρ_nm - ρ_0) / (1 - ρ_0), 0, 1)``,
    ``ρ_nm = cos(ω_n, ω_m)``.

    Args:
        messages: ``batch_shape x N x M`` the peers' messages ``ω``.
        support: Optional ``batch_shape x N`` booleans: the peers whose messages count
            (default: all).
        threshold: ``ρ_0`` (:data:`DUPLICATE_CORRELATION`).

    Returns:
        ``batch_shape x N`` counts ``≥ 1`` (1 for a message unlike every other one;
        ``k`` for each of ``k`` copies, also of copies rescaled by positive factors).
    """
    near = near_copies(messages, threshold)
    if support is not None:
        near = near * support.unsqueeze(-2).to(near.dtype)
    return near.sum(-1).clamp_min(1.0)


def fidelity_weights(scores: Tensor, support: Tensor | None = None, redundancy: Tensor | None = None) -> Tensor:
    r"""``P_N ∝ exp(z_n) / c_n`` over the peers in ``support``.

    Args:
        scores: ``batch_shape x N`` fidelity scores (``-inf`` rules a peer out; NaN is an error).
        support: Optional ``batch_shape x N`` booleans: peers that may be chosen
            (others get probability 0). A row with no peer in support is all zeros.
        redundancy: Optional ``batch_shape x N`` near-duplicate counts ``c_n ≥ 1``
            (:func:`redundancy`); default 1.

    Returns:
        ``batch_shape x N`` probabilities (float64).

    Raises:
        ValueError: ``scores`` holds NaN or ``+inf`` (a message that is not a finite vector).
    """
    z = scores.to(torch.float64)
    bad = torch.isnan(z) | (z == torch.inf)
    if support is not None:
        bad = bad & support
    if bad.any():
        raise ValueError(
            f"`scores` holds {int(bad.sum())} NaN or +inf value(s): every scored peer's message must "
            "be a finite vector."
        )
    if redundancy is not None:
        z = z - redundancy.to(z).log()
    if support is not None:
        z = torch.where(support, z, -torch.inf)
    probs = torch.softmax(z, dim=-1)
    return torch.nan_to_num(probs, nan=0.0)  # rows with no support: softmax of all -inf


def reference_points(
    bounds: Tensor, candidates: Tensor | None = None, num: int = REFERENCE_POINTS, seed: int = REFERENCE_SEED
) -> Tensor:
    r"""The points on which :func:`corroborated_counts` compares the peers' maximizers.

    A finite domain's own candidates (maximizers and quantiles over them are exact); on a box, the
    first ``num`` points of a scrambled Sobol sequence of fixed ``seed`` scaled to ``bounds``: the
    same points for every agent, run and round, so the counts are a function of the messages and
    scores alone (a maximizer over ``num`` points is within about ``num^{-1/d}`` of the box's width
    of a maximizer over the box; what matters is only whether two maximizers coincide).

    Args:
        bounds: ``2 x d`` box.
        candidates: Optional ``C x d`` finite domain.
        num: Points of the Sobol set (:data:`REFERENCE_POINTS`).
        seed: Its scrambling seed (:data:`REFERENCE_SEED`).

    Returns:
        ``C x d`` (or ``num x d``) float64 points.
    """
    if candidates is not None:
        return candidates.to(torch.float64)
    lo, hi = bounds.to(torch.float64)
    unit = SobolEngine(lo.shape[-1], scramble=True, seed=seed).draw(num, dtype=torch.float64).to(lo.device)
    return lo + (hi - lo) * unit


def reference_values(
    features: RandomFourierFeatures, messages: Tensor, reference: Tensor, *, reference_features: Tensor | None = None
) -> Tensor:
    r"""Each peer's sampled function on the reference points: ``φ(x_c)ᵀω_n``.

    Args:
        features: The shared feature map.
        messages: ``batch_shape x N x M`` messages.
        reference: ``C x d`` points (:func:`reference_points`).
        reference_features: Optional ``C x M`` ``features(reference)`` in float64, when the caller has them.

    Returns:
        ``batch_shape x N x C`` float64 values.
    """
    phi = features(reference.to(torch.float64)) if reference_features is None else reference_features  # C x M
    return matmul(messages.to(torch.float64), phi.mT)  # batch x N x C


def maximizer_correlation(
    features: RandomFourierFeatures, values: Tensor, reference: Tensor, *, reference_features: Tensor | None = None
) -> Tensor:
    r"""Kernel correlation of every two peers' maximizers over the reference points:
    ``φ(x̂_n)ᵀφ(x̂_m) / (‖φ(x̂_n)‖ ‖φ(x̂_m)‖)``, ``x̂_n = argmax_c φ(x_c)ᵀω_n``.

    Args:
        features: The shared feature map.
        values: ``batch_shape x N x C`` (:func:`reference_values`).
        reference: ``C x d`` the points behind ``values``.
        reference_features: Optional ``C x M`` ``features(reference)`` in float64, when the caller has them.

    Returns:
        ``batch_shape x N x N`` correlations (1 on the diagonal).
    """
    # the reference points' features, then each maximizer's row: what a run gets does not depend on how
    # many runs share the batch (features of batch x N gathered points would go through one product
    # whose rounding changes with its row count)
    phi = features(reference.to(torch.float64)) if reference_features is None else reference_features  # C x M
    phi_top = phi[values.argmax(-1)]  # batch x N x M
    unit = phi_top / phi_top.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return matmul(unit, unit.transpose(-1, -2))


def coinciding_maximizers(correlation: Tensor, threshold: float = COINCIDE_CORRELATION) -> Tensor:
    r"""``batch_shape x N x N`` 1 where two peers' maximizers coincide (``correlation`` from
    :func:`maximizer_correlation` above ``threshold``), else 0 (float64)."""
    return (correlation > threshold).to(torch.float64)


def cross_check(
    values: Tensor,
    correlation: Tensor,
    weights: Tensor,
    strength: float = CROSS_CHECK_STRENGTH,
    threshold: float = COINCIDE_CORRELATION,
) -> Tensor:
    r"""Log-factors ``ℓ_n = -β Σ_m w_m o_nm (1 - q_mn) / Σ_m w_m o_nm`` on ``P_N``: a peer's claim
    checked by the peers outside its group.

    ``q_mn`` is the quantile of ``φ(x̂_n)ᵀω_m`` among peer ``m``'s own values on the reference points
    (1 at its own maximizer, uniform at a point unrelated to its function);
    ``o_nm = 1 - clamp((k_nm - ρ) / (1 - ρ), 0, 1)``, ``k_nm`` the kernel correlation of the two
    maximizers (0 for ``m = n`` and for peers whose maximizers coincide with ``n``'s: the group making
    the claim); ``w`` the raters' ``P_N``. A peer whose maximizer the outside peers rate at their own
    top keeps its weight, one they rate at the median loses ``e^{-β/2}``; a peer with no outside
    opinion (``Σ_m w_m o_nm = 0``) keeps it.

    Args:
        values: ``batch_shape x N x C`` (:func:`reference_values`).
        correlation: ``batch_shape x N x N`` (:func:`maximizer_correlation`).
        weights: ``batch_shape x N`` the raters' weights (0 for peers that do not rate).
        strength: ``β`` (:data:`CROSS_CHECK_STRENGTH`).
        threshold: ``ρ`` (:data:`COINCIDE_CORRELATION`).

    Returns:
        ``batch_shape x N`` log-factors ``≤ 0`` (float64).
    """
    N = values.shape[-2]
    outside = 1 - ((correlation - threshold) / (1 - threshold)).clamp(0, 1)  # batch x N x N, 0 on the diagonal
    top = values.argmax(-1)  # batch x N
    at = values.gather(-1, top.unsqueeze(-2).expand(*values.shape[:-1], N))  # batch x m x n: f_m(x̂_n)
    q = torch.searchsorted(values.sort(-1).values.contiguous(), at.contiguous()).to(values.dtype)
    q = q / max(values.shape[-1] - 1, 1)  # batch x m x n quantiles in [0, 1]
    rated = weights.to(values.dtype).unsqueeze(-1) * outside  # batch x m x n
    mass = rated.sum(-2)
    return -strength * (rated * (1 - q)).sum(-2) / mass.clamp_min(1e-300)


def corroborated_counts(
    features: RandomFourierFeatures,
    messages: Tensor,
    scores: Tensor,
    reference: Tensor,
    support: Tensor | None = None,
    strength: float = CROSS_CHECK_STRENGTH,
) -> Tensor:
    r"""Near-duplicate counts of ``agent_weights: corroborated``: ``c_n e^{-ℓ_n}``.

    ``c_n = Σ_m max(near_nm, s_nm)`` counts, besides near-copies of the message (:func:`redundancy`),
    the peers whose maximizers over ``reference`` coincide with ``n``'s (:func:`coinciding_maximizers`);
    ``ℓ_n`` is :func:`cross_check` with the raters weighted by ``P_N ∝ exp(z) / c`` on ``support``.
    :func:`fidelity_weights` with these counts gives
    ``P_N ∝ exp(z_n + ℓ_n) / c_n``: a group of coinciding maximizers weighs one peer, times what the
    peers outside it think of its claim.

    Args:
        features: The shared feature map.
        messages: ``batch_shape x N x M`` the peers' messages.
        scores: ``batch_shape x N`` their fidelity scores (:func:`fidelity_scores`).
        reference: ``C x d`` points (:func:`reference_points`; the space ``features`` takes).
        support: Optional ``batch_shape x N`` booleans: the peers whose messages count and rate.
        strength: ``β`` of :func:`cross_check`.

    Returns:
        ``batch_shape x N`` float64 counts ``≥ 1``.

    Memory: ``batch_shape x N x C`` values and ``batch_shape x N x N`` comparisons.
    """
    phi = features(reference.to(torch.float64))  # C x M: the reference points' features, once for both
    values = reference_values(features, messages, reference, reference_features=phi)
    correlation = maximizer_correlation(features, values, reference, reference_features=phi)
    near = torch.maximum(near_copies(messages), coinciding_maximizers(correlation))
    if support is not None:
        near = near * support.unsqueeze(-2).to(near.dtype)
    counts = near.sum(-1).clamp_min(1.0)
    raters = fidelity_weights(scores, support, counts)
    return counts * (-cross_check(values, correlation, raters, strength)).exp()


def peer_counts(
    agent_weights: str,
    features: RandomFourierFeatures,
    messages: Tensor,
    scores: Tensor,
    reference: Tensor | None,
    support: Tensor | None = None,
) -> Tensor:
    r"""The near-duplicate counts ``agent_weights`` divides ``P_N`` by: :func:`corroborated_counts` for
    ``"corroborated"`` (``reference`` required), else :func:`redundancy` (``batch_shape x N``)."""
    if agent_weights == "corroborated":
        if reference is None:
            raise ValueError("agent_weights='corroborated' needs reference points (`reference_points`).")
        return corroborated_counts(features, messages, scores, reference, support)
    return redundancy(messages, support)


def helpful_posterior(scores: Tensor, num_valid: Tensor, tau_helpful: float = TAU_HELPFUL) -> Tensor:
    r"""``P(helpful_n | z_n) = σ(z_n μ − μ²/2)``, ``μ = τ_h / s(n)``: each peer's posterior of being
    helpful (rank agreement ``τ_h``) rather than unrelated (``τ = 0``), equally likely a priori
    (:func:`peer_trust`). 1/2 while the agent has fewer than two observations.

    Args:
        scores: ``batch_shape x N`` fidelity scores.
        num_valid: ``batch_shape`` valid observations.
        tau_helpful: ``τ_h``.

    Returns:
        ``batch_shape x N`` probabilities.
    """
    z = scores.to(torch.float64)
    mu = (tau_helpful / null_std(num_valid).to(z)).unsqueeze(-1)  # 0 with fewer than two observations
    return torch.sigmoid(z * mu - mu.square() / 2)


def peer_trust(scores: Tensor, probs: Tensor, num_valid: Tensor, tau_helpful: float = TAU_HELPFUL) -> Tensor:
    r"""How much the peer drawn from ``P_N`` is expected to help: ``g = Σ_n P_N(n) · min(1, 2 P(helpful_n | z_n))``.

    Each peer is either *helpful* (its rank agreement with the agent is
    ``τ = τ_h``) or not (``τ = 0``), equally likely a priori. Since ``z_n ≈ N(τ / s(n), 1)``,
    the posterior is ``P(helpful | z) = σ(z μ - μ²/2)`` with ``μ = τ_h / s(n)``: it
    stays at 1/2 while ``s(n)`` is large (few observations: no evidence, the
    schedule's ``p_t`` is kept, ``g = 1``), goes to 1 for a peer whose ``τ`` exceeds
    ``τ_h / 2`` and to 0 for one below it (unrelated or adversarial peers) as
    observations accumulate.

    Args:
        scores: ``batch_shape x N`` fidelity scores.
        probs: ``batch_shape x N`` ``P_N``.
        num_valid: ``batch_shape`` valid observations behind the scores.
        tau_helpful: ``τ_h``, the rank agreement of a helpful peer.

    Returns:
        ``batch_shape`` trust in ``[0, 1]``.
    """
    helpful = helpful_posterior(scores, num_valid, tau_helpful)
    g = (probs.to(torch.float64) * (2 * helpful).clamp_max(1)).sum(-1)
    return g.clamp(0, 1)


def trusted_p_t(p_t: float | Tensor, trust: Tensor) -> Tensor:
    r"""``p_t' = 1 - (1 - p_t) · g``: follow peers only as much as they are trusted."""
    return 1 - (1 - torch.as_tensor(p_t, dtype=trust.dtype, device=trust.device)) * trust


def learn_peer_choice(
    distribution: AgentDistribution,
    scores: Tensor,
    num_valid: Tensor,
    p_t: float | Tensor,
    agent_weights: str,
    trust: bool,
    copies: Tensor | None = None,
) -> float | Tensor:
    r"""Apply the fidelity scores to one FTS choice: the simulator's (all runs) and the acquisition's (one target).

    With ``agent_weights="learned"`` (or ``"corroborated"``) re-weights ``distribution`` (in place) by
    :func:`fidelity_weights` on its support, near-duplicate messages counted
    once (``copies``: :func:`redundancy`, or :func:`corroborated_counts`; :func:`peer_counts` gives the
    one ``agent_weights`` names); with ``trust`` returns the trusted
    ``p_t'`` (:func:`peer_trust`, :func:`trusted_p_t`), else ``p_t`` unchanged.

    Args:
        distribution: ``P_N`` of the batch (:class:`~fbo_torch.protocol.schedules.AgentDistribution`).
        scores: ``batch_shape x N`` (or ``N``, shared by the batch) fidelity scores.
        num_valid: ``batch_shape`` (or scalar) valid observations behind the scores.
        p_t: The schedule's probability of the own GP.
        agent_weights: ``"uniform"``, ``"learned"`` or ``"corroborated"``.
        trust: Whether to scale ``1 - p_t`` by the trust in ``P_N``'s draw.
        copies: ``batch_shape x N`` (or ``N``) near-duplicate counts of the messages behind
            ``scores`` (:func:`peer_counts`); ``None`` counts every message as unlike the others.

    Returns:
        The probability of the own GP: ``p_t``, or the trusted ``p_t'`` with ``trust``.
    """
    if agent_weights in LEARNED_WEIGHTS:
        distribution.reweight(fidelity_weights(scores, distribution.support, copies))
    if trust:
        return trusted_p_t(p_t, peer_trust(scores, distribution.probs, num_valid))
    return p_t


def check_agent_weights(value: str, key: str = "agent_weights") -> str:
    """``value`` must be one of :data:`AGENT_WEIGHTS` (``ValueError`` naming ``key``)."""
    if value not in AGENT_WEIGHTS:
        raise ValueError(f"`{key}` must be one of {AGENT_WEIGHTS}, got {value!r}.")
    return value


__all__ = [
    "AGENT_WEIGHTS",
    "COINCIDE_CORRELATION",
    "CROSS_CHECK_STRENGTH",
    "DUPLICATE_CORRELATION",
    "LEARNED_WEIGHTS",
    "MIN_OBSERVATIONS",
    "REFERENCE_POINTS",
    "REFERENCE_SEED",
    "TAU_HELPFUL",
    "check_agent_weights",
    "coinciding_maximizers",
    "corroborated_counts",
    "cross_check",
    "fidelity_scores",
    "fidelity_weights",
    "helpful_posterior",
    "kendall_tau",
    "learn_peer_choice",
    "maximizer_correlation",
    "near_copies",
    "null_std",
    "peer_counts",
    "peer_predictions",
    "peer_trust",
    "redundancy",
    "reference_points",
    "reference_values",
    "trusted_p_t",
]
