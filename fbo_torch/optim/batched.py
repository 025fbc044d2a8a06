r"""Maximize many independent functions at once: one per agent (or per run).

Every FTS / DP-FTS-DE round asks each of ``B`` agents to maximize its own
sampled function. Instead of ``B`` calls to ``optimize_acqf``, the functions
are evaluated together: ``fn`` maps ``B x C x d`` candidates (``C`` per
problem) to ``B x C`` values in one tensor computation.

:func:`maximize_batched` does what ``optimize_acqf`` does, for all ``B``
problems together and without reading a device value on the host:

* **raw points**: a scrambled Sobol set (BoTorch draws its raw samples from
  Sobol too), shifted modulo 1 per problem by a random vector from the
  problem's key (a Cranley–Patterson rotation), so every agent searches its
  own low-discrepancy set and the draw is reproducible on any device;
* **restart selection**: BoTorch's Boltzmann rule (``initialize_q_batch``:
  sample without replacement with probability ``∝ exp(η·z)`` of the
  standardized values, always keeping the best), sampled exactly by
  Gumbel-top-k from the problem's key. BoTorch's implementation tests
  ``std == 0`` on the host and samples from the global RNG;
* **refinement**: batched box-constrained BFGS
  (:func:`~fbo_torch.optim.quasi_newton.minimize_batched`) — every restart of
  every problem converges on its own, the line search evaluates all its
  candidate steps in one call — with the closed-form gradient of ``fn`` when
  it has a ``value_and_grad`` method (:class:`~fbo_torch.sampling.rff_paths.RFFSamplePaths`,
  :class:`~fbo_torch.sampling.gp_paths.GPThompsonPaths`), else autograd.
  ``"adam"`` (projected Adam) and ``"lbfgsb"`` (BoTorch's batched SciPy
  L-BFGS-B, host-side) remain as references.

Problems may have their own boxes (``B x 2 x d`` bounds); optimization runs in
each problem's unit cube so one set of bounds serves them all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from fbo_torch.optim.quasi_newton import QNResult, ValueAndGrad, Values, minimize_batched
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.cuda_graphs import GraphCache
from fbo_torch.utils.dispatch import gpu_path, without_autograd
from fbo_torch.utils.validation import check_int, check_tensor


def _load_lbfgsb() -> Callable[..., Any] | None:
    """BoTorch's batched L-BFGS-B (guarded by BoTorch for supported SciPy versions), or None."""
    try:
        from botorch.optim.batched_lbfgs_b import fmin_l_bfgs_b_batched
    except Exception:  # pragma: no cover - depends on the SciPy version
        return None
    return cast("Callable[..., Any]", fmin_l_bfgs_b_batched)


fmin_l_bfgs_b_batched = _load_lbfgsb()

BatchedFunction = Callable[[Tensor], Tensor]

#: Default cap on points per call of ``fn`` during raw scoring (B x chunk) on a CPU.
DEFAULT_MAX_POINTS = 2**11  # B x chunk points per call; larger chunks page-fault (mmap) on every call
#: The same cap on a GPU, where every call is a handful of kernel launches: large
#: enough that N = 1,000 agents x 512 raw points are one call (~1 GB of float64 features).
DEFAULT_MAX_POINTS_CUDA = 2**20

REFINE = ("qn", "adam", "lbfgsb", None)
SCREENS = ("auto", "sobol", "product")
#: Dimensions where ``screen="auto"`` takes the product set: measured as good as the Sobol set
#: there (``benchmarks/maximizer_quality.py``), worse from ``d = 4`` on, where each half's
#: ``√raw_samples`` points cover a 2-D or larger factor too coarsely.
PRODUCT_DIMS = (2, 3)
#: With ``refine_dtype``: how many restarts of each function (the best by their lower-precision
#: values) are finished in full precision. Restarts that end in the same maximum or in a clearly
#: lower one need no polish; 4 leave room for maxima whose values lower precision cannot order
#: (2 and 1 were measured a few float64 roundings worse on smooth paths, ``docs/performance.md``).
POLISH_RESTARTS = 4
#: With ``refine_dtype``: of the restarts to finish in full precision, those within this many
#: lengthscales (every coordinate) of a better-ranked one (itself finished or not: a chain of such
#: neighbours stays within a few of these radii of the finished one) are not finished: where the
#: lower precision stopped, they are on the same maximum, and most of a function's best restarts
#: are (docs/design.md). They are returned where the lower precision left them, with their value there.
POLISH_TWIN = 1e-3
#: Restarts of one function evaluated as a block of this many at a line-search step once at most
#: this many of them need it (:func:`~fbo_torch.optim.quasi_newton.minimize_batched`'s
#: ``sub_group``, which acts in the sequential line search, a CPU's; for functions with ``take``
#: and more restarts than this).
SUB_GROUP: int | None = 4


