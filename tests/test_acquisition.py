import math

import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf

from fbo_torch.acquisition import FederatedThompsonSampling, PiecewiseRFFThompsonSample, RFFThompsonSample
from fbo_torch.features import RandomFourierFeatures
from fbo_torch.federation import AgentMessage, SubRegionPartition

f64 = torch.float64
BOUNDS = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64)


def grid(n=301):
    g = torch.linspace(0, 1, n, dtype=f64)
    return torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)


@pytest.fixture
def rff():
    return RandomFourierFeatures(2, 60, lengthscale=0.2, seed=0)


@pytest.fixture
def gp():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(12, 2, generator=g, dtype=f64)
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    return SingleTaskGP(X, Y).eval()


def test_rff_thompson_sample_finds_grid_maximizer(rff):
    omega = torch.randn(60, generator=torch.Generator().manual_seed(3), dtype=f64)
    acqf = RFFThompsonSample(rff, omega)
    G = grid()
    vals = rff(G) @ omega
    torch.manual_seed(0)
    x, v = optimize_acqf(acqf, BOUNDS, q=1, num_restarts=10, raw_samples=512)
    assert x.shape == (1, 2)
    assert v.item() >= vals.max().item() - 1e-6  # at least as good as the dense grid
    assert torch.allclose(acqf(x.unsqueeze(0)), rff(x) @ omega)
    # the grid's argmax is where the optimizer went
    assert (x - G[vals.argmax()]).norm() < 0.02


def test_rff_thompson_sample_q3_independent_vectors(rff):
    omegas = torch.randn(3, 60, generator=torch.Generator().manual_seed(4), dtype=f64)
    acqf = RFFThompsonSample(rff, omegas)
    torch.manual_seed(0)
    X, v = optimize_acqf(acqf, BOUNDS, q=3, num_restarts=8, raw_samples=512, sequential=False)
    assert X.shape == (3, 2)
    G = grid()
    best = (rff(G) @ omegas.T).max(0).values  # each vector's grid maximum
    got = (rff(X) * omegas).sum(-1)
    assert (got >= best - 1e-6).all()
    with pytest.raises(ValueError, match="q = 2"):
        acqf(torch.rand(1, 2, 2, dtype=f64))


def test_rff_thompson_sample_message_and_errors(rff):
    msg = AgentMessage(torch.randn(60, dtype=f64), agent_id=3, num_observations=10, fingerprint=rff.fingerprint)
    assert msg.num_parameters == 60
    RFFThompsonSample(rff, msg)
    other = RandomFourierFeatures(2, 60, lengthscale=0.2, seed=1)
    with pytest.raises(ValueError, match="different random-feature map"):
        RFFThompsonSample(other, msg)
    with pytest.raises(ValueError, match="M = 60"):
        RFFThompsonSample(rff, torch.randn(59, dtype=f64))
    with pytest.raises(TypeError, match="features"):
        RFFThompsonSample("rff", torch.randn(60, dtype=f64))


def test_fts_shapes_and_bounds_in_optimize_acqf(rff, gp):
    msgs = torch.randn(5, 60, generator=torch.Generator().manual_seed(0), dtype=f64)
    for q in (1, 3):
        acqf = FederatedThompsonSampling(gp, msgs, rff, p_t=0.5, generator=torch.Generator().manual_seed(q), q=q)
        X, _ = optimize_acqf(acqf, BOUNDS, q=q, num_restarts=4, raw_samples=128, sequential=False)
        assert X.shape == (q, 2) and (X >= 0).all() and (X <= 1).all()
        assert len(acqf.sources) == q
    with pytest.raises(AttributeError):
        acqf.source


def test_fts_uses_chosen_message(rff, gp):
    msgs = torch.randn(5, 60, generator=torch.Generator().manual_seed(0), dtype=f64)
    acqf = FederatedThompsonSampling(gp, msgs, rff, p_t=0.0, generator=torch.Generator().manual_seed(0))
    n = acqf.source
    assert isinstance(n, int)
    X = torch.rand(7, 1, 2, dtype=f64)
    torch.testing.assert_close(acqf(X), (rff(X.squeeze(1)) @ msgs[n]))
    own = FederatedThompsonSampling(gp, msgs, rff, p_t=1.0, generator=torch.Generator().manual_seed(0))
    assert own.source == "own"
    # the own branch is a pathwise GP sample: reproducible from the generator
    own2 = FederatedThompsonSampling(gp, msgs, rff, p_t=1.0, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(own(X), own2(X))


def test_fts_source_frequencies(rff, gp):
    # over many constructions: fraction of "own" ~ p_t; agents ~ P_N; stragglers never
    msgs = torch.randn(4, 60, dtype=f64)
    probs = torch.tensor([0.5, 0.0, 0.25, 0.25], dtype=f64)
    gen = torch.Generator().manual_seed(0)
    K, p = 300, 0.4
    sources = [FederatedThompsonSampling(gp, msgs, rff, p_t=p, agent_probs=probs, generator=gen).source for _ in range(K)]
    own = sum(s == "own" for s in sources)
    assert abs(own / K - p) < 4 * math.sqrt(p * (1 - p) / K)
    agents = [s for s in sources if s != "own"]
    assert 1 not in agents
    frac0 = agents.count(0) / len(agents)
    assert abs(frac0 - 0.5) < 4 * math.sqrt(0.25 / len(agents))


def test_fts_validation(rff, gp):
    msgs = torch.randn(3, 60, dtype=f64)
    with pytest.raises(ValueError, match="p_t"):
        FederatedThompsonSampling(gp, msgs, rff, p_t=1.5)
    with pytest.raises(ValueError, match="sum to 1"):
        FederatedThompsonSampling(gp, msgs, rff, p_t=0.5, agent_probs=torch.tensor([0.5, 0.2, 0.2]))
    with pytest.raises(ValueError, match="empty"):
        FederatedThompsonSampling(gp, torch.empty(0, 60, dtype=f64), rff, p_t=0.5)
    with pytest.raises(ValueError, match="empty"):
        FederatedThompsonSampling(gp, [], rff, p_t=0.5)
    bad = [AgentMessage(msgs[0], 0, 5, rff.fingerprint), AgentMessage(msgs[1], 1, 5, "0123456789abcdef")]
    with pytest.raises(ValueError, match="different random-feature map"):
        FederatedThompsonSampling(gp, bad, rff, p_t=0.5)
    ok = [AgentMessage(m, i, 5, rff.fingerprint) for i, m in enumerate(msgs)]
    FederatedThompsonSampling(gp, ok, rff, p_t=0.5)


def test_piecewise_acquisition_uses_region_vectors(rff):
    part = SubRegionPartition(BOUNDS, 4)
    omegas = torch.randn(4, 60, generator=torch.Generator().manual_seed(2), dtype=f64)
    acqf = PiecewiseRFFThompsonSample(rff, omegas, part)
    X = torch.rand(50, 1, 2, dtype=f64)
    region = part.region_of(X.squeeze(1))
    expected = (rff(X.squeeze(1)) * omegas[region]).sum(-1)
    torch.testing.assert_close(acqf(X), expected)
    # maximizing region by region gives the dense-grid maximum of the piecewise function
    best = -math.inf
    for i, rb in enumerate(acqf.region_bounds()):
        torch.manual_seed(0)
        _, v = optimize_acqf(acqf.region_acquisition(i), rb, q=1, num_restarts=6, raw_samples=256)
        best = max(best, v.item())
    G = grid(201)
    dense = (rff(G) * omegas[part.region_of(G)]).sum(-1).max().item()
    assert best >= dense - 1e-6
