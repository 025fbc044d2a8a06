import pytest
import torch
from scipy.optimize import minimize

from fbo_torch.optim.quasi_newton import autograd_value_and_grad, minimize_batched

f64 = torch.float64


def rosen(x):
    return (100 * (x[..., 1:] - x[..., :-1] ** 2) ** 2 + (1 - x[..., :-1]) ** 2).sum(-1)


def _quadratics(seed):
    """8 random convex quadratics in 5-D (lambda_min(Q) >= 0.5): value-and-gradient and the minimizers."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(8, 5, 5, generator=g, dtype=f64)
    Q = A @ A.mT + 0.5 * torch.eye(5, dtype=f64)
    c = torch.randn(8, 5, generator=g, dtype=f64)

    def vg(x):
        Qx = (Q @ x.unsqueeze(-1)).squeeze(-1)
        return 0.5 * (x * Qx).sum(-1) - (c * x).sum(-1), Qx - c

    return vg, torch.linalg.solve(Q, c.unsqueeze(-1)).squeeze(-1)


def test_quadratic_converges_to_the_exact_minimizer():
    vg, x_star = _quadratics(0)
    res = minimize_batched(vg, torch.zeros(8, 5, dtype=f64), maxiter=60)
    assert res.converged.all()
    # BFGS on a quadratic: the gradient tolerance 1e-8 bounds |x - x*| by 1e-8 / λ_min(Q) (λ_min >= 0.5)
    torch.testing.assert_close(res.x, x_star, atol=1e-7, rtol=0)


def test_box_constrained_rosenbrock_no_worse_than_scipy_lbfgsb():
    g = torch.Generator().manual_seed(0)
    x0 = torch.rand(32, 4, generator=g, dtype=f64) * 2 - 1
    res = minimize_batched(autograd_value_and_grad(rosen), x0, lower=-0.5, upper=0.5, maxiter=200)
    assert res.converged.all()
    assert ((res.x >= -0.5) & (res.x <= 0.5)).all()
    ref = torch.tensor(
        [
            minimize(
                lambda z: rosen(torch.tensor(z)).item(),
                x0[i].numpy(),
                bounds=[(-0.5, 0.5)] * 4,
                method="L-BFGS-B",
                options={"ftol": 1e-14, "gtol": 1e-10},
            ).fun
            for i in range(32)
        ],
        dtype=f64,
    )
    # both reach a stationary point; ours may find a lower one, and is never above SciPy's beyond
    # the function's round-off at the solution (values ~ 1, float64)
    assert (res.fun <= ref + 1e-9).all(), (res.fun - ref).max()


def test_problems_are_independent_of_the_batch():
    x0 = torch.rand(10, 3, generator=torch.Generator().manual_seed(1), dtype=f64) * 2 - 1
    full = minimize_batched(autograd_value_and_grad(rosen), x0, maxiter=80)
    alone = minimize_batched(autograd_value_and_grad(rosen), x0[6:7], maxiter=80)
    assert torch.equal(alone.x[0], full.x[6])
    assert alone.iterations[0] == full.iterations[6]


@pytest.mark.parametrize("line_search", ["parallel", "sequential"])
@pytest.mark.parametrize("with_values", [True, False])
def test_dropping_converged_problems_changes_no_result(with_values, line_search):
    # shifted Rosenbrocks (problem b depends on its own shift c[b]): some start at their minimum and
    # stop at once, others take many iterations; with `restrict` the converged ones leave the batch
    g = torch.Generator().manual_seed(5)
    c = torch.rand(24, 3, generator=g, dtype=f64) - 0.5
    x0 = torch.rand(24, 3, generator=g, dtype=f64) * 2 - 1
    x0[:8] = c[:8] + 1.0  # rosen's minimum is at 1: converged at the first check

    def functions(shift):
        vg = autograd_value_and_grad(lambda x: rosen(x - shift))
        return vg, ((lambda xs: rosen(xs - shift)) if with_values else None)

    sizes = []

    def restrict(index):
        sizes.append(index.numel())
        assert torch.equal(index, index.sort().values) and index.unique().numel() == index.numel()
        return functions(c[index])

    kw = dict(
        lower=-1.5, upper=1.5, maxiter=120, init_step=torch.linspace(0.05, 0.5, 24, dtype=f64), line_search=line_search
    )
    plain = minimize_batched(*functions(c)[:1], x0, values=functions(c)[1], check_every=None, **kw)
    fast = minimize_batched(*functions(c)[:1], x0, values=functions(c)[1], restrict=restrict, **kw)
    if line_search == "parallel":  # restrict only drops problems: ever smaller batches
        assert sizes and sizes[0] <= 24 - 6 and sizes == sorted(sizes, reverse=True)
    else:  # it also line-searches sub-batches (at most 3/4 of the batch)
        assert sizes and max(sizes) <= 24 - 6
    for a, b in (
        (fast.x, plain.x),
        (fast.fun, plain.fun),
        (fast.grad, plain.grad),
        (fast.converged, plain.converged),
        (fast.iterations, plain.iterations),
    ):
        assert torch.equal(a, b)
    assert plain.converged.all()


def test_groups_leave_the_batch_together():
    # with group = 3, problems 3j..3j+2 leave together: restrict only ever sees whole groups
    g = torch.Generator().manual_seed(9)
    c = torch.rand(12, 2, generator=g, dtype=f64)
    x0 = torch.rand(12, 2, generator=g, dtype=f64) * 2 - 1
    x0[:6] = c[:6] + 1.0  # groups 0 and 1 start at their minima
    seen = []

    def restrict(index):
        seen.append(index)
        return autograd_value_and_grad(lambda x: rosen(x - c[index])), None

    vg = autograd_value_and_grad(lambda x: rosen(x - c))
    res = minimize_batched(vg, x0, maxiter=100, restrict=restrict, group=3)
    plain = minimize_batched(vg, x0, maxiter=100, check_every=None)
    assert seen and all(
        i.numel() % 3 == 0 and torch.equal(i.view(-1, 3) % 3, torch.arange(3).expand(i.numel() // 3, 3)) for i in seen
    )
    assert torch.equal(res.x, plain.x) and torch.equal(res.iterations, plain.iterations)
    with pytest.raises(ValueError, match="group"):
        minimize_batched(vg, x0, restrict=restrict, group=5)


def test_no_step_onto_an_infinite_plateau():
    # f = +inf where x0 > 1: from there, the Armijo threshold f + c1 * decrease is +inf as well and
    # would accept any +inf candidate; only finite values are accepted, and every candidate step
    # (at most 4 x 0.1 long) stays on the plateau, so the problem stays put
    def vg(x):
        f = torch.where(x[..., 0] > 1, torch.full_like(x[..., 0], torch.inf), (x * x).sum(-1))
        return f, 2 * x

    x0 = torch.tensor([[3.0, 0.5]], dtype=f64)
    for ls in ("parallel", "sequential"):
        res = minimize_batched(vg, x0, maxiter=20, init_step=0.1, max_step=4.0, line_search=ls, check_every=None)
        assert torch.equal(res.x, x0) and res.iterations[0] == 0


def test_nonfinite_candidates_are_rejected():
    # log-barrier at 0: the line search must not accept a step into the region where f is inf
    def vg(x):
        f = torch.where(x[..., 0] > 0, -torch.log(x[..., 0]) + x[..., 0], torch.full_like(x[..., 0], torch.inf))
        return f, (-1.0 / x + 1.0)

    res = minimize_batched(vg, torch.full((3, 1), 5.0, dtype=f64), maxiter=60, init_step=10.0)
    torch.testing.assert_close(res.x, torch.ones(3, 1, dtype=f64), atol=1e-6, rtol=0)


def test_shape_check():
    with pytest.raises(ValueError, match="x0"):
        minimize_batched(autograd_value_and_grad(rosen), torch.zeros(3, dtype=f64))


def test_sequential_and_parallel_line_searches_take_the_same_steps():
    # the CPU path (one candidate step at a time, early exit) and the GPU path (all steps in one
    # call, fixed iterations) accept the same steps, so they reach the same points
    x0 = torch.rand(12, 3, generator=torch.Generator().manual_seed(2), dtype=f64) * 2 - 1
    vg = autograd_value_and_grad(rosen)
    seq = minimize_batched(vg, x0, lower=-0.8, upper=0.8, maxiter=120, line_search="sequential", check_every=4)
    par = minimize_batched(vg, x0, lower=-0.8, upper=0.8, maxiter=120, line_search="parallel", check_every=None)
    torch.testing.assert_close(seq.x, par.x, atol=1e-12, rtol=0)
    assert torch.equal(seq.iterations, par.iterations)
    with pytest.raises(ValueError, match="line_search"):
        minimize_batched(vg, x0, line_search="newton")


def test_extrapolating_line_search_keeps_exact_convergence():
    # candidates up to 4x the quasi-Newton step (the maximizer's lengthscale rule): on a quadratic
    # the 4x step fails Armijo near the minimum (f(x + 4d) - f(x) = -4 g'd > 0), so BFGS still
    # converges to the gradient tolerance: |x - x*| <= 1e-8 / lambda_min(Q), lambda_min >= 0.5
    vg, x_star = _quadratics(3)
    steps = torch.linspace(0.01, 1.0, 8, dtype=f64)  # one first-step length per problem
    res = minimize_batched(vg, torch.zeros(8, 5, dtype=f64), maxiter=100, init_step=steps, max_step=4.0, num_steps=6)
    assert res.converged.all()
    torch.testing.assert_close(res.x, x_star, atol=1e-7, rtol=0)


def test_extrapolation_takes_the_long_step_far_from_a_minimum():
    # f(x) = -exp(-x^2/2) from x = 3 (gradient ~ 0.033): a first step of 0.1 and candidates up to
    # 4x reach the well from the flat tail in fewer iterations than plain backtracking
    def vg(x):
        e = torch.exp(-0.5 * x * x)
        return -e.sum(-1), x * e

    x0 = torch.full((1, 1), 3.0, dtype=f64)
    plain = minimize_batched(vg, x0, maxiter=200, init_step=0.1, check_every=None, gtol=1e-10)
    ext = minimize_batched(vg, x0, maxiter=200, init_step=0.1, max_step=4.0, num_steps=6, check_every=None, gtol=1e-10)
    for r in (plain, ext):
        torch.testing.assert_close(r.x, torch.zeros(1, 1, dtype=f64), atol=1e-8, rtol=0)
    assert ext.iterations[0] < plain.iterations[0]


def test_max_step_scales_the_candidate_steps():
    # f = (x - 0.3)^2 from 0, first step of length 1 towards +x, candidates max_step * (1, 1/4, 1/16):
    # max_step 2 -> 2 (f = 2.89, fails Armijo), 1/2 (f = 0.04, passes): the largest passing one, 1/2
    def vg(x):
        return ((x - 0.3) ** 2).sum(-1), 2 * (x - 0.3)

    r = minimize_batched(
        vg,
        torch.zeros(1, 1, dtype=f64),
        maxiter=1,
        init_step=1.0,
        max_step=2.0,
        num_steps=3,
        shrink=0.25,
        check_every=None,
    )
    torch.testing.assert_close(r.x, torch.full((1, 1), 0.5, dtype=f64), atol=0, rtol=0)


def test_line_search_argument_checks():
    vg = autograd_value_and_grad(rosen)
    x0 = torch.zeros(4, 2, dtype=f64)
    with pytest.raises(ValueError, match="max_step"):
        minimize_batched(vg, x0, max_step=0.0)
    with pytest.raises(ValueError, match="init_step"):
        minimize_batched(vg, x0, init_step=torch.ones(3, dtype=f64))


def test_smaller_steps_are_evaluated_only_where_still_needed():
    # the sequential (CPU) line search with `restrict`: once most problems accepted a larger
    # step, the next candidate is evaluated on the groups that still need it; same result,
    # fewer evaluations (shifted Rosenbrocks in groups of 2)
    g = torch.Generator().manual_seed(6)
    c = torch.rand(40, 3, generator=g, dtype=f64) - 0.5
    x0 = torch.rand(40, 3, generator=g, dtype=f64) * 2 - 1
    points = []

    def functions(shift):
        def values(xs):
            points.append(xs.shape[0] * xs.shape[1])
            return rosen(xs - shift)

        vg = autograd_value_and_grad(lambda x: rosen(x - shift))

        def value_and_grad(x):  # from the unit step down the candidates come with their gradients
            points.append(x.shape[0])
            return vg(x)

        return value_and_grad, values

    kw = dict(lower=-1.5, upper=1.5, maxiter=60, line_search="sequential", check_every=10**6, group=2)
    vg, values = functions(c)
    plain = minimize_batched(vg, x0, values=values, **kw)
    n_plain, points[:] = sum(points), []
    fast = minimize_batched(vg, x0, values=values, restrict=lambda index: functions(c[index]), **kw)
    assert sum(points) < n_plain
    for a, b in ((fast.x, plain.x), (fast.fun, plain.fun), (fast.iterations, plain.iterations)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("max_step", [1.0, 4.0])
def test_sequential_line_search_evaluates_each_accepted_point_once(max_step):
    # on a CPU the candidates from the unit step down come with their gradients: the accepted
    # point is not evaluated again (an extrapolating candidate, value only, gets its gradient
    # where it was accepted); the same iterates as the parallel (GPU) search, which evaluates
    # every candidate by value and the accepted point with its gradient
    calls = {"vg": 0, "values": 0}
    vg0 = autograd_value_and_grad(rosen)

    def vg(x):
        calls["vg"] += 1
        return vg0(x)

    def values(xs):
        calls["values"] += 1
        return rosen(xs)

    x0 = torch.rand(16, 3, generator=torch.Generator().manual_seed(9), dtype=f64) * 2 - 1
    kw = dict(values=values, lower=-1.2, upper=1.2, maxiter=40, max_step=max_step, num_steps=5)
    seq = minimize_batched(vg, x0, line_search="sequential", check_every=None, **kw)
    n_seq = dict(calls)
    calls.update(vg=0, values=0)
    par = minimize_batched(vg, x0, line_search="parallel", check_every=None, **kw)
    # `values` and `value_and_grad` compute rosen the same way: the same iterates, bit for bit
    for a, b in ((seq.x, par.x), (seq.fun, par.fun), (seq.grad, par.grad), (seq.iterations, par.iterations)):
        assert torch.equal(a, b)
    assert calls == {"vg": 41, "values": 40}  # parallel: one gradient per iteration (+ the start)
    if max_step == 1.0:
        # the unit step is the first candidate: every evaluation comes with its gradient, and
        # fewer calls than the parallel search, which evaluates each accepted point twice
        assert n_seq["values"] == 0 and n_seq["vg"] < 81
    else:
        assert 0 < n_seq["values"] <= 40  # only the 4x candidate by value, once per iteration at most


def test_late_gradients_of_extrapolated_steps_in_dropped_batches():
    # with extrapolating candidates (max_step 4) a problem that accepted the 4x step, evaluated by
    # value only, gets its gradient afterwards, on the groups it is in; with `restrict` (converged
    # groups dropped, late evaluations on sub-batches) the same iterates as without, bit for bit
    g = torch.Generator().manual_seed(11)
    c = torch.rand(40, 3, generator=g, dtype=f64) - 0.5
    x0 = torch.rand(40, 3, generator=g, dtype=f64) * 2 - 1
    sub_calls = []

    def functions(shift, record=False):
        vg = autograd_value_and_grad(lambda x: rosen(x - shift))

        def value_and_grad(x):
            if record:
                sub_calls.append(x.shape[0])
            return vg(x)

        return value_and_grad, (lambda xs: rosen(xs - shift))

    kw = dict(
        lower=-1.5,
        upper=1.5,
        maxiter=60,
        line_search="sequential",
        check_every=4,
        group=2,
        max_step=4.0,
        num_steps=5,
        init_step=0.05,
    )
    vg, values = functions(c)
    plain = minimize_batched(vg, x0, values=values, **kw)
    fast = minimize_batched(vg, x0, values=values, restrict=lambda index: functions(c[index], True), **kw)
    par = minimize_batched(vg, x0, values=values, **{**kw, "line_search": "parallel", "check_every": None})
    assert sub_calls and min(sub_calls) < 40  # sub-batches were evaluated with their gradients
    for a, b, p in (
        (fast.x, plain.x, par.x),
        (fast.fun, plain.fun, par.fun),
        (fast.iterations, plain.iterations, par.iterations),
    ):
        assert torch.equal(a, b) and torch.equal(a, p)


@pytest.mark.parametrize("line_search", ["sequential", "parallel"])
def test_extrapolating_only_while_accepted_reaches_the_same_minima_with_fewer_evaluations(line_search):
    # 16 Rosenbrock problems from random starts, candidate steps up to 4x the Newton step: trying the
    # long steps only while they are accepted converges to the same minimizer (to the tolerances),
    # and on the sequential (CPU) search evaluates fewer points by value
    counts = {}

    def run(mode):
        calls = {"values": 0}

        def values(xs):
            calls["values"] += xs.shape[0] * xs.shape[1]
            return rosen(xs)

        x0 = torch.rand(16, 3, generator=torch.Generator().manual_seed(5), dtype=f64) * 2 - 1
        res = minimize_batched(
            autograd_value_and_grad(rosen),
            x0,
            values=values,
            lower=-1.5,
            upper=1.5,
            maxiter=300,
            max_step=4.0,
            num_steps=5,
            gtol=1e-10,
            line_search=line_search,
            extrapolate=mode,
        )
        counts[mode] = calls["values"]
        return res

    always, sparing = run("always"), run("while_accepted")
    assert always.converged.all() and sparing.converged.all()
    torch.testing.assert_close(sparing.x, torch.ones(16, 3, dtype=f64), atol=1e-6, rtol=0)
    torch.testing.assert_close(always.x, sparing.x, atol=1e-6, rtol=0)
    if line_search == "sequential":
        assert counts["while_accepted"] < counts["always"]
    with pytest.raises(ValueError, match="extrapolate"):
        minimize_batched(autograd_value_and_grad(rosen), torch.zeros(2, 3, dtype=f64), extrapolate="sometimes")


def test_sample_paths_spare_extrapolation_only_in_low_dimensions():
    from fbo_torch.models.batched_gp import BatchedExactGP
    from fbo_torch.utils import keyed_random as kr

    for d, mode in ((2, "while_accepted"), (3, "while_accepted"), (5, "always")):
        X = torch.rand(2, 8, d, generator=torch.Generator().manual_seed(d), dtype=f64)
        bounds = torch.tensor([[0.0] * d, [1.0] * d], dtype=f64)
        gp = BatchedExactGP(X, X.sum(-1, keepdim=True), bounds)
        assert gp.draw_paths(kr.fold(kr.root_key(0, "x"), torch.arange(2)), 16).extrapolate == mode


def test_a_continuation_with_the_learned_inverse_hessian_converges_at_once():
    # stopped early, then continued from where it stopped with the curvature it learned: a few
    # quasi-Newton steps finish it (not the steepest-descent start of a cold run); NaN rows start cold
    vg, x_star = _quadratics(2)
    early = minimize_batched(vg, torch.zeros(8, 5, dtype=f64), maxiter=6)
    assert not early.converged.all() and early.inv_hessian.shape == (8, 5, 5)
    H = early.inv_hessian.clone()
    H[0] = torch.nan
    warm = minimize_batched(vg, early.x, maxiter=60, inv_hessian=H, ftol=0.0)  # to gtol
    cold = minimize_batched(vg, early.x, maxiter=60, ftol=0.0)
    assert warm.converged.all() and cold.converged.all()
    torch.testing.assert_close(warm.x, x_star, atol=1e-7, rtol=0)  # as in the quadratic test above
    assert warm.iterations[1:].sum() <= 0.8 * cold.iterations[1:].sum(), (warm.iterations, cold.iterations)
    assert torch.equal(warm.x[0], cold.x[0]) and warm.iterations[0] == cold.iterations[0]  # NaN: a cold start
    # the learned approximation is symmetric positive definite where it holds curvature
    Hf = warm.inv_hessian[~warm.inv_hessian.isnan().flatten(1).any(-1)]
    torch.testing.assert_close(Hf, Hf.mT, atol=1e-12, rtol=1e-9)
    assert (torch.linalg.eigvalsh(Hf) > 0).all()
    with pytest.raises(ValueError, match="inv_hessian"):
        minimize_batched(vg, early.x, inv_hessian=H[:, :4])


def test_a_minimum_on_a_face_of_the_box_converges_superlinearly_in_the_free_coordinates():
    # 1/2 xᵀQx − cᵀx on [0, 1]²: coupled coordinates (Q01 = ρ in [0.5, 0.95]), the minimum on the
    # face x0 = 0 at x1 = c1 (the gradient's first component there, ρ c1 + 0.5 > 0, points out of
    # the box). The curvature pairs must be those of the free coordinate: with the held one's
    # gradient change (ρ s1) in y, BFGS learned the full-space curvature and converged linearly
    # (7-60 iterations, some stopping 1e-3 away); on the free coordinate a 1-D quadratic needs one
    # secant pair.
    g = torch.Generator().manual_seed(0)
    B = 8
    rho = 0.5 + 0.45 * torch.rand(B, generator=g, dtype=f64)
    one = torch.ones(B, dtype=f64)
    Q = torch.stack([torch.stack([one, rho], -1), torch.stack([rho, one], -1)], -2)
    c1 = 0.2 + 0.6 * torch.rand(B, generator=g, dtype=f64)
    c = torch.stack([-0.5 * one, c1], -1)

    def vg(x):
        Qx = (Q @ x.unsqueeze(-1)).squeeze(-1)
        return 0.5 * (x * Qx).sum(-1) - (c * x).sum(-1), Qx - c

    x_star = torch.stack([0 * one, c1], -1)
    # cold from the inside, and a continuation next to the minimum with the full-space inverse
    # Hessian Q⁻¹ (what a climb that reached the face last would pass on)
    box = dict(lower=0.0, upper=1.0, maxiter=60, ftol=0.0)  # to gtol: the bound below
    cold = minimize_batched(vg, torch.full((B, 2), 0.9, dtype=f64), **box)
    x0 = x_star + torch.tensor([0.0, 1e-3], dtype=f64)
    warm = minimize_batched(vg, x0, inv_hessian=torch.linalg.inv(Q), **box)
    for res, most in ((cold, 4), (warm, 2)):
        assert res.converged.all()
        assert (res.iterations <= most).all(), res.iterations
        # the gradient tolerance 1e-8 bounds |x1 - x1*| by 1e-8 / Q11 (Q11 = 1)
        torch.testing.assert_close(res.x, x_star, atol=1e-8, rtol=0)


def test_a_step_predicting_no_resolvable_decrease_ends_the_problem_before_its_evaluation():
    # quadratics lifted to |f| ~ 1e3, run to the end (no gradient or decrease tolerance): without
    # dtol a problem ends only when its line search has failed twice (quasi-Newton, then steepest
    # descent); with dtol = ε it stops once its step predicts a decrease of at most ε|f|, and
    # the decrease it leaves is of that size: on a quadratic with H ≈ Q⁻¹ the remaining gap
    # ½gᵀQ⁻¹g is the predicted ½gᵀHg (2ε|f| allows H to be off by a factor of two)
    g = torch.Generator().manual_seed(3)
    A = torch.randn(8, 5, 5, generator=g, dtype=f64)
    Q = A @ A.mT + 0.5 * torch.eye(5, dtype=f64)
    c = torch.randn(8, 5, generator=g, dtype=f64)
    x_star = torch.linalg.solve(Q, c.unsqueeze(-1)).squeeze(-1)
    f_star = 1e3 - 0.5 * (c * x_star).sum(-1)
    evaluated = []

    def vg(x):
        evaluated.append(x.shape[0])
        Qx = (Q @ x.unsqueeze(-1)).squeeze(-1)
        return 0.5 * (x * Qx).sum(-1) - (c * x).sum(-1) + 1e3, Qx - c

    eps = torch.finfo(f64).eps
    runs = {}
    for dtol in (None, eps):
        evaluated.clear()
        res = minimize_batched(vg, torch.zeros(8, 5, dtype=f64), maxiter=100, gtol=0.0, ftol=0.0, dtol=dtol)
        assert res.converged.all()
        if dtol is not None:
            for bad in (-1.0, float("nan")):
                with pytest.raises(ValueError, match="dtol"):
                    minimize_batched(vg, torch.zeros(8, 5, dtype=f64), dtol=bad)
        e = res.x - x_star
        gap = 0.5 * (e.unsqueeze(-2) @ Q @ e.unsqueeze(-1)).view(-1)  # f − f*, without f's rounding
        runs[dtol] = (res.iterations, sum(evaluated), gap)
    (it0, ev0, _), (it1, ev1, gap1) = runs[None], runs[eps]
    assert (it1 <= it0).all() and it1.sum() < it0.sum(), (it0, it1)
    assert ev1 < ev0
    assert (gap1 <= 2 * eps * f_star.abs()).all(), gap1 / (eps * f_star.abs())


def _aten_calls(fn) -> int:
    """The operators ``fn()`` dispatches (on the CPU path: no ``FBO_SYNC_FREE``)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name.startswith("aten::"))


