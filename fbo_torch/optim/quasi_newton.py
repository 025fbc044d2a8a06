r"""Batched box-constrained BFGS for many small independent problems, on the device.

A federation round solves thousands of tiny optimization problems: every
agent's GP hyperparameters (``d + 3`` numbers) and every agent's Thompson
sample maximizer (``d`` numbers, a few restarts). SciPy's L-BFGS-B solves one
problem at a time on the host; BoTorch's ``fmin_l_bfgs_b_batched`` still
drives SciPy's Fortran per problem and moves values and gradients to the host
at every iteration (on a GPU: one synchronization per iteration, ~1,000 per
refit). :func:`minimize_batched` keeps everything in batched tensor
operations:

* **Dense BFGS per problem** (``batch x p x p`` inverse-Hessian approximations;
  ``p`` is small), with Nocedal & Wright's initial scaling (6.20) and the
  update skipped where the curvature condition ``sᵀy > 0`` fails.
* **Parallel backtracking line search**: the ``K`` candidate steps
  ``α_k = α₀ · shrink^k`` are evaluated in *one* batched call of the function;
  each problem takes the largest step that satisfies the Armijo condition along
  its projected path. This costs ``K`` times the flops of one evaluation but
  the same number of kernel launches, which is what counts on a GPU.
* **Boxes by projection**: coordinates at a bound whose gradient points
  outward are held fixed (removed from the direction and from ``H``), steps
  are projected onto the box (projected-path Armijo, Bertsekas 1982).
* **Every problem converges on its own**: a problem whose projected gradient
  falls below ``gtol``, whose decrease falls below ``ftol`` or (with ``dtol``) whose
  quasi-Newton step predicts no resolvable decrease stops moving,
  while the others continue. The number of iterations is a fixed cap, so the
  loop never reads a device value on the host (no synchronization at all,
  unless ``check_every`` asks for an early exit).
* **Few operations per iteration**: on a GPU every tensor operation is a kernel
  launch of a few microseconds whatever the batch, so an iteration is written as
  ~77 of them besides the function's own (counted by ``benchmarks/op_count.py``):
  a reset of the curvature information is a flag, not a write of the identity into
  ``H``; ``H`` is stored negated (the quasi-Newton direction and ``−H₀y`` without a
  negation); ``sᵀs, sᵀy, yᵀy`` come from one ``2 x 2`` Gram product; the rank-two BFGS
  update is one batched product; the held set is one comparison with a per-coordinate bound
  chosen by the gradient's sign; whether a problem accepted a step and which one is one
  ``max``; device scalars instead of Python numbers; unbounded problems skip the
  active-set bookkeeping (``tests/benchmarks/test_op_budget.py`` holds the counts).

The result for one problem does not depend on which other problems share the
batch: a single agent on its own device (a federated client) and a simulator
batching 10,000 agents compute the same bits on one CPU, the products taken with
:func:`~fbo_torch.utils.batch_invariant.matmul` (a batch of one, which converged
problems leaving the batch can leave, rounds as a larger one) under MKL's strict
mode (memory alignment does not change them either).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from fbo_torch.utils.batch_invariant import matmul
from fbo_torch.utils.dispatch import gpu_path

ValueAndGrad = Callable[[Tensor], tuple[Tensor, Tensor]]
Values = Callable[[Tensor], Tensor]
#: ``restrict(index)`` (or ``restrict(index, size=m)`` with ``sub_group``): the functions of a sub-batch.
Restrict = Callable[..., tuple[ValueAndGrad, Values | None]]


@dataclass
class QNResult:
    r"""Result of :func:`minimize_batched`.

    Attributes:
        x: ``batch x p`` final points.
        fun: ``batch`` values at ``x``.
        grad: ``batch x p`` gradients at ``x``.
        converged: ``batch`` booleans (projected gradient or decrease below tolerance, or a step
            predicting no decrease above ``dtol``).
        iterations: ``batch`` number of iterations in which the problem moved.
        inv_hessian: ``batch x p x p`` the final inverse-Hessian approximations (on the coordinates
            not held at a bound), NaN where a problem holds no curvature information (it never
            updated, or its last step restarted from steepest descent): what a continuation
            passes back as ``inv_hessian``.
    """

    x: Tensor
    fun: Tensor
    grad: Tensor
    converged: Tensor
    iterations: Tensor
    inv_hessian: Tensor


def autograd_value_and_grad(fun: Values) -> ValueAndGrad:
    r"""Turn a batched function ``batch x p -> batch`` into value-and-gradient by autograd."""

    def vg(x: Tensor) -> tuple[Tensor, Tensor]:
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            f = fun(xg)
            (g,) = torch.autograd.grad(f.sum(), xg)
        return f.detach(), g

    return vg


def minimize_batched(
    value_and_grad: ValueAndGrad,
    x0: Tensor,
    values: Values | None = None,
    lower: Tensor | float | None = None,
    upper: Tensor | float | None = None,
    maxiter: int = 50,
    init_step: float | Tensor = 0.1,
    num_steps: int = 4,
    shrink: float = 0.25,
    max_step: float = 1.0,
    gtol: float = 1e-8,
    ftol: float = 1e-12,
    armijo: float = 1e-4,
    check_every: int | None | str = "auto",
    line_search: str = "auto",
    restrict: Restrict | None = None,
    group: int = 1,
    sub_group: int | None = None,
    extrapolate: str = "always",
    inv_hessian: Tensor | None = None,
    dtol: float | None = None,
    active: Tensor | None = None,
) -> QNResult:
    r"""Minimize a batch of independent smooth functions with box-constrained BFGS.

    Args:
        value_and_grad: ``x (batch x p) -> (f (batch), g (batch x p))``; problem
            ``b`` may only depend on ``x[b]``.
        x0: ``batch x p`` starting points (inside the box).
        values: ``x (K x batch x p) -> f (K x batch)`` without gradients, for the
            line search, ideally one batched evaluation; default: ``value_and_grad``
            called once per candidate step.
        lower / upper: Bounds broadcasting with ``x0`` (``None``: unbounded).
        maxiter: Iterations (a fixed cap; no host synchronization inside).
        init_step: Length (inf-norm) of the first step, before curvature is known: a
            number, or a ``batch`` tensor (one length per problem, e.g. from each
            function's lengthscale).
        num_steps: Candidate step sizes per line search (evaluated together on a GPU):
            ``max_step · (1, shrink, shrink², ...)``. 4 (not 8): BFGS accepts the unit step almost
            always, so 8 candidates change neither the fitted MLLs nor the maximizer's gaps
            and cost twice the line search (see docs/design.md).
        shrink: Ratio between consecutive candidate steps.
        max_step: The largest candidate as a multiple of the (quasi-)Newton step
            (1: plain backtracking; > 1 lets a problem far from a minimum move
            several Newton steps at once, as SciPy's extrapolating line search
            does). Each problem takes the largest candidate that satisfies Armijo;
            near a minimum a step of ``max_step ≥ 2`` Newton steps fails it on a
            quadratic, so convergence is kept.
        gtol: Stop a problem when its projected gradient's inf-norm is below this.
        ftol: Stop a problem when an accepted step decreases ``f`` by less than
            ``ftol · max(1, |f|)``.
        dtol: Also stop a problem, before evaluating its step, when the quasi-Newton step
            predicts a decrease ``−½ gᵀd`` (the quadratic model's, the Newton decrement's
            ``λ²/2``) of at most ``dtol · max(1, |f|)`` (``None``: never). Near a minimum the
            Armijo test compares values that differ by less than their rounding, so the line
            search rejects every candidate and the problem then retries from steepest descent:
            up to ``2 · num_steps`` evaluations to learn that no decrease is resolvable. With
            ``dtol`` at the precision's resolution (``ε``, or a run's ``ftol``) the problem
            stops at once. Not applied to steepest-descent steps (no curvature to predict with).
        armijo: Sufficient-decrease constant ``c₁``.
        check_every: If set, every this many iterations read on the host whether all problems
            have converged and stop early, and drop converged groups (``restrict``); off the GPU
            path also at every iteration in between whether all have converged (reading a value
            costs nothing there), so no iteration runs idle.
            ``"auto"``: every 4 iterations on a CPU (where reading a value costs
            nothing), never on CUDA (the loop then never waits for the device and
            can be captured as a CUDA graph) or when the environment variable
            ``FBO_SYNC_FREE=1`` asks a CPU to behave like a GPU (tests, op counts). The result is the same either way:
            converged problems do not move.
        line_search: ``"parallel"`` (all ``num_steps`` candidates in one call, as
            on a GPU) or ``"sequential"`` (one candidate step at a time, stopping
            when every problem has accepted one, what a CPU prefers; with ``restrict``
            a smaller step is evaluated only for the groups of problems that still need
            it once they are at most three quarters of the batch: with thousands of
            restarts a few always reject the larger steps, and every candidate was
            evaluated for all of them; candidates from the unit step down are evaluated with
            their gradients, so the accepted point is not evaluated again, while the
            extrapolating ones, rarely accepted, are evaluated by value and get their gradient
            only where accepted, and only for the problems that may take them, see ``extrapolate``);
            ``"auto"`` picks by device. Both accept the same steps up to
            the rounding of ``values`` against ``value_and_grad`` (identical where they compute
            the value the same way; GP sample paths and the MLL round them differently, and
            the iterates then differ at the level of that rounding, e.g. 6e-9 in a maximizer).
        restrict: Optional ``index (m) -> (value_and_grad, values)``: the functions of
            the sub-batch ``index`` (its problem ``i`` is problem ``index[i]``). Where
            the loop reads the host anyway (``check_every``, i.e. on a CPU), the
            converged problems are then dropped from the batch once they are a
            quarter of it, and the others go on in a smaller batch: the same
            iterations per problem, less work where convergence is uneven (GP
            refits with restarts: median 19 of up to 60 iterations). Never on a
            sync-free device, whose shapes stay fixed.
        extrapolate: When the candidates beyond the Newton step (``max_step > 1``) are tried:
            ``"always"``, or ``"while_accepted"``: in a problem's first iteration after a
            (re)start and while its last step was one of them. They pay while a problem crosses
            a long slope and fail Armijo once it is near a minimum, where ``"while_accepted"``
            skips them; on rough functions (short-lengthscale RFF paths) a problem keeps finding
            long steps worth trying, and ``"always"`` finds better maxima there
            (``benchmarks/maximizer_quality.py``).
        group: With ``restrict``, problems leave in consecutive groups of this size,
            a group once all its problems have converged (``batch`` must be a
            multiple): the restarts of one function stay together, so every
            function is evaluated on as many points as in the full batch and a
            problem's iterations are the same floating-point operations whatever
            else is in the batch.
        sub_group: With ``restrict`` and the sequential line search, a group with at most this
            many problems left to evaluate at a candidate step (``1 <= sub_group < group``) is
            evaluated on those problems only: ``restrict(index, size=sub_group)`` gives the
            functions on blocks of ``sub_group`` problems of one group each (its problems to
            evaluate, in order, the first repeated to fill the block); ``restrict(None,
            size=sub_group)`` the same for a block of every group of the whole batch. Groups converge
            unevenly — most of a function's restarts stop within a few iterations, a few climb on —
            and a whole group is evaluated for each of those few otherwise. Which groups go
            by blocks depends on their own problems only (never on the rest of the batch), so a
            problem's iterations still do not depend on what else is in the batch.

        active: Optional ``batch`` booleans: the problems that move; the others are returned
            where they start, as converged (they are evaluated there once), e.g. restarts that
            duplicate another one of their function.
        inv_hessian: Optional ``batch x p x p`` inverse-Hessian approximations to start from (a
            previous run's :attr:`QNResult.inv_hessian`, e.g. of a lower-precision run from which
            this one continues): the first step of a problem with one is a quasi-Newton step and
            does not extrapolate under ``"while_accepted"``; NaN rows start from steepest descent.

    Returns:
        :class:`QNResult`.
    """
    if x0.ndim != 2:
        raise ValueError(f"`x0` must be batch x p, got shape {tuple(x0.shape)}.")
    B, p = x0.shape
    dt, dev = x0.dtype, x0.device
    sync_free = gpu_path(dev)
    if check_every == "auto":
        check_every = None if sync_free else 4
    elif isinstance(check_every, str):
        raise ValueError(f"`check_every` must be an int, None or 'auto', got {check_every!r}.")
    if line_search == "auto":
        line_search = "parallel" if sync_free else "sequential"
    if line_search not in ("parallel", "sequential"):
        raise ValueError(f"`line_search` must be 'parallel', 'sequential' or 'auto', got {line_search!r}.")
    if not (isinstance(group, int) and group >= 1 and B % group == 0):
        raise ValueError(f"`group` must be a positive divisor of the batch size {B}, got {group!r}.")
    if sub_group is not None and not (
        isinstance(sub_group, int) and not isinstance(sub_group, bool) and 1 <= sub_group < group
    ):
        raise ValueError(f"`sub_group` must be None or an int in [1, group = {group}), got {sub_group!r}.")
    if sub_group is not None and restrict is None:
        raise ValueError("`sub_group` needs `restrict` (the functions of a sub-batch).")
    if active is not None and not (isinstance(active, Tensor) and active.shape == (B,) and active.dtype == torch.bool):
        got = f"{active.dtype} {tuple(active.shape)}" if isinstance(active, Tensor) else type(active).__name__
        raise ValueError(f"`active` must be a tensor of {B} booleans, got {got}.")
    if not max_step > 0:
        raise ValueError(f"`max_step` must be positive, got {max_step!r}.")
    if dtol is not None and not dtol >= 0:
        raise ValueError(f"`dtol` must be a non-negative number or None, got {dtol!r}.")
    if isinstance(init_step, Tensor):
        if init_step.shape not in ((), (B,)):
            raise ValueError(
                f"`init_step` must be a number or a tensor of {B} lengths, got shape {tuple(init_step.shape)}."
            )
        init_step = init_step.to(dtype=dt, device=dev)

    def bound(v: Tensor | float | None, default: float) -> Tensor:
        # Python numbers become fills on the device (no host-to-device copy: CUDA-graph safe)
        if isinstance(v, Tensor):
            return v.to(dtype=dt, device=dev).expand(B, p)
        return torch.full((B, p), default if v is None else float(v), dtype=dt, device=dev)

    lo, hi = bound(lower, -torch.inf), bound(upper, torch.inf)
    bounded = lower is not None or upper is not None  # without bounds no coordinate is ever held
    # K calls without `values`; pass `values` for one batched call
    batch_values: Values = _stacked(value_and_grad) if values is None else values
    full: list[Tensor] | None = None  # x, f, g, done, iters, nH, first of the whole batch once problems were dropped
    index: Tensor | None = None  # then: the problems still in the batch

    alphas = (max_step * shrink ** torch.arange(num_steps, dtype=dt, device=dev)).view(-1, 1, 1)  # K x 1 x 1
    unit = next((j for j in range(num_steps) if max_step * shrink**j <= 1.0), num_steps)  # the first step <= 1
    # device scalars: a Python number in a tensor expression costs a host-side wrapper op each time
    zero, one = torch.zeros((), dtype=dt, device=dev), torch.ones((), dtype=dt, device=dev)
    nan = torch.full((), torch.nan, dtype=dt, device=dev)
    neg_step = -init_step if isinstance(init_step, Tensor) else torch.full((), -float(init_step), dtype=dt, device=dev)
    x = x0.detach().clamp(lo, hi)
    f, g = value_and_grad(x)
    # nH (batch x p x p) holds minus a problem's inverse-Hessian approximation (the sign saves a
    # negation per product) only where `first` is False; where it is True the next step is steepest
    # descent and the next update starts from a scaled identity, so a reset is just `first = True`
    neg_eye = -torch.eye(p, dtype=dt, device=dev)
    if inv_hessian is None:
        nH = neg_eye.expand(B, p, p).clone()
        first = torch.ones(B, dtype=torch.bool, device=dev)  # no curvature pair yet
    else:
        if inv_hessian.shape != (B, p, p):
            raise ValueError(f"`inv_hessian` must be {B} x {p} x {p}, got shape {tuple(inv_hessian.shape)}.")
        first = inv_hessian.isnan().flatten(1).any(-1)
        nH = torch.where(first.view(B, 1, 1), neg_eye, inv_hessian.to(dtype=dt, device=dev).neg())
    done = torch.zeros(B, dtype=torch.bool, device=dev) if active is None else ~active.to(dev)
    iters = torch.zeros(B, dtype=torch.long, device=dev)
    failed = torch.zeros(B, dtype=torch.bool, device=dev)
    held: Tensor | None = None  # set at the top of every iteration when bounded
    # the problems that may take an extrapolating candidate this iteration
    expand = first.clone() if inv_hessian is not None and extrapolate == "while_accepted" else torch.ones_like(first)
    if extrapolate not in ("always", "while_accepted"):
        raise ValueError(f"`extrapolate` must be 'always' or 'while_accepted', got {extrapolate!r}.")
    tiny = torch.finfo(dt).tiny

    def _on_groups(
        mask: Tensor, pts: Tensor, with_grad: bool, may_restrict: bool
    ) -> tuple[Tensor, Tensor | None] | None:
        """Values (and gradients) at ``pts`` (``B x p``) for the groups with a problem in ``mask``
        (sequential line search): ``None`` if there are none; with ``restrict``, once they are at
        most three quarters of the batch, evaluated on those whole groups only (so every
        function sees the points it would see in the full batch: the same values), the other
        problems' values +inf; else on the whole batch. With ``sub_group``, the groups with at most
        that many problems in ``mask`` on blocks of those problems (:func:`_in_blocks`)."""
        few: Tensor | None = None  # with sub_group: the groups evaluated in blocks
        num_few = 0
        if sub_group is not None and may_restrict:
            counts = mask.view(-1, group).sum(-1)
            most = int(counts.max())
            if most == 0:
                return None
            if most <= sub_group:  # every group in blocks
                few, num_whole = counts > 0, 0
                num_few = int(few.sum())
            else:
                whole = counts > sub_group
                few = (counts > 0) ^ whole  # (counts > 0) & ~whole
                num_whole, num_few = int(whole.sum()), int(few.sum())
        else:
            whole = mask.view(-1, group).any(-1)
            num_whole = int(whole.sum())
            if num_whole == 0:
                return None
        gs: Tensor | None
        if num_whole == 0:
            fs, gs = torch.full((B,), torch.inf, dtype=dt, device=dev), g.clone() if with_grad else None
        elif restrict is not None and may_restrict and 4 * num_whole <= 3 * whole.numel():
            pos = whole.repeat_interleave(group).nonzero().squeeze(-1)
            sub, sub_g = _evaluate(restrict(pos if index is None else index[pos]), pts[pos], with_grad)
            fs = torch.full((B,), torch.inf, dtype=dt, device=dev).index_copy_(0, pos, sub)
            gs = None if sub_g is None else g.index_copy(0, pos, sub_g)
        else:
            fs, gs = _evaluate((value_and_grad, batch_values), pts, with_grad)
        if num_few:
            assert few is not None  # num_few > 0
            if num_whole:  # written into below: copies where they are the functions' own outputs
                fs, gs = fs.clone(), None if gs is None else gs.clone()
            _in_blocks(mask, counts, few, num_few, pts, fs, gs)
        return fs, gs

    def _in_blocks(
        mask: Tensor, counts: Tensor, few: Tensor, num_few: int, pts: Tensor, fs: Tensor, gs: Tensor | None
    ) -> None:
        """Write into ``fs`` (and ``gs``) the values (and gradients) of the problems in ``mask`` of the
        ``few`` groups, each evaluated in a block of ``sub_group`` problems of its group: those in
        ``mask``, in order, the first one repeated."""
        assert restrict is not None and sub_group is not None  # with sub_group (checked on entry)
        # most groups, none dropped yet: a block for every group (the functions as they are,
        # nothing gathered; the other groups' blocks are evaluated and not used), else for those only
        every = index is None and 2 * num_few >= few.numel()
        m = mask.view(-1, group)
        if every:
            first, real = group_starts, slots < counts.unsqueeze(-1)
            real &= few.unsqueeze(-1)
        else:
            grp = few.nonzero().squeeze(-1)  # S groups
            m, first = m[grp], grp.unsqueeze(-1) * group
            real = slots < counts[grp].unsqueeze(-1)
        order = torch.argsort(m.logical_not(), dim=-1, stable=True)[:, :sub_group]  # S x sub_group
        block = (first + torch.where(real, order, order[:, :1])).view(-1)  # S * sub_group problems
        fns = restrict(None if every else block if index is None else index[block], size=sub_group)
        sub, sub_g = _evaluate(fns, pts[block], gs is not None)
        keep = real.view(-1)
        dst = block[keep]
        fs.index_copy_(0, dst, sub[keep])
        if gs is not None:
            assert sub_g is not None  # evaluated with gradients
            gs.index_copy_(0, dst, sub_g[keep])

    if sub_group is not None:  # constants of _in_blocks
        group_starts = torch.arange(0, B, group, device=dev).unsqueeze(-1)  # G x 1
        slots = torch.arange(sub_group, device=dev)

    for it in range(maxiter):
        if bounded:
            # coordinates held at a bound: moving along -g would leave the box; where the held
            # set changed, the curvature pairs describe another subspace: start over
            prev_held = held
            # (x <= lo) & (g > 0) | (x >= hi) & (g < 0) for x in [lo, hi], in fewer operations
            held = x == torch.where(g > 0, lo, torch.where(g < 0, hi, nan))
            restart = failed if prev_held is None else (held != prev_held).any(-1) | failed
            pg = torch.where(held, zero, g)
        else:
            restart, pg = failed, g
        first = first | restart
        # one kernel on a GPU; on a CPU torch's inf-norm over a few coordinates per row is ~20x slower
        # than the largest absolute value (the same number, exactly)
        gnorm = torch.linalg.vector_norm(pg, ord=torch.inf, dim=-1) if sync_free else pg.abs().amax(-1)
        done = done | (gnorm <= gtol)
        # steepest descent with a step of length init_step: before any curvature pair, and
        # where the quasi-Newton direction is not a descent direction (loss of definiteness)
        sd = pg * (neg_step / gnorm.clamp_min(tiny)).unsqueeze(-1)
        d = matmul(nH, pg.unsqueeze(-1)).squeeze(-1)
        if bounded:
            d = torch.where(cast(Tensor, held), zero, d)  # set above: bounded
        d = torch.where(first.unsqueeze(-1), sd, d)
        gd = matmul(pg.unsqueeze(-2), d.unsqueeze(-1)).view(B)
        descent = gd < 0  # False also for NaN
        fscale = torch.clamp(f.abs(), min=1.0)
        if dtol is not None:  # a quasi-Newton step predicting no resolvable decrease: converged
            # (not at an infinite value, whose scale would accept any step: a NaN start may still move)
            done = done | (((gd >= fscale * (-2.0 * dtol)) & descent & f.isfinite()) > first)  # ... & ~first
        d = torch.where(descent.unsqueeze(-1), d, sd)
        first = first >= descent  # first | ~descent
        cand = torch.addcmul(x, alphas, d)  # K x B x p
        if bounded:
            cand = cand.clamp(lo, hi)
        decrease = (g * (cand - x)).sum(-1)  # K x B, projected-path Armijo
        moving = ~done
        if line_search == "parallel":  # all K candidate steps in one evaluation
            fc = batch_values(cand)  # K x B
            # finite (|fc| < inf, also false for NaN): with f = +inf the threshold alone accepts +inf
            ok = (fc <= torch.add(f, decrease, alpha=armijo)) & (fc.abs() < torch.inf) & moving
            if unit > 0:  # the same rule as the sequential search: extrapolate only where it may pay
                ok[:unit] &= expand
        else:  # one step size at a time until every moving problem has accepted one
            ok = torch.zeros(num_steps, B, dtype=torch.bool, device=dev)
            need = moving
            # from the unit step down a candidate is evaluated with its gradient, which the next
            # iteration needs where it is accepted (one of them almost always is): no evaluation
            # of the accepted point afterwards; the longer, extrapolating candidates, rarely
            # accepted, by value only, and where one was accepted its gradient is evaluated below
            f_new, g_new = f, g
            for j in range(num_steps):
                with_grad = j >= unit
                # after the first candidate most problems accepted a larger step: evaluate this one
                # only on the groups that still need it; the extrapolating ones only where they may pay
                ev = _on_groups(need & expand if j < unit else need, cand[j], with_grad, j > 0 or unit > 0)
                if ev is None:
                    if j < unit:  # nobody extrapolates this iteration
                        continue
                    break
                fj, gj = ev
                ok[j] = need & (fj <= torch.add(f, decrease[j], alpha=armijo)) & (fj.abs() < torch.inf)
                if j < unit:
                    ok[j] &= expand
                if with_grad:
                    f_new = torch.where(ok[j], fj, f_new)
                    g_new = torch.where(ok[j].unsqueeze(-1), cast(Tensor, gj), g_new)  # with_grad
                need = need & ~ok[j]
        # a moving problem that accepted a step, and the largest accepted step (the first True)
        move, k = ok.max(0)
        x_new = cand.gather(0, k.view(1, B, 1).expand(1, B, p)).squeeze(0)
        x_new = torch.where(move.unsqueeze(-1), x_new, x)
        if line_search == "parallel":
            f_new, g_new = value_and_grad(x_new)
            f_new = torch.where(move, f_new, f)
            g_new = torch.where(move.unsqueeze(-1), g_new, g)
        elif unit > 0:  # problems that accepted a value-only (extrapolating) candidate
            late = ok[:unit].any(0)
            ev = _on_groups(late, x_new, True, True)
            if ev is not None:
                f_new = torch.where(late, ev[0], f_new)
                g_new = torch.where(late.unsqueeze(-1), cast(Tensor, ev[1]), g_new)  # with_grad
        # BFGS update of the inverse Hessian where the curvature condition holds
        s = x_new - x
        # curvature pairs on the free coordinates (s is zero on the held ones): the held
        # coordinates' gradients change along s through the coupling terms of the Hessian, and
        # with them in y the update learns the curvature of the full space, not of the free
        # subspace the steps move in (on a maximum at a bound: linear convergence instead of
        # superlinear, e.g. 19 instead of 7 iterations of a float64 polish)
        y = g_new - g if held is None else torch.where(held, zero, g_new - g)
        sy_ = torch.stack((s, y), -2)  # B x 2 x p
        gram = matmul(sy_, sy_.mT)  # B x 2 x 2: sᵀs, sᵀy, yᵀy in one product
        ss, sy, yy = gram[:, 0, 0], gram[:, 0, 1], gram[:, 1, 1]
        upd = move & (sy > 1e-10 * torch.sqrt(ss * yy))  # also sᵀy > 0
        # before the first update: H₀ = (sᵀy / yᵀy) I (Nocedal & Wright 6.20)
        nH0 = torch.where(first.view(B, 1, 1), neg_eye * (sy / yy.clamp_min(tiny)).view(B, 1, 1), nH)
        rho = torch.where(upd, sy, one).reciprocal()
        nHy = matmul(nH0, y.unsqueeze(-1)).squeeze(-1)  # -H₀y
        q = matmul(y.unsqueeze(-2), nHy.unsqueeze(-1)).view(B)  # -yᵀH₀y
        # H₀ − ρ(H₀y sᵀ + s yᵀH₀) + (ρ²yᵀH₀y + ρ) ssᵀ = H₀ + a uᵀ + u (−H₀y)ᵀ, u = ρs, a = (1 + ρyᵀH₀y)s − H₀y
        u = rho.unsqueeze(-1) * s
        a = torch.addcmul(nHy, torch.addcmul(one, rho, q, value=-1.0).unsqueeze(-1), s)
        nH_upd = nH0 - matmul(torch.stack((a, u), -1), torch.stack((u, nHy), -2))
        nH = torch.where(upd.view(B, 1, 1), nH_upd, nH)
        first = first > upd  # first & ~upd
        # a failed line search restarts from steepest descent; failing that too, no decrease
        # is possible at this resolution: converged. So is a negligible decrease.
        failed = moving ^ move  # moving & ~move (move implies moving)
        small = (f - f_new) <= ftol * fscale
        done = done | (failed & first) | (move & small)
        iters = iters + move
        x, f, g = x_new, f_new, g_new
        if unit > 0 and extrapolate == "while_accepted":
            # extrapolate again only after a step that did, or from a (re)start (steepest descent)
            expand = ok[:unit].any(0) | first
        if check_every and not sync_free and (it + 1) % check_every and bool(done.all()):
            break  # on a CPU one read between the checks: no idle iterations once nothing moves
        if check_every and (it + 1) % check_every == 0:
            group_done = done.view(-1, group).all(-1)
            num_done = int(group_done.sum())
            if num_done == group_done.numel():
                break
            if restrict is not None and 4 * num_done >= group_done.numel():  # go on with the groups still moving
                if full is None or index is None:  # both set together
                    full, index = [t.clone() for t in (x, f, g, done, iters, nH, first)], torch.arange(B, device=dev)
                else:
                    for t, v in zip(full, (x, f, g, done, iters, nH, first), strict=True):
                        t[index] = v
                keep = (~group_done).repeat_interleave(group).nonzero().squeeze(-1)
                index = index[keep]
                x, f, g, nH, first, done, iters, failed, lo, hi, expand = (
                    t[keep] for t in (x, f, g, nH, first, done, iters, failed, lo, hi, expand)
                )
                if held is not None:
                    held = held[keep]
                if neg_step.ndim == 1:
                    neg_step = neg_step[keep]
                value_and_grad, sub_values = restrict(index)
                batch_values = sub_values if sub_values is not None else _stacked(value_and_grad)
                B = index.numel()
    if full is not None:
        for t, v in zip(full, (x, f, g, done, iters, nH, first), strict=True):
            t[index] = v
        x, f, g, done, iters, nH, first = full
    H = torch.where(first.view(-1, 1, 1), nan, nH.neg())
    return QNResult(x=x, fun=f, grad=g, converged=done, iterations=iters, inv_hessian=H)


def _evaluate(fns: tuple[ValueAndGrad, Values | None], x: Tensor, with_grad: bool) -> tuple[Tensor, Tensor | None]:
    """Values (and gradients) at ``x`` (``batch x p``) of ``(value_and_grad, values)``: with gradients
    the first, else the second (one call for the candidate step), ``value_and_grad``'s where none."""
    value_and_grad, values = fns
    if with_grad:
        return value_and_grad(x)
    return (values if values is not None else _stacked(value_and_grad))(x.unsqueeze(0))[0], None


def _stacked(value_and_grad: ValueAndGrad) -> Values:
    """``values`` from ``value_and_grad``: one call per candidate step."""
    return lambda xs: torch.stack([value_and_grad(x)[0] for x in xs])
