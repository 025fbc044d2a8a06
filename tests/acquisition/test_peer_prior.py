import math

import pytest
import torch
from botorch.acquisition import LogExpectedImprovement
from botorch.acquisition.prior_guided import PriorGuidedAcquisitionFunction

from fbo_torch.acquisition.batched import BatchedLogExpectedImprovement
from fbo_torch.acquisition.peer_prior import BatchedPriorGuided, PeerOptimumPrior, log_bump_mixture
from fbo_torch.features import RandomFourierFeatures
from fbo_torch.models.batched_gp import BatchedExactGP
from fbo_torch.protocol.message_average import MessageAverage

f64 = torch.float64


def _gps(B=3, n=10, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = -1 + 3 * torch.rand(B, n, d, generator=g, dtype=f64)
    Y = torch.sin(2 * X).sum(-1, keepdim=True)
    bounds = torch.tensor([[-1.0] * d, [2.0] * d], dtype=f64)
    return BatchedExactGP(X, Y, bounds).fit(), bounds, Y


def test_log_prior_is_the_floored_bump_mixture():
    bounds = torch.tensor([[0.0, -2.0], [2.0, 2.0]], dtype=f64)
    centers = torch.tensor([[0.5, 0.0], [1.5, 1.0]], dtype=f64)
    prior = PeerOptimumPrior(centers, bounds, weights=torch.tensor([3.0, 1.0], dtype=f64), width=0.2, floor=0.1)
    X = torch.tensor([[[0.5, 0.0]], [[1.0, -1.0]], [[1.5, 1.0]]], dtype=f64)  # 3 x 1 x 2
    U = (X - bounds[0]) / (bounds[1] - bounds[0])
    Uc = (centers - bounds[0]) / (bounds[1] - bounds[0])
    bumps = torch.exp(-((U - Uc) ** 2).sum(-1) / (2 * 0.2**2))  # 3 x 2
    expected = torch.log(0.1 + 0.9 * (bumps * torch.tensor([0.75, 0.25], dtype=f64)).sum(-1, keepdim=True))
    torch.testing.assert_close(prior(X), expected, rtol=1e-13, atol=1e-13)
    assert float(prior(X).max()) <= 0.0 and float(prior(X).min()) >= math.log(0.1) - 1e-15


def test_batched_prior_guided_equals_botorch_per_agent():
    gp, bounds, Y = _gps()
    B, d, K = 3, 2, 4
    g = torch.Generator().manual_seed(1)
    centers = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(B, K, d, generator=g, dtype=f64)
    w = torch.rand(B, K, generator=g, dtype=f64)
    w[1, 2] = 0.0  # a peer without weight
    w = w / w.sum(-1, keepdim=True)
    log_w = torch.where(w > 0, w.log(), -torch.inf)
    exponent = torch.tensor([0.5, 1.0, 2.0], dtype=f64)
    best = Y.squeeze(-1).amax(-1)
    ours = BatchedPriorGuided(
        BatchedLogExpectedImprovement(gp.posterior_moments(), best), centers, log_w, exponent, width=0.15, floor=0.05
    )
    X = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(B, 7, d, generator=g, dtype=f64)
    values = ours(X)
    for b in range(B):
        prior = PeerOptimumPrior(centers[b], bounds, weights=w[b], width=0.15, floor=0.05)
        ref = PriorGuidedAcquisitionFunction(
            LogExpectedImprovement(gp.to_botorch(b), best_f=best[b]), prior, log=True, prior_exponent=float(exponent[b])
        )
        torch.testing.assert_close(values[b], ref(X[b].unsqueeze(-2)).detach(), rtol=1e-9, atol=1e-9)


def test_closed_form_gradient_equals_autograd():
    gp, bounds, Y = _gps(seed=2)
    g = torch.Generator().manual_seed(3)
    centers = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(3, 5, 2, generator=g, dtype=f64)
    log_w = torch.full((3, 5), math.log(0.2), dtype=f64)
    fn = BatchedPriorGuided(
        BatchedLogExpectedImprovement(gp.posterior_moments(), Y.squeeze(-1).amax(-1)),
        centers,
        log_w,
        1.3,
        width=0.1,
        floor=0.02,
    )
    X = (bounds[0] + (bounds[1] - bounds[0]) * torch.rand(3, 6, 2, generator=g, dtype=f64)).requires_grad_(True)
    value, grad = fn.value_and_grad(X.detach())
    (auto,) = torch.autograd.grad(fn(X).sum(), X)
    torch.testing.assert_close(grad, auto, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(value, fn(X).detach(), rtol=0, atol=0)
    sub = fn.take(torch.tensor([2, 0]))
    torch.testing.assert_close(sub(X.detach()[[2, 0]]), value[[2, 0]], rtol=1e-14, atol=1e-14)


def test_the_floor_bounds_what_the_prior_can_cost():
    """The chosen point's acquisition is within exponent · |log λ| of the best (log space)."""
    gp, bounds, Y = _gps(B=4, seed=4)
    g = torch.Generator().manual_seed(5)
    grid = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(4, 2000, 2, generator=g, dtype=f64)
    acq = BatchedLogExpectedImprovement(gp.posterior_moments(), Y.squeeze(-1).amax(-1))
    centers = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(4, 3, 2, generator=g, dtype=f64)  # misleading peers
    for e, lam in [(0.5, 0.05), (2.0, 0.05), (1.0, 0.3)]:
        fn = BatchedPriorGuided(acq, centers, torch.full((4, 3), -math.log(3), dtype=f64), e, width=0.05, floor=lam)
        j = fn(grid).argmax(-1)
        base = acq(grid)
        chosen = base.gather(1, j.unsqueeze(-1)).squeeze(-1)
        assert torch.all(chosen >= base.amax(-1) - e * abs(math.log(lam)) - 1e-12)


def test_no_weighted_peer_leaves_the_acquisition_unchanged():
    gp, bounds, Y = _gps(seed=6)
    acq = BatchedLogExpectedImprovement(gp.posterior_moments(), Y.squeeze(-1).amax(-1))
    centers = torch.zeros(3, 2, 2, dtype=f64)
    fn = BatchedPriorGuided(acq, centers, torch.full((3, 2), -torch.inf, dtype=f64), 2.0, floor=0.1)
    X = torch.rand(3, 5, 2, dtype=f64)
    torch.testing.assert_close(fn(X), acq(X) + 2.0 * math.log(0.1), rtol=1e-14, atol=1e-14)
    _, grad = fn.value_and_grad(X)
    torch.testing.assert_close(grad, acq.value_and_grad(X)[1], rtol=0, atol=0)


def test_from_messages_centers_are_the_message_maximizers():
    rff = RandomFourierFeatures(dim=2, num_features=200, lengthscale=0.3, seed=0)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64)
    # two peers whose functions peak at known points: least-squares fits of -‖x - c‖²
    grid = torch.rand(400, 2, generator=torch.Generator().manual_seed(7), dtype=f64)
    phi = rff(grid)
    c = torch.tensor([[0.2, 0.7], [0.8, 0.3]], dtype=f64)
    targets = -((grid.unsqueeze(0) - c.unsqueeze(1)) ** 2).sum(-1)  # 2 x 400
    omegas = torch.linalg.lstsq(phi.expand(2, -1, -1), targets.unsqueeze(-1), rcond=None).solution.squeeze(-1)
    prior = PeerOptimumPrior.from_messages(rff, omegas, bounds, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(prior.centers, c, rtol=0, atol=0.03)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(width=0.0), "width"),
        (dict(floor=1.0), "floor"),
        (dict(floor=0), "floor"),
        (dict(weights=torch.tensor([1.0, -1.0], dtype=f64)), "weights"),
    ],
)
def test_prior_arguments_are_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        PeerOptimumPrior(torch.zeros(2, 2, dtype=f64), torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64), **kw)


