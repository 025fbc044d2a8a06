r"""Analytic acquisitions of many agents' GPs at once: ``B x C x d -> B x C``.

BoTorch's ``LogExpectedImprovement`` and ``UpperConfidenceBound`` are
``AcquisitionFunction`` modules of one model, maximized one at a time by
``optimize_acqf``. Here each is a plain function object over the posteriors of
``B`` agents' exact GPs (:class:`~fbo_torch.models.gp_posterior.BatchedGPPosterior`,
from :meth:`~fbo_torch.models.batched_gp.BatchedExactGP.posterior_moments`):
row ``b`` of its input goes to agent ``b``'s GP, so
:func:`~fbo_torch.optim.batched.maximize_batched` (or
:meth:`~fbo_torch.optim.domain.Domain.maximize`) maximizes every agent's
acquisition together. Values equal BoTorch's per agent to float64 round-off:
the same moments (variance clamped at ``1e-12``, BoTorch's ``min_var``), the
same ``log h(u)`` (:func:`log_h`, BoTorch's numerics from its public primitives). They have what the batched
maximizer uses, like the Thompson samples of
:class:`~fbo_torch.sampling.gp_paths.GPThompsonPaths`: closed-form input
gradients (``value_and_grad``), ``take`` (drop agents whose restarts have
converged), ``lengthscales`` (scaled line search) and ``graph_state``
(CUDA graphs).

This is where an agent's own GP may be searched with an improvement-based
acquisition instead of a Thompson sample (``own_acquisition`` in
:class:`~fbo_torch.federation.settings.MethodSettings`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from botorch.utils.probability.utils import log_ndtr, log_phi, ndtr, phi
from botorch.utils.safe_math import log1mexp
from torch import Tensor

from fbo_torch.models.gp_posterior import BatchedGPPosterior

#: BoTorch's ``_mean_and_sigma`` clamps the posterior variance at this value (original units).
MIN_VAR = 1e-12


def log_h(u: Tensor) -> Tensor:
    r"""``log h(u) = log(φ(u) + u Φ(u))``, accurate for ``|u|`` up to ``1e100`` in float64: LogEI's core.

    The numerics of BoTorch's ``LogExpectedImprovement`` (Ament et al. 2023), written here
    from BoTorch's public primitives because BoTorch keeps its own helper private: the
    direct formula for ``u > -1``; below, ``log φ(u) + log(1 − exp(w))`` with
    ``w = log(|u| Φ(u) / φ(u))`` from the scaled complementary error function, and the
    leading order ``−2 log|u|`` of that term beyond ``−1/√ε`` (``1e6`` in float64,
    ``1e3`` in float32). Every branch's input is masked so that gradients stay finite.
    ``tests/acquisition/test_batched.py`` checks it against BoTorch's LogEI.

    Args:
        u: The standardized improvement ``(μ − best_f) / σ`` (float32 or float64), any shape.

    Returns:
        ``log h(u)``, the shape of ``u``.
    """
    if u.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"`u` must be float32 or float64, got {u.dtype}.")
    bound = -1.0
    u_upper = u.masked_fill(u < bound, bound)
    upper = (phi(u_upper) + u_upper * ndtr(u_upper)).log()
    eps = -1e6 if u.dtype == torch.float64 else -1e3
    u_lower = u.masked_fill(u > bound, bound)
    u_eps = u_lower.masked_fill(u < eps, eps)
    w = torch.log(torch.special.erfcx(-(2**-0.5) * u_eps) * u_eps.abs()) + math.log(math.pi / 2) / 2
    lower = log_phi(u) + torch.where(u > eps, log1mexp(w), -2 * u_lower.abs().log())
    return torch.where(u > bound, upper, lower)


class BatchedAnalyticAcquisition:
    r"""Base of the batched analytic acquisitions: ``B`` GP posteriors and one ``B``-vector
    parameter (``best_f`` or ``beta``). Subclasses define ``_value`` (and its derivatives)."""

    leading_dims = False
    _PARAM = ""

    def __init__(self, posterior: BatchedGPPosterior, param: Tensor | float) -> None:
        if not isinstance(posterior, BatchedGPPosterior):
            raise ValueError(
                f"`posterior` must be a BatchedGPPosterior (gp.posterior_moments()), got {type(posterior).__name__}."
            )
        B = posterior.batch_size
        like = posterior.alpha
        param = torch.as_tensor(param, dtype=like.dtype, device=like.device)
        if param.ndim > 1 or param.numel() not in (1, B):
            raise ValueError(
                f"`{self._PARAM}` must be a number or a tensor of {B} values (one per agent), "
                f"got shape {tuple(param.shape)}."
            )
        self.posterior = posterior
        self.param = param.reshape(-1).expand(B)

    @property
    def batch_size(self) -> int:
        return self.posterior.batch_size

    def _sigma(self, var: Tensor) -> Tensor:
        return var.clamp_min(MIN_VAR).sqrt()

    def _value(self, mean: Tensor, sigma: Tensor, grad: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """``(value, ∂value/∂mean, ∂value/∂σ)`` at ``B x C`` moments (the derivatives ``None`` without ``grad``)."""
        raise NotImplementedError

    def __call__(self, X: Tensor) -> Tensor:
        """Values at ``B x C x d`` points: ``B x C``."""
        mean, var, _, _ = self.posterior.moments(X)
        return self._value(mean, self._sigma(var), grad=False)[0]

    def value_and_grad(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Values (``B x C``) and input gradients (``B x C x d``), in closed form."""
        mean, var, d_mean, d_var = self.posterior.moments(X, grad=True)
        sigma = self._sigma(var)
        value, dv_dmean, dv_dsigma = self._value(mean, sigma, grad=True)
        # grad=True gives every derivative
        assert d_mean is not None and d_var is not None and dv_dmean is not None and dv_dsigma is not None
        # σ = √max(var, min_var): ∂σ = ∂var / 2σ above the clamp, 0 below (autograd's convention)
        dsigma_dvar = torch.where(var > MIN_VAR, 0.5 / sigma, 0.0)
        g = dv_dmean.unsqueeze(-1) * d_mean + (dv_dsigma * dsigma_dvar).unsqueeze(-1) * d_var
        return value, g

    def lengthscales(self) -> Tensor:
        """Each GP's lengthscales in input coordinates (``B x d``)."""
        return self.posterior.lengthscales()

    def take(self, index: Tensor) -> BatchedAnalyticAcquisition:
        """The acquisitions ``index`` (``m`` indices into the batch, repeats allowed) as a batch of ``m``."""
        return type(self)(self.posterior.take(index), self.param[index])

    def graph_state(self) -> tuple[tuple[Tensor, ...], tuple[Any, ...]]:
        tensors, _ = self.posterior.graph_state()
        return (*tensors, self.param), ()

    @classmethod
    def from_graph_state(cls, tensors: tuple[Tensor, ...], config: tuple[Any, ...]) -> BatchedAnalyticAcquisition:
        return cls(BatchedGPPosterior.from_graph_state(tensors[:-1], ()), tensors[-1])