def test_no_iteration_runs_once_every_problem_has_converged(monkeypatch):
    # with check_every a CPU reads at every iteration whether anything still moves, so a cap of
    # 50 or of 200 iterations runs the same operations (the restrictions stay every check_every);
    # the GPU path (here FBO_SYNC_FREE=1) reads nothing unless asked and runs every iteration
    vg, _ = _quadratics(4)
    x0 = torch.zeros(8, 5, dtype=f64)
    runs = {m: minimize_batched(vg, x0, maxiter=m, check_every=1000) for m in (50, 200)}
    assert runs[50].converged.all() and runs[50].iterations.max() < 50
    assert torch.equal(runs[50].x, runs[200].x)
    ops = {m: _aten_calls(lambda m=m: minimize_batched(vg, x0, maxiter=m, check_every=1000)) for m in (50, 200)}
    assert ops[50] == ops[200], ops
    monkeypatch.setenv("FBO_SYNC_FREE", "1")
    ops = {m: _aten_calls(lambda m=m: minimize_batched(vg, x0, maxiter=m, check_every=1000)) for m in (50, 200)}
    assert ops[50] < ops[200], ops


def _shifted_groups(seed, G, k, p=3):
    """``G`` shifted Rosenbrocks (function ``j``: ``rosen(x − c_j)``), ``k`` restarts each (problem
    ``j·k + i`` is restart ``i`` of function ``j``), and ``restrict`` in both of its forms."""
    g = torch.Generator().manual_seed(seed)
    c = torch.rand(G, p, generator=g, dtype=f64) - 0.5
    x0 = torch.rand(G * k, p, generator=g, dtype=f64) * 2 - 1
    calls, points = [], []

    def functions(shift):
        vg = autograd_value_and_grad(lambda x: rosen(x - shift))

        def value_and_grad(x):
            points.append(x.shape[0])
            return vg(x)

        def values(xs):
            points.append(xs.shape[0] * xs.shape[1])
            return rosen(xs - shift)

        return value_and_grad, values

    def restrict(index, size=k):
        calls.append((None if index is None else index.clone(), size))
        # index: blocks of `size` problems of one function each; None: a block of every function
        return functions(
            c.repeat_interleave(size, 0) if index is None else c[torch.div(index, k, rounding_mode="floor")]
        )

    return functions(c.repeat_interleave(k, 0)), x0, restrict, calls, points


