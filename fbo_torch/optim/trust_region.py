r"""Trust regions for many agents at once: TuRBO-1's box, success and failure rules, batched.

A GP's expected improvement (and a Thompson sample) is largest where the
posterior variance is: on a small budget that sends an agent to the corners
of its box, or pins a coordinate to a bound the model extrapolates towards
(boundary over-exploration; Siivola et al., 2018). TuRBO (Eriksson et al.,
NeurIPS 2019) searches only a box around the incumbent whose side grows after
consecutive improvements and shrinks after consecutive failures.
:class:`TrustRegions` keeps that state for ``B`` agents as tensors and
gives every agent's box (``B x 2 x d``, the ``region_bounds`` of
:meth:`~fbo_torch.optim.domain.Domain.maximize`), following BoTorch's TuRBO
tutorial: side ``L`` scaled per dimension by the GP's lengthscales
(``L·ℓ_i / (Πℓ_j)^{1/d}``), ``L ∈ [2⁻⁷, 1.6]`` starting at 0.8, doubled after
``3`` successes in a row, halved after ``max(4, d)`` failures in a row; a
success is an improvement of at least ``1e-3·|best|``. A region that shrinks
below its minimum starts again at 0.8 around the incumbent (TuRBO restarts
its whole model; an agent keeps its data).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class TrustRegions:
    r"""TuRBO-1 trust regions of ``B`` agents.

    Args:
        batch: ``B``. dim: ``d``.
        dtype / device: Of the state tensors.
        length_init / length_min / length_max: The side ``L``'s start, floor (restart
            below it) and cap, in unit-cube units.
        success_tolerance: Successes in a row that double ``L``.
        failure_tolerance: Failures in a row that halve it (default ``max(4, d)``).
    """

    def __init__(self, batch: int, dim: int, dtype: torch.dtype = torch.float64, device=None,
                 length_init: float = 0.8, length_min: float = 0.5**7, length_max: float = 1.6,
                 success_tolerance: int = 3, failure_tolerance: int | None = None) -> None:
        self.dim = dim
        self.length_init, self.length_min, self.length_max = length_init, length_min, length_max
        self.success_tolerance = success_tolerance
        self.failure_tolerance = max(4, dim) if failure_tolerance is None else failure_tolerance
        self.length = torch.full((batch,), length_init, dtype=dtype, device=device)
        self.successes = torch.zeros(batch, dtype=torch.long, device=device)
        self.failures = torch.zeros(batch, dtype=torch.long, device=device)
        self.best = torch.full((batch,), -math.inf, dtype=dtype, device=device)

    def observe(self, y: Tensor) -> None:
        r"""Update every region with its agent's new observation ``y`` (``B``; NaN: a failed
        evaluation, which counts as a failure). The first call only sets the incumbents."""
        first = torch.isinf(self.best) & (self.best < 0)
        ok = torch.isfinite(y)
        improved = ok & (y > self.best + 1e-3 * self.best.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0))
        self.successes = torch.where(improved, self.successes + 1, torch.zeros_like(self.successes))
        self.failures = torch.where(improved, torch.zeros_like(self.failures), self.failures + 1)
        grow = self.successes >= self.success_tolerance
        shrink = self.failures >= self.failure_tolerance
        length = torch.where(grow, (2.0 * self.length).clamp_max(self.length_max), self.length)
        length = torch.where(shrink, length / 2.0, length)
        length = torch.where(length < self.length_min, torch.full_like(length, self.length_init), length)
        self.length = torch.where(first, self.length, length)
        self.successes = torch.where(grow | first, torch.zeros_like(self.successes), self.successes)
        self.failures = torch.where(shrink | first, torch.zeros_like(self.failures), self.failures)
        self.best = torch.where(ok, torch.maximum(self.best, y), self.best)

    def set_best(self, best: Tensor) -> None:
        """Start from ``B`` incumbents (e.g. the best initial observations)."""
        self.best = best.to(self.best)

    def bounds(self, center: Tensor, lengthscales: Tensor | None = None) -> Tensor:
        r"""``B x 2 x d`` boxes in unit-cube coordinates around ``center`` (``B x d``, unit cube),
        each side ``L·w_i`` with ``w`` the lengthscales (``B x d``, any units) over their geometric
        mean (1 without lengthscales), clipped to ``[0, 1]``."""
        if lengthscales is None:
            w = torch.ones_like(center)
        else:
            w = lengthscales / lengthscales.log().mean(-1, keepdim=True).exp()
        half = 0.5 * self.length.unsqueeze(-1) * w
        return torch.stack([(center - half).clamp(0.0, 1.0), (center + half).clamp(0.0, 1.0)], dim=1)

    def state_dict(self) -> dict:
        return {"length": self.length, "successes": self.successes, "failures": self.failures, "best": self.best}

    def load_state_dict(self, state: dict) -> None:
        dev = self.length.device
        self.length = state["length"].to(dev)
        self.successes = state["successes"].to(dev)
        self.failures = state["failures"].to(dev)
        self.best = state["best"].to(dev)


__all__ = ["TrustRegions"]
