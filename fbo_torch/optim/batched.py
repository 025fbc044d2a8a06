r"""Maximize many independent functions at once: one per agent (or per run).

Every FTS / DP-FTS-DE round asks each of ``B`` agents to maximize its own
sampled function. Instead of ``B`` calls to ``optimize_acqf``, the functions
are evaluated together: ``fn`` maps ``B x C x d`` candidates (``C`` per
problem) to ``B x C`` values in one tensor computation.

:func:`maximize_batched` does what ``optimize_acqf`` does — score many raw
random points, keep the best as restarts, refine them with a gradient method —
for all ``B`` problems together:

* raw scoring is chunked so that ``B x chunk`` points per call stay within a
  memory budget;
* refinement uses BoTorch's batched L-BFGS-B (``fmin_l_bfgs_b_batched``:
  every problem keeps its own line search and stopping rule) or, on request or
  when that is unavailable, a projected Adam loop that runs entirely on the
  tensors' device with no host synchronization.

Problems may have their own boxes (``B x 2 x d`` bounds); optimization runs in
each problem's unit cube so one set of bounds serves them all.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from fbo_torch.utils.validation import check_int, check_tensor

try:  # BoTorch's batched L-BFGS-B (guarded by BoTorch for supported SciPy versions)
    from botorch.optim.batched_lbfgs_b import fmin_l_bfgs_b_batched
except Exception:  # pragma: no cover - depends on the SciPy version
    fmin_l_bfgs_b_batched = None

BatchedFunction = Callable[[Tensor], Tensor]

#: Default cap on points per call of ``fn`` during raw scoring (B x chunk).
DEFAULT_MAX_POINTS = 2**11  # B x chunk points per call; larger chunks page-fault (mmap) on every call


def _expand_bounds(bounds: Tensor, batch_size: int | None) -> Tensor:
    check_tensor("bounds", bounds)
    if bounds.ndim == 2:
        if batch_size is None:
            raise ValueError("`batch_size` is required when `bounds` is 2 x d (shared by all problems).")
        bounds = bounds.unsqueeze(0).expand(batch_size, 2, bounds.shape[-1])
    elif bounds.ndim != 3 or bounds.shape[1] != 2:
        raise ValueError(f"`bounds` must be 2 x d or B x 2 x d, got shape {tuple(bounds.shape)}.")
    elif batch_size is not None and bounds.shape[0] != batch_size:
        raise ValueError(f"`bounds` has {bounds.shape[0]} problems but batch_size = {batch_size}.")
    if not (bounds[:, 1] > bounds[:, 0]).all():
        raise ValueError("`bounds`: every upper bound must exceed its lower bound.")
    return bounds


def _uniform(shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None) -> Tensor:
    if generator is None:
        return torch.rand(shape, dtype=like.dtype, device=like.device)
    return torch.rand(shape, dtype=like.dtype, device=generator.device, generator=generator).to(like.device)


def score_chunked(fn: BatchedFunction, X: Tensor, max_points: int = DEFAULT_MAX_POINTS) -> Tensor:
    r"""Evaluate ``fn`` on ``B x C x d`` in chunks of the ``C`` dimension (no grad).

    The result equals ``fn(X)``; only peak memory changes.
    """
    B, C = X.shape[0], X.shape[1]
    chunk = max(1, max_points // max(B, 1))
    with torch.no_grad():
        if chunk >= C:
            return fn(X)
        return torch.cat([fn(X[:, s : s + chunk]) for s in range(0, C, chunk)], dim=1)


def maximize_discrete(
    fn: BatchedFunction, candidates: Tensor, batch_size: int, max_points: int = DEFAULT_MAX_POINTS
) -> tuple[Tensor, Tensor]:
    r"""Exact maximization over a finite domain for ``B`` problems.

    Args:
        fn: ``B x C x d -> B x C``.
        candidates: ``C x d`` finite domain (shared) or ``B x C x d``.
        batch_size: ``B``.
        max_points: Cap on ``B x chunk`` points per call.

    Returns:
        ``(X_best, values)``: ``B x d`` maximizers and ``B`` maximal values.
    """
    check_tensor("candidates", candidates)
    B = check_int("batch_size", batch_size, minimum=1)
    if candidates.ndim == 2:
        candidates = candidates.unsqueeze(0).expand(B, *candidates.shape)
    vals = score_chunked(fn, candidates, max_points)
    best, idx = vals.max(dim=-1)
    X_best = candidates.gather(1, idx.view(B, 1, 1).expand(B, 1, candidates.shape[-1])).squeeze(1)
    return X_best, best


def maximize_batched(
    fn: BatchedFunction,
    bounds: Tensor,
    batch_size: int | None = None,
    raw_samples: int = 1024,
    num_restarts: int = 8,
    refine: str | None = "lbfgsb",
    maxiter: int = 200,
    lr: float = 0.01,
    max_points: int = DEFAULT_MAX_POINTS,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Multi-start maximization of ``B`` independent functions at once.

    Args:
        fn: Batched function ``B x C x d -> B x C`` (differentiable in its
            input for gradient refinement). Problem ``b`` must only depend on
            row ``b`` of the input.
        bounds: ``2 x d`` (shared) or ``B x 2 x d`` per-problem boxes.
        batch_size: ``B`` (required with shared bounds).
        raw_samples: Uniform random points scored per problem.
        num_restarts: Best raw points refined per problem.
        refine: ``"lbfgsb"`` (BoTorch's batched L-BFGS-B), ``"adam"`` (projected
            Adam on-device, fixed ``maxiter`` steps), or ``None`` (raw points only).
        maxiter: Iteration cap for the refinement.
        lr: Adam step size in unit-cube coordinates.
        max_points: Cap on ``B x chunk`` points per ``fn`` call while scoring.
        generator: Optional generator for the raw points.

    Returns:
        ``(X_best, values)``: ``B x d`` maximizers inside their boxes and ``B``
        values ``fn`` takes there.
    """
    bounds = _expand_bounds(bounds, batch_size)
    B, _, d = bounds.shape
    raw_samples = check_int("raw_samples", raw_samples, minimum=1)
    k = min(check_int("num_restarts", num_restarts, minimum=1), raw_samples)
    lo, width = bounds[:, 0:1, :], bounds[:, 1:2, :] - bounds[:, 0:1, :]

    def fn_unit(U: Tensor) -> Tensor:
        return fn(lo + U * width)

    U_raw = _uniform((B, raw_samples, d), bounds, generator)
    vals = score_chunked(fn_unit, U_raw, max_points)
    top_vals, top_idx = vals.topk(k, dim=-1)
    U0 = U_raw.gather(1, top_idx.unsqueeze(-1).expand(B, k, d))

    if refine is None:
        U_fin, v_fin = U0, top_vals
    elif refine == "lbfgsb" and fmin_l_bfgs_b_batched is not None:
        U_fin = _refine_lbfgsb(fn_unit, U0, maxiter)
        with torch.no_grad():
            v_fin = fn_unit(U_fin)
    elif refine in ("lbfgsb", "adam"):
        U_fin = _refine_adam(fn_unit, U0, maxiter, lr)
        with torch.no_grad():
            v_fin = fn_unit(U_fin)
    else:
        raise ValueError(f"`refine` must be 'lbfgsb', 'adam' or None, got {refine!r}.")
    # keep the raw point where refinement did not improve (Adam is not monotone)
    better = v_fin >= top_vals
    U_fin = torch.where(better.unsqueeze(-1), U_fin, U0)
    v_fin = torch.where(better, v_fin, top_vals)
    best, j = v_fin.max(dim=-1)
    U_best = U_fin.gather(1, j.view(B, 1, 1).expand(B, 1, d)).squeeze(1)
    X_best = lo.squeeze(1) + U_best * width.squeeze(1)
    return X_best.detach(), best.detach()