def test_groups_evaluated_by_blocks_take_the_same_steps_on_fewer_points():
    # sub_group: a group with few restarts left to evaluate at a step is evaluated on those alone;
    # Rosenbrock's value does not depend on the block a point is in, so every iterate is the same
    G, k = 12, 8
    (vg, values), x0, restrict, calls, points = _shifted_groups(11, G, k)
    kw = dict(lower=-1.5, upper=1.5, maxiter=80, line_search="sequential", group=k)
    plain = minimize_batched(vg, x0, values=values, check_every=None, **kw)
    n_plain, points[:] = sum(points), []
    fast = minimize_batched(vg, x0, values=values, restrict=restrict, sub_group=3, **kw)
    for a, b in ((fast.x, plain.x), (fast.fun, plain.fun), (fast.iterations, plain.iterations)):
        assert torch.equal(a, b)
    assert plain.converged.all() and sum(points) < n_plain
    blocks = [(i, size) for i, size in calls if size == 3]
    assert blocks and any(i is None for i, _ in blocks) and any(i is not None for i, _ in blocks)
    for i, _ in blocks:  # each block holds restarts of one function, in order (the first repeated)
        if i is not None:
            b = i.view(-1, 3)
            assert (torch.div(b, k, rounding_mode="floor") == torch.div(b[:, :1], k, rounding_mode="floor")).all()
            assert ((b[:, 1:] > b[:, :-1]) | (b[:, 1:] == b[:, :1])).all()
    # with extrapolating candidates (value-only, then the gradient where one was accepted) and some
    # problems inactive: still the plain run's steps
    active = torch.rand(G * k, generator=torch.Generator().manual_seed(1)) > 0.2
    kw.update(max_step=4.0, num_steps=6, active=active)
    plain = minimize_batched(vg, x0, values=values, check_every=None, **kw)
    fast = minimize_batched(vg, x0, values=values, restrict=restrict, sub_group=3, **kw)
    for a, b in ((fast.x, plain.x), (fast.fun, plain.fun), (fast.iterations, plain.iterations)):
        assert torch.equal(a, b)
    assert torch.equal(fast.x[~active], x0[~active])
    for bad in (0, k, 2.5, True):
        with pytest.raises(ValueError, match="sub_group"):
            minimize_batched(vg, x0, restrict=restrict, group=k, sub_group=bad)
    with pytest.raises(ValueError, match="sub_group"):
        minimize_batched(vg, x0, group=k, sub_group=2)


def test_inactive_problems_stay_where_they_start():
    # `active`: the other problems are evaluated at their start and returned there, as converged;
    # the active ones take the steps they take in a batch of their own
    vg, x_star = _quadratics(5)
    x0 = torch.zeros(8, 5, dtype=f64)
    active = torch.tensor([True, False, True, True, False, True, False, True])
    res = minimize_batched(vg, x0, maxiter=60, active=active)
    alone = minimize_batched(lambda x: tuple(t[active] for t in vg(_scatter(x, active))), x0[active], maxiter=60)
    assert torch.equal(res.x[active], alone.x) and torch.equal(res.iterations[active], alone.iterations)
    assert torch.equal(res.x[~active], x0[~active]) and (res.iterations[~active] == 0).all()
    assert res.converged.all() and torch.equal(res.fun[~active], vg(x0)[0][~active])
    for bad in (active[:5], active.long(), active.tolist()):
        with pytest.raises(ValueError, match="active"):
            minimize_batched(vg, x0, active=bad)


def _scatter(x, active):
    """``x`` (``active.sum() x p``) written into the rows ``active`` of a zero ``8 x p`` batch."""
    out = torch.zeros(active.numel(), x.shape[-1], dtype=x.dtype)
    out[active] = x
    return out
