"""BoTorch conformance: a fixed list of BoTorch acquisitions over fbo_torch's models.

Runs analytic, MC, knowledge-gradient, integrated-variance, max-value-entropy
and pathwise acquisitions (and ``MaxPosteriorSampling``) through
``optimize_acqf`` with q in {1, 3} over

* ``RFFBayesianLinear`` for one agent, in both exact representations, and
* ``SingleTaskGP(covar_module=SharedRFFKernel(...))``, fitted,

and evaluates them on a batched (N agents) ``RFFBayesianLinear`` where BoTorch
supports batched models (acquisition values per agent, pathwise paths), so a
BoTorch release that breaks the model contract fails here. Models and
optimizer budgets are tiny; the assertions are on contracts (finite values,
shapes, bounds, distinct Thompson samples) and, for pathwise sampling, on the
paths' moments against the posterior.
"""

from __future__ import annotations

import math

import pytest
import torch
from botorch.acquisition import (
    LogExpectedImprovement,
    PosteriorMean,
    ProbabilityOfImprovement,
    UpperConfidenceBound,
    qKnowledgeGradient,
    qLogExpectedImprovement,
    qLogNoisyExpectedImprovement,
    qMaxValueEntropy,
    qNegIntegratedPosteriorVariance,
    qUpperConfidenceBound,
)
from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling
from botorch.fit import fit_gpytorch_mll
from botorch.generation import MaxPosteriorSampling
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf
from botorch.sampling.pathwise import draw_matheron_paths, get_matheron_path_model
from gpytorch.mlls import ExactMarginalLogLikelihood

from fbo_torch import RandomFourierFeatures, RFFBayesianLinear, SharedRFFKernel
from fbo_torch.acquisition import FederatedThompsonSampling

f64 = torch.float64
D, M, N_OBS = 2, 24, 8
BOUNDS = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64)
OPT = dict(num_restarts=2, raw_samples=16, options={"maxiter": 15})


