r"""Peers' messages as a prior over where the optimum is: πBO with a federation's beliefs.

πBO (Hvarfner et al., ICLR 2022; BoTorch's
``botorch.acquisition.prior_guided.PriorGuidedAcquisitionFunction``) multiplies an
acquisition by a user's prior ``π(x)`` over the optimizer's location, raised to
an exponent that decays as the agent's own evidence grows, ``α(x)·π(x)^{β/t}``.
Here the "user" is the federation: peer ``n``'s message ``ω_n`` describes its
function ``g_n(x) = φ(x)ᵀω_n``, whose maximizer ``c_n`` is the peer's belief of
where its optimum lies, and

.. math::

    π(x) = λ + (1 − λ) \sum_n P_N(n) \exp\Bigl(-\frac{\lVert \tilde x − \tilde c_n \rVert^2}{2 s^2}\Bigr)

(unnormalized; ``x̃`` in unit-cube coordinates of the domain, ``s`` the bumps'
width, ``P_N`` the weights of the peers, ``λ`` a floor). Where peers share
their optimum's location with the agent (tasks that differ in shape and scale
but not in where they are best), the prior steers the acquisition there early;
where they do not, two bounds keep it harmless:

* the floor: ``log π ∈ [log λ, 0]``, so the point chosen has an acquisition value
  within ``(β/t)·|log λ|`` of the best in log space, i.e. expected improvement at
  least ``λ^{β/t}`` times the largest (e.g. 0.55× at ``t = 10`` with ``β = 2``, ``λ = 0.05``);
* the decay ``β/t``: the agent's own model decides alone as evidence accumulates.

A single message is one posterior draw, whose maximizer is mostly where the
draw's prior fluctuations peak, far from the peer's data; a receiver
therefore averages each peer's messages over rounds
(:class:`~fbo_torch.protocol.message_average.MessageAverage`) before taking
the maximizer (post-processing of what was sent: nothing more is shared).

:class:`PeerOptimumPrior` is the prior as a module for BoTorch users (its
``forward`` is the log prior, for ``PriorGuidedAcquisitionFunction(..., log=True)``);
:class:`BatchedPriorGuided` is the same acquisition for ``B`` agents at once in the
batched engine, with closed-form input gradients.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import Module

from fbo_torch.acquisition.batched import BatchedAnalyticAcquisition
from fbo_torch.acquisition.search import maximize_rff_samples
from fbo_torch.features import RandomFourierFeatures
from fbo_torch.optim.domain import Domain
from fbo_torch.utils.validation import check_tensor


def _check_prior_args(width: float, floor: float) -> None:
    if isinstance(width, bool) or not isinstance(width, (int, float)) or not (math.isfinite(width) and width > 0):
        raise ValueError(f"`width` must be a finite number > 0 (unit-cube units), got {width!r}.")
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 < floor < 1:
        raise ValueError(f"`floor` must be a number in (0, 1), got {floor!r}.")


def log_bump_mixture(
    U: Tensor, centers: Tensor, log_weights: Tensor, width: float, floor: float, grad: bool = False
) -> tuple[Tensor, Tensor | None]:
    r"""``log π`` of the floored bump mixture at unit-cube points, and its gradient.

    Args:
        U: ``B x C x d`` points in unit-cube coordinates.
        centers: ``B x K x d`` bump centers (unit cube).
        log_weights: ``B x K`` log weights (``-inf`` for a peer with no weight; each row's weights
            sum to 1 or all are ``-inf``).
        width, floor: ``s`` and ``λ``.
        grad: Also return ``∂ log π / ∂U`` (``B x C x d``).

    Returns:
        ``(log π, gradient)``: ``B x C`` and ``B x C x d`` (``None`` without ``grad``). A row
        without any weighted peer has ``log π = log λ`` everywhere (a constant: no influence).
    """
    diff = U.unsqueeze(-2) - centers.unsqueeze(-3)  # B x C x K x d
    e = log_weights.unsqueeze(-2) - (diff * diff).sum(-1) / (2.0 * width * width)  # B x C x K
    lm = torch.logsumexp(e, -1)  # B x C; -inf without weighted peers
    log_floor = math.log(floor)
    lp = torch.logaddexp(torch.full_like(lm, log_floor), lm + math.log1p(-floor))
    if not grad:
        return lp, None
    r = torch.softmax(e, -1).nan_to_num(0.0)  # all -inf rows: no gradient
    g_mix = -(r.unsqueeze(-1) * diff).sum(-2) / (width * width)  # ∂ log Σ / ∂U
    frac = torch.exp(lm + math.log1p(-floor) - lp)  # share of the mixture in π
    return lp, frac.unsqueeze(-1) * g_mix


class PeerOptimumPrior(Module):
    r"""A prior over the optimizer's location from peers' beliefs, as a BoTorch prior module.

    ``forward`` returns ``log π(x)`` (up to a constant) for use with BoTorch's
    ``PriorGuidedAcquisitionFunction(acqf, prior, log=True, prior_exponent=β/t)``
    on a log acquisition such as ``LogExpectedImprovement``.

    Args:
        centers: ``K x d`` peers' believed optimizers, in the domain's coordinates.
        bounds: ``2 x d`` domain (the bumps' width is relative to it).
        weights: ``K`` non-negative weights (``P_N``; default uniform); normalized.
        width: The bumps' standard deviation ``s`` in unit-cube units.
        floor: ``λ ∈ (0, 1)``: ``π ≥ λ`` everywhere.

    Example:
        >>> prior = PeerOptimumPrior.from_messages(rff, omegas, bounds)
        >>> acqf = PriorGuidedAcquisitionFunction(LogExpectedImprovement(gp, best_f), prior,
        ...                                       log=True, prior_exponent=2.0 / t)
    """

    lo: Tensor
    width_box: Tensor
    centers: Tensor
    log_weights: Tensor

    def __init__(
        self, centers: Tensor, bounds: Tensor, weights: Tensor | None = None, width: float = 0.1, floor: float = 0.05
    ) -> None:
        super().__init__()
        check_tensor("centers", centers)
        check_tensor("bounds", bounds)
        if centers.ndim != 2 or bounds.shape != (2, centers.shape[-1]):
            raise ValueError(
                f"`centers` must be K x d and `bounds` 2 x d, got {tuple(centers.shape)} and {tuple(bounds.shape)}."
            )
        _check_prior_args(width, floor)
        K = centers.shape[0]
        if weights is None:
            weights = torch.full((K,), 1.0 / max(K, 1), dtype=centers.dtype, device=centers.device)
        weights = torch.as_tensor(weights, dtype=centers.dtype, device=centers.device)
        if weights.shape != (K,) or not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
            raise ValueError(f"`weights` must be {K} finite numbers >= 0, got {weights.tolist()}.")
        total = weights.sum()
        log_w = torch.where(weights > 0, (weights / total.clamp_min(1e-300)).clamp_min(1e-300).log(), -torch.inf)
        self.register_buffer("lo", bounds[0])
        self.register_buffer("width_box", bounds[1] - bounds[0])
        self.register_buffer("centers", (centers - bounds[0]) / (bounds[1] - bounds[0]))
        self.register_buffer("log_weights", log_w)
        self.width, self.floor = float(width), float(floor)

    @classmethod
    def from_messages(
        cls,
        features: RandomFourierFeatures,
        omegas: Tensor,
        bounds: Tensor,
        weights: Tensor | None = None,
        width: float = 0.1,
        floor: float = 0.05,
        input_bounds: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> PeerOptimumPrior:
        r"""The prior whose centers are the maximizers of ``φ(x)ᵀω_k`` (``omegas``: ``K x M``,
        e.g. each peer's averaged messages), found by the batched maximizer."""
        centers, _ = maximize_rff_samples(
            features, omegas, Domain(bounds), generator=generator, input_bounds=input_bounds
        )
        return cls(centers, bounds, weights, width, floor)

    def forward(self, X: Tensor) -> Tensor:
        """``log π`` at ``batch_shape x q x d`` points: ``batch_shape x q``."""
        U = (X - self.lo) / self.width_box
        shape = U.shape[:-1]
        flat = U.reshape(1, -1, U.shape[-1])
        lp, _ = log_bump_mixture(flat, self.centers.unsqueeze(0), self.log_weights.unsqueeze(0), self.width, self.floor)
        return lp.reshape(shape)


class BatchedPriorGuided:
    r"""``α_b(x) + e_b · log π_b(x)`` for ``B`` agents at once: BoTorch's
    ``PriorGuidedAcquisitionFunction(α_b, PeerOptimumPrior_b, log=True, prior_exponent=e_b)``
    (``α`` a log acquisition, e.g. :class:`~fbo_torch.acquisition.batched.BatchedLogExpectedImprovement`).

    Args:
        acquisition: The agents' batched acquisition (``B x C x d -> B x C``).
        centers: ``B x K x d`` bump centers in the domain's coordinates.
        log_weights: ``B x K`` log weights (``-inf``: none).
        exponent: ``B`` exponents ``e_b`` (``β/t``).
        width, floor: As in :class:`PeerOptimumPrior`.
        unit: ``centers`` are in unit-cube coordinates already (not the domain's).
    """

    leading_dims = False

    def __init__(
        self,
        acquisition: BatchedAnalyticAcquisition,
        centers: Tensor,
        log_weights: Tensor,
        exponent: Tensor | float,
        width: float = 0.1,
        floor: float = 0.05,
        unit: bool = False,
    ) -> None:
        _check_prior_args(width, floor)
        post = acquisition.posterior
        self.acquisition = acquisition
        self.lo, self.box = post.lo, post.width
        self.centers = centers if unit else (centers - self.lo) / self.box
        self.log_weights = log_weights
        B = acquisition.batch_size
        self.exponent = torch.as_tensor(exponent, dtype=centers.dtype, device=centers.device).reshape(-1).expand(B)
        self.width, self.floor = float(width), float(floor)

    @property
    def batch_size(self) -> int:
        return self.acquisition.batch_size

    def _log_prior(self, X: Tensor, grad: bool) -> tuple[Tensor, Tensor | None]:
        lp, g = log_bump_mixture((X - self.lo) / self.box, self.centers, self.log_weights, self.width, self.floor, grad)
        return lp, (None if g is None else g / self.box)

    def __call__(self, X: Tensor) -> Tensor:
        """Values at ``B x C x d`` points: ``B x C``."""
        return self.acquisition(X) + self.exponent.unsqueeze(-1) * self._log_prior(X, False)[0]

    def value_and_grad(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Values (``B x C``) and input gradients (``B x C x d``), in closed form."""
        v, g = self.acquisition.value_and_grad(X)
        lp, gp = self._log_prior(X, True)
        assert gp is not None  # grad=True gives the gradient
        e = self.exponent.unsqueeze(-1)
        return v + e * lp, g + e.unsqueeze(-1) * gp

    def lengthscales(self) -> Tensor:
        return self.acquisition.lengthscales()

    def take(self, index: Tensor) -> BatchedPriorGuided:
        return BatchedPriorGuided(
            self.acquisition.take(index),
            self.centers[index],
            self.log_weights[index],
            self.exponent[index],
            self.width,
            self.floor,
            unit=True,
        )


__all__ = ["BatchedPriorGuided", "PeerOptimumPrior", "log_bump_mixture"]
