import math

import pytest
import torch
from scipy import stats

from fbo_torch.utils import keyed_random as kr


def _splitmix64_reference(seed: int, n: int) -> list[int]:
    """The published SplitMix64 generator (Steele et al.), unsigned 64-bit outputs."""
    M = (1 << 64) - 1
    state, out = seed & M, []
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & M
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        out.append(z ^ (z >> 31))
    return out


@pytest.mark.parametrize("seed", [0, 1, 12345, -(2**63), 2**63 - 1])
def test_bits_equal_the_splitmix64_reference(seed):
    # exact integer arithmetic: must hold bit for bit on every CPU capability and on CUDA
    got = kr.random_bits(torch.tensor([seed]), 6)[0]
    ref = [kr._signed(v) for v in _splitmix64_reference(seed, 6)]
    assert got.tolist() == ref
    if seed == 0:  # SplitMix64's first output from seed 0, as published
        assert ref[0] & ((1 << 64) - 1) == 0xE220A8397B1DCDAF


def test_streams_are_batch_independent_and_prefix_stable():
    keys = kr.fold(kr.root_key(7, "test"), torch.arange(5))
    u = kr.uniform(keys, 40)
    assert u.shape == (5, 40)
    for b in range(5):
        assert torch.equal(kr.uniform(keys[b : b + 1], 40)[0], u[b])
    assert torch.equal(kr.uniform(keys, 10), u[:, :10])
    assert torch.equal(kr.uniform(keys, 10, offset=30), u[:, 30:])
    z = kr.normal(keys, 7)
    for b in range(5):
        assert torch.equal(kr.normal(keys[b : b + 1], 7)[0], z[b])


def test_fold_on_tensors_matches_fold_on_ints():
    parent = kr.root_key(3, "omega")
    vals = torch.tensor([0, 1, 2, 10**12, -5])
    t = kr.fold(torch.full((5,), parent, dtype=torch.int64), vals)
    assert t.tolist() == [kr.fold(parent, int(v)) for v in vals]
    assert kr.fold(parent, vals).tolist() == t.tolist()
    assert kr.fold(torch.tensor([parent]), "x").item() == kr.fold(parent, "x")
    # distinct children, distinct from the parent
    assert len(set(t.tolist()) | {parent}) == 6


def test_uniform_and_normal_distributions():
    keys = kr.fold(kr.root_key(0, "dist"), torch.arange(200))
    u = kr.uniform(keys, 500).flatten()  # 100,000 draws
    n = u.numel()
    assert ((u >= 0) & (u < 1)).all()
    # mean and variance within 5 standard errors of 1/2 and 1/12
    assert abs(u.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(u.var().item() - 1 / 12) < 5 * math.sqrt(1 / 180 / n)
    assert stats.kstest(u.numpy(), "uniform").pvalue > 1e-4
    z = kr.normal(keys, 501).flatten()
    assert torch.isfinite(z).all()
    assert abs(z.mean().item()) < 5 / math.sqrt(z.numel())
    assert abs(z.var().item() - 1) < 5 * math.sqrt(2 / z.numel())
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-4
    # neighbouring agents' streams are uncorrelated: |corr| of 200 pairs of 500 draws
    a, b = kr.normal(keys[:-1], 500), kr.normal(keys[1:], 500)
    corr = ((a - a.mean(-1, keepdim=True)) * (b - b.mean(-1, keepdim=True))).mean(-1) / (a.std(-1) * b.std(-1))
    assert corr.abs().max() < 5 / math.sqrt(500)
    g = kr.gumbel(keys, 500).flatten()
    assert stats.kstest(g.numpy(), "gumbel_r").pvalue > 1e-4


def test_draws_are_their_formulas_and_leave_their_inputs_alone():
    # the draws are computed in place (one scratch tensor): the same bits as the textbook
    # expressions on the stream's uniforms, and the caller's tensors are not written
    keys = kr.fold(kr.root_key(5, "formula"), torch.arange(7))
    before = keys.clone()
    u = kr.uniform(keys, 10)
    r, theta = torch.sqrt(-2.0 * torch.log1p(-u[:, :5])), (2.0 * math.pi) * u[:, 5:]
    assert torch.equal(kr.normal(keys, 10), torch.cat([r * torch.cos(theta), r * torch.sin(theta)], -1))
    assert torch.equal(kr.normal(keys, 9), torch.cat([r * torch.cos(theta), r * torch.sin(theta)], -1)[:, :9])
    assert torch.equal(kr.gumbel(keys, 10), -torch.log(-torch.log(u.clamp(min=2.0**-60))))
    bits = kr.random_bits(keys, 3)
    copy = bits.clone()
    mixed = kr.mix64(bits)
    assert torch.equal(bits, copy) and not torch.equal(mixed, bits)
    assert torch.equal(keys, before)


def test_keys_must_be_int64():
    with pytest.raises(TypeError, match="int64"):
        kr.uniform(torch.tensor([1.0]), 3)


@pytest.mark.cuda
def test_uniform_bits_identical_on_cuda():
    keys = kr.fold(kr.root_key(1, "cuda"), torch.arange(64))
    assert torch.equal(kr.uniform(keys.cuda(), 100).cpu(), kr.uniform(keys, 100))
    # normals pass through log/cos: equal to a few ulp
    torch.testing.assert_close(kr.normal(keys.cuda(), 100).cpu(), kr.normal(keys, 100), atol=1e-13, rtol=1e-13)