def _refine_lbfgsb(fn_unit: BatchedFunction, U0: Tensor, maxiter: int) -> Tensor:
    """BoTorch's batched L-BFGS-B on the B*k problems, each in [0, 1]^d."""
    B, k, d = U0.shape
    current = U0.detach().clone().reshape(B * k, d)

    def func(x: np.ndarray, batch_indices: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        idx = torch.as_tensor(np.asarray(batch_indices if batch_indices is not None else range(B * k)))
        idx = idx.to(current.device)
        current[idx] = torch.from_numpy(x.reshape(-1, d)).to(current)
        U = current.reshape(B, k, d).clone().requires_grad_(True)
        with torch.enable_grad():
            vals = fn_unit(U)
            (grad,) = torch.autograd.grad(vals.sum(), U)
        f = (-vals).detach().reshape(-1)[idx]
        g = (-grad).detach().reshape(B * k, d)[idx]
        return f.cpu().numpy().astype(np.float64), g.cpu().numpy().astype(np.float64).reshape(x.shape)

    x0 = current.cpu().numpy().astype(np.float64)
    xs, _, _ = fmin_l_bfgs_b_batched(
        func, x0, bounds=[(0.0, 1.0)] * d, maxiter=maxiter, pass_batch_indices=True
    )
    xs = np.asarray(xs).reshape(B * k, d)
    return torch.from_numpy(xs).to(U0).clamp(0.0, 1.0).reshape(B, k, d)


def _refine_adam(fn_unit: BatchedFunction, U0: Tensor, maxiter: int, lr: float) -> Tensor:
    """Projected Adam on every restart at once; per-coordinate steps keep problems independent.

    The step size decays geometrically from ``lr`` to ``lr/100`` so the last
    steps converge tightly onto the local maximum. No host synchronization
    happens inside the loop.
    """
    U = U0.detach().clone().requires_grad_(True)
    opt = torch.optim.Adam([U], lr=lr)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.01 ** (1.0 / max(maxiter, 1)))
    with torch.enable_grad():
        for _ in range(maxiter):
            opt.zero_grad(set_to_none=True)
            loss = -fn_unit(U).sum()
            loss.backward()
            opt.step()
            sched.step()
            with torch.no_grad():
                U.clamp_(0.0, 1.0)
    return U.detach()
