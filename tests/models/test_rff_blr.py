import math

import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.posteriors.gpytorch import GPyTorchPosterior

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.kernels import SharedRFFKernel as RFFKernel
from fbo_torch.models import RFFBayesianLinear, cholesky_rank_one_update
from fbo_torch.models.weight_posterior import cholesky_solve_vec

f64 = torch.float64


def make_data(N=4, n=12, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(N, n, d, generator=g, dtype=f64)
    Y = torch.sin(6 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(N, n, 1, generator=g, dtype=f64)
    return X, Y


@pytest.fixture
def rff():
    return RandomFourierFeatures(dim=2, num_features=40, lengthscale=0.25, seed=3)


@pytest.fixture(params=["weight", "dual"])
def rep(request):
    """Both exact representations must give the same posterior."""
    return request.param


def test_posterior_equals_gp_with_rff_kernel_matrix(rff, rep):
    # FTS appendix B: φᵀν and σ²φᵀΣ⁻¹φ are the GP posterior with kernel ΦΦᵀ
    X, Y = make_data()
    noise = 0.05
    model = RFFBayesianLinear(rff, X, Y, noise, representation=rep)
    Xs = torch.rand(4, 9, 2, dtype=f64)
    post = model.posterior(Xs)
    Phi, phis = rff(X), rff(Xs)
    K = Phi @ Phi.mT + noise * torch.eye(X.shape[1], dtype=f64)
    Lk = torch.linalg.cholesky(K)
    ks = Phi @ phis.mT  # N x n x q
    alpha = torch.cholesky_solve(Y, Lk)
    mean_gp = (ks.mT @ alpha).squeeze(-1)
    V = torch.linalg.solve_triangular(Lk, ks, upper=False)
    cov_gp = phis @ phis.mT - V.mT @ V
    torch.testing.assert_close(post.mean.squeeze(-1), mean_gp, atol=1e-8, rtol=0)
    torch.testing.assert_close(post.mvn.covariance_matrix, cov_gp, atol=1e-8, rtol=0)
    assert isinstance(post, GPyTorchPosterior)
    assert post.mean.shape == (4, 9, 1) and post.variance.shape == (4, 9, 1)


def test_posterior_matches_singletaskgp_with_rff_kernel(rff):
    X, Y = make_data(N=3)
    noise = 0.02
    model = RFFBayesianLinear(rff, X, Y, noise)
    gp = SingleTaskGP(
        X, Y, train_Yvar=torch.full_like(Y, noise), covar_module=RFFKernel(rff), outcome_transform=None
    ).eval()
    gp.mean_module.constant.data.fill_(0.0)
    Xs = torch.rand(3, 5, 2, dtype=f64)
    p1, p2 = model.posterior(Xs), gp.posterior(Xs)
    torch.testing.assert_close(p1.mean, p2.mean, atol=1e-8, rtol=0)
    torch.testing.assert_close(p1.variance, p2.variance, atol=1e-8, rtol=0)


def test_rff_kernel_values_and_construction(rff):
    k = RFFKernel(rff)
    X1, X2 = torch.rand(5, 2, dtype=f64), torch.rand(3, 2, dtype=f64)
    torch.testing.assert_close(k(X1, X2).to_dense(), rff(X1) @ rff(X2).T)
    torch.testing.assert_close(k(X1, X1).to_dense(), rff(X1) @ rff(X1).T)
    torch.testing.assert_close(k(X1, X1, diag=True), torch.ones(5, dtype=f64))  # normalized: k(x,x)=σ₀²
    k2 = RFFKernel(dim=2, num_features=40, lengthscale=0.25, seed=3)
    assert k2.features.fingerprint == rff.fingerprint
    with pytest.raises(TypeError):
        RFFKernel()
    with pytest.raises(TypeError, match="not both"):
        RFFKernel(rff, seed=1)


def test_batched_equals_single_agent_models(rff, rep):
    X, Y = make_data(N=5)
    batched = RFFBayesianLinear(rff, X, Y, torch.tensor([0.01, 0.02, 0.03, 0.04, 0.05], dtype=f64), representation=rep)
    Xs = torch.rand(6, 2, dtype=f64)
    post = batched.posterior(Xs)
    assert batched.batch_shape == torch.Size([5]) and batched.num_outputs == 1
    for i in range(5):
        single = RFFBayesianLinear(rff, X[i], Y[i], 0.01 * (i + 1), representation=rep)
        assert single.batch_shape == torch.Size([])
        torch.testing.assert_close(batched.weight_mean[i], single.weight_mean, atol=1e-10, rtol=0)
        sp = single.posterior(Xs)
        torch.testing.assert_close(post.mean[i], sp.mean, atol=1e-10, rtol=0)
        torch.testing.assert_close(post.mvn.covariance_matrix[i], sp.mvn.covariance_matrix, atol=1e-10, rtol=0)


def test_unequal_lengths_and_mask(rff, rep):
    X, Y = make_data(N=3, n=10)
    lengths = torch.tensor([10, 4, 0])
    Xp, Yp = X.clone(), Y.clone()
    Xp[1, 4:] = float("nan")  # padding may hold anything
    Yp[1, 4:] = float("inf")
    m = RFFBayesianLinear(rff, Xp, Yp, 0.01, lengths=lengths, representation=rep)
    torch.testing.assert_close(m.lengths, lengths)
    ref0 = RFFBayesianLinear(rff, X[0], Y[0], 0.01, representation=rep)
    ref1 = RFFBayesianLinear(rff, X[1, :4], Y[1, :4], 0.01, representation=rep)
    torch.testing.assert_close(m.weight_mean[0], ref0.weight_mean)
    torch.testing.assert_close(m.weight_mean[1], ref1.weight_mean)
    # an agent with no data has the prior: ν = 0, cov = I
    torch.testing.assert_close(m.weight_mean[2], torch.zeros(40, dtype=f64))
    torch.testing.assert_close(m.weight_covariance()[2], torch.eye(40, dtype=f64))
    mask = torch.arange(10).expand(3, 10) < lengths.unsqueeze(-1)
    m2 = RFFBayesianLinear(rff, Xp, Yp, 0.01, mask=mask, representation=rep)
    torch.testing.assert_close(m2.weight_mean, m.weight_mean)


def test_incremental_update_equals_refit(rff, rep):
    X, Y = make_data(N=4, n=30)
    m = RFFBayesianLinear(rff, X[:, :5], Y[:, :5], 0.01, representation=rep)
    for j in range(5, 30):
        m.update(X[:, j : j + 1], Y[:, j : j + 1])
    ref = RFFBayesianLinear(rff, X, Y, 0.01, representation=rep)
    torch.testing.assert_close(m.chol, ref.chol, atol=1e-10, rtol=0)
    torch.testing.assert_close(m.weight_mean, ref.weight_mean, atol=1e-9, rtol=0)
    assert m.train_X.shape == (4, 30, 2) and bool(m.mask.all())
    # masked update: only some agents get a point; k = 2 points at once
    Xn, Yn = make_data(N=4, n=2, seed=7)
    mask = torch.tensor([[True, True], [False, False], [True, False], [False, True]])
    m.update(Xn, Yn, mask=mask)
    torch.testing.assert_close(m.lengths, torch.tensor([32, 30, 31, 31]))
    ref2 = RFFBayesianLinear(rff, m.train_X, m.train_Y, 0.01, mask=m.mask, representation=rep)
    torch.testing.assert_close(m.chol, ref2.chol, atol=1e-10, rtol=0)
    torch.testing.assert_close(m.weight_mean, ref2.weight_mean, atol=1e-9, rtol=0)


def test_reserve_avoids_reallocation_and_keeps_results(rff, rep):
    X, Y = make_data(N=3, n=12)
    m = RFFBayesianLinear(rff, X[:, :4], Y[:, :4], 0.01, representation=rep).reserve(8)
    assert m.train_X.shape == (3, 4, 2)  # the view shows the data only
    ptr = m._train_X.data_ptr()
    for j in range(4, 12):
        m.update(X[:, j : j + 1], Y[:, j : j + 1])
    assert m._train_X.data_ptr() == ptr  # no update reallocated
    ref = RFFBayesianLinear(rff, X, Y, 0.01, representation=rep)
    torch.testing.assert_close(m.weight_mean, ref.weight_mean, atol=1e-9, rtol=0)
    # reserving less than the free capacity, or zero, is a no-op
    assert m.reserve(0) is m
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="extra"):
            m.reserve(bad)


def test_cholesky_solve_vec_matches_torch():
    g = torch.Generator().manual_seed(3)
    A = torch.randn(5, 9, 9, generator=g, dtype=f64)
    L = torch.linalg.cholesky(A @ A.mT + torch.eye(9, dtype=f64))
    b = torch.randn(5, 9, generator=g, dtype=f64)
    torch.testing.assert_close(cholesky_solve_vec(L, b), torch.cholesky_solve(b.unsqueeze(-1), L).squeeze(-1))


def test_condition_on_observations_returns_new_model(rff, rep):
    X, Y = make_data(N=2, n=6)
    m = RFFBayesianLinear(rff, X[:, :5], Y[:, :5], 0.01, representation=rep)
    m2 = m.condition_on_observations(X[:, 5:], Y[:, 5:])
    assert m.train_X.shape[1] == 5 and m2.train_X.shape[1] == 6
    torch.testing.assert_close(m2.weight_mean, RFFBayesianLinear(rff, X, Y, 0.01, representation=rep).weight_mean)


def test_rank_one_update_formula():
    g = torch.Generator().manual_seed(1)
    A = torch.randn(7, 20, 20, generator=g, dtype=f64)
    S = A @ A.mT + 0.1 * torch.eye(20, dtype=f64)
    x = torch.randn(7, 20, generator=g, dtype=f64)
    x[3] = 0.0
    L = torch.linalg.cholesky(S)
    L2 = cholesky_rank_one_update(L, x)
    torch.testing.assert_close(L2, torch.linalg.cholesky(S + x.unsqueeze(-1) * x.unsqueeze(-2)), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(L2[3], L[3])
    assert torch.equal(L2, torch.tril(L2))


def test_sample_weights_moments(rff, rep):
    # empirical mean/cov of ω draws vs ν and σ²Σ⁻¹, tolerances from the sample size
    X, Y = make_data(N=2, n=15)
    noise = 0.05
    m = RFFBayesianLinear(rff, X, Y, noise, representation=rep)
    S = 40000
    gen = torch.Generator().manual_seed(0)
    w = m.sample_weights(torch.Size([S]), generator=gen)
    assert w.shape == (S, 2, 40)
    Phi = rff(X)
    Sigma = Phi.mT @ Phi + noise * torch.eye(40, dtype=f64)
    cov = noise * torch.linalg.solve(Sigma, torch.eye(40, dtype=f64).expand(2, 40, 40))
    nu = torch.linalg.solve(Sigma, Phi.mT @ Y).squeeze(-1)
    sd = cov.diagonal(dim1=-2, dim2=-1).sqrt()
    z_mean = (w.mean(0) - nu) / (sd / math.sqrt(S))
    assert z_mean.abs().max() < 4.5  # 80 coordinates, each ~N(0,1)
    centered = w - w.mean(0)
    emp = torch.einsum("sni,snj->nij", centered, centered) / (S - 1)
    se = ((cov**2 + sd.unsqueeze(-1) ** 2 * sd.unsqueeze(-2) ** 2) / S).sqrt()
    assert ((emp - cov) / se).abs().max() < 5.5  # 3200 entries, ~N(0,1) each
    # reproducible with a generator
    w1 = m.sample_weights(torch.Size([3]), generator=torch.Generator().manual_seed(4))
    w2 = m.sample_weights(torch.Size([3]), generator=torch.Generator().manual_seed(4))
    assert torch.equal(w1, w2)


def test_sample_weights_base_samples_are_batch_independent(rff, rep):
    # ω is a deterministic function of the base samples: agent 2's draw is the same whether it is
    # drawn in a batch of four or alone, and the draws have the posterior's moments (checked above
    # for the generator path, which uses the same formula)
    X, Y = make_data(N=4, n=12)
    m = RFFBayesianLinear(rff, X, Y, 0.05, representation=rep)
    base = torch.randn(4, 40 + 12, generator=torch.Generator().manual_seed(1), dtype=f64)
    w = m.sample_weights(base_samples=base)
    single = RFFBayesianLinear(rff, X[2], Y[2], 0.05, representation=rep)
    w2 = single.sample_weights(base_samples=base[2])
    assert w2.shape == (40,)
    # same data and normals, a batch of 1 vs 4: equal to float64 round-off of O(n M) sums
    torch.testing.assert_close(w2, w[2], atol=1e-10, rtol=1e-10)
    with pytest.raises(ValueError, match="base_samples"):
        m.sample_weights(base_samples=base[:, :40])
    # zero base samples give the posterior mean
    torch.testing.assert_close(m.sample_weights(base_samples=torch.zeros_like(base)), m.weight_mean)


def test_update_with_masked_nan_without_validation(rff, rep):
    # an engine that masks failed evaluations may pass NaN where the mask is False
    X, Y = make_data(N=3, n=10)
    m = RFFBayesianLinear(rff, X[:, :8], Y[:, :8], 0.05, representation=rep)
    Yn = Y[:, 8:9].clone()
    Yn[1] = float("nan")
    mask = torch.tensor([[True], [False], [True]])
    m.update(X[:, 8:9], Yn, mask=mask, validate=False)
    ref = RFFBayesianLinear(
        rff, X[:, :9], Y[:, :9], 0.05, mask=torch.cat([torch.ones(3, 8, dtype=torch.bool), mask], 1), representation=rep
    )
    torch.testing.assert_close(m.weight_mean, ref.weight_mean, atol=1e-10, rtol=1e-8)
    assert torch.isfinite(m.weight_mean).all()


def test_device_dtype_follow_inputs(device, rff, rep):
    X, Y = make_data(N=3)
    rff_d = RandomFourierFeatures(dim=2, num_features=40, lengthscale=0.25, seed=3, device=device)
    m = RFFBayesianLinear(rff_d, X.to(device), Y.to(device), 0.01, representation=rep)
    w = m.sample_weights(generator=torch.Generator().manual_seed(0))
    assert w.device.type == device.type and w.dtype == f64
    ref = RFFBayesianLinear(rff, X, Y, 0.01, representation=rep)
    torch.testing.assert_close(w.cpu(), ref.sample_weights(generator=torch.Generator().manual_seed(0)))
    post = m.posterior(torch.rand(4, 2, dtype=f64, device=device))
    assert post.mean.device.type == device.type
    m.update(X[:, :1].to(device), Y[:, :1].to(device))
    assert m.chol.device.type == device.type


@pytest.mark.cuda
def test_cuda_batched_matches_cpu(rff):
    X, Y = make_data(N=6, n=20)
    mc = RFFBayesianLinear(rff, X, Y, 0.01)
    mg = RFFBayesianLinear(
        RandomFourierFeatures(2, 40, lengthscale=0.25, seed=3, device="cuda"), X.cuda(), Y.cuda(), 0.01
    )
    torch.testing.assert_close(mg.weight_mean.cpu(), mc.weight_mean, atol=1e-9, rtol=0)


def test_validation_errors(rff):
    X, Y = make_data(N=2, n=5)
    bad = Y.clone()
    bad[0, 2] = float("nan")
    with pytest.raises(ValueError, match="train_Y.*NaN"):
        RFFBayesianLinear(rff, X, bad, 0.01)
    bad[0, 2] = float("inf")
    with pytest.raises(ValueError, match="train_Y"):
        RFFBayesianLinear(rff, X, bad, 0.01)
    with pytest.raises(ValueError, match="train_X"):
        RFFBayesianLinear(rff, X[0, 0], Y, 0.01)
    with pytest.raises(ValueError, match="train_Y"):
        RFFBayesianLinear(rff, X, Y[:, :4], 0.01)
    with pytest.raises(ValueError, match="d = 2"):
        RFFBayesianLinear(rff, torch.rand(2, 5, 3, dtype=f64), Y, 0.01)
    with pytest.raises(ValueError, match="noise_variance"):
        RFFBayesianLinear(rff, X, Y, 0.0)
    with pytest.raises(ValueError, match="noise_variance"):
        RFFBayesianLinear(rff, X, Y, torch.tensor([0.1, -0.1], dtype=f64))
    with pytest.raises(ValueError, match="noise_variance"):
        RFFBayesianLinear(rff, X, Y, torch.tensor([0.1, 0.1, 0.1], dtype=f64))
    with pytest.raises(TypeError, match="features"):
        RFFBayesianLinear("rff", X, Y, 0.01)
    with pytest.raises(ValueError, match="lengths"):
        RFFBayesianLinear(rff, X, Y, 0.01, lengths=torch.tensor([6, 1]))
    with pytest.raises(ValueError, match="at most one"):
        RFFBayesianLinear(rff, X, Y, 0.01, lengths=torch.tensor([5, 1]), mask=torch.ones(2, 5, dtype=torch.bool))
    m = RFFBayesianLinear(rff, X, Y, 0.01)
    with pytest.raises(ValueError, match="N x k x d"):
        m.update(X[:1, :1], Y[:1, :1])
    with pytest.raises(ValueError, match="Y"):
        m.update(X[:, :1], torch.full_like(Y[:, :1], float("nan")))
    with pytest.raises(ValueError, match="d = 2"):
        m.posterior(torch.rand(3, 4, dtype=f64))


def test_representations_agree(rff):
    # weight-space and function-space forms are the same posterior
    X, Y = make_data(N=3, n=15)
    lengths = torch.tensor([15, 9, 1])
    w = RFFBayesianLinear(rff, X, Y, 0.03, lengths=lengths, representation="weight")
    d = RFFBayesianLinear(rff, X, Y, 0.03, lengths=lengths, representation="dual")
    assert d.representation == "dual" and RFFBayesianLinear(rff, X, Y, 0.03).representation == "dual"  # n < M
    assert RFFBayesianLinear(rff, make_data(n=45)[0], make_data(n=45)[1], 0.03).representation == "weight"
    torch.testing.assert_close(w.weight_mean, d.weight_mean, atol=1e-9, rtol=0)
    torch.testing.assert_close(w.weight_covariance(), d.weight_covariance(), atol=1e-9, rtol=0)
    torch.testing.assert_close(w.chol, d.chol, atol=1e-9, rtol=0)
    Xs = torch.rand(3, 4, 2, dtype=f64)
    pw, pd = w.posterior(Xs), d.posterior(Xs)
    torch.testing.assert_close(pw.mean, pd.mean, atol=1e-9, rtol=0)
    torch.testing.assert_close(pw.mvn.covariance_matrix, pd.mvn.covariance_matrix, atol=1e-9, rtol=0)
    Xn, Yn = make_data(N=3, n=1, seed=5)
    w.update(Xn, Yn)
    d.update(Xn, Yn, mask=torch.tensor([[True], [True], [True]]))
    torch.testing.assert_close(w.weight_mean, d.weight_mean, atol=1e-9, rtol=0)
    with pytest.raises(ValueError, match="representation"):
        RFFBayesianLinear(rff, X, Y, 0.03, representation="primal")


# --------------------------------------------------------------------------- #
# the BoTorch model contract and bad input
# --------------------------------------------------------------------------- #

# Tolerance for two exact float64 routes to the same posterior: the Cholesky
# solves lose about κ·eps with κ ≤ (max ‖φ‖² · n + σ²) / σ² ≲ 2e4 for the data
# here (‖φ‖² = 1, n ≤ 20, σ² ≥ 1e-2), so 2e4 · 2.2e-16 ≈ 5e-12; 1e-9 leaves room
# for the accumulation over M = 40 features.
EXACT = dict(atol=1e-9, rtol=0)


@pytest.mark.parametrize("batched", [False, True])
def test_observation_noise_shape_matches_singletaskgp(rff, rep, batched):
    # unbatched dual gave (1, q, 1) variances; weight form and SingleTaskGP give (q, 1)
    X, Y = make_data(N=2, n=10)
    if not batched:
        X, Y = X[0], Y[0]
    m = RFFBayesianLinear(rff, X, Y, 0.05, representation=rep)
    Xs = torch.rand(5, 2, dtype=f64)
    p0, p1 = m.posterior(Xs), m.posterior(Xs, observation_noise=True)
    expected = (2, 5, 1) if batched else (5, 1)
    assert p0.variance.shape == p1.variance.shape == expected
    torch.testing.assert_close(p1.variance, p0.variance + 0.05, **EXACT)
    gp = SingleTaskGP(X, Y, train_Yvar=torch.full_like(Y, 0.05), covar_module=RFFKernel(rff), outcome_transform=None)
    assert gp.posterior(Xs, observation_noise=True).variance.shape == expected


def test_no_data_is_the_prior_and_bad_sizes_are_clear(rff, rep):
    # n = 0 is legal (the prior N(0, I)); N = 0 agents and a string noise are clear errors
    X, Y = make_data(N=3, n=6)
    m = RFFBayesianLinear(rff, X[:, :0], Y[:, :0], 0.01, representation=rep)
    Xs = torch.rand(4, 2, dtype=f64)
    post = m.posterior(Xs)
    torch.testing.assert_close(post.mean, torch.zeros(3, 4, 1, dtype=f64))
    torch.testing.assert_close(post.mvn.covariance_matrix, (rff(Xs) @ rff(Xs).T).expand(3, 4, 4), **EXACT)
    assert m.sample_weights(torch.Size([2])).shape == (2, 3, 40)
    for j in range(6):
        m.update(X[:, j : j + 1], Y[:, j : j + 1])
    torch.testing.assert_close(
        m.weight_mean, RFFBayesianLinear(rff, X, Y, 0.01, representation=rep).weight_mean, **EXACT
    )
    with pytest.raises(ValueError, match="N = 0 agents"):
        RFFBayesianLinear(rff, X[:0], Y[:0], 0.01)
    with pytest.raises(TypeError, match="noise_variance"):
        RFFBayesianLinear(rff, X, Y, "0.01")
    with pytest.raises(TypeError, match="noise_variance"):
        RFFBayesianLinear(rff, X, Y, None)
    assert RFFBayesianLinear(rff, X, Y, [0.01, 0.02, 0.03]).noise_variance.tolist() == [0.01, 0.02, 0.03]


def test_state_dict_is_tensors_and_survives_update(rff, rep):
    # an update()d model's storage grew, and its state_dict did not load into a fresh model
    X, Y = make_data(N=3, n=12)
    m = RFFBayesianLinear(rff, X[:, :4], Y[:, :4], 0.02, representation=rep)
    for j in range(4, 12):
        m.update(X[:, j : j + 1], Y[:, j : j + 1])
    state = m.state_dict()
    assert all(isinstance(v, torch.Tensor) for v in state.values()), {k: type(v) for k, v in state.items()}
    # the state holds what a model fitted on the same data holds (no spare capacity)
    ref = RFFBayesianLinear(rff, X, Y, 0.02, representation=rep)
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in ref.state_dict().items()}
    fresh = RFFBayesianLinear(rff, X[:, :2], Y[:, :2], 0.02, representation=rep)
    fresh.load_state_dict(state)
    Xs = torch.rand(3, 5, 2, dtype=f64)
    torch.testing.assert_close(fresh.posterior(Xs).mean, m.posterior(Xs).mean, atol=0, rtol=0)
    torch.testing.assert_close(fresh.posterior(Xs).variance, ref.posterior(Xs).variance, **EXACT)
    # the loaded model keeps updating like the original
    Xn, Yn = make_data(N=3, n=1, seed=9)
    m.update(Xn, Yn)
    fresh.update(Xn, Yn)
    torch.testing.assert_close(fresh.weight_mean, m.weight_mean, **EXACT)
    # a state saved in the other representation loads too (the model switches)
    other = RFFBayesianLinear(rff, X[:, :2], Y[:, :2], 0.02, representation="dual" if rep == "weight" else "weight")
    other.load_state_dict(ref.state_dict())
    assert other.representation == rep
    torch.testing.assert_close(other.posterior(Xs).mean, ref.posterior(Xs).mean, atol=0, rtol=0)
    with pytest.raises(RuntimeError, match="size mismatch"):
        RFFBayesianLinear(rff, X[:2], Y[:2], 0.02, representation=rep).load_state_dict(state)


def test_subset_output(rff):
    X, Y = make_data(N=2)
    m = RFFBayesianLinear(rff, X, Y, 0.01)
    assert m.subset_output([0]) is m
    with pytest.raises(ValueError, match="single output"):
        m.subset_output([1])
    with pytest.raises(ValueError, match="output_indices"):
        m.posterior(X, output_indices=[1])


def test_transforms_are_honoured(rff, rep):
    # transforms attached to the model were silently ignored
    from botorch.models.transforms import Normalize, Standardize

    X, Y = make_data(N=2, n=10)
    Xr, Yr = 3.0 + 4.0 * X, 10.0 + 5.0 * Y  # raw scale
    bounds = torch.tensor([[3.0, 3.0], [7.0, 7.0]], dtype=f64)
    m = RFFBayesianLinear(
        rff,
        Xr[:, :8],
        Yr[:, :8],
        0.01,
        representation=rep,
        input_transform=Normalize(2, bounds=bounds),
        outcome_transform=Standardize(1, batch_shape=torch.Size([2])),
    )
    mu, sd = Yr[:, :8].mean(-2, keepdim=True), Yr[:, :8].std(-2, keepdim=True)
    plain = RFFBayesianLinear(rff, X[:, :8], (Yr[:, :8] - mu) / sd, 0.01, representation=rep)
    Xs = torch.rand(2, 4, 2, dtype=f64)
    post, ref = m.posterior(3.0 + 4.0 * Xs), plain.posterior(Xs)
    torch.testing.assert_close(post.mean, mu + sd * ref.mean, **EXACT)
    torch.testing.assert_close(post.variance, sd**2 * ref.variance, **EXACT)
    # fantasy-layout conditioning takes raw Y and noise on the transformed scale (BoTorch's convention)
    Yf = Yr[:, 8:].unsqueeze(0)  # 1 fantasy x N x 2 x 1
    noise = torch.full_like(Yf, 0.003)
    cm = m.condition_on_observations(Xr[:, 8:], Yf, noise=noise)
    cp = plain.condition_on_observations(X[:, 8:], (Yf - mu) / sd, noise=noise)
    torch.testing.assert_close(cm.posterior(3.0 + 4.0 * Xs).mean, mu + sd * cp.posterior(Xs).mean, **EXACT)
    torch.testing.assert_close(cm.posterior(3.0 + 4.0 * Xs).variance, sd**2 * cp.posterior(Xs).variance, **EXACT)
    # update() takes raw data and transforms it with the fitted (fixed) transforms
    m.update(Xr[:, 8:], Yr[:, 8:])
    plain.update(X[:, 8:], (Yr[:, 8:] - mu) / sd)
    torch.testing.assert_close(m.weight_mean, plain.weight_mean, **EXACT)
    # a transform attached afterwards is refused, not ignored
    m2 = RFFBayesianLinear(rff, X, Y, 0.01, representation=rep)
    m2.outcome_transform = Standardize(1)
    with pytest.raises(RuntimeError, match="outcome_transform.*constructor"):
        m2.posterior(Xs)
    m3 = RFFBayesianLinear(rff, X, Y, 0.01, representation=rep)
    m3.input_transform = Normalize(2)
    with pytest.raises(RuntimeError, match="input_transform"):
        m3.update(X[:, :1], Y[:, :1])
    with pytest.raises(ValueError, match="padding"):
        RFFBayesianLinear(rff, X, Y, 0.01, lengths=torch.tensor([10, 5]), outcome_transform=Standardize(1))


def test_fantasy_conditioning_equals_refit(rff, rep):
    # condition_on_observations in BoTorch's fantasy layout = a refit on the union of the data
    from fbo_torch.models.rff_blr import ConditionedRFFBayesianLinear

    X, Y = make_data(N=3, n=10)
    m = RFFBayesianLinear(rff, X, Y, 0.02, representation=rep)
    Xf = torch.rand(3, 2, 2, dtype=f64, generator=torch.Generator().manual_seed(5))
    Yf = torch.randn(4, 3, 2, 1, dtype=f64, generator=torch.Generator().manual_seed(6))  # 4 fantasies
    c = m.condition_on_observations(Xf, Yf)
    assert isinstance(c, ConditionedRFFBayesianLinear) and c.batch_shape == (4, 3)
    Xs = torch.rand(3, 5, 2, dtype=f64)
    post = c.posterior(Xs)
    assert post.mean.shape == (4, 3, 5, 1)
    # conditioning again (nested fantasies) stacks rows
    Xg = torch.rand(3, 1, 2, dtype=f64, generator=torch.Generator().manual_seed(7))
    Yg = torch.randn(4, 3, 1, 1, dtype=f64, generator=torch.Generator().manual_seed(8))
    cc = c.condition_on_observations(Xg, Yg)
    for f in range(4):
        ref = RFFBayesianLinear(rff, torch.cat([X, Xf], 1), torch.cat([Y, Yf[f]], 1), 0.02, representation=rep)
        torch.testing.assert_close(post.mean[f], ref.posterior(Xs).mean, **EXACT)
        torch.testing.assert_close(post.mvn.covariance_matrix[f], ref.posterior(Xs).mvn.covariance_matrix, **EXACT)
        ref.update(Xg, Yg[f])
        torch.testing.assert_close(cc.posterior(Xs).mean[f], ref.posterior(Xs).mean, **EXACT)
        torch.testing.assert_close(cc.posterior(Xs).variance[f], ref.posterior(Xs).variance, **EXACT)
    # own layout without noise: still an exact RFFBayesianLinear copy
    assert isinstance(m.condition_on_observations(Xf, Yf[0]), RFFBayesianLinear)


def test_fantasize_batch_shapes(rff, rep):
    from botorch.sampling import SobolQMCNormalSampler

    X, Y = make_data(N=1, n=10)
    m = RFFBayesianLinear(rff, X[0], Y[0], 0.02, representation=rep)
    Xq = torch.rand(6, 3, 2, dtype=f64)  # b = 6 candidate sets of q = 3
    fm = m.fantasize(Xq, SobolQMCNormalSampler(torch.Size([5]), seed=0))
    assert fm.batch_shape == (5, 6)
    post = fm.posterior(torch.rand(5, 6, 1, 2, dtype=f64))
    assert post.mean.shape == (5, 6, 1, 1) and torch.isfinite(post.variance).all()
    # conditioning on q noisy fantasies can only shrink the variance
    Xs = torch.rand(6, 4, 2, dtype=f64)
    assert (fm.posterior(Xs).variance <= m.posterior(Xs).variance + 1e-12).all()
    assert fm.subset_output([0]) is fm


def test_rff_kernel_fits_and_is_renamed(rff):
    # fit_gpytorch_mll failed on SingleTaskGP(RFFKernel) ('dict' object has no attribute 'detach')
    from botorch.fit import fit_gpytorch_mll
    from gpytorch.mlls import ExactMarginalLogLikelihood

    import fbo_torch
    from fbo_torch.kernels import SharedRFFKernel

    X, Y = make_data(N=1, n=15)
    gp = SingleTaskGP(X[0], Y[0], covar_module=SharedRFFKernel(rff))
    noise0 = gp.likelihood.noise.item()
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    assert gp.likelihood.noise.item() != noise0 and math.isfinite(gp.likelihood.noise.item())
    assert all(isinstance(v, torch.Tensor) for v in gp.state_dict().values())
    post = gp.posterior(torch.rand(4, 2, dtype=f64))
    assert torch.isfinite(post.mean).all() and (post.variance > 0).all()
    assert SharedRFFKernel(rff).dtype == f64  # the kernel has no parameters; it reports its map's dtype
    with pytest.warns(DeprecationWarning, match="SharedRFFKernel"):
        assert fbo_torch.RFFKernel is SharedRFFKernel


def test_contract_runs_on_the_models_device(device, rep):
    # fantasies, pathwise paths, transforms and the state dict follow the model's device
    from botorch.models.transforms import Normalize, Standardize
    from botorch.sampling import SobolQMCNormalSampler
    from botorch.sampling.pathwise import draw_matheron_paths

    rff_d = RandomFourierFeatures(dim=2, num_features=40, lengthscale=0.25, seed=3, device=device)
    X, Y = (t.to(device) for t in make_data(N=2, n=8))
    m = RFFBayesianLinear(
        rff_d,
        X,
        Y,
        0.01,
        representation=rep,
        input_transform=Normalize(2),
        outcome_transform=Standardize(1, batch_shape=torch.Size([2])),
    )
    Xq = torch.rand(3, 2, 2, 2, dtype=f64, device=device)
    fm = m.fantasize(Xq, SobolQMCNormalSampler(torch.Size([4]), seed=0))
    post = fm.posterior(torch.rand(3, 2, 5, 2, dtype=f64, device=device))
    assert post.mean.device.type == device.type and post.mean.shape == (4, 3, 2, 5, 1)
    paths = draw_matheron_paths(m, sample_shape=torch.Size([6]))
    values = paths(torch.rand(2, 5, 2, dtype=f64, device=device))
    assert values.shape == (6, 2, 5) and values.device.type == device.type and torch.isfinite(values).all()
    fresh = RFFBayesianLinear(
        rff_d,
        X,
        Y,
        0.01,
        representation=rep,
        input_transform=Normalize(2),
        outcome_transform=Standardize(1, batch_shape=torch.Size([2])),
    )
    m.update(X[:, :1], Y[:, :1])
    fresh.load_state_dict(m.state_dict())
    assert fresh.train_X.device.type == device.type and fresh.train_X.shape == (2, 9, 2)


def test_one_weight_posterior_from_data_messages_and_models():
    # RFFWeightPosterior from (Φ, y) equals the model's (both representations) and the message form
    from fbo_torch.models.agent_posteriors import AgentRFFPosteriors
    from fbo_torch.models.weight_posterior import RFFWeightPosterior

    g = torch.Generator().manual_seed(11)
    rff = RandomFourierFeatures(2, 30, lengthscale=0.3, seed=2)
    X = torch.rand(3, 12, 2, generator=g, dtype=torch.float64)
    Y = torch.sin(4 * X).sum(-1, keepdim=True)
    noise = torch.tensor([0.01, 0.05, 0.2], dtype=torch.float64)
    post = RFFWeightPosterior.from_data(rff(X), Y.squeeze(-1), noise)
    assert post.mean.shape == (3, 30) and post.root.shape == (3, 30, 30) and post.mean.dtype == torch.float64
    for rep in ("weight", "dual"):
        model = RFFBayesianLinear(rff, X, Y, noise, representation=rep)
        torch.testing.assert_close(post.mean, model.weight_mean, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(post.covariance(), model.weight_covariance(), rtol=1e-9, atol=1e-10)
        mine = model.weight_posterior()
        torch.testing.assert_close(mine.covariance(), model.weight_covariance(), rtol=1e-9, atol=1e-10)
    # a message (ν, C) gives the same Gaussian, hence the same predictive
    msg = RFFWeightPosterior.from_covariance(post.mean, post.covariance())
    phi = rff(torch.rand(3, 4, 2, generator=g, dtype=torch.float64))
    for a, b in zip(msg.predict(phi), post.predict(phi), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    mean, cov = post.predict(phi)
    torch.testing.assert_close(mean, (phi @ post.mean.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(cov, phi @ post.covariance() @ phi.mT, rtol=1e-9, atol=1e-12)
    # the agents' model on these posteriors, and the weighted sum RGPE uses
    agents = AgentRFFPosteriors.from_model(RFFBayesianLinear(rff, X, Y, noise))
    torch.testing.assert_close(agents.weight_posterior.covariance(), post.covariance(), rtol=1e-9, atol=1e-10)
    w = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    comb = post.combine(w)
    torch.testing.assert_close(comb.mean, w @ post.mean)
    torch.testing.assert_close(
        comb.covariance(), (w.square().view(3, 1, 1) * post.covariance()).sum(0), rtol=1e-9, atol=1e-12
    )
