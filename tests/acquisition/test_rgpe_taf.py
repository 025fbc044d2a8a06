import itertools
import math
import warnings

import pytest
import torch
from botorch.acquisition import ExpectedImprovement, LogExpectedImprovement, qLogNoisyExpectedImprovement
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf
from botorch.posteriors.gpytorch import GPyTorchPosterior
from hypothesis import given, settings
from hypothesis import strategies as st

from fbo_torch.acquisition.rgpe import (
    RGPE,
    _loo_ranking_loss,
    compute_rgpe_weights,
    loo_posteriors,
    ranking_loss,
)
from fbo_torch.acquisition.taf import TransferAcquisitionFunction, compute_taf_weights
from fbo_torch.features import RandomFourierFeatures
from fbo_torch.models.agent_posteriors import AgentRFFPosteriors
from fbo_torch.models.rff_blr import RFFBayesianLinear
from fbo_torch.models.weight_posterior import psd_factor
from fbo_torch.protocol.messages import PosteriorMessage

f64 = torch.float64


def target_fn(X):
    return torch.sin(6 * X[..., 0]) + torch.cos(4 * X[..., 1])


def unrelated_fn(X):
    return torch.sin(11 * X[..., 1] + 2.0) * torch.cos(7 * X[..., 0])


@pytest.fixture
def rff():
    return RandomFourierFeatures(dim=2, num_features=60, lengthscale=0.2, seed=11)


def make_agents(rff, N=4, n=15, seed=0, noise=1e-2):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(N, n, 2, generator=g, dtype=f64)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(N, n, 1, generator=g, dtype=f64)
    return RFFBayesianLinear(rff, X, Y, noise)