class BatchedLogExpectedImprovement(BatchedAnalyticAcquisition):
    r"""``log EI_b(x) = log h((μ_b(x) − f*_b)/σ_b(x)) + log σ_b(x)``, ``h(u) = φ(u) + uΦ(u)``:
    BoTorch's ``LogExpectedImprovement(model_b, best_f=f*_b)`` for ``B`` agents at once.

    Args:
        posterior: The agents' posteriors (``gp.posterior_moments()``).
        best_f: ``B`` incumbents (e.g. each agent's best valid observation), or one number
            for all, in the original outcome units.

    The gradient: ``∂ log h/∂u = Φ(u)/h(u) = exp(log Φ(u) − log h(u))`` (both logarithms
    accurate far into the tails), ``∂u = (∂μ − u ∂σ)/σ``, plus ``∂σ/σ``.
    """

    _PARAM = "best_f"

    def __init__(self, posterior: BatchedGPPosterior, best_f: Tensor | float) -> None:
        super().__init__(posterior, best_f)

    @property
    def best_f(self) -> Tensor:
        return self.param

    def _value(self, mean: Tensor, sigma: Tensor, grad: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
        u = (mean - self.param.unsqueeze(-1)) / sigma
        log_h_u = log_h(u)
        value = log_h_u + sigma.log()
        if not grad:
            return value, None, None
        dlogh = torch.exp(log_ndtr(u) - log_h_u)  # Φ(u)/h(u)
        inv_sigma = 1.0 / sigma
        return value, dlogh * inv_sigma, (1.0 - dlogh * u) * inv_sigma


class BatchedUpperConfidenceBound(BatchedAnalyticAcquisition):
    r"""``UCB_b(x) = μ_b(x) + √β σ_b(x)``: BoTorch's ``UpperConfidenceBound(model_b, beta)`` for
    ``B`` agents at once.

    Args:
        posterior: The agents' posteriors (``gp.posterior_moments()``).
        beta: ``β ≥ 0``, one number or ``B`` values.
    """

    _PARAM = "beta"

    def __init__(self, posterior: BatchedGPPosterior, beta: Tensor | float) -> None:
        if not isinstance(beta, Tensor) and not (isinstance(beta, (int, float)) and beta >= 0):
            raise ValueError(f"`beta` must be a number >= 0, got {beta!r}.")
        super().__init__(posterior, beta)

    @property
    def beta(self) -> Tensor:
        return self.param

    def _value(self, mean: Tensor, sigma: Tensor, grad: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
        root = self.param.sqrt().unsqueeze(-1)
        value = mean + root * sigma
        if not grad:
            return value, None, None
        return value, torch.ones_like(mean), root.expand_as(sigma)


__all__ = ["BatchedAnalyticAcquisition", "BatchedLogExpectedImprovement", "BatchedUpperConfidenceBound"]
