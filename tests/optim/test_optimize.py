"""optimize_acqf_batched: as good as per-problem optimize_acqf, with BoTorch's shapes, dtypes and devices."""

import pytest
import torch
from botorch.acquisition import LogExpectedImprovement, PosteriorMean, UpperConfidenceBound
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf

from fbo_torch.models import BatchedExactGP
from fbo_torch.optim import optimize_acqf_batched

f64 = torch.float64
B, D, N = 3, 2, 8


def problems(device="cpu"):
    """``B`` fitted GPs as one batched SingleTaskGP and as ``B`` unbatched ones (same hyperparameters)."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(B, N, D, generator=g, dtype=f64)
    Y = torch.sin(5 * X + 6 * torch.rand(B, 1, D, generator=g, dtype=f64)).sum(-1, keepdim=True)
    bounds = torch.tensor([[0.0] * D, [1.0] * D], dtype=f64)
    gp = BatchedExactGP(X, Y, bounds).fit()
    batched = gp.to_botorch().to(device)
    return batched, [gp.to_botorch(b) for b in range(B)], Y.to(device), bounds.to(device)


ACQFS = {
    "UpperConfidenceBound": lambda m, best: UpperConfidenceBound(m, beta=2.0),
    "LogExpectedImprovement": lambda m, best: LogExpectedImprovement(m, best_f=best),
    "PosteriorMean": lambda m, best: PosteriorMean(m),
}


@pytest.fixture(scope="module")
def setup():
    return problems()


@pytest.mark.parametrize("name", list(ACQFS))
def test_values_at_least_those_of_per_problem_optimize_acqf(setup, name):
    batched, singles, Y, bounds = setup
    make = ACQFS[name]
    X, values = optimize_acqf_batched(
        make(batched, Y.amax((-2, -1))), bounds, num_restarts=4, raw_samples=128, options={"seed": 0}
    )
    assert X.shape == (B, 1, D) and values.shape == (B,)
    for b, model in enumerate(singles):
        acqf = make(model, Y[b].max())
        torch.manual_seed(b)
        _, ref = optimize_acqf(acqf, bounds, q=1, num_restarts=4, raw_samples=128)
        with torch.no_grad():
            here = acqf(X[b : b + 1])
        assert torch.allclose(here, values[b : b + 1], atol=1e-9, rtol=1e-9)  # problem b's acquisition at X[b]
        assert here.item() >= ref.item() - 1e-6 * max(1.0, abs(ref.item())), (b, here.item(), ref.item())


def test_shapes_bounds_and_best_f_shapes(setup):
    batched, _, Y, bounds = setup
    best_column = Y.amax(-2)  # B x 1: BoTorch's own shape for per-problem incumbents
    best_flat = Y.amax((-2, -1))  # B: read as B x 1 during the call
    acq_c = LogExpectedImprovement(batched, best_f=best_column)
    acq_f = LogExpectedImprovement(batched, best_f=best_flat)
    Xc, vc = optimize_acqf_batched(acq_c, bounds, num_restarts=2, raw_samples=32, options={"seed": 1, "maxiter": 20})
    Xf, vf = optimize_acqf_batched(acq_f, bounds, num_restarts=2, raw_samples=32, options={"seed": 1, "maxiter": 20})
    assert torch.equal(Xc, Xf) and torch.equal(vc, vf)
    assert acq_f.best_f.shape == (B,)  # left as it was
    assert Xc.dtype == f64 and vc.dtype == f64 and Xc.device == bounds.device
    # per-problem boxes
    boxes = torch.stack([torch.tensor([[0.1 * b, 0.0], [0.1 * b + 0.2, 0.3]], dtype=f64) for b in range(B)])
    X, v = optimize_acqf_batched(
        UpperConfidenceBound(batched, beta=1.0), boxes, num_restarts=2, raw_samples=32, options={"seed": 2}
    )
    assert ((X[:, 0] >= boxes[:, 0]) & (X[:, 0] <= boxes[:, 1])).all()
    # float32 bounds follow the model (float64), and seeds reproduce
    X2, v2 = optimize_acqf_batched(
        UpperConfidenceBound(batched, beta=1.0), boxes.float(), num_restarts=2, raw_samples=32, options={"seed": 2}
    )
    assert X2.dtype == f64 and torch.allclose(X2, X, atol=1e-6)


def test_argument_errors(setup):
    batched, singles, Y, bounds = setup
    ucb = UpperConfidenceBound(batched, beta=2.0)
    with pytest.raises(ValueError, match="q = 1"):
        optimize_acqf_batched(ucb, bounds, q=2)
    with pytest.raises(ValueError, match="batch_shape \\(\\)"):
        optimize_acqf_batched(UpperConfidenceBound(singles[0], beta=2.0), bounds)
    X = torch.rand(2, 3, 5, D, dtype=f64)
    two_dims = SingleTaskGP(X, X.sum(-1, keepdim=True))
    with pytest.raises(ValueError, match="one batch dimension"):
        optimize_acqf_batched(UpperConfidenceBound(two_dims, beta=2.0), bounds)
    with pytest.raises(ValueError, match="unknown keys \\['batch_limit'\\]"):
        optimize_acqf_batched(ucb, bounds, options={"batch_limit": 4})
    with pytest.raises(ValueError, match="`num_problems` = 4"):
        optimize_acqf_batched(ucb, bounds, num_problems=4)
    with pytest.raises(TypeError, match="AcquisitionFunction"):
        optimize_acqf_batched(lambda X: X.sum(-1), bounds)


@pytest.mark.cuda
def test_runs_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    batched, _, Y, bounds = problems("cuda")
    X, v = optimize_acqf_batched(
        UpperConfidenceBound(batched, beta=2.0), bounds.cpu(), num_restarts=2, raw_samples=32, options={"seed": 0}
    )
    assert X.device.type == "cuda" and v.device.type == "cuda" and X.shape == (B, 1, D)