def federation(rff, n_agent=40, n_target=14, seed=0):
    """Agents 0 (same function as the target), 1 (negated), 2 (unrelated); target data."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(3, n_agent, 2, generator=g, dtype=f64)
    Y = torch.stack([target_fn(X[0]), -target_fn(X[1]), unrelated_fn(X[2])]).unsqueeze(-1)
    Y = Y + 0.02 * torch.randn(Y.shape, generator=g, dtype=f64)
    blr = RFFBayesianLinear(rff, X, Y, 1e-2)
    tX = torch.rand(n_target, 2, generator=g, dtype=f64)
    tY = (target_fn(tX) + 0.02 * torch.randn(n_target, generator=g, dtype=f64)).unsqueeze(-1)
    return blr, tX, tY


def target_gp(tX, tY):
    gp = SingleTaskGP(tX, tY).eval()
    gp.covar_module.lengthscale = torch.tensor([[0.2, 0.2]], dtype=f64)
    gp.likelihood.noise = torch.tensor([1e-3], dtype=f64)
    return gp


# ------------------------------------------------------------ AgentRFFPosteriors
def test_agent_posteriors_equal_rff_blr(rff):
    blr = make_agents(rff)
    post = AgentRFFPosteriors.from_model(blr)
    assert post.batch_shape == torch.Size([4]) and post.num_outputs == 1
    for Xs in (
        torch.rand(1, 2, dtype=f64),  # shared, q = 1
        torch.rand(5, 2, dtype=f64),  # shared, q = 5
        torch.rand(3, 1, 5, 2, dtype=f64),  # b x 1 x q x d
        torch.rand(4, 3, 2, dtype=f64),  # one set per agent
        torch.rand(2, 4, 3, 2, dtype=f64),  # b x N x q x d
        torch.rand(6, 1, 1, 2, dtype=f64),  # b x 1 x 1 x d (acquisition layout)
    ):
        p1, p2 = post.posterior(Xs), blr.posterior(Xs)
        assert isinstance(p1, GPyTorchPosterior)
        assert p1.mean.shape == p2.mean.shape
        torch.testing.assert_close(p1.mean, p2.mean, atol=1e-8, rtol=0)
        torch.testing.assert_close(p1.variance, p2.variance, atol=1e-8, rtol=0)
        torch.testing.assert_close(p1.mvn.covariance_matrix, p2.mvn.covariance_matrix, atol=1e-8, rtol=0)
    Xs = torch.rand(7, 2, dtype=f64)
    mean, var = post.predict(Xs)
    p2 = blr.posterior(Xs)
    torch.testing.assert_close(mean, p2.mean.squeeze(-1).mT, atol=1e-8, rtol=0)
    torch.testing.assert_close(var, p2.variance.squeeze(-1).mT, atol=1e-8, rtol=0)
    torch.testing.assert_close(post.weight_covariance(), blr.weight_covariance(), atol=1e-8, rtol=0)
    # observation noise uses each agent's σ²
    torch.testing.assert_close(
        post.posterior(Xs, observation_noise=True).variance,
        blr.posterior(Xs, observation_noise=True).variance,
        atol=1e-8,
        rtol=0,
    )
    # incumbents are the best observed values
    torch.testing.assert_close(post.incumbents, blr.train_Y.squeeze(-1).amax(-1))


def test_from_messages_equals_model_and_checks_fingerprint(rff):
    blr = make_agents(rff)
    cov = blr.weight_covariance()
    msgs = [
        PosteriorMessage(
            blr.weight_mean[i],
            cov[i],
            agent_id=10 + i,
            num_observations=15,
            fingerprint=rff.fingerprint,
            incumbent=float(blr.train_Y[i].max()),
        )
        for i in range(4)
    ]
    post = AgentRFFPosteriors.from_messages(msgs, rff)
    assert post.agent_ids == [10, 11, 12, 13]
    Xs = torch.rand(6, 2, dtype=f64)
    p1, p2 = post.posterior(Xs), blr.posterior(Xs)
    torch.testing.assert_close(p1.mean, p2.mean, atol=1e-8, rtol=0)
    torch.testing.assert_close(p1.variance, p2.variance, atol=1e-8, rtol=0)
    torch.testing.assert_close(post.incumbents, blr.train_Y.squeeze(-1).amax(-1))
    # without incumbents in every message, none are kept
    no_inc = [PosteriorMessage(m.weight_mean, m.weight_covariance, m.agent_id, 15, m.fingerprint) for m in msgs]
    assert AgentRFFPosteriors.from_messages(no_inc[:2] + msgs[2:], rff).incumbents is None

    other = RandomFourierFeatures(dim=2, num_features=60, lengthscale=0.2, seed=12)
    bad = msgs[:3] + [PosteriorMessage(msgs[3].weight_mean, msgs[3].weight_covariance, 13, 15, other.fingerprint)]
    with pytest.raises(ValueError, match=r"agents \[13\].*fingerprint"):
        AgentRFFPosteriors.from_messages(bad, rff)
    with pytest.raises(ValueError, match="fingerprint"):
        AgentRFFPosteriors.from_messages(msgs, other)
    with pytest.raises(ValueError, match="empty"):
        AgentRFFPosteriors.from_messages([], rff)
    with pytest.raises(TypeError, match="PosteriorMessage"):
        AgentRFFPosteriors.from_messages([blr.weight_mean[0]], rff)


def test_agent_posteriors_argument_errors(rff):
    nu = torch.zeros(3, 60, dtype=f64)
    cov = torch.eye(60, dtype=f64).expand(3, 60, 60)
    with pytest.raises(ValueError, match="weight_covariances"):
        AgentRFFPosteriors(rff, nu, cov[:2])
    with pytest.raises(ValueError, match="weight_means"):
        AgentRFFPosteriors(rff, torch.zeros(3, 59, dtype=f64), cov)
    with pytest.raises(TypeError, match="features"):
        AgentRFFPosteriors(None, nu, cov)
    with pytest.raises(ValueError, match="incumbents"):
        AgentRFFPosteriors(rff, nu, cov, incumbents=[1.0, 2.0])
    post = AgentRFFPosteriors(rff, nu, cov)
    with pytest.raises(ValueError, match="X"):
        post.posterior(torch.rand(5, 3, 2, dtype=f64))  # batch 5 does not broadcast with N = 3
    with pytest.raises(ValueError, match="X"):
        post.posterior(torch.rand(5, 3, dtype=f64))  # wrong d


def test_psd_factor_handles_semidefinite():
    A = torch.randn(4, 6, 3, dtype=f64)
    C = torch.cat([A @ A.mT, torch.zeros(1, 6, 6, dtype=f64)])  # rank 3 and zero
    R = psd_factor(C)
    torch.testing.assert_close(R @ R.mT, C, atol=1e-10, rtol=0)


def test_follows_input_dtype(rff):
    blr = make_agents(rff)
    post = AgentRFFPosteriors.from_model(blr).to(torch.float32)
    out = post.posterior(torch.rand(3, 2))
    assert out.mean.dtype == torch.float32 and post.predict(torch.rand(3, 2))[1].dtype == torch.float32


def test_sample_joint_moments_and_reproducible(rff):
    post = AgentRFFPosteriors.from_model(make_agents(rff, N=2))
    Xs = torch.rand(3, 2, dtype=f64)
    s = post.sample_joint(Xs, torch.Size([40000]), generator=torch.Generator().manual_seed(0))
    assert s.shape == (40000, 2, 3)
    p = post.posterior(Xs)
    torch.testing.assert_close(s.mean(0), p.mean.squeeze(-1), atol=0.03, rtol=0)
    emp = torch.einsum("sni,snj->nij", s - s.mean(0), s - s.mean(0)) / s.shape[0]
    torch.testing.assert_close(emp, p.mvn.covariance_matrix, atol=0.03, rtol=0.05)
    s2 = post.sample_joint(Xs, torch.Size([40000]), generator=torch.Generator().manual_seed(0))
    assert torch.equal(s, s2)


def test_linear_combination_is_weighted_sum(rff):
    post = AgentRFFPosteriors.from_model(make_agents(rff))
    w = torch.tensor([0.1, 0.0, 0.5, 0.4], dtype=f64)
    nu, R = post.linear_combination(w)
    Xs = torch.rand(5, 2, dtype=f64)
    phi = rff(Xs)
    p = post.posterior(Xs)
    torch.testing.assert_close(phi @ nu, (w[:, None] * p.mean.squeeze(-1)).sum(0), atol=1e-10, rtol=0)
    cov = (w[:, None, None] ** 2 * p.mvn.covariance_matrix).sum(0)
    torch.testing.assert_close(phi @ R @ R.mT @ phi.mT, cov, atol=1e-10, rtol=0)


# ------------------------------------------------------------------- ranking
def test_ranking_loss_matches_brute_force():
    g = torch.Generator().manual_seed(3)
    y = torch.randint(0, 4, (7,), generator=g).to(f64)  # many ties in y
    f = torch.randint(0, 5, (6, 7), generator=g).to(f64)  # ties in f
    loss = ranking_loss(f, y)
    for s in range(6):
        ref = 0.0
        for j, k in itertools.product(range(7), range(7)):
            if y[j] == y[k]:
                continue
            if f[s, j] == f[s, k]:
                ref += 0.5
            else:
                ref += float((f[s, j] < f[s, k]) != (y[j] < y[k]))
        assert loss[s].item() == ref
    # LOO variant: row j of each draw is fold j
    F = torch.randn(5, 7, 7, generator=g, dtype=f64)
    yl = torch.randn(7, generator=g, dtype=f64)
    ref = torch.zeros(5, dtype=f64)
    for s, j, k in itertools.product(range(5), range(7), range(7)):
        if j != k:
            ref[s] += float((F[s, j, j] < F[s, j, k]) != (yl[j] < yl[k]))
    torch.testing.assert_close(_loo_ranking_loss(F, yl), ref)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=1, max_value=7).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(0, 3), min_size=n, max_size=n),
            st.lists(st.lists(st.integers(0, 3), min_size=n, max_size=n), min_size=1, max_size=3),
        )
    )
)
def test_ranking_loss_property(data):
    y_list, f_list = data
    y, f = torch.tensor(y_list, dtype=f64), torch.tensor(f_list, dtype=f64)
    n = y.shape[0]
    ref = torch.zeros(f.shape[0], dtype=f64)
    for s, j, k in itertools.product(range(f.shape[0]), range(n), range(n)):
        if y[j] != y[k]:
            ref[s] += 0.5 if f[s, j] == f[s, k] else float((f[s, j] < f[s, k]) != (y[j] < y[k]))
    torch.testing.assert_close(ranking_loss(f, y), ref)
    assert bool((ranking_loss(f, y) <= n * (n - 1)).all())


def test_loo_posteriors_match_refits():
    g = torch.Generator().manual_seed(0)
    n = 6
    X = torch.rand(n, 2, generator=g, dtype=f64)
    K = torch.exp(-torch.cdist(X, X).square() / 0.1)
    m = torch.full((n,), 0.3, dtype=f64)
    noise = torch.rand(n, generator=g, dtype=f64) * 0.1 + 0.01
    y = torch.randn(n, generator=g, dtype=f64)
    means, Sigma, U = loo_posteriors(m, K, noise, y)
    for j in range(n):
        keep = torch.arange(n) != j
        Ky = K[keep][:, keep] + torch.diag(noise[keep])
        Ks = K[:, keep]
        mean_ref = m + Ks @ torch.linalg.solve(Ky, y[keep] - m[keep])
        cov_ref = K - Ks @ torch.linalg.solve(Ky, Ks.mT)
        torch.testing.assert_close(means[j], mean_ref, atol=1e-9, rtol=0)
        torch.testing.assert_close(Sigma + torch.outer(U[:, j], U[:, j]), cov_ref, atol=1e-9, rtol=0)


# -------------------------------------------------------------- RGPE weights
@pytest.mark.parametrize("target_kind", ["gp", "rff"])
def test_rgpe_weights_favour_agent_with_target_function(rff, target_kind):
    blr, tX, tY = federation(rff)
    agents = AgentRFFPosteriors.from_model(blr)
    tm = target_gp(tX, tY) if target_kind == "gp" else RFFBayesianLinear(rff, tX, tY, 1e-2)
    w = compute_rgpe_weights(tm, agents, tX, tY, num_samples=512, generator=torch.Generator().manual_seed(0))
    assert w.shape == (4,) and w.dtype == f64
    assert bool((w >= 0).all())
    torch.testing.assert_close(w.sum(), torch.tensor(1.0, dtype=f64))
    assert w[0] > w[1] and w[0] > w[2]
    assert w[0] > 0.3 and w[1] < 0.01 and w[2] < 0.05
    # reproducible with the same generator
    w2 = compute_rgpe_weights(tm, agents, tX, tY, num_samples=512, generator=torch.Generator().manual_seed(0))
    assert torch.equal(w, w2)


def test_rgpe_weights_small_n_ties_and_no_agents(rff):
    blr, tX, tY = federation(rff)
    agents = AgentRFFPosteriors.from_model(blr)
    # a single observation ranks nothing: uniform
    gp1 = target_gp(tX[:1], tY[:1])
    w = compute_rgpe_weights(gp1, agents, tX[:1], tY[:1])
    torch.testing.assert_close(w, torch.full((4,), 0.25, dtype=f64))
    # all observations equal: nothing to rank either
    flat = torch.ones_like(tY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # BoTorch warns about unstandardized constant outcomes
        gp_flat = target_gp(tX, flat)
    w = compute_rgpe_weights(gp_flat, agents, tX, flat)
    torch.testing.assert_close(w, torch.full((4,), 0.25, dtype=f64))
    # no agents: all weight on the target
    w = compute_rgpe_weights(target_gp(tX, tY), None, tX, tY)
    torch.testing.assert_close(w, torch.ones(1, dtype=f64))
    with pytest.raises(ValueError, match="train_Y"):
        compute_rgpe_weights(target_gp(tX, tY), agents, tX, tY[:-1])
    with pytest.raises(ValueError, match="weight_dilution"):
        compute_rgpe_weights(target_gp(tX, tY), agents, tX, tY, weight_dilution="median")


def test_rgpe_tied_losses_split_evenly(rff):
    # two agents with exactly the same posterior: ties among minima split the draw's weight
    blr, tX, tY = federation(rff)
    a = AgentRFFPosteriors.from_model(blr)
    nu = a.weight_mean[[0, 0]]
    R = torch.zeros_like(a.covariance_factor[[0, 0]])  # deterministic agents: identical losses
    twins = AgentRFFPosteriors.from_factors(rff, nu, R)
    w = compute_rgpe_weights(target_gp(tX, tY), twins, tX, tY, generator=torch.Generator().manual_seed(0))
    assert w[0] == w[1]
    torch.testing.assert_close(w.sum(), torch.tensor(1.0, dtype=f64))


def test_rgpe_weight_dilution(rff):
    blr, tX, tY = federation(rff)
    agents = AgentRFFPosteriors.from_model(blr)
    gp = target_gp(tX, tY)
    kw = dict(num_samples=256, generator=torch.Generator().manual_seed(0))
    w = compute_rgpe_weights(gp, agents, tX, tY, weight_dilution="percentile", **kw)
    assert w[1] == 0 and w[2] == 0 and w[0] > 0
    torch.testing.assert_close(w.sum(), torch.tensor(1.0, dtype=f64))
    # at the end of the horizon every agent is dropped
    w = compute_rgpe_weights(gp, agents, tX, tY, weight_dilution="probabilistic", horizon=tX.shape[0], **kw)
    torch.testing.assert_close(w, torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=f64))
    w = compute_rgpe_weights(gp, agents, tX, tY, weight_dilution="probabilistic", **kw)
    assert w[1] == 0 and w[2] == 0


# ---------------------------------------------------------------- RGPE model
def test_rgpe_posterior_is_weighted_ensemble(rff):
    blr, tX, tY = federation(rff)
    agents = AgentRFFPosteriors.from_model(blr)
    gp = target_gp(tX, tY)
    w = torch.tensor([0.5, 0.1, 0.1, 0.3], dtype=f64)
    model = RGPE(gp, agents, w * 2)  # renormalized
    torch.testing.assert_close(model.weights, w)
    Xs = torch.rand(2, 3, 2, dtype=f64)
    post = model.posterior(Xs)
    pt, pa = gp.posterior(Xs), agents.posterior(Xs.unsqueeze(-3))  # 2 x 3 x 3
    mean = w[-1] * pt.mean.squeeze(-1) + (w[:3, None] * pa.mean.squeeze(-1)).sum(-2)
    cov = w[-1] ** 2 * pt.mvn.covariance_matrix + (w[:3, None, None] ** 2 * pa.mvn.covariance_matrix).sum(-3)
    torch.testing.assert_close(post.mean.squeeze(-1), mean, atol=1e-10, rtol=0)
    torch.testing.assert_close(post.mvn.covariance_matrix, cov, atol=1e-10, rtol=0)
    assert post.mean.shape == (2, 3, 1)
    # only the target: the target's posterior
    only = RGPE(gp, agents, torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=f64))
    torch.testing.assert_close(only.posterior(Xs).mean, pt.mean)
    with pytest.raises(ValueError, match="weights"):
        RGPE(gp, agents, torch.ones(3, dtype=f64))
    with pytest.raises(ValueError, match="weights"):
        RGPE(gp, agents, torch.tensor([1.0, -1.0, 0.5, 0.5], dtype=f64))


def test_rgpe_and_taf_inside_optimize_acqf(rff):
    blr, tX, tY = federation(rff)
    agents = AgentRFFPosteriors.from_model(blr)
    gp = target_gp(tX, tY)
    bounds = torch.tensor([[0.1, 0.0], [0.9, 0.7]], dtype=f64)
    rgpe = RGPE.from_data(gp, agents, tX, tY, num_samples=128, generator=torch.Generator().manual_seed(0))
    for acqf, q in (
        (LogExpectedImprovement(rgpe, best_f=tY.max()), 1),
        (qLogNoisyExpectedImprovement(rgpe, X_baseline=tX), 2),  # joint q x q covariance
        (TransferAcquisitionFunction(gp, agents, tX, tY), 1),
        (TransferAcquisitionFunction(gp, agents, tX, tY, incumbent="target"), 1),
    ):
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x, val = optimize_acqf(acqf, bounds=bounds, q=q, num_restarts=2, raw_samples=32)
        assert x.shape == (q, 2)
        assert bool(((x >= bounds[0]) & (x <= bounds[1])).all())
        assert torch.isfinite(val).all()


# ---------------------------------------------------------------------- TAF
def test_taf_reduces_to_ei_without_agents(rff):
    _, tX, tY = federation(rff)
    gp = target_gp(tX, tY)
    Xs = torch.rand(50, 1, 2, dtype=f64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ei = ExpectedImprovement(gp, best_f=tY.max())
        ei_custom = ExpectedImprovement(gp, best_f=0.3)
    taf = TransferAcquisitionFunction(gp, None, tX, tY)
    assert taf.weights.tolist() == [1.0]
    torch.testing.assert_close(taf(Xs), ei(Xs), atol=1e-14, rtol=0)
    torch.testing.assert_close(TransferAcquisitionFunction(gp, None, tX, tY, best_f=0.3)(Xs), ei_custom(Xs))
    assert taf(Xs).shape == (50,) and taf(Xs[0]).shape == (1,)  # 1 x d is read as 1 x 1 x d


def test_taf_weights_and_value(rff):
    blr, tX, tY = federation(rff)
    # agent 3 has exactly the target's data, i.e. is identical to the target
    X4 = torch.cat([blr.train_X, torch.zeros(1, blr.train_X.shape[1], 2, dtype=f64)])
    Y4 = torch.cat([blr.train_Y, torch.zeros(1, blr.train_Y.shape[1], 1, dtype=f64)])
    n = tX.shape[0]
    X4[3, :n], Y4[3, :n] = tX, tY
    blr4 = RFFBayesianLinear(rff, X4, Y4, 1e-2, lengths=torch.tensor([40, 40, 40, n]))
    agents = AgentRFFPosteriors.from_model(blr4)
    gp = target_gp(tX, tY)
    taf = TransferAcquisitionFunction(gp, agents, tX, tY, bandwidth=0.5)
    w = taf.weights
    torch.testing.assert_close(w.sum(), torch.tensor(1.0, dtype=f64))
    assert w[3] == pytest.approx(float(w[-1]), abs=1e-12)  # perfect ranking: same weight as the target
    assert w[3] == w.max() and w[3] > 0.25  # the largest weight any agent can get
    assert w[1] == 0 and w[2] < w[0] and w[0] > 0.25  # negated: 0; unrelated below same-function
    torch.testing.assert_close(w, compute_taf_weights(agents, tX, tY, 0.5))
    # value = w_t EI + Σ w_n max(μ_n - incumbent_n, 0)
    Xs = torch.rand(20, 1, 2, dtype=f64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ei = ExpectedImprovement(gp, best_f=tY.max())(Xs)
    mu = agents.posterior(Xs.unsqueeze(-3)).mean.squeeze(-1).squeeze(-1)  # 20 x N
    ref = w[-1] * ei + ((mu - agents.incumbents).clamp_min(0) * w[:-1]).sum(-1)
    torch.testing.assert_close(taf(Xs), ref, atol=1e-12, rtol=0)
    # Wistuba et al.'s incumbent: the best predicted value over the target's inputs
    taf_t = TransferAcquisitionFunction(gp, agents, tX, tY, incumbent="target")
    inc = agents.posterior(tX).mean.squeeze(-1).amax(-1)
    torch.testing.assert_close(taf_t.agent_incumbents, inc)
    # autograd
    Xg = Xs.clone().requires_grad_(True)
    taf(Xg).sum().backward()
    assert Xg.grad is not None and torch.isfinite(Xg.grad).all()


def test_taf_errors_and_small_n(rff):
    blr, tX, tY = federation(rff)
    agents = AgentRFFPosteriors.from_model(blr)
    no_inc = AgentRFFPosteriors.from_factors(rff, agents.weight_mean, agents.covariance_factor)
    gp = target_gp(tX, tY)
    with pytest.raises(ValueError, match="incumbent"):
        TransferAcquisitionFunction(gp, no_inc, tX, tY)
    TransferAcquisitionFunction(gp, no_inc, tX, tY, incumbent="target")  # needs none
    with pytest.raises(ValueError, match="bandwidth"):
        TransferAcquisitionFunction(gp, agents, tX, tY, bandwidth=0.0)
    with pytest.raises(ValueError, match="incumbent"):
        TransferAcquisitionFunction(gp, agents, tX, tY, incumbent="best")
    w = compute_taf_weights(agents, tX[:1], tY[:1])
    torch.testing.assert_close(w, torch.full((4,), 0.25, dtype=f64))
    # RGPE weights can be plugged in
    taf = TransferAcquisitionFunction(gp, agents, tX, tY, weights=torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=f64))
    torch.testing.assert_close(taf.weights, torch.tensor([0.5, 0.0, 0.0, 0.5], dtype=f64))


# ---------------------------------------------------------- many agents, batched
def test_many_agents_match_per_agent_reference():
    rff = RandomFourierFeatures(dim=2, num_features=40, lengthscale=0.3, seed=5)
    N, n = 200, 8
    g = torch.Generator().manual_seed(0)
    X = torch.rand(N, n, 2, generator=g, dtype=f64)
    Y = torch.sin(4 * X + torch.rand(N, 1, 2, generator=g, dtype=f64) * 6).sum(-1, keepdim=True)
    noise = 0.01 + 0.05 * torch.rand(N, generator=g, dtype=f64)
    blr = RFFBayesianLinear(rff, X, Y, noise)
    agents = AgentRFFPosteriors.from_model(blr)
    tX = torch.rand(10, 2, generator=g, dtype=f64)
    tY = torch.sin(4 * tX).sum(-1, keepdim=True)
    gp = target_gp(tX, tY)
    w = torch.rand(N + 1, generator=g, dtype=f64)
    w = w / w.sum()
    rgpe = RGPE(gp, agents, w)
    taf = TransferAcquisitionFunction(gp, agents, tX, tY)
    cand = torch.rand(1000, 1, 2, generator=g, dtype=f64)
    post = rgpe.posterior(cand)
    tafv = taf(cand)
    mean_all, var_all = agents.predict(cand.squeeze(-2))
    assert post.mean.shape == (1000, 1, 1) and tafv.shape == (1000,) and var_all.shape == (1000, N)

    # slow reference: one agent at a time, straight from its precision Cholesky factor
    idx = [0, 17, 999]
    pt = gp.posterior(cand[idx])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ei = ExpectedImprovement(gp, best_f=tY.max())(cand[idx])
    phi = rff(cand[idx].squeeze(-2))  # 3 x M
    ref_mean = w[-1] * pt.mean.view(-1)
    ref_var = w[-1] ** 2 * pt.variance.view(-1)
    ref_taf = taf.weights[-1] * ei
    for a in range(N):
        nu_a = blr.weight_mean[a]
        v = torch.linalg.solve_triangular(blr.chol[a], phi.mT, upper=False)
        mu_a = phi @ nu_a
        var_a = blr.noise_variance[a] * v.square().sum(0)
        torch.testing.assert_close(mean_all[idx, a], mu_a, atol=1e-10, rtol=0)
        torch.testing.assert_close(var_all[idx, a], var_a, atol=1e-10, rtol=0)
        ref_mean = ref_mean + w[a] * mu_a
        ref_var = ref_var + w[a] ** 2 * var_a
        ref_taf = ref_taf + taf.weights[a] * (mu_a - blr.train_Y[a].max()).clamp_min(0)
    torch.testing.assert_close(post.mean.view(-1)[idx], ref_mean, atol=1e-10, rtol=0)
    torch.testing.assert_close(post.variance.view(-1)[idx], ref_var, atol=1e-10, rtol=0)
    torch.testing.assert_close(tafv[idx], ref_taf, atol=1e-10, rtol=0)

    # weights for 200 agents in one call, valid distribution
    wr = compute_rgpe_weights(gp, agents, tX, tY, num_samples=64, generator=torch.Generator().manual_seed(1))
    assert wr.shape == (N + 1,) and bool((wr >= 0).all())
    assert math.isclose(float(wr.sum()), 1.0, abs_tol=1e-12)


def test_follows_device_and_cpu_generator(device):
    rff_d = RandomFourierFeatures(dim=2, num_features=60, lengthscale=0.2, seed=11, device=device)
    blr, tX, tY = federation(RandomFourierFeatures(dim=2, num_features=60, lengthscale=0.2, seed=11))
    blr_d = RFFBayesianLinear(rff_d, blr.train_X.to(device), blr.train_Y.to(device), 1e-2)
    agents = AgentRFFPosteriors.from_model(blr_d)
    tXd, tYd = tX.to(device), tY.to(device)
    gp = target_gp(tX, tY).to(device)
    w = compute_rgpe_weights(gp, agents, tXd, tYd, num_samples=64, generator=torch.Generator().manual_seed(0))
    assert w.device.type == device.type
    ref = compute_rgpe_weights(
        target_gp(tX, tY),
        AgentRFFPosteriors.from_model(blr),
        tX,
        tY,
        num_samples=64,
        generator=torch.Generator().manual_seed(0),
    )
    torch.testing.assert_close(w.cpu(), ref)  # the same draws whatever the device
    cand = torch.rand(5, 1, 2, dtype=f64, device=device)
    assert RGPE(gp, agents, w).posterior(cand).mean.device.type == device.type
    assert TransferAcquisitionFunction(gp, agents, tXd, tYd)(cand).device.type == device.type


def test_rank_deficient_joint_posterior_can_be_sampled(rff):
    # q > M points: φ C φᵀ has rank <= M; the lazy covariance gets jitter when sampled
    post = AgentRFFPosteriors.from_model(make_agents(rff, N=2)).posterior(torch.rand(80, 2, dtype=f64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = post.rsample(torch.Size([3]))
    assert s.shape == (3, 2, 80, 1) and torch.isfinite(s).all()
