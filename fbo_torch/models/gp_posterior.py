r"""The posterior mean and variance of a batch of exact GPs, as plain batched tensors.

:meth:`~fbo_torch.models.batched_gp.BatchedExactGP.posterior_moments` factors
each agent's GP once (GPyTorch's prediction caches: the Cholesky factor ``L`` of
``K + σ²I`` and ``α = (K + σ²I)⁻¹(y − c)``) into a
:class:`BatchedGPPosterior`; evaluating it at ``B x C x d`` points is then a
kernel matrix, one triangular solve for the variance and, with the input
gradient, a second one — the moments an analytic acquisition
(:mod:`fbo_torch.acquisition.batched`) is built from. Values are those of
BoTorch's ``SingleTaskGP.posterior(X)`` (the latent function, no observation
noise) in the original outcome units, per agent.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from fbo_torch.utils.batch_invariant import matmul


class FactoredGPs(NamedTuple):
    r"""``B`` exact GPs at fixed hyperparameters, factored: what a posterior or a path is built from.

    ``bounds``: ``2 x d`` domain box; ``X``: ``B x n x d`` normalized training inputs;
    ``y``: ``B x n`` standardized outcomes; ``mask``: ``B x n`` bool, the valid observations;
    ``L``: ``B x n x n`` Cholesky factor of ``K + σ²I``; ``hyperparameters``: constrained
    ``lengthscale`` (``B x d``), ``outputscale``, ``noise`` and ``mean`` (``B``);
    ``y_mean``, ``y_std``: ``B`` each, the outcome standardization.
    """

    bounds: Tensor
    X: Tensor
    y: Tensor
    mask: Tensor
    L: Tensor
    hyperparameters: dict[str, Tensor]
    y_mean: Tensor
    y_std: Tensor


class BatchedGPPosterior:
    r"""``B`` exact GP posteriors, callable on ``B x C x d`` domain points.

    With normalized inputs ``x̃ = (x − lo)/width``, ``k_b(x) = σ_f² exp(−½‖(x̃ − X̃_b)/ℓ_b‖²)``
    on agent ``b``'s valid observations (padded or failed ones contribute nothing),
    standardized mean ``c_b + k_b(x)ᵀα_b`` and variance ``σ_f² − ‖L_b⁻¹k_b(x)‖²``,
    returned as ``y_mean + y_std · mean`` and ``y_std² · variance``.

    Build it with ``gp.posterior_moments()`` (or :meth:`from_factor`).

    Args:
        lo: ``d`` lower bounds of the domain (the normalization's offset).
        width: ``d`` widths of the domain (the normalization's scale).
        Xt: ``B x n x d`` normalized training inputs.
        mask: ``B x n`` booleans: valid observations.
        L: ``B x n x n`` Cholesky factors of ``K + σ²I`` on the valid observations.
        alpha: ``B x n`` weights ``(K + σ²I)⁻¹(y − c)`` (0 at invalid observations).
        ls: ``B x d`` lengthscales (normalized units).
        os_: ``B`` outputscales ``σ_f²``.
        mean: ``B`` constant means ``c`` (standardized units).
        y_mean: ``B`` means of the outcome standardization.
        y_std: ``B`` standard deviations of the outcome standardization.
    """

    #: ``maximize_batched`` folds the line search's candidates into ``C`` (the per-agent
    #: matrices would be copied for every leading batch).
    leading_dims = False

    # a pure function of tensors: maximizers may capture it as a CUDA graph
    _FIELDS = ("lo", "width", "Xt", "mask", "L", "alpha", "ls", "os", "mean", "y_mean", "y_std")

    def __init__(
        self,
        lo: Tensor,
        width: Tensor,
        Xt: Tensor,
        mask: Tensor,
        L: Tensor,
        alpha: Tensor,
        ls: Tensor,
        os_: Tensor,
        mean: Tensor,
        y_mean: Tensor,
        y_std: Tensor,
    ) -> None:
        self.lo, self.width, self.Xt, self.mask, self.L, self.alpha = lo, width, Xt, mask, L, alpha
        self.ls, self.os, self.mean, self.y_mean, self.y_std = ls, os_, mean, y_mean, y_std

    @classmethod
    def from_factor(cls, gp: FactoredGPs) -> BatchedGPPosterior:
        """The posteriors of factored GPs (two triangular solves)."""
        hp = gp.hyperparameters
        r = torch.where(gp.mask, gp.y - hp["mean"].unsqueeze(-1), 0.0).unsqueeze(-1)
        # two triangular solves: torch.cholesky_solve checks for errors on the host (a synchronization)
        z = torch.linalg.solve_triangular(gp.L, r, upper=False)
        alpha = torch.linalg.solve_triangular(gp.L.mT, z, upper=True).squeeze(-1)
        alpha = torch.where(gp.mask, alpha, 0.0)
        lo, width = gp.bounds[0], gp.bounds[1] - gp.bounds[0]
        return cls(
            lo, width, gp.X, gp.mask, gp.L, alpha, hp["lengthscale"], hp["outputscale"], hp["mean"], gp.y_mean, gp.y_std
        )

    @property
    def batch_size(self) -> int:
        return self.L.shape[0]

    def lengthscales(self) -> Tensor:
        """Each GP's lengthscales in input coordinates (``B x d``): the scale on which its posterior varies."""
        return self.ls * self.width

    def take(self, index: Tensor) -> BatchedGPPosterior:
        """The posteriors ``index`` (``m`` indices into the batch, repeats allowed) as a batch of ``m``."""
        return type(self).from_graph_state(
            tuple(getattr(self, f) if f in ("lo", "width") else getattr(self, f)[index] for f in self._FIELDS), ()
        )

    def graph_state(self) -> tuple[tuple[Tensor, ...], tuple[Any, ...]]:
        return tuple(getattr(self, f) for f in self._FIELDS), ()

    @classmethod
    def from_graph_state(cls, tensors: tuple[Tensor, ...], config: tuple[Any, ...]) -> BatchedGPPosterior:
        return cls(*tensors)

    def moments(self, X: Tensor, grad: bool = False) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        r"""Posterior mean and variance at ``B x C x d`` points, and their input gradients.

        Args:
            X: ``B x C x d`` points of the domain (row ``b`` for GP ``b``).
            grad: Also return the gradients ``∂mean/∂x`` and ``∂variance/∂x`` in closed form.

        Returns:
            ``(mean, variance, d_mean, d_variance)``: ``B x C`` each, gradients ``B x C x d``
            (``None`` without ``grad``); original outcome units. The variance is not
            clamped (it may round to slightly below 0 at an observed point).

        With ``a = x̃/ℓ``, ``b_i = X̃_i/ℓ`` and ``q = 1/(ℓ · width)``: ``∂k_i/∂x = k_i (b_i − a) ⊙ q``,
        so ``∂mean = [(k ⊙ α)ᵀb − (kᵀα) a] ⊙ q`` and, with ``w = (K + σ²I)⁻¹k`` (the second
        solve), ``∂variance = −2 [(k ⊙ w)ᵀb − (kᵀw) a] ⊙ q``.
        """
        q = (1.0 / (self.ls * self.width)).unsqueeze(-2)  # B x 1 x d: x − lo → x̃/ℓ
        a = (X - self.lo) * q  # B x C x d
        b = self.Xt / self.ls.unsqueeze(-2)  # B x n x d
        # ‖a − b‖² = ‖a‖² + ‖b‖² − 2aᵀb (B x C x n memory, not B x C x n x d); +inf for invalid
        # observations, so their kernel values are exactly 0
        bb = torch.where(self.mask, (b * b).sum(-1), torch.inf).unsqueeze(-2)  # B x 1 x n
        D = (a * a).sum(-1, keepdim=True) + bb - 2.0 * matmul(a, b.mT)
        k = self.os.view(-1, 1, 1) * torch.exp(-0.5 * D.clamp_min(0.0))  # B x C x n
        ka = matmul(k, self.alpha.unsqueeze(-1))  # B x C x 1
        v = torch.linalg.solve_triangular(self.L.mT, k, upper=True, left=False)  # rows: L⁻¹k
        var_s = self.os.unsqueeze(-1) - (v * v).sum(-1)
        ys = self.y_std.unsqueeze(-1)
        mean = self.y_mean.unsqueeze(-1) + ys * (self.mean.unsqueeze(-1) + ka.squeeze(-1))
        var = ys * ys * var_s
        if not grad:
            return mean, var, None, None
        w = torch.linalg.solve_triangular(self.L, v, upper=False, left=False)  # rows: K⁻¹k
        kw = torch.stack([k * self.alpha.unsqueeze(-2), k * w])  # 2 x B x C x n
        s = kw.sum(-1, keepdim=True)  # [kᵀα, kᵀw]
        g = (kw @ b - s * a) * q  # 2 x B x C x d
        ys3 = ys.unsqueeze(-1)
        return mean, var, ys3 * g[0], (-2.0 * ys3 * ys3) * g[1]

    def __call__(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """``(mean, variance)`` at ``B x C x d`` points: ``B x C`` each, original outcome units."""
        mean, var, _, _ = self.moments(X)
        return mean, var


__all__ = ["BatchedGPPosterior", "FactoredGPs"]
