import pytest
import torch
from botorch.optim import optimize_acqf

from fbo_torch.acquisition import RFFThompsonSample
from fbo_torch.features import RandomFourierFeatures
from fbo_torch.optim import maximize_batched, maximize_discrete, score_chunked
from fbo_torch.runners.common import Domain, maximize_rff_samples

f64 = torch.float64
BOUNDS = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64)


@pytest.fixture(scope="module")
def problem():
    rff = RandomFourierFeatures(2, 60, lengthscale=0.15, seed=4)
    omegas = torch.randn(6, 60, generator=torch.Generator().manual_seed(0), dtype=f64)

    def fn(X):
        return (rff(X) * omegas.unsqueeze(-2)).sum(-1)

    return rff, omegas, fn


def test_chunked_scoring_equals_unchunked(problem):
    _, _, fn = problem
    X = torch.rand(6, 1000, 2, dtype=f64)
    full = fn(X)
    for cap in (6, 60, 600, 10**6):
        # equal up to round-off (matmul blocking differs with the chunk shape)
        torch.testing.assert_close(score_chunked(fn, X, max_points=cap), full, atol=1e-13, rtol=1e-12)


def test_discrete_maximization_is_exact(problem):
    _, _, fn = problem
    C = torch.rand(500, 2, dtype=f64)
    X, v = maximize_discrete(fn, C, 6, max_points=100)
    vals = fn(C.expand(6, -1, -1))
    torch.testing.assert_close(v, vals.max(-1).values)
    torch.testing.assert_close(X, C[vals.argmax(-1)])


@pytest.mark.parametrize("refine", ["adam", "lbfgsb"])
def test_batched_maximizer_matches_optimize_acqf(problem, refine):
    # each of the 6 problems solved at once reaches what optimize_acqf reaches one by one
    rff, omegas, fn = problem
    X, v = maximize_batched(fn, BOUNDS, 6, raw_samples=2048, num_restarts=6, refine=refine, maxiter=200,
                            generator=torch.Generator().manual_seed(1))
    assert X.shape == (6, 2) and ((X >= 0) & (X <= 1)).all()
    torch.testing.assert_close(v, fn(X.unsqueeze(1)).squeeze(1))
    for b in range(6):
        torch.manual_seed(b)
        _, ref = optimize_acqf(RFFThompsonSample(rff, omegas[b]), BOUNDS, q=1, num_restarts=10, raw_samples=1024)
        assert v[b] >= ref - 1e-6 * ref.abs().clamp_min(1)


def test_per_problem_boxes(problem):
    _, _, fn = problem
    boxes = torch.tensor([[[0.0, 0.0], [0.5, 0.5]], [[0.5, 0.0], [1.0, 0.5]]], dtype=f64).repeat(3, 1, 1)
    X, _ = maximize_batched(fn, boxes, raw_samples=256, num_restarts=2, maxiter=20)
    assert ((X >= boxes[:, 0]) & (X <= boxes[:, 1])).all()


def test_rff_domain_maximizer_uses_dense_search(problem):
    rff, omegas, fn = problem
    dom = Domain(BOUNDS)
    X, v = maximize_rff_samples(rff, omegas, dom, generator=torch.Generator().manual_seed(0))
    g = torch.linspace(0, 1, 201, dtype=f64)
    G = torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    dense = fn(G.expand(6, -1, -1)).max(-1).values
    assert (v >= dense - 1e-9).all()


def test_validation():
    with pytest.raises(ValueError, match="batch_size"):
        maximize_batched(lambda X: X.sum(-1), BOUNDS)
    with pytest.raises(ValueError, match="upper bound"):
        maximize_batched(lambda X: X.sum(-1), BOUNDS.flip(0), 2)
    with pytest.raises(ValueError, match="refine"):
        maximize_batched(lambda X: X.sum(-1), BOUNDS, 2, refine="newton")
