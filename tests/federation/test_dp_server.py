import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fbo_torch.federation import DPAggregator, clip_vectors
from fbo_torch.protocol import ExplorationWeights, SubRegionPartition, default_splits, exploration_weights

f64 = torch.float64


# ----------------------------------------------------------------- clipping
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 30),
    m=st.integers(1, 40),
    S=st.floats(0.01, 100.0),
    P=st.integers(1, 8),
    scale=st.floats(1e-3, 1e3),
)
def test_clipping_bounds_norm_and_keeps_small_vectors(seed, n, m, S, P, scale):
    g = torch.Generator().manual_seed(seed)
    w = scale * torch.randn(n, m, generator=g, dtype=f64)
    bound = S / math.sqrt(P)
    out, was = clip_vectors(w, bound)
    norms = w.norm(dim=-1)
    assert (out.norm(dim=-1) <= bound * (1 + 1e-12)).all()
    assert torch.equal(out[~was], w[~was])  # unclipped vectors unchanged
    assert torch.equal(was, norms > bound)
    # clipped vectors keep their direction
    if was.any():
        cos = (out[was] * w[was]).sum(-1) / (out[was].norm(dim=-1) * norms[was])
        torch.testing.assert_close(cos, torch.ones_like(cos))


# ----------------------------------------------------------------- weights
def test_weight_schedule_synthetic_values():
    membership = SubRegionPartition(torch.tensor([[0.0], [1.0]], dtype=f64), 2).membership(torch.arange(6) % 2)
    w = ExplorationWeights(membership, a=16, b=1, const_rounds=5, decay_rounds=5)
    assert [w.a_at(t) for t in range(0, 12)] == pytest.approx([16] * 6 + [16, 12.25, 8.5, 4.75, 1, 1])
    for t in range(12):
        W = w(t)
        torch.testing.assert_close(W.sum(-1), torch.ones(2, dtype=f64))
        ratio = W[0, 0] / W[0, 1]  # assigned / not assigned
        assert ratio.item() == pytest.approx(math.exp(w.a_at(t) - 1))
    assert torch.allclose(w(11), torch.full((2, 6), 1 / 6, dtype=f64))
    real = ExplorationWeights(membership, const_rounds=10, decay_rounds=30)
    assert real.a_at(10) == 16 and real.a_at(40) == 1 and real.a_at(25) == pytest.approx(16 - 15 * 14 / 29)
    fixed = ExplorationWeights(membership, mode="fixed")
    assert fixed.a_at(100) == 16
    uniform = ExplorationWeights(membership, mode="uniform")
    assert torch.allclose(uniform(0), torch.full((2, 6), 1 / 6, dtype=f64))


@settings(max_examples=40, deadline=None)
@given(P=st.integers(1, 6), N=st.integers(1, 40), a=st.floats(1.0, 20.0))
def test_weights_rows_sum_to_one(P, N, a):
    membership = torch.arange(P).unsqueeze(-1) == (torch.arange(N) % P).unsqueeze(0)
    W = exploration_weights(membership, a, 1.0)
    torch.testing.assert_close(W.sum(-1), torch.ones(P, dtype=f64))
    assert (W > 0).all()


def test_weight_validation():
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="a"):
        ExplorationWeights(m, a=0.5, b=1.0)
    with pytest.raises(ValueError, match="mode"):
        ExplorationWeights(m, mode="x")
    with pytest.raises(ValueError, match="membership"):
        exploration_weights(torch.ones(2, 3), 2.0)