def test_log_bump_mixture_rows_without_peers_are_the_floor():
    lp, g = log_bump_mixture(
        torch.rand(2, 4, 3, dtype=f64),
        torch.zeros(2, 2, 3, dtype=f64),
        torch.full((2, 2), -torch.inf, dtype=f64),
        0.1,
        0.2,
        grad=True,
    )
    torch.testing.assert_close(lp, torch.full((2, 4), math.log(0.2), dtype=f64))
    assert torch.all(g == 0)


def test_message_average_is_a_mean_then_an_exponential_average():
    avg = MessageAverage(memory=3)
    msgs = [torch.full((2, 4), float(v), dtype=f64) for v in (1, 2, 3, 7)]
    assert torch.equal(avg.update(msgs[0]), msgs[0])
    torch.testing.assert_close(avg.update(msgs[1]), torch.full((2, 4), 1.5, dtype=f64))
    torch.testing.assert_close(avg.update(msgs[2]), torch.full((2, 4), 2.0, dtype=f64))
    torch.testing.assert_close(avg.update(msgs[3]), torch.full((2, 4), 2.0 + (7 - 2.0) / 3, dtype=f64))
    state = avg.state_dict()
    again = MessageAverage(memory=1)
    again.load_state_dict(state)
    assert again.memory == 3 and torch.equal(again.mean, avg.mean)
    with pytest.raises(ValueError, match="one message per slot"):
        avg.update(torch.zeros(3, 4, dtype=f64))
    with pytest.raises(ValueError, match="memory"):
        MessageAverage(memory=0)
