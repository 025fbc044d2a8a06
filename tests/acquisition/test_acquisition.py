import math

import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf

from fbo_torch.acquisition import FederatedThompsonSampling, PiecewiseRFFThompsonSample, RFFThompsonSample
from fbo_torch.features import RandomFourierFeatures
from fbo_torch.protocol import AgentMessage, SubRegionPartition
from fbo_torch.protocol.messages import stack_omegas

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
    # q = 3 vectors, optimized jointly: candidate j must climb its own function phi(x)^T omega_j.
    # Started from each vector's grid argmax (machine-independent: a float64 argmax on a fixed grid),
    # so every machine optimizes in the same basins. L-BFGS-B only accepts steps that increase the
    # (separable) sum, so the sum cannot end below the grid values by more than round-off; and each
    # candidate converges to its basin's local maximum, which is >= its grid value, to L-BFGS-B's
    # relative tolerance ftol = factr * eps = 1e7 * 2.2e-16 (BoTorch's default) of the sum's scale.
    omegas = torch.randn(3, 60, generator=torch.Generator().manual_seed(4), dtype=f64)
    acqf = RFFThompsonSample(rff, omegas)
    G = grid()
    vals = rff(G) @ omegas.T  # grid values of each vector
    best, arg = vals.max(0)
    start = G[arg].unsqueeze(0)  # 1 x 3 x 2
    X, v = optimize_acqf(acqf, BOUNDS, q=3, num_restarts=1, batch_initial_conditions=start, sequential=False)
    assert X.shape == (3, 2) and ((X >= 0) & (X <= 1)).all()
    got = (rff(X) * omegas).sum(-1)
    eps = torch.finfo(f64).eps
    scale = best.abs().sum().item()
    assert got.sum().item() >= best.sum().item() - 64 * eps * scale
    assert (got >= best - 1e7 * eps * scale).all(), got - best
    # a mix-up (every candidate using omega_0) would score differently: the three maxima are distinct
    assert torch.cdist(X, X).add(torch.eye(3, dtype=f64)).min() > 0.01
    with pytest.raises(ValueError, match="q = 2"):
        acqf(torch.rand(1, 2, 2, dtype=f64))


def test_rff_thompson_sample_one_omega_refuses_q_above_one(rff):
    # one omega with q > 1 silently returned q identical points
    acqf = RFFThompsonSample(rff, torch.randn(60, dtype=f64))
    with pytest.raises(ValueError, match="one weight vector cannot produce q = 3"):
        optimize_acqf(acqf, BOUNDS, q=3, num_restarts=2, raw_samples=16, sequential=False)
    with pytest.raises(ValueError, match="pending points"):
        optimize_acqf(acqf, BOUNDS, q=3, num_restarts=2, raw_samples=16, sequential=True)
    acqf.set_X_pending(None)  # clearing is fine
    x, _ = optimize_acqf(acqf, BOUNDS, q=1, num_restarts=2, raw_samples=16)
    assert x.shape == (1, 2)


def test_rff_thompson_sample_message_and_errors(rff):
    msg = AgentMessage(torch.randn(60, dtype=f64), agent_id=3, num_observations=10, fingerprint=rff.fingerprint)
    assert msg.num_parameters == 60
    RFFThompsonSample(rff, msg)
    other = RandomFourierFeatures(2, 60, lengthscale=0.2, seed=1)
    with pytest.raises(ValueError, match="different random-feature map"):
        RFFThompsonSample(other, msg)
    # a message over 3 parameters sent to a 2-dimensional map: said as a dimension mismatch, not a fingerprint one
    msg3 = AgentMessage(
        torch.randn(60, dtype=f64),
        agent_id=3,
        num_observations=10,
        fingerprint=RandomFourierFeatures(3, 60, lengthscale=0.2, seed=0).fingerprint,
        input_bounds=torch.tensor([[0.0] * 3, [1.0] * 3], dtype=f64),
    )
    for make in (lambda: RFFThompsonSample(rff, msg3), lambda: stack_omegas([msg, msg3], rff.fingerprint, rff.dim)):
        with pytest.raises(
            ValueError,
            match=r"agents \[3\] are 3-dimensional .* receiver's feature map is "
            r"2-dimensional",
        ):
            make()
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
    # the intended message was swallowed by nn.Module.__getattr__
    with pytest.raises(AttributeError, match="q = 3 candidates: use `sources`"):
        acqf.source
    assert not hasattr(acqf, "source")
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        acqf.nonexistent


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
    sources = [
        FederatedThompsonSampling(gp, msgs, rff, p_t=p, agent_probs=probs, generator=gen).source for _ in range(K)
    ]
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
    with pytest.raises(ValueError, match="empty but p_t = 0.5 < 1"):
        FederatedThompsonSampling(gp, torch.empty(0, 60, dtype=f64), rff, p_t=0.5)
    with pytest.raises(ValueError, match="empty"):
        FederatedThompsonSampling(gp, [], rff, p_t=0.5)
    bad = [AgentMessage(msgs[0], 0, 5, rff.fingerprint), AgentMessage(msgs[1], 1, 5, "0123456789abcdef")]
    with pytest.raises(ValueError, match="different random-feature map"):
        FederatedThompsonSampling(gp, bad, rff, p_t=0.5)
    ok = [AgentMessage(m, i, 5, rff.fingerprint) for i, m in enumerate(msgs)]
    FederatedThompsonSampling(gp, ok, rff, p_t=0.5)