# ----------------------------------------------------------------- partition
@settings(max_examples=50, deadline=None)
@given(d=st.integers(1, 4), P=st.sampled_from([1, 2, 3, 4, 6, 8, 9]), seed=st.integers(0, 1000))
def test_partition_covers_disjoint_equal_volume(d, P, seed):
    lo = torch.linspace(-1, 0, d, dtype=f64)
    bounds = torch.stack([lo, lo + torch.linspace(1, 3, d, dtype=f64)])
    part = SubRegionPartition(bounds, P)
    rb = part.region_bounds()
    vol = (rb[:, 1] - rb[:, 0]).prod(-1)
    torch.testing.assert_close(vol, torch.full((P,), float((bounds[1] - bounds[0]).prod()) / P, dtype=f64))
    g = torch.Generator().manual_seed(seed)
    X = bounds[0] + torch.rand(500, d, generator=g, dtype=f64) * (bounds[1] - bounds[0])
    X = torch.cat([X, bounds, rb[:, 0], rb[:, 1]])  # corners and region corners too
    reg = part.region_of(X)
    assert ((reg >= 0) & (reg < P)).all()
    # each point lies in the closed box of its region; region boxes overlap only on borders
    inside = (X >= rb[reg, 0] - 1e-12) & (X <= rb[reg, 1] + 1e-12)
    assert inside.all()
    interior = X[:500]
    inside_count = ((interior.unsqueeze(1) > rb[:, 0]) & (interior.unsqueeze(1) < rb[:, 1])).all(-1).sum(-1)
    assert (inside_count == 1).all()  # disjoint: every interior point strictly inside one region
    # sampling inside an agent's region lands in that region
    regions = part.assign_agents(2 * P + 1)
    pts = part.sample(regions, 7, generator=g)
    assert (part.region_of(pts) == regions.unsqueeze(-1)).all()


def test_partition_thesis_layout():
    part = SubRegionPartition(torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64), 4)
    assert part.splits == (2, 2)
    pts = torch.tensor([[0.2, 0.2], [0.2, 0.7], [0.7, 0.2], [0.7, 0.7], [0.5, 0.5], [1.0, 1.0]], dtype=f64)
    assert part.region_of(pts).tolist() == [0, 1, 2, 3, 3, 3]
    assert (
        default_splits(4, 3) == (2, 2, 1) and default_splits(3, 1) == (3,) and default_splits(2, 5) == (2, 1, 1, 1, 1)
    )
    assert part.assign_agents(6).tolist() == [0, 1, 2, 3, 0, 1]
    with pytest.raises(ValueError, match="num_regions"):
        SubRegionPartition(torch.tensor([[0.0], [1.0]], dtype=f64), 0)
    with pytest.raises(ValueError, match="splits"):
        SubRegionPartition(torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64), 4, splits=(2, 3))


# ----------------------------------------------------------------- server
def uniform_weights(P, N):
    return torch.full((P, N), 1.0 / N, dtype=f64)


def test_sampled_fraction_matches_q():
    N, q = 2000, 0.3
    server = DPAggregator(q, 1.0, 0.0, uniform_weights(1, N))
    gen = torch.Generator().manual_seed(0)
    fracs = []
    for t in range(10):
        server.aggregate(torch.randn(N, 5, dtype=f64), round=t, generator=gen)
        fracs.append(server.history[-1].num_sampled.item() / N)
    mean = sum(fracs) / len(fracs)
    assert abs(mean - q) < 4 * math.sqrt(q * (1 - q) / (N * len(fracs)))


@pytest.mark.parametrize("P,q,z,S", [(1, 0.25, 1.0, 11.0), (4, 0.35, 1.6, 22.0), (2, 1.0, 0.5, 3.0)])
def test_noise_std_with_zero_vectors(P, q, z, S):
    N, M = 50, 200
    membership = torch.arange(P).unsqueeze(-1) == (torch.arange(N) % P).unsqueeze(0)
    W = exploration_weights(membership, 16.0, 1.0)
    server = DPAggregator(q, S, z, W)
    out = server.aggregate(torch.zeros(20, N, M, dtype=f64), generator=torch.Generator().manual_seed(1))
    expected = z * W.max().item() * S / q
    assert server.noise_std(W) == pytest.approx(expected)
    n = out.numel()
    emp = out.std().item()
    # the sample std of n iid normals has relative standard error ~ 1/sqrt(2n)
    assert abs(emp / expected - 1) < 4 / math.sqrt(2 * n)
    assert abs(out.mean().item()) < 4 * expected / math.sqrt(n)


