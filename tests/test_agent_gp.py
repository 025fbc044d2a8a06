import pytest
import torch
from botorch.models import SingleTaskGP

from fbo_torch.models import build_agent_gps, draw_thompson_paths, fit_agent_gps

f64 = torch.float64


def data(N=3, n=12, d=2, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(N, n, d, generator=g, dtype=f64)
    Y = scale * torch.sin(5 * X).sum(-1, keepdim=True) + 0.05 * torch.randn(N, n, 1, generator=g, dtype=f64)
    return X, Y


def test_batched_fit_matches_separate_fits():
    X, Y = data()
    gp = fit_agent_gps(X, Y)
    assert isinstance(gp, SingleTaskGP) and gp.batch_shape == torch.Size([3])
    Xs = torch.rand(3, 6, 2, dtype=f64)
    with torch.no_grad():
        mb = gp.posterior(Xs).mean
        for i in range(3):
            gi = fit_agent_gps(X[i : i + 1], Y[i : i + 1])
            torch.testing.assert_close(gi.posterior(Xs[i : i + 1]).mean[0], mb[i], atol=2e-3, rtol=2e-3)


def test_outcome_standardization_and_ard():
    X, Y = data(scale=1000.0)
    gp = fit_agent_gps(X, Y)
    ls = gp.covar_module.lengthscale
    assert ls.shape == (3, 1, 2)  # one lengthscale per agent and dimension (ARD)
    # fitting happens on standardized outcomes
    assert gp.train_targets.abs().max() < 5


def test_paths_shapes_and_moments():
    X, Y = data(N=2, n=15)
    gp = fit_agent_gps(X, Y)
    paths = draw_thompson_paths(gp, sample_shape=torch.Size([3000]), seed=0)
    Xs = torch.rand(2, 4, 2, dtype=f64)
    with torch.no_grad():
        v = paths(Xs)
        post = gp.posterior(Xs)
    assert v.shape == (3000, 2, 4)
    sd = post.variance.squeeze(-1).sqrt()
    z = (v.mean(0) - post.mean.squeeze(-1)) / (sd / 3000**0.5)
    # pathwise draws use a finite random-feature prior: allow a little bias on top of MC error
    assert z.abs().max() < 6
    torch.testing.assert_close(v.std(0), sd, rtol=0.15, atol=1e-3)
    # a single draw per agent evaluates to N x C and is differentiable
    one = draw_thompson_paths(gp, seed=1)
    Xg = Xs.clone().requires_grad_(True)
    out = one(Xg)
    assert out.shape == (2, 4)
    out.sum().backward()
    assert Xg.grad is not None and torch.isfinite(Xg.grad).all()
    # seeded draws repeat
    with torch.no_grad():
        assert torch.equal(draw_thompson_paths(gp, seed=5)(Xs), draw_thompson_paths(gp, seed=5)(Xs))


def test_warm_start_without_refit_keeps_hyperparameters():
    X, Y = data(n=10)
    gp = fit_agent_gps(X, Y)
    X2, Y2 = data(n=11, seed=1)
    gp2 = fit_agent_gps(X2, Y2, previous=gp, refit=False)
    torch.testing.assert_close(gp2.covar_module.lengthscale, gp.covar_module.lengthscale)
    torch.testing.assert_close(gp2.likelihood.noise, gp.likelihood.noise)
    assert gp2.train_inputs[0].shape == (3, 11, 2)


def test_bounds_normalize_inputs():
    X, Y = data()
    bounds = torch.tensor([[0.0, 0.0], [10.0, 10.0]], dtype=f64)
    gp = build_agent_gps(10 * X, Y, bounds=bounds)
    assert gp.input_transform is not None
    unit = build_agent_gps(X, Y, bounds=torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64))
    assert getattr(unit, "input_transform", None) is None  # unit cube: nothing to normalize


def test_validation():
    X, Y = data()
    with pytest.raises(ValueError, match="train_X"):
        build_agent_gps(X[0], Y)
    with pytest.raises(ValueError, match="train_Y"):
        build_agent_gps(X, Y[:, :3])
    Yb = Y.clone()
    Yb[1, 1] = float("nan")
    with pytest.raises(ValueError, match="train_Y.*NaN"):
        build_agent_gps(X, Yb)
    with pytest.raises(ValueError, match="bounds"):
        build_agent_gps(X, Y, bounds=torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=f64))
