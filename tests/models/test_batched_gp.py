import math
import warnings
from functools import partial

import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.sampling.pathwise import draw_kernel_feature_paths, draw_matheron_paths
from gpytorch.mlls import ExactMarginalLogLikelihood

from fbo_torch.models.batched_gp import BatchedExactGP, GPSpec
from fbo_torch.sampling.gp_paths import GPThompsonPaths
from fbo_torch.utils import keyed_random as kr

f64 = torch.float64


def _data(B=6, n=15, d=3, seed=0, lo=-1.0, hi=2.0):
    g = torch.Generator().manual_seed(seed)
    X = lo + (hi - lo) * torch.rand(B, n, d, generator=g, dtype=f64)
    Y = torch.sin(2 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(B, n, 1, generator=g, dtype=f64)
    bounds = torch.tensor([[lo] * d, [hi] * d], dtype=f64)
    return X, Y, bounds


def _gpytorch_mll(model):
    model.train()
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    with torch.no_grad():
        return mll(model(*model.train_inputs), model.train_targets)


@pytest.mark.parametrize("spec", ["botorch", "rbf", "fbo"])
def test_mll_equals_gpytorch(spec):
    X, Y, bounds = _data()
    gp = BatchedExactGP(X, Y, bounds, spec=spec)
    gp.params = gp.params + 0.3 * torch.randn(gp.params.shape, generator=torch.Generator().manual_seed(1), dtype=f64)
    ref = _gpytorch_mll(gp.to_botorch())
    # without priors the two are the same float64 computation (Cholesky of a 15 x 15 matrix):
    # agreement to ~1e-13. GPyTorch stores the LogNormal priors' loc/scale in float32
    # (relative error 6e-8 on loc ~ 1.96), which moves log p(ℓ) by ~1e-7 per dimension.
    tol = 1e-6 if gp.spec.priors else 1e-11
    torch.testing.assert_close(gp.mll(), ref, atol=tol, rtol=0)


def test_masked_observations_equal_dropping_them():
    X, Y, bounds = _data(B=3, n=12)
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[1, [2, 7]] = False
    Yn = Y.clone()
    Yn[1, [2, 7]] = float("nan")  # failed evaluations
    gp = BatchedExactGP(X, Yn, bounds, mask=mask)
    keep = mask[1]
    single = BatchedExactGP(X[1:2, keep], Y[1:2, keep], bounds)
    torch.testing.assert_close(gp.mll()[1], single.mll()[0], atol=1e-12, rtol=1e-12)
    assert torch.isfinite(gp.mll()).all()
    gp.fit(maxiter=40)
    single.fit(maxiter=40)
    torch.testing.assert_close(gp.params[1], single.params[0], atol=1e-8, rtol=1e-8)


def test_leave_one_out_density_equals_conditioning_on_the_other_points():
    """The closed form equals the definition: each valid observation's density under the GP conditioned on the
    others (the same hyperparameters), masked entries left out; float64 solves of 12 x 12 systems agree to ~1e-10."""
    X, Y, bounds = _data(B=3, n=12)
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[1, -3:] = False
    gp = BatchedExactGP(X, Y, bounds, spec="fbo", mask=mask).fit(maxiter=40)
    K = gp._train_cov(gp.params)
    r = gp.y - gp.unpack(gp.params)["mean"].unsqueeze(-1)
    expected = []
    for b in range(3):
        idx = mask[b].nonzero().squeeze(-1)
        Kb, rb, total = K[b][idx][:, idx], r[b][idx], 0.0
        for i in range(len(idx)):
            rest = [j for j in range(len(idx)) if j != i]
            k = Kb[i, rest]
            mu = k @ torch.linalg.solve(Kb[rest][:, rest], rb[rest])
            var = Kb[i, i] - k @ torch.linalg.solve(Kb[rest][:, rest], k)
            total += float(-0.5 * torch.log(2 * math.pi * var) - 0.5 * (rb[i] - mu) ** 2 / var)
        expected.append(total)
    torch.testing.assert_close(gp.loo_log_predictive(), torch.tensor(expected, dtype=f64), atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("spec", ["botorch", "rbf"])
def test_fit_is_as_good_as_fit_gpytorch_mll(spec):
    # per-agent MLL after our batched BFGS vs BoTorch's SciPy L-BFGS-B on the same model;
    # both evaluated by GPyTorch. Stated tolerance: ours >= SciPy's - 1e-4 (MLL per datum).
    X, Y, bounds = _data(B=12, n=20, d=3, seed=2)
    ours = BatchedExactGP(X, Y, bounds, spec=spec).fit(maxiter=100)
    assert ours.converged.all()
    ref_model = BatchedExactGP(X, Y, bounds, spec=spec).to_botorch()
    ref_model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_gpytorch_mll(ExactMarginalLogLikelihood(ref_model.likelihood, ref_model))
    ref = _gpytorch_mll(ref_model)
    got = _gpytorch_mll(ours.to_botorch())
    assert (got >= ref - 1e-4).all(), (got - ref).min()


def test_fit_of_one_agent_does_not_depend_on_the_batch():
    X, Y, bounds = _data(B=5, n=14, seed=3)
    full = BatchedExactGP(X, Y, bounds).fit(maxiter=60)
    alone = BatchedExactGP(X[3:4], Y[3:4], bounds).fit(maxiter=60)
    # the same iterations on the same numbers; batched kernels may reassociate sums (float64)
    torch.testing.assert_close(alone.params[0], full.params[3], atol=1e-9, rtol=1e-9)


def test_restarts_keep_the_best_start():
    X, Y, bounds = _data(B=4, n=16, seed=4)
    spec = GPSpec(ard=False, outputscale=True, mean="zero", priors=False, standardize=False, lengthscale_lower=1e-3)
    gp = BatchedExactGP(X, Y, bounds, spec=spec)
    starts = gp.random_params(kr.fold(kr.root_key(0, "restarts"), torch.arange(4)), 5)
    assert starts.shape == (5, 4, gp.params.shape[-1])
    plain = BatchedExactGP(X, Y, bounds, spec=spec).fit(maxiter=60)
    multi = gp.fit(maxiter=60, restarts=starts)
    assert (multi.mll() >= plain.mll() - 1e-9).all()


@pytest.mark.parametrize("spec", ["botorch", "authors"])
def test_dropping_converged_fits_changes_no_result(spec):
    # on a CPU the fit drops converged problems from the batch (minimize_batched's `restrict`);
    # check_every=None keeps the whole batch to the end: the same iterations per problem, so the
    # same parameters up to batched kernels' reassociation of float64 sums (as for one agent alone)
    X, Y, bounds = _data(B=8, n=18, d=2, seed=6)
    mask = torch.rand(8, 18, generator=torch.Generator().manual_seed(7)) > 0.2
    gp = BatchedExactGP(X, Y, bounds, spec=spec, mask=mask)
    starts = gp.random_params(kr.fold(kr.root_key(1, "restarts"), torch.arange(8)), 6)
    fast = BatchedExactGP(X, Y, bounds, spec=spec, mask=mask).fit(maxiter=60, restarts=starts)
    plain = BatchedExactGP(X, Y, bounds, spec=spec, mask=mask).fit(maxiter=60, restarts=starts, check_every=None)
    torch.testing.assert_close(fast.params, plain.params, atol=1e-9, rtol=1e-9)
    assert torch.equal(fast.converged, plain.converged)


def test_paths_evaluate_like_botorch_matheron_paths():
    # BoTorch draws the randomness; our closed-form evaluation must give the same path values
    X, Y, bounds = _data(B=3, n=10, d=2)
    gp = BatchedExactGP(X, Y, bounds).fit(maxiter=40)
    model = gp.to_botorch()
    torch.manual_seed(0)
    paths = draw_matheron_paths(model, torch.Size(), prior_sampler=partial(draw_kernel_feature_paths, num_features=64))
    W = paths.paths.prior_paths.feature_map.weight / gp.hyperparameters["lengthscale"].unsqueeze(-2)
    w = paths.paths.prior_paths.weight
    v = paths.paths.update_paths.weight
    hp = gp.hyperparameters
    ours = GPThompsonPaths(
        bounds[0],
        bounds[1] - bounds[0],
        W,
        w,
        torch.sqrt(2.0 * hp["outputscale"] / 64),
        gp.X,
        v,
        hp["lengthscale"],
        hp["outputscale"],
        hp["mean"],
        gp.y_mean,
        gp.y_std,
    )
    Xt = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(
        3, 7, 2, generator=torch.Generator().manual_seed(5), dtype=f64
    )
    with torch.no_grad():
        ref = paths(Xt)
    torch.testing.assert_close(ours(Xt), ref, atol=1e-10, rtol=1e-10)


def test_path_moments_match_the_posterior():
    # many keyed draws of one agent's path: mean and variance at test points vs the exact
    # GP posterior (RFF prior features are unbiased, so only Monte Carlo error remains)
    X, Y, bounds = _data(B=1, n=8, d=1, seed=6)
    gp = BatchedExactGP(X, Y, bounds).fit(maxiter=40)
    S = 4000
    big = BatchedExactGP(X.expand(S, -1, -1), Y.expand(S, -1, -1), bounds, params=gp.params.expand(S, -1))
    paths = big.draw_paths(kr.fold(kr.root_key(0, "moments"), torch.arange(S)), num_features=512)
    Xt = torch.linspace(-1, 2, 9, dtype=f64).view(1, 9, 1)
    vals = paths(Xt.expand(S, -1, -1))  # S x 9
    post = gp.to_botorch().posterior(Xt[0])
    mu, var = post.mean.squeeze(-1).detach(), post.variance.squeeze(-1).detach()
    se = (var / S).sqrt()
    assert ((vals.mean(0) - mu).abs() / se).max() < 4.5
    # sample variance: relative s.e. sqrt(2/S) ~ 2.2%, plus the RFF prior's own finite-F error
    assert ((vals.var(0) / var - 1).abs()).max() < 0.15


def test_closed_form_gradient_equals_autograd():
    X, Y, bounds = _data(B=4, n=9, d=3, seed=7)
    gp = BatchedExactGP(X, Y, bounds).fit(maxiter=30)
    paths = gp.draw_paths(kr.fold(kr.root_key(1, "g"), torch.arange(4)), num_features=32)
    Xq = (bounds[0] + (bounds[1] - bounds[0]) * torch.rand(4, 5, 3, dtype=f64)).requires_grad_(True)
    f, g = paths.value_and_grad(Xq.detach())
    (g_ref,) = torch.autograd.grad(paths(Xq).sum(), Xq)
    torch.testing.assert_close(g, g_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(f, paths(Xq.detach()))


@pytest.mark.parametrize("spec", ["botorch", "rbf", "authors", "fbo"])
def test_mll_closed_form_gradient_equals_autograd(spec):
    # every spec's parametrization (ARD or shared lengthscale, signal variance, mean, priors), with
    # masked observations; float64 roundoff of a 12 x 12 Cholesky with condition < 1e6 is far below 1e-8
    X, Y, bounds = _data(B=5, n=12, d=3, seed=11)
    mask = torch.rand(5, 12, generator=torch.Generator().manual_seed(3)) > 0.3
    gp = BatchedExactGP(X, Y, bounds, spec=spec, mask=mask)
    p = gp.initial_params(5) + 0.3 * torch.randn(
        5, gp.params.shape[-1], generator=torch.Generator().manual_seed(4), dtype=f64
    )
    x = p.clone().requires_grad_(True)
    (g_ref,) = torch.autograd.grad(gp.mll(x).sum(), x)
    f, g = gp.mll_and_grad(p)
    torch.testing.assert_close(f, gp.mll(p), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(g, g_ref, atol=1e-8 * g_ref.abs().max().item(), rtol=0)
    # not positive definite (all inputs equal, zero noise: K is a matrix of ones): -inf and a zero gradient
    bad = BatchedExactGP(torch.full_like(X, -1.0), Y, bounds, spec=GPSpec(noise_lower=0.0), mask=mask)
    fb, gb = bad.mll_and_grad(
        torch.cat([torch.zeros(5, 3, dtype=f64), torch.full((5, 1), -1e3, dtype=f64), torch.zeros(5, 1, dtype=f64)], -1)
    )
    assert torch.isneginf(fb).all() and (gb == 0).all()


def test_paths_of_one_agent_do_not_depend_on_the_batch():
    X, Y, bounds = _data(B=4, n=9, d=2, seed=8)
    gp = BatchedExactGP(X, Y, bounds).fit(maxiter=30)
    keys = kr.fold(kr.root_key(2, "own"), torch.arange(4))
    Xt = torch.rand(4, 6, 2, dtype=f64) * 3 - 1
    full = gp.draw_paths(keys, 64)(Xt)
    alone = BatchedExactGP(X[2:3], Y[2:3], bounds, params=gp.params[2:3]).draw_paths(keys[2:3], 64)(Xt[2:3])
    torch.testing.assert_close(alone[0], full[2], atol=1e-10, rtol=1e-10)


def test_bad_inputs_name_the_argument():
    X, Y, bounds = _data(B=2, n=5)
    with pytest.raises(ValueError, match="train_Y"):
        BatchedExactGP(X, Y[..., 0], bounds)
    with pytest.raises(ValueError, match="mask"):
        BatchedExactGP(X, Y, bounds, mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="Unknown GP spec"):
        BatchedExactGP(X, Y, bounds, spec="matern")
    gp = BatchedExactGP(X, Y, bounds)
    with pytest.raises(ValueError, match="even"):
        gp.draw_paths(torch.zeros(2, dtype=torch.int64), 33)
    assert math.isfinite(gp.mll().sum().item())


@pytest.mark.parametrize("spec", ["botorch", "rbf", "fbo"])
def test_pack_inverts_unpack_and_names_a_missing_hyperparameter(spec):
    X, Y, bounds = _data(B=2, n=5)
    gp = BatchedExactGP(X, Y, bounds, spec=spec)
    hp = gp.unpack(gp.params)
    full = gp.pack(hp["lengthscale"], hp["noise"], hp["outputscale"], hp["mean"])
    torch.testing.assert_close(full, gp.params, atol=1e-12, rtol=1e-12)
    needed = [
        name for name, used in (("outputscale", gp.spec.outputscale), ("mean", gp.spec.mean == "constant")) if used
    ]
    for name in needed:
        given = {k: hp[k] for k in ("outputscale", "mean") if k != name}
        with pytest.raises(ValueError, match=f"`{name}` is required"):
            gp.pack(hp["lengthscale"], hp["noise"], **given)


def test_paths_differentiate_in_every_tensor_they_are_built_from():
    # values without the gradient run in place where autograd records nothing; a path built from
    # tensors that record gradients (hyperparameters, weights) must still differentiate: each
    # tensor's autograd gradient equals a central difference (float64, step 1e-6: truncation
    # ~1e-12 relative, cancellation ~1e-10 absolute)
    X, Y, bounds = _data(B=3, n=7, d=2, seed=5)
    gp = BatchedExactGP(X, Y, bounds).fit(maxiter=30)
    paths = gp.draw_paths(kr.fold(kr.root_key(2, "diff"), torch.arange(3)), num_features=16)
    gen = torch.Generator().manual_seed(0)
    Xq = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(3, 4, 2, generator=gen, dtype=f64)
    tensors, config = paths.graph_state()
    fields = GPThompsonPaths._FIELDS

    def total(i, t):
        return GPThompsonPaths.from_graph_state(tensors[:i] + (t,) + tensors[i + 1 :], config)(Xq).sum()

    for name in ("ls", "os", "w", "v", "mean", "W"):
        i = fields.index(name)
        t = tensors[i].detach().clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(total(i, t), t)
        e = torch.zeros_like(t).view(-1)
        e[0] = 1e-6
        fd = (total(i, t.detach() + e.view_as(t)) - total(i, t.detach() - e.view_as(t))) / 2e-6
        torch.testing.assert_close(grad.reshape(-1)[0], fd, rtol=1e-6, atol=1e-8, msg=name)


def test_float32_screening_copy_and_screened_maximization():
    from fbo_torch.optim import maximize_batched

    X, Y, bounds = _data(B=5, n=9, d=2, seed=9)
    gp = BatchedExactGP(X, Y, bounds).fit(maxiter=30)
    paths = gp.draw_paths(kr.fold(kr.root_key(3, "own"), torch.arange(5)), num_features=64)
    Xt = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(5, 50, 2, dtype=f64)
    full, low = paths(Xt), paths.astype(torch.float32)(Xt.float())
    assert low.dtype == torch.float32
    # float32 evaluation of O(F + n) terms of size ~|f|: error a few hundred float32 eps of the scale
    scale = full.abs().max()
    assert (low.double() - full).abs().max() <= 500 * torch.finfo(torch.float32).eps * scale
    keys = kr.fold(kr.root_key(4, "max"), torch.arange(5))
    Xs, vs = maximize_batched(paths, bounds, 5, keys=keys, maxiter=50, screen_dtype=torch.float32)
    Xp, vp = maximize_batched(paths, bounds, 5, keys=keys, maxiter=50)
    assert vs.dtype == f64 and Xs.dtype == f64
    torch.testing.assert_close(vs, paths(Xs.unsqueeze(1)).squeeze(1), atol=1e-12, rtol=1e-12)
    # both reach the dense-grid maximum (grid spacing 1/200: the refined value is at least the grid's)
    g = torch.linspace(0, 1, 201, dtype=f64)
    G = torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    grid = paths((bounds[0] + (bounds[1] - bounds[0]) * G).expand(5, -1, -1)).max(-1).values
    tol = 1e-6 * grid.abs().clamp_min(1)
    assert (vs >= grid - tol).all() and (vp >= grid - tol).all()
    with pytest.raises(ValueError, match="screen_dtype"):
        maximize_batched(paths, bounds, 5, keys=keys, screen_dtype="float32")


def test_paths_report_their_lengthscales_in_input_units():
    # the maximizer scales its line search to these: the GP's lengthscales live on the unit cube of
    # its bounds, so in input units they are multiplied by the box width
    X, Y, bounds = _data(B=3, n=8, d=2, seed=9)
    gp = BatchedExactGP(X, Y, bounds).fit(maxiter=30)
    paths = gp.draw_paths(kr.fold(kr.root_key(3, "ls"), torch.arange(3)), num_features=16)
    want = gp.hyperparameters["lengthscale"] * (bounds[1] - bounds[0])
    torch.testing.assert_close(paths.lengthscales(), want, atol=0, rtol=0)
    again = GPThompsonPaths.from_graph_state(*paths.graph_state())
    torch.testing.assert_close(again.lengthscales(), want, atol=0, rtol=0)


def _masked_gp(spec, B=4, n=12, d=3, seed=11):
    """A fitted batch where agent 1 has two failed (NaN, masked) evaluations."""
    X, Y, bounds = _data(B=B, n=n, d=d, seed=seed)
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[1, [2, 7]] = False
    Y = Y.clone()
    Y[1, [2, 7]] = float("nan")
    return BatchedExactGP(X, Y, bounds, spec=spec, mask=mask).fit(maxiter=30), X, bounds


@pytest.mark.parametrize("spec", ["botorch", "rbf", "authors", "fbo"])
def test_posterior_equals_botorch_posterior(spec):
    # each agent's mean and variance (original units, no observation noise) are those of its
    # SingleTaskGP; the masked agent's GP is the one on its valid observations. Both are float64
    # Cholesky solves of a 12 x 12 system: agreement to ~1e-14 (1e-11 leaves room, not slack)
    gp, X, bounds = _masked_gp(spec)
    gen = torch.Generator().manual_seed(1)
    Xt = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(4, 9, 3, generator=gen, dtype=f64)
    Xt[:, 0] = X[:, 0]  # at an observation (variance ~ noise: cancellation in σ_f² − kᵀK⁻¹k)
    Xt[1, 1] = X[1, 2]  # at the failed evaluation's input: no data there
    mean, var = gp.posterior(Xt)
    assert mean.shape == var.shape == (4, 9) and mean.dtype == f64
    for b in range(4):
        post = gp.to_botorch(b).posterior(Xt[b])
        torch.testing.assert_close(mean[b], post.mean.squeeze(-1).detach(), atol=1e-11, rtol=1e-11)
        torch.testing.assert_close(var[b], post.variance.squeeze(-1).detach(), atol=1e-11, rtol=1e-11)
    # the failed observation does not enter: agent 1's posterior equals a GP without those points
    keep = gp.mask[1]
    alone = BatchedExactGP(
        X[1:2, keep],
        gp.y_mean[1] + gp.y_std[1] * gp.y[1:2, keep].unsqueeze(-1),
        bounds,
        spec=spec,
        params=gp.params[1:2],
    )
    m1, v1 = alone.posterior(Xt[1:2])
    torch.testing.assert_close(m1[0], mean[1], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(v1[0], var[1], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("spec", ["botorch", "authors"])
def test_posterior_closed_form_gradients_equal_autograd(spec):
    # away from observed inputs (where the expansion ‖a‖² + ‖b‖² − 2aᵀb rounds to 0 and is
    # clamped, autograd drops that point's term; the closed form keeps it)
    gp, X, bounds = _masked_gp(spec, seed=12)
    post = gp.posterior_moments()
    gen = torch.Generator().manual_seed(2)
    Xq = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(4, 6, 3, generator=gen, dtype=f64)
    mean, var, dm, dv = post.moments(Xq, grad=True)
    Xg = Xq.clone().requires_grad_(True)
    m, v = post(Xg)
    gm, gv = (torch.autograd.grad(t.sum(), Xg, retain_graph=True)[0] for t in (m, v))
    torch.testing.assert_close(dm, gm, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(dv, gv, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close((mean, var), (m.detach(), v.detach()), atol=0, rtol=0)
    # a sub-batch and a rebuilt copy are the same posteriors
    idx = torch.tensor([3, 1, 1])
    torch.testing.assert_close(post.take(idx)(Xq[idx]), (mean[idx], var[idx]), atol=0, rtol=0)
    again = type(post).from_graph_state(*post.graph_state())
    torch.testing.assert_close(again(Xq), post(Xq), atol=0, rtol=0)
    torch.testing.assert_close(post.lengthscales(), gp.hyperparameters["lengthscale"] * (bounds[1] - bounds[0]))


def test_a_cpu_fit_skips_autograd_bookkeeping_and_returns_ordinary_tensors(monkeypatch):
    # the MLL's gradient is in closed form: the fit runs in inference mode on a CPU, with the
    # same result bit for bit, and its parameters serve autograd afterwards (BoTorch's export)
    X, Y, bounds = _data(B=4, n=12, d=2)
    real = torch.inference_mode
    fits, entries = {}, []
    for enabled in (True, False):

        def mode(flag: bool = True, enabled: bool = enabled):
            entries.append(enabled)
            return real(flag and enabled)

        monkeypatch.setattr(torch, "inference_mode", mode)
        fits[enabled] = BatchedExactGP(X, Y, bounds).fit(maxiter=30)
    assert entries == [True, False]
    assert torch.equal(fits[True].params, fits[False].params)
    assert torch.equal(fits[True].converged, fits[False].converged)
    assert not fits[True].params.is_inference()
    model = fits[True].to_botorch(0)
    Xq = torch.rand(3, 2, dtype=f64, requires_grad=True)
    model.posterior(Xq).mean.sum().backward()
    assert Xq.grad is not None and torch.isfinite(Xq.grad).all()


def test_paths_from_draws_that_record_gradients_equal_the_plain_ones():
    # without gradients the prior's waves are computed in place; with frequencies that record
    # them, out of place: the same values, and the gradient in the frequencies is a finite difference's
    X, Y, bounds = _data(B=3, n=8, d=2, seed=4)
    gp = BatchedExactGP(X, Y, bounds).fit(maxiter=30)
    g = torch.Generator().manual_seed(5)
    W = torch.randn(3, 8, 2, generator=g, dtype=f64)
    w = torch.randn(3, 16, generator=g, dtype=f64)
    eps = torch.randn(3, 8, generator=g, dtype=f64)
    Xq = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(3, 5, 2, generator=g, dtype=f64)
    plain = GPThompsonPaths.from_draws(gp.factored(), W, w, eps)(Xq)
    Wg = W.clone().requires_grad_(True)
    paths = GPThompsonPaths.from_draws(gp.factored(), Wg, w, eps)
    values = paths(Xq)
    assert torch.equal(values.detach(), plain)
    (grad,) = torch.autograd.grad(values.sum(), Wg)
    e = torch.zeros_like(W)
    e[1, 3, 0] = 1e-6

    def total(W_):
        return GPThompsonPaths.from_draws(gp.factored(), W_, w, eps)(Xq).sum()

    fd = (total(W + e) - total(W - e)) / 2e-6
    torch.testing.assert_close(grad[1, 3, 0], fd, rtol=1e-6, atol=1e-8)
    # the product screen too: the same values with and without gradients, and its gradient
    XA = bounds[0, :1] + (bounds[1, :1] - bounds[0, :1]) * torch.rand(3, 4, 1, generator=g, dtype=f64)
    XB = bounds[0, 1:] + (bounds[1, 1:] - bounds[0, 1:]) * torch.rand(3, 6, 1, generator=g, dtype=f64)
    plain_pv = GPThompsonPaths.from_draws(gp.factored(), W, w, eps).product_values(XA, XB)
    pv = GPThompsonPaths.from_draws(gp.factored(), Wg, w, eps).product_values(XA, XB)
    torch.testing.assert_close(pv.detach(), plain_pv, atol=64 * torch.finfo(f64).eps * plain_pv.abs().max(), rtol=0)
    (grad_pv,) = torch.autograd.grad(pv.sum(), Wg)
    assert torch.isfinite(grad_pv).all() and grad_pv.abs().sum() > 0

    def total_pv(W_):
        return GPThompsonPaths.from_draws(gp.factored(), W_, w, eps).product_values(XA, XB).sum()

    fd_pv = (total_pv(W + e) - total_pv(W - e)) / 2e-6
    torch.testing.assert_close(grad_pv[1, 3, 0], fd_pv, rtol=1e-6, atol=1e-8)


def test_mll_is_the_same_bits_with_and_without_autograd():
    # the exponent's multiply-adds are the same operation in place (no gradients) and out of place
    for spec in (GPSpec(), GPSpec(ard=False)):
        X, Y, bounds = _data(B=4, n=9, d=3, seed=6)
        gp = BatchedExactGP(X, Y, bounds, spec=spec)
        p = gp.initial_params(4) + 0.2
        plain = gp.mll(p)
        recorded = gp.mll(p.clone().requires_grad_(True))
        assert torch.equal(recorded.detach(), plain)


def _lognormal_lengthscale_logpdf(ls: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    z = (ls.log() - loc) / scale
    return (-0.5 * z**2 - ls.log() - scale.log() - 0.5 * math.log(2 * math.pi)).sum(-1)


def test_per_agent_lengthscale_prior_enters_the_mll_like_the_spec_prior():
    X, Y, b = _data(B=3, n=12, d=2)
    plain = BatchedExactGP(X, Y, b, spec="fbo")
    loc, scale = plain.spec.ls_prior(2)
    same = BatchedExactGP(
        X, Y, b, spec="fbo", ls_prior=(torch.full((3, 2), loc, dtype=f64), torch.full((3, 2), scale, dtype=f64))
    )
    assert torch.equal(same.params, plain.params)  # both start at the prior's mode
    torch.testing.assert_close(same.mll_and_grad()[0], plain.mll_and_grad()[0], rtol=0, atol=1e-13)
    torch.testing.assert_close(same.mll_and_grad()[1], plain.mll_and_grad()[1], rtol=0, atol=1e-13)
    # another prior changes the MLL by exactly the difference of the two log densities (÷ n)
    loc2 = torch.tensor([[-3.0, -1.0], [-2.0, -2.0], [0.0, -4.0]], dtype=torch.float64)
    scale2 = torch.tensor([[0.2, 0.5], [1.0, 0.3], [0.4, 0.4]], dtype=torch.float64)
    other = BatchedExactGP(X, Y, b, spec="fbo", params=plain.params, ls_prior=(loc2, scale2))
    ls = plain.hyperparameters["lengthscale"]
    expected = (
        _lognormal_lengthscale_logpdf(ls, loc2, scale2)
        - _lognormal_lengthscale_logpdf(
            ls, torch.tensor(loc, dtype=torch.float64), torch.tensor(scale, dtype=torch.float64)
        )
    ) / 12
    torch.testing.assert_close(other.mll() - plain.mll(), expected, rtol=0, atol=1e-12)
    # and the fit follows a tight prior: lengthscales at its median
    tight = BatchedExactGP(
        X, Y, b, spec="fbo", ls_prior=(torch.tensor([[-3.0, -3.0]], dtype=f64), torch.tensor([[0.02, 0.02]], dtype=f64))
    )
    tight.fit()
    torch.testing.assert_close(
        tight.hyperparameters["lengthscale"], torch.full((3, 2), math.exp(-3.0), dtype=f64), rtol=0.1, atol=0
    )


def test_per_agent_lengthscale_prior_is_checked():
    X, Y, b = _data(B=2, n=6, d=2)
    with pytest.raises(ValueError, match="`ls_prior` .* broadcast to 2 x 2"):
        BatchedExactGP(X, Y, b, spec="fbo", ls_prior=(torch.zeros(3, 2), torch.ones(3, 2)))
    with pytest.raises(ValueError, match="scale finite and > 0"):
        BatchedExactGP(X, Y, b, spec="fbo", ls_prior=(torch.zeros(2, 2), torch.zeros(2, 2)))
    with pytest.raises(ValueError, match="needs a GP spec with priors"):
        BatchedExactGP(X, Y, b, spec="rbf", ls_prior=(torch.zeros(2, 2), torch.ones(2, 2)))