def default_max_points(device: torch.device | str) -> int:
    """The scoring chunk cap for ``device`` (see :data:`DEFAULT_MAX_POINTS`)."""
    return DEFAULT_MAX_POINTS_CUDA if torch.device(device).type == "cuda" else DEFAULT_MAX_POINTS


_SOBOL_CACHE: dict[tuple[int, torch.dtype, str], Tensor] = {}
_SOBOL_MIN_ROWS = 1024  # the raw-point count of a search: one table serves every smaller n


def sobol_points(n: int, d: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    r"""``n x d`` scrambled Sobol points in ``[0, 1)^d`` (seed 0), cached per dimension/dtype/device.

    The first ``n`` points of one table (a Sobol sequence's draws are its prefixes), so a smaller
    ``n`` in a later round is a view, not a new host-to-device copy; the table is copied to a CUDA
    device from pinned memory without blocking (no synchronization inside a round).
    """
    key = (d, dtype, str(device))
    pts = _SOBOL_CACHE.get(key)
    if pts is None or pts.shape[0] < n:
        rows = max(_SOBOL_MIN_ROWS, 1 << max(n - 1, 0).bit_length())
        with torch.inference_mode(False):  # cached: an ordinary tensor even if first drawn in inference mode
            eng = torch.quasirandom.SobolEngine(d, scramble=True, seed=0)
            host = eng.draw(rows, dtype=torch.float64).to(dtype=dtype)
            if torch.device(device).type == "cuda":
                pts = host.pin_memory().to(device=device, non_blocking=True)
            else:
                pts = host.to(device=device)
        if len(_SOBOL_CACHE) > 64:
            _SOBOL_CACHE.clear()
        _SOBOL_CACHE[key] = pts
    return pts[:n]


def raw_points(keys: Tensor, n: int, d: int, dtype: torch.dtype) -> Tensor:
    r"""``B x n x d`` raw points in the unit cube: the Sobol set rotated by a keyed shift per problem."""
    base = sobol_points(n, d, dtype, keys.device)
    shift = kr.uniform(kr.fold(keys, "raw-shift"), d, dtype=dtype)  # B x d
    return torch.remainder(base.unsqueeze(0) + shift.unsqueeze(-2), 1.0)


def product_points(keys: Tensor, n: int, d: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    r"""The two factors of a product raw set of about ``n`` points in ``[0, 1)^d`` (``d >= 2``):
    ``B x nA x dA`` points of the first ``dA = ⌈d/2⌉`` coordinates and ``B x nB x (d − dA)`` of the
    others, ``nA = ⌈√n⌉``, ``nB = ⌈n / nA⌉``; each a scrambled Sobol set rotated by its own keyed
    shift per problem (as :func:`raw_points`). The raw points are all pairs ``(a_i, b_j)``."""
    dA = (d + 1) // 2
    nA = math.isqrt(n - 1) + 1 if n > 1 else 1
    nB = -(-n // nA)
    return raw_points(kr.fold(keys, "product-a"), nA, dA, dtype), raw_points(
        kr.fold(keys, "product-b"), nB, d - dA, dtype
    )


def boltzmann_restarts(values: Tensor, k: int, keys: Tensor, eta: float = 1.0) -> Tensor:
    r"""Indices of ``k`` restarts per problem (``B x C`` values → ``B x k``), BoTorch's rule.

    Without replacement with probability ``∝ exp(η z)`` of the standardized
    values (Gumbel-top-k), the best raw point always included; a problem with
    constant values picks uniformly. Non-finite values are never picked unless
    nothing else is left.
    """
    finite = torch.isfinite(values)
    v = torch.where(finite, values, 0.0)
    cnt = finite.sum(-1, keepdim=True).clamp_min(1)
    mean = v.sum(-1, keepdim=True) / cnt
    dev = torch.where(finite, v.sub_(mean), 0.0)  # (v - mean) where finite
    std = torch.sqrt((dev**2).sum(-1, keepdim=True) / (cnt - 1).clamp_min(1))
    # z = dev / std, 0 where std = 0 (also where the squares underflowed); the B x C passes in place
    logits = dev.div_(std.clamp_min(torch.finfo(v.dtype).tiny)).masked_fill_(std == 0, 0.0).mul_(eta)
    logits.add_(kr.gumbel(kr.fold(keys, "restarts"), values.shape[-1], dtype=v.dtype))
    unusable = ~finite
    logits.masked_fill_(unusable, -torch.inf)
    best = values.masked_fill(unusable, -torch.inf).argmax(-1, keepdim=True)
    return logits.scatter_(-1, best, torch.inf).topk(k, dim=-1).indices


def maximize_batched(
    fn: BatchedFunction,
    bounds: Tensor,
    batch_size: int | None = None,
    raw_samples: int = 1024,
    num_restarts: int = 8,
    refine: str | None = "qn",
    maxiter: int = 100,
    lr: float = 0.01,
    max_points: int | None = None,
    generator: torch.Generator | None = None,
    keys: Tensor | None = None,
    eta: float = 1.0,
    validate: bool = True,
    screen_dtype: torch.dtype | None = None,
    gtol: float = 1e-9,
    ftol: float = 1e-12,
    screen: str = "auto",
    refine_dtype: torch.dtype | None = None,
    line_search: str = "auto",
) -> tuple[Tensor, Tensor]:
    r"""Multi-start maximization of ``B`` independent functions at once.

    Args:
        fn: Batched function ``B x C x d -> B x C`` (differentiable in its
            input for gradient refinement, or with a ``value_and_grad`` method
            returning values and input gradients). Problem ``b`` must only
            depend on row ``b`` of the input. With a true ``leading_dims``
            attribute it is also called on ``K x B x C x d`` (the line search's
            ``K`` candidate steps, without reordering them into ``C``).
        bounds: ``2 x d`` (shared) or ``B x 2 x d`` per-problem boxes.
        batch_size: ``B`` (required with shared bounds).
        raw_samples: Raw (Sobol) points scored per problem.
        num_restarts: Restarts refined per problem (Boltzmann-selected).
        refine: ``"qn"`` (batched BFGS on the device, default), ``"adam"``
            (projected Adam, ``maxiter`` steps), ``"lbfgsb"`` (BoTorch's batched
            SciPy L-BFGS-B, on the host), or ``None`` (raw points only).
        maxiter: Iteration cap for the refinement.
        lr: Adam step size in unit-cube coordinates (``"adam"`` only).
        max_points: Cap on ``B x chunk`` points per ``fn`` call while scoring
            (default by device: :func:`default_max_points`).
        generator: Optional generator for the problems' keys (when ``keys`` is not given).
        keys: Optional ``B`` int64 keys of the problems' random streams (raw
            point shifts, restart selection): with keys, problem ``b``'s result
            does not depend on the other problems in the batch.
        eta: Boltzmann temperature of the restart selection (BoTorch's default 1).
        validate: Check that every box is non-empty (reads a device value: engines
            that built their boxes themselves pass ``False`` to avoid the synchronization).
        screen_dtype: Optional lower precision (e.g. ``torch.float32``) for scoring
            the raw points only, used when ``fn`` has an ``astype(dtype)`` method
            (:class:`~fbo_torch.sampling.gp_paths.GPThompsonPaths`,
            :class:`~fbo_torch.sampling.rff_paths.RFFSamplePaths`). Raw scores only
            rank candidates for the Boltzmann restart selection, whose own noise
            (Gumbel, unit temperature on standardized values) dwarfs float32
            rounding; the selected restarts are re-scored and refined in the
            bounds' precision, so values and maximizers stay float64. On a GPU
            this halves the memory traffic of the largest phase and runs sin/cos
            at float32 speed.
        gtol / ftol: Stopping tolerances of the ``"qn"`` refinement (inf-norm of the
            projected gradient in unit-cube coordinates; relative decrease), see
            :func:`~fbo_torch.optim.quasi_newton.minimize_batched`.
        screen: The raw points: ``"sobol"`` (``raw_samples`` points of a rotated Sobol set) or
            ``"product"``: for ``d >= 2`` and functions with a ``product_values(XA, XB)`` method
            (:meth:`~fbo_torch.sampling.gp_paths.GPThompsonPaths.product_values`), the pairs of two
            rotated Sobol sets of about ``√raw_samples`` points each on the two halves of the
            coordinates (:func:`product_points`), scored as matrix products at the transcendental
            cost of ``2√raw_samples`` evaluations; otherwise ``"sobol"``. The selected restarts are
            re-scored exactly (``benchmarks/maximizer_quality.py`` compares both screens).
            ``"auto"`` (default): the product set where it was measured as good, ``d`` in
            :data:`PRODUCT_DIMS`.
        refine_dtype: Optional lower precision (e.g. ``torch.float32``) for the first phase of the
            ``"qn"`` refinement, used when ``fn`` has an ``astype(dtype)`` method: every restart
            climbs in ``refine_dtype`` until its steps or its projected gradient reach that
            precision's resolution, then the best :data:`POLISH_RESTARTS` of each function (by
            those values) continue in the bounds' precision from there, starting with the
            inverse-Hessian approximations they learned (:func:`~fbo_torch.optim.quasi_newton.minimize_batched`'s
            ``inv_hessian``) and stopping at ``gtol``, at a decrease below ``ftol / 100`` or when no
            step decreases the value. So
            maxima and values are full precision, while most evaluations run at float32 speed
            (twice to three times float64's on a CPU: half the bytes per SIMD lane and per cache
            line; ``benchmarks/maximizer_quality.py`` compares the gaps).
        line_search: The ``"qn"`` refinement's line search
            (:func:`~fbo_torch.optim.quasi_newton.minimize_batched`): ``"parallel"`` (every
            candidate step in one call), ``"sequential"`` (one step at a time), or ``"auto"``
            (default): ``fn``'s own ``line_search`` attribute if it has one, else
            :func:`~fbo_torch.optim.quasi_newton.minimize_batched`'s choice for the device.

    Returns:
        ``(X_best, values)``: ``B x d`` maximizers inside their boxes and ``B``
        values ``fn`` takes there.

    Example:
        >>> def fn(X):                      # B x C x d -> B x C: problem b is row b
        ...     return -((X - centers.unsqueeze(1)) ** 2).sum(-1)
        >>> X, values = maximize_batched(fn, bounds, batch_size=centers.shape[0], raw_samples=256, num_restarts=4)

    For BoTorch acquisition functions over a batched model, use
    :func:`~fbo_torch.optim.optimize.optimize_acqf_batched`, which builds ``fn``.
    """
    bounds = _expand_bounds(bounds, batch_size, validate)
    B, _, d = bounds.shape
    raw_samples = check_int("raw_samples", raw_samples, minimum=1)
    k = min(check_int("num_restarts", num_restarts, minimum=1), raw_samples)
    if refine not in REFINE:
        raise ValueError(f"`refine` must be one of {REFINE}, got {refine!r}.")
    if max_points is None:
        max_points = default_max_points(bounds.device)
    if keys is None:
        keys = kr.keys_from_generator((B,), generator, device=bounds.device)
    elif keys.shape != (B,) or keys.dtype != torch.int64:
        raise ValueError(f"`keys` must be {B} int64 keys (one per problem), got {keys.dtype} {tuple(keys.shape)}.")
    keys = keys.to(bounds.device)
    screen_dtype = _lower_precision("screen_dtype", screen_dtype, fn, bounds.dtype)
    if screen not in SCREENS:
        raise ValueError(f"`screen` must be one of {SCREENS}, got {screen!r}.")
    if screen == "auto":
        screen = "product" if d in PRODUCT_DIMS else "sobol"
    if screen == "product" and (d < 2 or not hasattr(fn, "product_values")):
        screen = "sobol"
    refine_dtype = _lower_precision("refine_dtype", refine_dtype, fn, bounds.dtype)
    if line_search not in ("auto", "parallel", "sequential"):
        raise ValueError(f"`line_search` must be 'auto', 'parallel' or 'sequential', got {line_search!r}.")
    settings = (
        raw_samples,
        k,
        refine,
        maxiter,
        lr,
        max_points,
        eta,
        screen_dtype,
        gtol,
        ftol,
        screen,
        refine_dtype,
        line_search,
    )
    state = getattr(fn, "graph_state", None)
    if state is not None and refine in ("qn", None):
        # a pure function of tensors: the whole maximization is one CUDA graph replay
        tensors, config = state()
        cls: Any = type(fn)  # a class with graph_state() and from_graph_state(tensors, config)

        def pure(keys_: Tensor, bounds_: Tensor, *ts: Tensor) -> tuple[Tensor, Tensor]:
            return _maximize(cls.from_graph_state(ts, config), bounds_, keys_, *settings)

        safe = getattr(fn, "inference_safe", False) and getattr(fn, "value_and_grad", None) is not None
        if not gpu_path(bounds.device) and safe:
            # closed-form gradients, no other library called (`inference_safe`: the sample paths);
            # `pure` rebuilds the function from its tensors, so the caller's object keeps none
            X, v = without_autograd(pure, keys, bounds, *tensors)
            return X, v
        X, v = _GRAPHS(pure, (keys, bounds.contiguous(), *tensors), key=(cls, config, settings))
        return X, v
    return _maximize(fn, bounds, keys, *settings)


_GRAPHS = GraphCache("maximize_batched")


def _lower_precision(
    name: str, dtype: torch.dtype | None, fn: BatchedFunction, full: torch.dtype
) -> torch.dtype | None:
    """A validated ``screen_dtype``/``refine_dtype``: ``None`` where it would change nothing (the
    bounds' own dtype) or cannot be used (``fn`` has no ``astype``)."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"`{name}` must be a floating torch.dtype or None, got {dtype!r}.")
    return None if dtype == full or not hasattr(fn, "astype") else dtype


def _maximize(
    fn: BatchedFunction,
    bounds: Tensor,
    keys: Tensor,
    raw_samples: int,
    k: int,
    refine: str | None,
    maxiter: int,
    lr: float,
    max_points: int,
    eta: float,
    screen_dtype: torch.dtype | None = None,
    gtol: float = 1e-9,
    ftol: float = 1e-12,
    screen: str = "sobol",
    refine_dtype: torch.dtype | None = None,
    line_search: str = "auto",
) -> tuple[Tensor, Tensor]:
    B, _, d = bounds.shape
    lo, width = bounds[:, 0:1, :], bounds[:, 1:2, :] - bounds[:, 0:1, :]

    def fn_unit(U: Tensor) -> Tensor:  # B x C x d in unit coordinates
        return fn(torch.addcmul(lo, U, width))

    if screen == "product":
        UA, UB = product_points(keys, raw_samples, d, bounds.dtype)
        vals = _score_product(fn, lo, width, UA, UB, screen_dtype, max_points)
        top_idx = boltzmann_restarts(vals, k, keys, eta)
        nB, dA = UB.shape[1], UA.shape[-1]
        iA, iB = torch.div(top_idx, nB, rounding_mode="floor"), torch.remainder(top_idx, nB)
        U0 = torch.cat(
            [UA.gather(1, iA.unsqueeze(-1).expand(B, k, dA)), UB.gather(1, iB.unsqueeze(-1).expand(B, k, d - dA))], -1
        )
        top_vals = fn_unit(U0)
    else:
        U_raw = raw_points(keys, raw_samples, d, bounds.dtype)
        if screen_dtype is None:
            vals = score_chunked(fn_unit, U_raw, max_points)
        else:  # rank the raw points in lower precision (the same points, rounded)
            fn_low: BatchedFunction = cast(Any, fn).astype(screen_dtype)  # kept only for functions with astype
            lo_l, width_l = lo.to(screen_dtype), width.to(screen_dtype)
            vals = score_chunked(lambda U: fn_low(lo_l + U * width_l), U_raw.to(screen_dtype), max_points)
        top_idx = boltzmann_restarts(vals, k, keys, eta)
        U0 = U_raw.gather(1, top_idx.unsqueeze(-1).expand(B, k, d))
        top_vals = vals.gather(1, top_idx) if screen_dtype is None else fn_unit(U0)

    if refine is None:
        U_fin, v_fin = U0, top_vals
    elif refine == "qn":
        ls_fn = getattr(fn, "lengthscales", None)
        ls = None if ls_fn is None else ls_fn().to(width).expand(B, d) / width.squeeze(1)  # unit coordinates
        U_fin, v_fin = _refine_qn(
            fn,
            lo,
            width,
            U0,
            maxiter,
            max_points,
            ls,
            gtol=gtol,
            ftol=ftol,
            refine_dtype=refine_dtype,
            line_search=line_search,
        )
    elif refine == "lbfgsb" and fmin_l_bfgs_b_batched is not None:
        U_fin = _refine_lbfgsb(fn_unit, U0, maxiter)
        with torch.no_grad():
            v_fin = fn_unit(U_fin)
    else:
        U_fin = _refine_adam(fn_unit, U0, maxiter, lr)
        with torch.no_grad():
            v_fin = fn_unit(U_fin)
    # keep the raw point where refinement did not improve (Adam is not monotone)
    better = v_fin >= top_vals
    U_fin = torch.where(better.unsqueeze(-1), U_fin, U0)
    v_fin = torch.where(better, v_fin, top_vals)
    best, j = v_fin.max(dim=-1)
    U_best = U_fin.gather(1, j.view(B, 1, 1).expand(B, 1, d)).squeeze(1)
    X_best = lo.squeeze(1) + U_best * width.squeeze(1)
    return X_best.detach(), best.detach()


def _refine_qn(
    fn: BatchedFunction,
    lo: Tensor,
    width: Tensor,
    U0: Tensor,
    maxiter: int,
    max_points: int = DEFAULT_MAX_POINTS_CUDA,
    lengthscales: Tensor | None = None,
    gtol: float = 1e-9,
    ftol: float = 1e-12,
    refine_dtype: torch.dtype | None = None,
    line_search: str = "auto",
) -> tuple[Tensor, Tensor]:
    """Batched BFGS on the B*k restarts in the unit cube (minimizing -fn).

    With the functions' ``B x d`` lengthscales (unit coordinates), the line search
    is scaled to them: the first step has the length of the shortest lengthscale
    (the candidates ``4ℓ, ℓ, ℓ/4, …`` bracket the scale on which a stationary
    sample path varies), and every step may extrapolate to 4× the quasi-Newton
    step (5 candidates ``4, 1, 1/4, 1/16, 1/64``; the largest that satisfies
    Armijo). Far from a maximum this lets a restart cross a lengthscale in one step,
    which closes most of the gap to a dense search on rough functions
    (``benchmarks/maximizer_quality.py``; the gaps are in docs/design.md); near a
    maximum the 4× step fails Armijo on a quadratic (``f(x + 4d) − f(x) = −4 gᵀd > 0``),
    so convergence stays at float roundoff.
    Functions without ``lengthscales()`` keep the plain rule (first step 0.05,
    backtracking from the unit step).

    Functions with a ``take(index)`` method (the functions of the problems ``index``,
    repeats allowed: :class:`~fbo_torch.sampling.rff_paths.RFFSamplePaths`,
    :class:`~fbo_torch.sampling.gp_paths.GPThompsonPaths`) let the BFGS drop
    functions whose restarts have all converged on a CPU (``minimize_batched``'s
    ``restrict``, a function's ``k`` restarts as one group, so its values are the
    same operations as in the full batch): most restarts converge in a fraction of
    ``maxiter`` iterations and only a few reach the cap (see docs/design.md). With more than
    :data:`SUB_GROUP` restarts per function, a function with at most that many restarts still
    needing a line-search step is evaluated in a block of those instead of on all ``k``
    (``sub_group``; the blocks depend on the function's own restarts, so its maximizer is the
    same in any batch).

    With ``refine_dtype`` (and ``fn.astype``) the BFGS runs twice: all ``B * k`` restarts in
    ``refine_dtype``, stopping at that precision's resolution (``gtol`` ``10√ε``, ``ftol`` ``256ε``),
    then the best :data:`POLISH_RESTARTS` of each function in ``U0``'s dtype from where they
    stopped, with the inverse Hessians they learned and first steps of ``√ε`` lengthscales where
    they hold none, except those within :data:`POLISH_TWIN` lengthscales of a better one (returned
    where they stopped, with their value there in ``U0``'s dtype); the other restarts are returned
    where they stopped with the value ``-inf``.

    A restart stops before its step is evaluated once the quasi-Newton step predicts a gain of at
    most one rounding unit of its value (``minimize_batched``'s ``dtol``: ``ε · max(1, |f|)``; in
    the lower-precision climb ``16ε``, the rounding of a sum over a few hundred features; not on
    the GPU path, whose shapes are fixed): beyond that the line search compares roundings, fails,
    and retries from steepest descent, up to ``2 · num_steps`` evaluations of the function's
    restarts to learn that nothing is left (``benchmarks/maximizer_quality.py``'s gaps in extended
    precision; the per-function comparison in docs/design.md).
    """
    B, k, d = U0.shape
    if line_search == "auto":  # the functions' own preference, if they state one
        line_search = getattr(fn, "line_search", "auto")
    init: Tensor | float = 0.05 if lengthscales is None else lengthscales.amin(-1).clamp(max=1.0)  # B

    def step(kk: int, scale: float = 1.0) -> dict[str, Any]:
        """minimize_batched's step options for ``kk`` restarts of each function."""
        if not isinstance(init, Tensor):
            return dict(init_step=init * scale)
        return dict(init_step=(init * scale).unsqueeze(-1).expand(B, kk).reshape(B * kk), max_step=4.0, num_steps=5)

    def functions(f: BatchedFunction, lo: Tensor, width: Tensor, B: int, k: int) -> tuple[ValueAndGrad, Values]:
        """value-and-gradient and line-search values of the ``B * k`` problems (``k`` restarts of ``f``'s ``B``)."""
        vg = getattr(f, "value_and_grad", None)
        neg_width = -width  # B x 1 x d: the chain rule and the sign of the minimized -f in one product
        # functions callable on K x B x C x d take the line search's candidates as they come (no copies)
        stacked = getattr(f, "leading_dims", False)

        def to_domain(U: Tensor) -> Tensor:
            return torch.addcmul(lo, U, width)

        def value_and_grad(x: Tensor) -> tuple[Tensor, Tensor]:
            U = x.view(B, k, d)
            if vg is not None:
                fv, g = vg(to_domain(U))
                g = g * neg_width
            else:
                with torch.enable_grad():
                    Ug = U.detach().requires_grad_(True)
                    fv = f(to_domain(Ug))
                    (g,) = torch.autograd.grad(fv.sum(), Ug)
                fv, g = fv.detach(), g.neg()
            return fv.reshape(-1).neg(), g.reshape(-1, d)

        def values(xs: Tensor) -> Tensor:  # K x (B*k) x d -> K x (B*k): fn on B x (K*k) points per call
            K = xs.shape[0]
            # as few calls as the memory cap allows (one for N <= ~10^4 agents: the op count stays flat)
            per_call = max(1, min(K, (4 * max_points) // max(1, B * k)))
            out = []
            for s0 in range(0, K, per_call):
                Kc = min(per_call, K - s0)
                with torch.no_grad():
                    if stacked:
                        fv = f(to_domain(xs[s0 : s0 + Kc].view(Kc, B, k, d))).view(Kc, B * k)
                    else:
                        U = xs[s0 : s0 + Kc].view(Kc, B, k, d).permute(1, 0, 2, 3).reshape(B, Kc * k, d)
                        fv = f(to_domain(U)).view(B, Kc, k).permute(1, 0, 2).reshape(Kc, B * k)
                # minimized: -f, with NaN as +inf (never accepted by the line search)
                out.append(fv.neg().nan_to_num_(nan=torch.inf, posinf=torch.inf, neginf=-torch.inf))
            return out[0] if len(out) == 1 else torch.cat(out)

        return value_and_grad, values

    def run(f: BatchedFunction, lo: Tensor, width: Tensor, x0: Tensor, kk: int, **options: Any) -> QNResult:
        value_and_grad, values = functions(f, lo, width, B, kk)
        restrict = None
        if hasattr(f, "take"):

            def restrict(index: Tensor | None, size: int = kk) -> tuple[ValueAndGrad, Values | None]:
                # problem b * kk + j is restart j of function b; `index` holds blocks of `size`
                # restarts of one function each (whole functions, or sub_group's blocks); None:
                # a block of every function
                if index is None:
                    return functions(f, lo, width, B, size)
                agent = torch.div(index[::size], kk, rounding_mode="floor")
                return functions(f.take(agent), lo[agent], width[agent], agent.numel(), size)

        return minimize_batched(
            value_and_grad,
            x0,
            values=values,
            lower=0.0,
            upper=1.0,
            restrict=restrict,
            group=kk,
            sub_group=SUB_GROUP if restrict is not None and SUB_GROUP is not None and kk > SUB_GROUP else None,
            extrapolate=getattr(f, "extrapolate", "always"),
            line_search=line_search,
            **{**step(kk), **options},
        )

    # a restart whose quasi-Newton step predicts a gain below one rounding unit of its value stops
    # there (minimize_batched's dtol): its line search could only compare roundings
    # (off the GPU path only: with fixed shapes a stopped problem saves nothing and the test costs kernels)
    sync_free = gpu_path(U0.device)
    dtol = None if sync_free else torch.finfo(U0.dtype).eps
    if refine_dtype is None:  # maximize_batched passes one only where it differs and fn has astype
        res = run(fn, lo, width, U0.reshape(B * k, d), k, maxiter=maxiter, gtol=gtol, ftol=ftol, dtol=dtol)
        return res.x.view(B, k, d), -res.fun.view(B, k)
    # every restart in lower precision; then the best `m` of each function from there in full
    # precision with the curvature learned: the maxima are found at full precision (`refine_dtype`)
    eps = torch.finfo(refine_dtype).eps
    low = run(
        cast(Any, fn).astype(refine_dtype),
        lo.to(refine_dtype),
        width.to(refine_dtype),
        U0.reshape(B * k, d).to(refine_dtype),
        k,
        maxiter=maxiter,
        gtol=max(gtol, 10 * math.sqrt(eps)),  # where the full precision takes over: its curvature known
        ftol=max(ftol, 256 * eps),
        dtol=None if sync_free else 16 * eps,  # the rounding of a sum over a few hundred features (~√F ε)
    )
    m = min(k, POLISH_RESTARTS)
    v_low = (-low.fun.view(B, k)).nan_to_num(nan=-torch.inf)
    top = v_low.topk(m, dim=-1).indices  # B x m
    U_low = low.x.view(B, k, d).to(U0.dtype)
    x0 = U_low.gather(1, top.unsqueeze(-1).expand(B, m, d)).reshape(B * m, d)
    active = None
    if POLISH_TWIN and lengthscales is not None and m > 1:
        # a restart that ended within POLISH_TWIN lengthscales of a better one (by the lower-precision
        # values) is on the same maximum: only the better one is finished
        xs = x0.view(B, m, d) / lengthscales.unsqueeze(1)
        before = torch.ones(m, m, dtype=torch.bool, device=U0.device).tril(-1)  # [i, j]: j ranks before i
        active = ((torch.cdist(xs, xs, p=torch.inf) <= POLISH_TWIN) & before).any(-1).logical_not_().view(-1)
    H0 = low.inv_hessian.view(B, k, d, d).gather(1, top.view(B, m, 1, 1).expand(B, m, d, d)).to(U0.dtype)
    res = run(
        fn,
        lo,
        width,
        x0,
        m,
        # to gtol, a decrease at float64 rounding or a failed line search: few problems, each near its maximum
        maxiter=maxiter,
        gtol=gtol,
        ftol=ftol * 1e-2,
        inv_hessian=H0.reshape(B * m, d, d),
        dtol=dtol,
        active=active,
        check_every=1 if not sync_free else "auto",
        # restarts without curvature start with steps at the lower precision's scale
        **({"init_step": step(m, math.sqrt(eps))["init_step"]} if isinstance(init, Tensor) else {}),
    )
    U = U_low.scatter(1, top.unsqueeze(-1).expand(B, m, d), res.x.view(B, m, d))
    v = torch.full_like(v_low, -torch.inf, dtype=U0.dtype).scatter(1, top, -res.fun.view(B, m))
    return U, v


def _expand_bounds(bounds: Tensor, batch_size: int | None, validate: bool = True) -> Tensor:
    check_tensor("bounds", bounds)
    if bounds.ndim == 2:
        if batch_size is None:
            raise ValueError("`batch_size` is required when `bounds` is 2 x d (shared by all problems).")
        bounds = bounds.unsqueeze(0).expand(batch_size, 2, bounds.shape[-1])
    elif bounds.ndim != 3 or bounds.shape[1] != 2:
        raise ValueError(f"`bounds` must be 2 x d or B x 2 x d, got shape {tuple(bounds.shape)}.")
    elif batch_size is not None and bounds.shape[0] != batch_size:
        raise ValueError(f"`bounds` has {bounds.shape[0]} problems but batch_size = {batch_size}.")
    if validate and not (bounds[:, 1] > bounds[:, 0]).all():  # reads a device value (a sync on CUDA)
        raise ValueError("`bounds`: every upper bound must exceed its lower bound.")
    return bounds


def _score_product(
    fn: BatchedFunction,
    lo: Tensor,
    width: Tensor,
    UA: Tensor,
    UB: Tensor,
    screen_dtype: torch.dtype | None,
    max_points: int,
) -> Tensor:
    """``B x (nA · nB)`` values of ``fn`` on the product raw set (row-major in ``(i, j)``), in
    ``screen_dtype`` when given, in chunks of problems of at most ``max_points`` raw points' worth
    of features each (the product's ``nA x nB`` scores are the only ``nA · nB``-sized arrays)."""
    B, nA, dA = UA.shape
    nB = UB.shape[1]
    f: Any = fn if screen_dtype is None else cast(Any, fn).astype(screen_dtype)
    dt = UA.dtype if screen_dtype is None else screen_dtype
    lo_, width_ = lo.to(dt), width.to(dt)
    XA = torch.addcmul(lo_[..., :dA], UA.to(dt), width_[..., :dA])
    XB = torch.addcmul(lo_[..., dA:], UB.to(dt), width_[..., dA:])
    with torch.no_grad():
        per = max(1, max_points // max(1, nA + nB))
        if per >= B:
            return cast(Tensor, f.product_values(XA, XB)).reshape(B, nA * nB)
        index = torch.arange(B, device=UA.device)
        parts = [f.take(index[s : s + per]).product_values(XA[s : s + per], XB[s : s + per]) for s in range(0, B, per)]
        return torch.cat(parts).reshape(B, nA * nB)


def score_chunked(fn: BatchedFunction, X: Tensor, max_points: int = DEFAULT_MAX_POINTS) -> Tensor:
    r"""Evaluate ``fn`` on ``B x C x d`` in chunks of the ``C`` dimension (no grad).

    The result equals ``fn(X)``; only peak memory changes.

    Args:
        fn: ``B x C x d`` -> ``B x C``: ``B`` functions, each on its row of points.
        X: ``B x C x d`` points.
        max_points: The most points (``B x chunk``) evaluated in one call.

    Returns:
        ``B x C`` values.
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

    if fmin_l_bfgs_b_batched is None:  # the caller falls back to Adam first
        raise RuntimeError("BoTorch's batched L-BFGS-B is not available with this SciPy version.")
    x0 = current.cpu().numpy().astype(np.float64)
    xs, _, _ = fmin_l_bfgs_b_batched(func, x0, bounds=[(0.0, 1.0)] * d, maxiter=maxiter, pass_batch_indices=True)
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
