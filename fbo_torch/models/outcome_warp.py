r"""Monotone output warps for many agents' GPs, chosen per agent by the evidence.

Black-box values are often heavy-tailed: a shifted Sphere spans ``1e0 … 1e5``
over its box, Rosenbrock ``1e0 … 1e9``. A GP on such values (even
standardized, as BoTorch's ``Standardize`` does) spends its signal variance
on the few huge values and cannot resolve the region that matters, near the
best observation: with BoTorch's noise floor (``σ² ≥ 10⁻⁴`` standardized) the
last few orders of magnitude of improvement look like noise. The fix used by
HEBO (Cowen-Rivers et al., 2022: power transforms of the outputs) and by
warped GPs (Snelson et al., 2004) is to model an increasing transform
``z = w(y)`` of the observations instead; an increasing ``w`` keeps the
maximizer, the ordering and every Thompson sample's argmax meaningful.

Which warp, if any, is decided per agent by the marginal likelihood of the
*original* observations: with ``z = w(y)`` standardized to ``z̃ = (z − m)/s``,

.. math::

    \log p(y) = \log p_{GP}(\tilde z) + \sum_i \log w'(y_i) - n \log s,

so a warp wins only where it explains the data better than the identity
(a smooth bowl such as a shifted Sphere becomes nearly quadratic in ``log``
of its gap; Ackley or Weierstrass keep the identity). The family is the log of
the gap to the best observation (for maximization),

.. math::

    w_c(y) = -\log\Bigl(\frac{y_{\max} - y}{y_{\max} - y_{\min}} + c\Bigr),

for a few offsets ``c`` (the identity is ``c → ∞``): it stretches the values
near the best and compresses the far tail, the more so the smaller ``c``.
The offsets are relative to the observed range, so the family is invariant to
affine changes of units. All candidates of all agents are fitted as one batch
(:class:`~fbo_torch.models.batched_gp.BatchedExactGP`), so a warped refit costs
``K`` times an unwarped one in arithmetic and nothing in kernel launches.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Offsets ``c`` of the log-gap warps tried besides the identity (relative to the observed range).
DEFAULT_OFFSETS = (1.0, 0.1, 0.01)


def log_gap_warps(y: Tensor, mask: Tensor, offsets: tuple[float, ...] = DEFAULT_OFFSETS) -> tuple[Tensor, Tensor]:
    r"""The identity and the log-gap warps of ``B`` agents' observations.

    Args:
        y: ``B x n`` observations (to be maximized); entries where ``mask`` is False are ignored.
        mask: ``B x n`` booleans, the valid observations.
        offsets: The offsets ``c`` (each ``> 0``).

    Returns:
        ``(Z, log_jac)``: ``K x B x n`` warped observations (``K = 1 + len(offsets)``; index
        0 is the identity; 0 where ``mask`` is False) and ``K x B`` sums of ``log w'(y_i)``
        over each agent's valid observations. An agent whose valid observations are all equal
        (or has fewer than two) gets the identity in every slot.
    """
    if y.shape != mask.shape or y.ndim != 2:
        raise ValueError(f"`y` and `mask` must both be B x n, got {tuple(y.shape)} and {tuple(mask.shape)}.")
    if not offsets or any(not (c > 0) for c in offsets):
        raise ValueError(f"`offsets` must be numbers > 0, got {offsets!r}.")
    y0 = torch.where(mask, y, 0.0)
    hi = torch.where(mask, y, -torch.inf).amax(-1, keepdim=True)
    lo = torch.where(mask, y, torch.inf).amin(-1, keepdim=True)
    rng = hi - lo
    ok = torch.isfinite(rng) & (rng > 0)  # B x 1
    rng_safe = torch.where(ok, rng, torch.ones_like(rng))
    gap = torch.where(mask & ok, (hi - y0) / rng_safe, 0.0)  # B x n in [0, 1]
    c = torch.tensor(offsets, dtype=y.dtype, device=y.device).view(-1, 1, 1)  # K' x 1 x 1
    shifted = gap.unsqueeze(0) + c
    warped = -torch.log(shifted)
    # w'(y) = 1 / (range · (gap + c))
    log_jac = torch.where(mask.unsqueeze(0), -torch.log(shifted) - torch.log(rng_safe).unsqueeze(0), 0.0).sum(-1)
    warped = torch.where((mask & ok).unsqueeze(0), warped, y0.unsqueeze(0))
    log_jac = torch.where(ok.view(1, -1), log_jac, 0.0)
    Z = torch.cat([y0.unsqueeze(0), warped], 0)
    log_jac = torch.cat([torch.zeros_like(log_jac[:1]), log_jac], 0)
    return Z, log_jac


__all__ = ["DEFAULT_OFFSETS", "log_gap_warps"]
