"""Batched LogEI / UCB over many agents' GPs: BoTorch's values per agent, closed-form gradients, maximizable."""

import pytest
import torch
from botorch.acquisition import LogExpectedImprovement, UpperConfidenceBound

from fbo_torch.acquisition.batched import BatchedLogExpectedImprovement, BatchedUpperConfidenceBound, log_h
from fbo_torch.models.batched_gp import BatchedExactGP
from fbo_torch.optim.batched import maximize_batched
from fbo_torch.utils import keyed_random as kr

f64 = torch.float64


def _gp(B=4, n=10, d=2, seed=0):
    """B fitted GPs on 2-D data in [-1, 2]²; agent 1 has two failed (masked) evaluations."""
    g = torch.Generator().manual_seed(seed)
    X = -1 + 3 * torch.rand(B, n, d, generator=g, dtype=f64)
    Y = torch.sin(2 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(B, n, 1, generator=g, dtype=f64)
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[1, [0, 5]] = False
    Y[1, [0, 5]] = float("nan")
    bounds = torch.tensor([[-1.0] * d, [2.0] * d], dtype=f64)
    gp = BatchedExactGP(X, Y, bounds, mask=mask).fit(maxiter=30)
    best = torch.where(mask, Y.squeeze(-1), -torch.inf).amax(-1)
    return gp, X, bounds, best


def _points(X, bounds, C=40, seed=1):
    g = torch.Generator().manual_seed(seed)
    Xt = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(X.shape[0], C, X.shape[-1], generator=g, dtype=f64)
    Xt[:, 0] = X[:, 2]  # at an observation: σ near the noise level, u very negative
    Xt[:, 1] = bounds[0]  # a far corner: σ near the prior's
    return Xt


def test_values_equal_botorch_per_agent():
    gp, X, bounds, best = _gp()
    Xt = _points(X, bounds)
    post = gp.posterior_moments()
    logei = BatchedLogExpectedImprovement(post, best)(Xt)
    ucb = BatchedUpperConfidenceBound(post, 0.7)(Xt)
    assert logei.shape == ucb.shape == (4, 40) and logei.dtype == f64
    assert logei.min() < -50  # the test reaches LogEI's far tail (at the observed points)
    for b in range(4):
        model = gp.to_botorch(b)
        with torch.no_grad():
            ref_ei = LogExpectedImprovement(model, best_f=best[b])(Xt[b].unsqueeze(-2))
            # a Python float β becomes a float32 buffer in BoTorch (0.7 -> 0.69999998): pass float64
            ref_ucb = UpperConfidenceBound(model, beta=torch.tensor(0.7, dtype=f64))(Xt[b].unsqueeze(-2))
        # the moments agree to ~1e-14 (test_batched_gp); log h(u) amplifies the mean's error by
        # |∂ log h/∂u| / σ ≈ |u| / σ, ~1e3 in the tail reached here: relative 1e-12 is round-off
        torch.testing.assert_close(logei[b], ref_ei, atol=1e-10, rtol=1e-12)
        torch.testing.assert_close(ucb[b], ref_ucb, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("kind", ["logei", "ucb"])
def test_closed_form_gradient_equals_autograd(kind):
    gp, X, bounds, best = _gp(seed=2)
    post = gp.posterior_moments()
    acq = BatchedLogExpectedImprovement(post, best) if kind == "logei" else BatchedUpperConfidenceBound(post, 2.0)
    Xq = _points(X, bounds, C=30, seed=3)[:, 1:]  # off the observed inputs (see test_batched_gp)
    value, grad = acq.value_and_grad(Xq)
    Xg = Xq.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(acq(Xg).sum(), Xg)
    torch.testing.assert_close(value, acq(Xq), atol=0, rtol=0)
    # the LogEI tail has gradients ~1e3 (|u|/σ): relative agreement to 1e-9
    torch.testing.assert_close(grad, ref, atol=1e-9, rtol=1e-9)


def test_maximize_batched_reaches_the_grid_maximum_and_one_agent_alone_the_same():
    gp, X, bounds, best = _gp(B=3, n=8, seed=4)
    acq = BatchedLogExpectedImprovement(gp.posterior_moments(), best)
    keys = kr.fold(kr.root_key(0, "logei"), torch.arange(3))
    Xb, vb = maximize_batched(acq, bounds, 3, raw_samples=256, num_restarts=8, maxiter=60, keys=keys)
    assert Xb.shape == (3, 2) and ((Xb >= bounds[0]) & (Xb <= bounds[1])).all()
    torch.testing.assert_close(vb, acq(Xb.unsqueeze(1)).squeeze(1), atol=1e-12, rtol=1e-12)
    g = torch.linspace(0, 1, 151, dtype=f64)
    G = bounds[0] + (bounds[1] - bounds[0]) * torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    grid = acq(G.expand(3, -1, -1)).max(-1).values
    assert (vb >= grid - 1e-6).all(), (vb, grid)
    # one agent alone (take) finds the same point with its key: rows never mix
    X1, v1 = maximize_batched(
        acq.take(torch.tensor([2])), bounds, 1, raw_samples=256, num_restarts=8, maxiter=60, keys=keys[2:]
    )
    torch.testing.assert_close(X1[0], Xb[2], atol=1e-9, rtol=0)


def test_graph_state_round_trip_and_bad_arguments():
    gp, X, bounds, best = _gp(B=2, n=6, seed=5)
    post = gp.posterior_moments()
    Xt = _points(X, bounds, C=5)
    for acq in (BatchedLogExpectedImprovement(post, best), BatchedUpperConfidenceBound(post, torch.tensor([1.0, 4.0]))):
        again = type(acq).from_graph_state(*acq.graph_state())
        torch.testing.assert_close(again(Xt), acq(Xt), atol=0, rtol=0)
        torch.testing.assert_close(acq.lengthscales(), post.lengthscales())
    # UCB's β enters as √β σ: β = 0 is the posterior mean
    torch.testing.assert_close(BatchedUpperConfidenceBound(post, 0.0)(Xt), post(Xt)[0], atol=0, rtol=0)
    with pytest.raises(ValueError, match="`best_f` must be a number or a tensor of 2 values"):
        BatchedLogExpectedImprovement(post, torch.zeros(3, dtype=f64))
    with pytest.raises(ValueError, match="`beta` must be a number >= 0"):
        BatchedUpperConfidenceBound(post, -1.0)
    with pytest.raises(ValueError, match="`posterior` must be a BatchedGPPosterior"):
        BatchedLogExpectedImprovement(gp, best)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_log_h_is_botorch_log_ei_core_across_its_range(dtype):
    """log h(u) equals the helper BoTorch's LogExpectedImprovement evaluates (LogEI = log h(u) + log sigma)
    from u = +30 down to -1e8, and its gradient is finite everywhere."""
    from botorch.acquisition import analytic

    u = torch.cat([-torch.logspace(-3, 8, 200, dtype=dtype), torch.linspace(-3, 30, 200, dtype=dtype)])
    u.requires_grad_(True)
    ours = log_h(u)
    expected = analytic._log_ei_helper(u.detach())  # the reference only: the package imports no private name
    # the same operations on the same primitives in the same order: the same numbers
    torch.testing.assert_close(ours.detach(), expected, rtol=0, atol=0)
    (grad,) = torch.autograd.grad(ours.sum(), u)
    assert bool(torch.isfinite(grad).all())
    with pytest.raises(TypeError, match="`u` must be float32 or float64"):
        log_h(torch.zeros(2, dtype=torch.float16))