def test_messages_as_tensors_are_checked_against_the_map_they_were_drawn_on(rff, gp):
    """Before: ω drawn on another feature map (another seed) was accepted as a tensor. A tensor carries no
    fingerprint, so the call checks the one it is given (`fingerprint=`), as it checks an AgentMessage's."""
    from fbo_torch import RFFBayesianLinear

    other = RandomFourierFeatures(2, 60, lengthscale=0.2, seed=1)  # same shape, another map
    X = torch.rand(3, 8, 2, dtype=f64, generator=torch.Generator().manual_seed(1))
    omegas = RFFBayesianLinear(other, X, torch.sin(5 * X).sum(-1, keepdim=True), noise_variance=1e-2).sample_weights()
    with pytest.raises(ValueError, match=r"`messages` were drawn on another feature map .* than `features`"):
        FederatedThompsonSampling(gp, omegas, rff, p_t=0.5, fingerprint=other.fingerprint)
    with pytest.raises(ValueError, match=r"`omega` were drawn on another feature map"):
        RFFThompsonSample(rff, omegas[0], fingerprint=other.fingerprint)
    FederatedThompsonSampling(gp, omegas, other, p_t=0.5, fingerprint=other.fingerprint)  # the right map
    RFFThompsonSample(other, omegas[0], fingerprint=other.fingerprint)
    # as AgentMessages the fingerprint travels with each vector and needs no argument
    msgs = [AgentMessage(w, i, 8, other.fingerprint) for i, w in enumerate(omegas)]
    with pytest.raises(ValueError, match="different random-feature map"):
        FederatedThompsonSampling(gp, msgs, rff, p_t=0.5)


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


def test_fts_continues_after_every_message_is_used(rff, gp):
    # a loop with p_t = 1 and no message left could not continue
    for empty in (torch.empty(0, 60, dtype=f64), []):
        acqf = FederatedThompsonSampling(gp, empty, rff, p_t=1.0, q=2, generator=torch.Generator().manual_seed(0))
        assert acqf.sources == ["own", "own"]
        X, _ = optimize_acqf(acqf, BOUNDS, q=2, num_restarts=2, raw_samples=32, sequential=False)
        assert X.shape == (2, 2) and ((X >= 0) & (X <= 1)).all()
    # with p_t = 1 nothing depends on the messages: same GP sample with or without them
    msgs = torch.randn(3, 60, dtype=f64)
    a = FederatedThompsonSampling(gp, msgs, rff, p_t=1.0, generator=torch.Generator().manual_seed(1))
    b = FederatedThompsonSampling(gp, [], rff, p_t=1.0, generator=torch.Generator().manual_seed(1))
    Xt = torch.rand(5, 1, 2, dtype=f64)
    with torch.no_grad():
        torch.testing.assert_close(a(Xt), b(Xt), atol=0, rtol=0)


def test_fts_own_branch_takes_a_botorch_acquisition(rff, gp):
    # p_t = 1: FTS is the own acquisition, so optimize_acqf returns LogEI's maximizer (same seed)
    from botorch.acquisition import LogExpectedImprovement

    best_f = gp.train_targets.max()
    msgs = torch.randn(3, 60, generator=torch.Generator().manual_seed(0), dtype=f64)
    logei = LogExpectedImprovement(gp, best_f=best_f)
    acqf = FederatedThompsonSampling(gp, msgs, rff, p_t=1.0, own_acquisition=logei)
    assert acqf.source == "own" and acqf.paths is None
    Xt = torch.rand(6, 1, 2, generator=torch.Generator().manual_seed(1), dtype=f64)
    with torch.no_grad():
        torch.testing.assert_close(acqf(Xt), logei(Xt), atol=0, rtol=0)
    found = []
    for f in (acqf, LogExpectedImprovement(gp, best_f=best_f)):
        torch.manual_seed(5)
        found.append(optimize_acqf(f, BOUNDS, q=1, num_restarts=4, raw_samples=128))
    torch.testing.assert_close(found[0], found[1], atol=0, rtol=0)
    # the message branch is unchanged by it
    msg = FederatedThompsonSampling(
        gp, msgs, rff, p_t=0.0, own_acquisition=logei, generator=torch.Generator().manual_seed(0)
    )
    torch.testing.assert_close(msg(Xt), rff(Xt.squeeze(1)) @ msgs[msg.source])
    with pytest.raises(ValueError, match="`own_acquisition` is supported with q = 1"):
        FederatedThompsonSampling(gp, msgs, rff, p_t=1.0, q=2, own_acquisition=logei)
    with pytest.raises(ValueError, match="`own_acquisition` must be a BoTorch AcquisitionFunction"):
        FederatedThompsonSampling(gp, msgs, rff, p_t=1.0, own_acquisition=lambda X: X.sum())