def test_exact_weighted_average_without_noise_or_subsampling():
    P, N, M, S = 3, 7, 5, 2.0
    g = torch.Generator().manual_seed(2)
    W = torch.softmax(torch.randn(P, N, generator=g, dtype=f64), -1)
    omegas = 3 * torch.randn(N, M, generator=g, dtype=f64)
    server = DPAggregator(1.0, S, 0.0, W)
    out = server.aggregate(omegas, generator=g)
    clipped, was = clip_vectors(omegas, S / math.sqrt(P))
    torch.testing.assert_close(out, W @ clipped, atol=1e-14, rtol=0)
    rec = server.history[-1]
    assert rec.num_sampled.item() == N and rec.fraction_clipped.item() == pytest.approx(was.double().mean().item())
    # no clipping at all with S = inf
    server_inf = DPAggregator(1.0, math.inf, 0.0, W)
    torch.testing.assert_close(server_inf.aggregate(omegas), W @ omegas)


def test_batched_federations_and_schedule():
    P, N, M = 2, 6, 4
    membership = torch.arange(P).unsqueeze(-1) == (torch.arange(N) % P).unsqueeze(0)
    sched = ExplorationWeights(membership, const_rounds=1, decay_rounds=2)
    server = DPAggregator(1.0, 100.0, 0.0, sched)
    omegas = torch.randn(3, N, M, dtype=f64)
    out = server.aggregate(omegas, round=5)
    assert out.shape == (3, P, M)
    torch.testing.assert_close(out, sched(5) @ omegas)
    assert server.history[-1].sampled.shape == (3, N)


def test_empty_sample_releases_only_noise():
    server = DPAggregator(1e-9, 1.0, 1.0, uniform_weights(1, 4))
    out = server.aggregate(100 * torch.ones(4, 3, dtype=f64), generator=torch.Generator().manual_seed(0))
    assert server.history[-1].num_sampled.item() == 0
    assert out.abs().max() < 1.0 / 1e-9 * 10  # noise scale z*max(w)*S/q, no data term
    assert server.history[-1].fraction_clipped.item() == 0.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sample_rate=0.0), "sample_rate"),
        (dict(sample_rate=1.5), "sample_rate"),
        (dict(noise_multiplier=-1.0), "noise_multiplier"),
        (dict(clip_norm=0.0), "clip_norm"),
        (dict(clip_norm=-2.0), "clip_norm"),
        (dict(clip_norm=math.inf), "clip_norm"),
        (dict(region_weights=torch.full((2, 3), 0.2, dtype=f64)), "sum to 1"),
        (dict(region_weights=torch.empty(0, 3, dtype=f64)), "P >= 1"),
        (dict(region_weights=torch.full((3,), 1 / 3, dtype=f64)), "P x N"),
    ],
)
def test_server_validation(kwargs, match):
    args = dict(sample_rate=0.5, clip_norm=1.0, noise_multiplier=1.0, region_weights=uniform_weights(2, 3))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        DPAggregator(**args).aggregate(torch.randn(3, 4, dtype=f64))


def test_server_rejects_wrong_agent_count_and_drops_non_finite_vectors():
    server = DPAggregator(0.5, 1.0, 1.0, uniform_weights(2, 3))
    with pytest.raises(ValueError, match="3 columns but 4 agents"):
        server.aggregate(torch.randn(4, 5, dtype=f64))
    bad = torch.randn(3, 5, dtype=f64)
    bad[0, 0] = float("nan")
    out = server.aggregate(bad, generator=torch.Generator().manual_seed(0))
    rec = server.history[-1]
    assert torch.isfinite(out).all()
    assert rec.valid.tolist() == [False, True, True] and int(rec.num_invalid) == 1 and not rec.sampled[0]
