"""The engine's exact GP (BatchedExactGP) exported to BoTorch: BatchedExactGP.to_botorch."""

import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.sampling.pathwise import draw_matheron_paths

from fbo_torch.models import BatchedExactGP

f64 = torch.float64


def _data(B=4, n=10, d=2, seed=0, lo=-1.0, hi=3.0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    X = lo + (hi - lo) * torch.rand(B, n, d, generator=g, dtype=f64)
    Y = scale * torch.sin(2 * X).sum(-1, keepdim=True) + 0.05 * torch.randn(B, n, 1, generator=g, dtype=f64)
    return X, Y, torch.tensor([[lo] * d, [hi] * d], dtype=f64)


def _engine_posterior(gp: BatchedExactGP, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior mean and variance of every agent at ``B x q x d`` points, in outcome units, from the
    engine's own tensors (its Cholesky factor of K + σ²I and hyperparameters): the reference."""
    hp = gp.hyperparameters
    lo, hi = gp.bounds
    Xt = (X - lo) / (hi - lo)
    ls = hp["lengthscale"].unsqueeze(-2)
    d2 = ((Xt.unsqueeze(-2) - gp.X.unsqueeze(-3)) / ls.unsqueeze(-2)).square().sum(-1)  # B x q x n
    os_ = hp["outputscale"].view(-1, 1, 1)
    k = os_ * torch.exp(-0.5 * d2) * gp.mask.unsqueeze(-2)
    L = gp.cholesky
    resid = torch.where(gp.mask, gp.y - hp["mean"].unsqueeze(-1), 0.0).unsqueeze(-1)
    alpha = torch.cholesky_solve(resid, L)
    mean = hp["mean"].unsqueeze(-1) + (k @ alpha).squeeze(-1)
    v = torch.linalg.solve_triangular(L, k.mT, upper=False)
    var = os_.squeeze(-1) - v.square().sum(-2)
    std = gp.y_std.unsqueeze(-1)
    return gp.y_mean.unsqueeze(-1) + std * mean, std * std * var


@pytest.mark.parametrize("spec", ["botorch", "rbf", "authors"])
def test_batched_export_has_the_engines_posterior(spec):
    X, Y, bounds = _data(scale=50.0)
    gp = BatchedExactGP(X, Y, bounds, spec=spec).fit(maxiter=30)
    model = gp.to_botorch()
    assert isinstance(model, SingleTaskGP) and model.batch_shape == torch.Size([4])
    Xs = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(
        4, 7, 2, generator=torch.Generator().manual_seed(1), dtype=f64
    )
    with torch.no_grad():
        post = model.posterior(Xs)
    mean, var = _engine_posterior(gp, Xs)
    torch.testing.assert_close(post.mean.squeeze(-1), mean, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(post.variance.squeeze(-1), var, rtol=1e-9, atol=1e-9)


def test_one_agent_export_drops_masked_observations():
    X, Y, bounds = _data(seed=3)
    mask = torch.ones(4, 10, dtype=torch.bool)
    mask[1, [2, 5, 7]] = False
    Y = torch.where(mask.unsqueeze(-1), Y, torch.nan)
    gp = BatchedExactGP(X, Y, bounds, mask=mask).fit(maxiter=30)
    with pytest.raises(ValueError, match="masked"):
        gp.to_botorch()
    Xs = torch.rand(4, 5, 2, generator=torch.Generator().manual_seed(2), dtype=f64) * 4 - 1
    mean, var = _engine_posterior(gp, Xs)
    for i in range(4):
        model = gp.to_botorch(index=i)
        assert model.batch_shape == torch.Size([]) and model.train_inputs[0].shape[-2] == int(mask[i].sum())
        with torch.no_grad():
            post = model.posterior(Xs[i])
        torch.testing.assert_close(post.mean.squeeze(-1), mean[i], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(post.variance.squeeze(-1), var[i], rtol=1e-9, atol=1e-9)


def test_export_works_with_botorch_pathwise_sampling():
    # what users of the export do: BoTorch's own Thompson paths of every agent's GP
    X, Y, bounds = _data(B=2, n=12)
    model = BatchedExactGP(X, Y, bounds).fit(maxiter=30).to_botorch()
    torch.manual_seed(0)
    with torch.no_grad():
        paths = draw_matheron_paths(model, sample_shape=torch.Size([3]))
        vals = paths(torch.rand(2, 6, 2, dtype=f64) * 4 - 1)
    assert vals.shape == (3, 2, 6) and vals.dtype == f64 and bool(torch.isfinite(vals).all())