def _data(n=N_OBS, batch=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(*batch, n, D, generator=g, dtype=f64)
    return X, torch.sin(5 * X).sum(-1, keepdim=True)


@pytest.fixture(scope="module")
def rff():
    return RandomFourierFeatures(D, M, lengthscale=0.3, seed=1)


def _model(kind: str, rff: RandomFourierFeatures):
    X, Y = _data()
    if kind == "stgp_shared_rff":
        gp = SingleTaskGP(X, Y, covar_module=SharedRFFKernel(rff))
        fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
        return gp.eval(), X, Y
    return RFFBayesianLinear(rff, X, Y, 0.01, representation=kind.removeprefix("rff_")), X, Y


MODELS = ["rff_dual", "rff_weight", "stgp_shared_rff"]


@pytest.fixture(scope="module", params=MODELS)
def setup(request, rff):
    return (request.param, *_model(request.param, rff))


# name -> (factory(model, X, Y, rff, q), q values, expect distinct candidates for q > 1)
ACQUISITIONS = {
    "LogExpectedImprovement": (lambda m, X, Y, rff, q: LogExpectedImprovement(m, best_f=Y.max()), (1,), False),
    "ProbabilityOfImprovement": (lambda m, X, Y, rff, q: ProbabilityOfImprovement(m, best_f=Y.max()), (1,), False),
    "UpperConfidenceBound": (lambda m, X, Y, rff, q: UpperConfidenceBound(m, beta=2.0), (1,), False),
    "PosteriorMean": (lambda m, X, Y, rff, q: PosteriorMean(m), (1,), False),
    "qLogExpectedImprovement": (lambda m, X, Y, rff, q: qLogExpectedImprovement(m, best_f=Y.max()), (1, 3), False),
    "qLogNoisyExpectedImprovement": (
        lambda m, X, Y, rff, q: qLogNoisyExpectedImprovement(m, X_baseline=X),
        (1, 3),
        False,
    ),
    "qUpperConfidenceBound": (lambda m, X, Y, rff, q: qUpperConfidenceBound(m, beta=2.0), (1, 3), False),
    "qKnowledgeGradient": (lambda m, X, Y, rff, q: qKnowledgeGradient(m, num_fantasies=4), (1, 3), False),
    "qNegIntegratedPosteriorVariance": (
        lambda m, X, Y, rff, q: qNegIntegratedPosteriorVariance(m, mc_points=_data(16, seed=5)[0]),
        (1, 3),
        False,
    ),
    "qMaxValueEntropy": (
        lambda m, X, Y, rff, q: qMaxValueEntropy(m, candidate_set=_data(32, seed=6)[0], num_mv_samples=4),
        (1,),
        False,
    ),
    "PathwiseThompsonSampling": (lambda m, X, Y, rff, q: PathwiseThompsonSampling(m), (1, 3), True),
    "FederatedThompsonSampling": (
        lambda m, X, Y, rff, q: FederatedThompsonSampling(
            m,
            torch.randn(5, M, dtype=f64, generator=torch.Generator().manual_seed(q)),
            rff,
            p_t=0.5,
            q=q,
            generator=torch.Generator().manual_seed(q),
        ),
        (1, 3),
        True,
    ),
}
CASES = [(name, q) for name, (_, qs, _) in ACQUISITIONS.items() for q in qs]


@pytest.mark.parametrize(("name", "q"), CASES, ids=[f"{n}-q{q}" for n, q in CASES])
def test_acquisition_optimizes(setup, rff, name, q):
    kind, model, X, Y = setup
    factory, _, distinct = ACQUISITIONS[name]
    torch.manual_seed(0)
    acqf = factory(model, X, Y, rff, q)
    cand, value = optimize_acqf(acqf, BOUNDS, q=q, sequential=False, **OPT)
    assert cand.shape == (q, D) and cand.dtype == f64
    assert ((cand >= BOUNDS[0]) & (cand <= BOUNDS[1])).all()
    assert torch.isfinite(value).all()
    if name == "qKnowledgeGradient":  # KG's value function is evaluated on the fantasy models
        return
    with torch.no_grad():
        assert torch.isfinite(acqf(cand.unsqueeze(0))).all()
    if distinct and q > 1:  # independent samples have different maximizers
        assert torch.pdist(cand).min() > 1e-6, cand


def test_max_posterior_sampling(setup):
    kind, model, X, Y = setup
    torch.manual_seed(0)
    cands = _data(20, seed=7)[0]  # fewer than M: the joint posterior is full rank (no jitter)
    picked = MaxPosteriorSampling(model, replacement=False)(cands, num_samples=3)
    assert picked.shape == (3, D)
    rows = (picked.unsqueeze(1) == cands.unsqueeze(0)).all(-1)  # 3 x 20
    assert (rows.sum(-1) == 1).all() and rows.any(0).sum() == 3  # three distinct candidates


def test_matheron_path_model(setup):
    kind, model, X, Y = setup
    torch.manual_seed(0)
    path_model = get_matheron_path_model(model)
    out = path_model(_data(5, seed=8)[0])
    assert out.shape == (5, 1) and torch.isfinite(out).all()


def _assert_moments(paths: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor) -> None:
    """``paths``: S x ... x q draws; ``mean``: ... x q; ``cov``: ... x q x q.

    Each empirical mean is N(μ, σ²/S) and each empirical covariance entry has
    standard error sqrt((Σ_ij² + Σ_ii Σ_jj) / S); with a few dozen entries,
    |z| < 5 fails with probability below 1e-5 for a correct sampler.
    """
    S = paths.shape[0]
    sd = cov.diagonal(dim1=-2, dim2=-1).sqrt()
    z_mean = (paths.mean(0) - mean) / (sd / math.sqrt(S))
    assert z_mean.abs().max() < 5, z_mean
    centered = paths - paths.mean(0)
    emp = torch.einsum("s...i,s...j->...ij", centered, centered) / (S - 1)
    se = ((cov**2 + sd.unsqueeze(-1) ** 2 * sd.unsqueeze(-2) ** 2) / S).sqrt()
    assert ((emp - cov) / se).abs().max() < 5


def test_pathwise_moments_match_posterior(setup):
    # sample paths of our models are draws from their posteriors
    kind, model, X, Y = setup
    Xs = _data(4, seed=9)[0]
    torch.manual_seed(1)
    S = 3000
    paths = draw_matheron_paths(model, sample_shape=torch.Size([S]))
    with torch.no_grad():
        values = paths(Xs)  # S x 4
        post = model.posterior(Xs)
    assert values.shape == (S, 4)
    _assert_moments(values, post.mean.squeeze(-1), post.mvn.covariance_matrix)


def test_batched_rff_model_where_botorch_supports_batches(rff):
    # one RFFBayesianLinear for N = 3 agents: acquisition values per agent, paths per agent
    N = 3
    X, Y = _data(batch=(N,))
    model = RFFBayesianLinear(rff, X, Y, torch.tensor([0.01, 0.02, 0.05], dtype=f64))
    best = Y.amax(dim=-2)  # N x 1 (per agent, BoTorch's batch x m)
    Xq = torch.rand(5, N, 1, D, dtype=f64)  # b x N x q x d
    for acqf in (
        LogExpectedImprovement(model, best_f=best),
        UpperConfidenceBound(model, beta=2.0),
        PosteriorMean(model),
    ):
        v = acqf(Xq)
        assert v.shape == (5, N) and torch.isfinite(v).all()
    Xq3 = torch.rand(5, N, 3, D, dtype=f64)
    torch.manual_seed(0)
    for acqf in (qLogExpectedImprovement(model, best_f=best.squeeze(-1)), qUpperConfidenceBound(model, beta=2.0)):
        v = acqf(Xq3)
        assert v.shape == (5, N) and torch.isfinite(v).all()
    picked = MaxPosteriorSampling(model, replacement=False)(torch.rand(N, 20, D, dtype=f64), num_samples=2)
    assert picked.shape == (N, 2, D)
    Xs = torch.rand(N, 4, D, dtype=f64)
    torch.manual_seed(2)
    S = 3000
    values = draw_matheron_paths(model, sample_shape=torch.Size([S]))(Xs)
    assert values.shape == (S, N, 4)
    post = model.posterior(Xs)
    _assert_moments(values, post.mean.squeeze(-1), post.mvn.covariance_matrix)


def test_transformed_rff_model_paths_and_acquisition(rff):
    # input/outcome transforms are honoured by pathwise sampling and acquisitions alike
    from botorch.models.transforms import Normalize, Standardize

    X, Y = _data()
    Xr, Yr = 2.0 + 3.0 * X, 4.0 * Y - 1.0
    bounds = torch.tensor([[2.0, 2.0], [5.0, 5.0]], dtype=f64)
    model = RFFBayesianLinear(
        rff, Xr, Yr, 0.01, input_transform=Normalize(D, bounds=bounds), outcome_transform=Standardize(1)
    )
    Xs = 2.0 + 3.0 * _data(4, seed=10)[0]
    torch.manual_seed(3)
    values = draw_matheron_paths(model, sample_shape=torch.Size([3000]))(Xs)
    post = model.posterior(Xs)
    _assert_moments(values, post.mean.squeeze(-1), post.mvn.covariance_matrix)
    torch.manual_seed(0)
    cand, value = optimize_acqf(qLogNoisyExpectedImprovement(model, X_baseline=Xr), bounds, q=2, **OPT)
    assert cand.shape == (2, D) and ((cand >= 2.0) & (cand <= 5.0)).all() and torch.isfinite(value).all()


def test_feature_map_and_scaled_kernel_paths(rff):
    # RandomFourierFeatures as a BoTorch pathwise FeatureMap; ScaleKernel(SharedRFFKernel) paths are exact too
    from botorch.sampling.pathwise import GeneralizedLinearPath
    from gpytorch.kernels import ScaleKernel

    from fbo_torch.sampling.pathwise import RFFFeatureMap

    fmap = RFFFeatureMap(rff)
    assert fmap.num_outputs == M and fmap.batch_shape == torch.Size([])
    w = torch.randn(2, M, dtype=f64, generator=torch.Generator().manual_seed(0))
    Xs = _data(5, seed=11)[0]
    # same dot products in another summation order: |error| <= M eps sum_i |phi_i w_i| <= M eps ||phi|| ||w||
    atol = M * torch.finfo(f64).eps * w.norm(dim=-1).max().item()
    torch.testing.assert_close(GeneralizedLinearPath(fmap, weight=w)(Xs), w @ rff(Xs).T, atol=atol, rtol=0)
    X, Y = _data()
    gp = SingleTaskGP(X, Y, covar_module=ScaleKernel(SharedRFFKernel(rff)))
    gp.covar_module.outputscale = 2.5
    gp.eval()
    torch.manual_seed(4)
    values = draw_matheron_paths(gp, sample_shape=torch.Size([3000]))(Xs)
    post = gp.posterior(Xs)
    _assert_moments(values, post.mean.squeeze(-1), post.mvn.covariance_matrix)
    assert rff.spectral.dtype == f64 and fmap.output_transform is None  # the shared map was not modified


def test_kernel_on_active_dims_paths(rff):
    # a SharedRFFKernel on 2 of 3 inputs: the prior paths select the same inputs the kernel does
    g = torch.Generator().manual_seed(12)
    X = torch.rand(N_OBS, 3, generator=g, dtype=f64)
    Y = torch.sin(5 * X[:, [0, 2]]).sum(-1, keepdim=True)
    gp = SingleTaskGP(X, Y, covar_module=SharedRFFKernel(rff, active_dims=(0, 2))).eval()
    Xs = torch.rand(4, 3, generator=g, dtype=f64)
    torch.manual_seed(5)
    values = draw_matheron_paths(gp, sample_shape=torch.Size([3000]))(Xs)
    post = gp.posterior(Xs)
    _assert_moments(values, post.mean.squeeze(-1), post.mvn.covariance_matrix)
