"""CUDA-graph replay of the engine's heavy phases: never different from eager, eager on a CPU."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.models.batched_gp import BatchedExactGP
from fbo_torch.optim import batched as ob
from fbo_torch.optim.batched import maximize_batched
from fbo_torch.sampling.rff_paths import RFFSamplePaths
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.cuda_graphs import GRAPH_REGION, GraphCache

f64 = torch.float64


def test_graph_cache_runs_eagerly_on_cpu_and_marks_the_region():
    cache = GraphCache("test")
    x = torch.arange(4.0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (y,) = cache(lambda t: (t * 2,), (x,), key="double")
    assert torch.equal(y, x * 2)
    assert any(e.name == f"{GRAPH_REGION}test::1" for e in prof.events())
    assert not cache._graphs  # nothing captured on a CPU


@pytest.mark.cuda
def test_graph_replay_equals_eager_and_follows_new_inputs():
    cache = GraphCache("test")

    def fn(a, b):
        return (torch.sin(a) @ b + 1.0,)

    a, b = torch.rand(5, 3, device="cuda", dtype=f64), torch.rand(3, 2, device="cuda", dtype=f64)
    (first,) = cache(fn, (a, b), key="k")
    assert len(cache._graphs) == 1
    a2 = torch.rand(5, 3, device="cuda", dtype=f64)
    (second,) = cache(fn, (a2, b), key="k")  # a replay with the new input copied in
    torch.testing.assert_close(second, fn(a2, b)[0], atol=0, rtol=0)
    torch.testing.assert_close(first, fn(a, b)[0], atol=0, rtol=0)


@pytest.mark.cuda
def test_graphed_maximizer_and_fit_equal_the_eager_ones(monkeypatch):
    rff = RandomFourierFeatures(2, 40, lengthscale=0.2, seed=1, device="cuda")
    om = torch.randn(16, 40, generator=torch.Generator().manual_seed(0), dtype=f64).cuda()
    b = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64, device="cuda")
    keys = kr.fold(kr.root_key(0, "g"), torch.arange(16, device="cuda"))
    X, v = maximize_batched(RFFSamplePaths(rff, om), b, 16, raw_samples=256, num_restarts=4, maxiter=20, keys=keys)
    assert len(ob._GRAPHS._graphs) >= 1
    X2, v2 = maximize_batched(
        RFFSamplePaths(rff, om * 1.5), b, 16, raw_samples=256, num_restarts=4, maxiter=20, keys=keys
    )  # replay with new ω
    monkeypatch.setenv("FBO_CUDA_GRAPHS", "0")
    Xe, ve = maximize_batched(
        RFFSamplePaths(rff, om * 1.5), b, 16, raw_samples=256, num_restarts=4, maxiter=20, keys=keys
    )
    torch.testing.assert_close(X2, Xe, atol=1e-12, rtol=0)
    torch.testing.assert_close(v2, ve, atol=1e-12, rtol=0)
    Xg = torch.rand(8, 12, 2, dtype=f64, device="cuda")
    Yg = torch.sin(5 * Xg).sum(-1, keepdim=True)
    eager = BatchedExactGP(Xg, Yg, b).fit(maxiter=30)
    monkeypatch.setenv("FBO_CUDA_GRAPHS", "1")
    graphed = BatchedExactGP(Xg, Yg, b).fit(maxiter=30)
    torch.testing.assert_close(graphed.params, eager.params, atol=1e-10, rtol=1e-10)


@pytest.mark.cuda
def test_cuda_and_cpu_maximizers_agree():
    # the same keys give the same raw points and restarts on both devices (bit-identical uniforms);
    # float64 kernels differ in the last bits, so maxima agree to round-off of the refinement
    rff = RandomFourierFeatures(2, 40, lengthscale=0.3, seed=1)
    om = torch.randn(8, 40, generator=torch.Generator().manual_seed(0), dtype=f64)
    b = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64)
    keys = kr.fold(kr.root_key(0, "dev"), torch.arange(8))
    _, v_cpu = maximize_batched(RFFSamplePaths(rff, om), b, 8, raw_samples=512, num_restarts=8, keys=keys)
    _, v_gpu = maximize_batched(
        RFFSamplePaths(rff.cuda(), om.cuda()), b.cuda(), 8, raw_samples=512, num_restarts=8, keys=keys.cuda()
    )
    torch.testing.assert_close(v_gpu.cpu(), v_cpu, atol=1e-8, rtol=1e-8)