def test_fts_with_rff_model_as_target(rff):
    # the own branch needs pathwise sampling of the target model; RFFBayesianLinear had none
    from fbo_torch.models import RFFBayesianLinear

    g = torch.Generator().manual_seed(0)
    X = torch.rand(12, 2, generator=g, dtype=f64)
    target = RFFBayesianLinear(rff, X, torch.sin(5 * X).sum(-1, keepdim=True), 0.01)
    msgs = torch.randn(4, 60, generator=g, dtype=f64)
    acqf = FederatedThompsonSampling(target, msgs, rff, p_t=0.5, q=3, generator=torch.Generator().manual_seed(2))
    X3, _ = optimize_acqf(acqf, BOUNDS, q=3, num_restarts=2, raw_samples=64, sequential=False)
    assert X3.shape == (3, 2) and ((X3 >= 0) & (X3 <= 1)).all()
    own = FederatedThompsonSampling(target, msgs, rff, p_t=1.0, generator=torch.Generator().manual_seed(3))
    # an own-branch value is phi(x)^T omega for one omega drawn from the target's posterior
    Xt = torch.rand(8, 1, 2, dtype=f64)
    omega = own.paths.weight.squeeze(0)
    with torch.no_grad():
        torch.testing.assert_close(own(Xt), rff(Xt.squeeze(1)) @ omega)


def test_partition_region_of_rejects_nan_and_outside_points():
    # NaN mapped to region -2**63 and outside points were clamped silently
    part = SubRegionPartition(torch.tensor([[-1.0, 0.0], [0.1, 2.0]], dtype=f64), 4)
    with pytest.raises(ValueError, match="NaN"):
        part.region_of(torch.tensor([[0.0, float("nan")]], dtype=f64))
    with pytest.raises(ValueError, match="outside the domain"):
        part.region_of(torch.tensor([[-0.5, 1.0], [0.2, 1.0]], dtype=f64))
    outside = torch.tensor([[-1.5, -1.0], [0.2, 3.0]], dtype=f64)
    assert part.region_of(outside, clamp=True).tolist() == [0, 3]  # nearest region
    with pytest.raises(ValueError, match="NaN"):
        part.region_of(torch.tensor([[float("nan"), 1.0]], dtype=f64), clamp=True)
    # rounding past a bound (lo + u * (hi - lo) with u -> 1) is on the bound, not outside
    u = torch.tensor([1 - 2**-53, 1 - 2**-53], dtype=f64)
    x = part.bounds[0] + u * (part.bounds[1] - part.bounds[0])
    past = torch.nextafter(part.bounds[1], torch.full((2,), math.inf, dtype=f64))
    assert part.region_of(torch.stack([x, past])).tolist() == [3, 3]


def test_messages_of_another_precision_or_kind_are_refused_naming_them():
    """Before: float32 messages for a float64 map were used in float32, mixed-dtype message lists were
    promoted silently, and integer messages failed on an argument `X` the caller never passed."""
    rff = RandomFourierFeatures(1, 20, lengthscale=0.2, seed=0)
    X = torch.rand(5, 1, dtype=f64)
    gp = SingleTaskGP(X, X.sin())
    with pytest.raises(TypeError, match="`messages` has dtype torch.float32, the feature map torch.float64"):
        FederatedThompsonSampling(gp, torch.randn(3, 20), rff, p_t=0.0)
    with pytest.raises(TypeError, match="`messages` must be a floating-point tensor, got dtype torch.int64"):
        FederatedThompsonSampling(gp, torch.ones(3, 20, dtype=torch.long), rff, p_t=0.0)
    mixed = [
        AgentMessage(torch.randn(20, dtype=f64), 0, 5, rff.fingerprint),
        AgentMessage(torch.randn(20), 1, 5, rff.fingerprint),
    ]
    with pytest.raises(TypeError, match="different dtypes"):
        FederatedThompsonSampling(gp, mixed, rff, p_t=0.0)
    with pytest.raises(TypeError, match="`omega` must be a floating-point tensor"):
        AgentMessage(torch.ones(20, dtype=torch.long), 0, 5, rff.fingerprint)
