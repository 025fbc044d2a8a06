"""The CPU and GPU code paths of the same sums (fbo_torch.utils.dispatch)."""

import pytest
import torch

from fbo_torch.utils.dispatch import gpu_path, rowdot, without_autograd


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("leading", [(), (3,)])
def test_rowdot_is_the_batched_matrix_vector_product(dtype, leading, monkeypatch):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(*leading, 4, 5, 64, generator=g, dtype=torch.float64)
    w = torch.randn(4, 64, 1, generator=g, dtype=torch.float64)
    exact = (a @ w).squeeze(-1)  # float64 reference
    # both paths sum the same 64 products in dtype: |error| <= 64 eps sum|a_i w_i| (a crude
    # forward bound of recursive summation; blocked and pairwise sums stay below it)
    bound = 64 * torch.finfo(dtype).eps * (a.abs() * w.mT.abs()).sum(-1) + 2 * torch.finfo(dtype).tiny
    a_, w_ = a.to(dtype), w.to(dtype)
    bound = bound + (a_.double() * w_.double().mT).sum(-1).sub(exact).abs()  # the inputs' own rounding
    for sync_free in ("0", "1"):
        monkeypatch.setenv("FBO_SYNC_FREE", sync_free)
        assert gpu_path(a_.device) == (sync_free == "1")
        out = rowdot(a_, w_)
        assert out.shape == (*leading, 4, 5) and out.dtype == dtype
        assert ((out.double() - exact).abs() <= bound).all()
    monkeypatch.setenv("FBO_SYNC_FREE", "0")
    b = a_.clone()
    torch.testing.assert_close(rowdot(b, w_, overwrite=True), rowdot(a_, w_), rtol=0, atol=0)
    assert not torch.equal(b, a_)  # a CPU overwrote the input it was allowed to
    c = a_.clone()
    rowdot(c, w_)
    assert torch.equal(c, a_)  # and only then


def test_gpu_path_follows_the_device(monkeypatch):
    monkeypatch.delenv("FBO_SYNC_FREE", raising=False)
    assert not gpu_path(torch.device("cpu"))
    assert gpu_path(torch.device("cuda"))  # a device object needs no GPU


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cos_in_place_is_the_cosine(dtype, threads, monkeypatch):
    import fbo_torch.utils.dispatch as dispatch
    from fbo_torch.utils.dispatch import cos_

    monkeypatch.delenv("FBO_SYNC_FREE", raising=False)
    numpy_calls = []
    np_cos = dispatch.np.cos
    monkeypatch.setattr(dispatch.np, "cos", lambda *a, **k: (numpy_calls.append(1), np_cos(*a, **k))[1])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(1)
        z = ((torch.rand(64, 33, generator=g, dtype=torch.float64) - 0.5) * 400).to(dtype)  # |z| <= 200
        exact = torch.cos(z.double())  # the cosine of the rounded arguments
        for a in (z.clone(), z.clone().mT):  # contiguous (NumPy's kernel on a CPU float32) and not
            out = cos_(a)
            assert out is a and out.dtype == dtype
            # |cos| <= 1: a few units in the last place of 1 are an absolute error of ~eps
            assert (out.double() - (exact if out.shape == z.shape else exact.mT)).abs().max() <= 2 * torch.finfo(
                dtype
            ).eps
        # NumPy's kernel exactly for the contiguous float32 tensor, whatever the number of threads
        assert len(numpy_calls) == (1 if dtype == torch.float32 else 0)
        v = torch.zeros(3)
        before_version = v._version
        cos_(v)
        assert v._version > before_version  # autograd sees the write
    finally:
        torch.set_num_threads(before)


def _at_threads(threads, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cos_and_rowdot_do_not_depend_on_the_number_of_threads(dtype, monkeypatch):
    # the screening shapes of the maximizers (agents x raw points x features), large enough
    # for torch to split elementwise kernels and reductions across threads
    from fbo_torch.utils.dispatch import cos_

    monkeypatch.delenv("FBO_SYNC_FREE", raising=False)
    g = torch.Generator().manual_seed(2)
    z = ((torch.rand(16, 512, 256, generator=g, dtype=torch.float64) - 0.5) * 400).to(dtype)
    w = torch.randn(16, 256, 1, generator=g, dtype=torch.float64).to(dtype)
    outs = [_at_threads(t, lambda: rowdot(cos_(z.clone()), w, overwrite=True)) for t in (1, 2, 3)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_a_simulation_is_bit_identical_at_one_and_two_threads(monkeypatch):
    # a few DP-FTS-DE rounds (float32 screening of raw points, float64 refinement, GP fits):
    # the same points queried and the same losses whatever torch.set_num_threads says
    from fbo_torch.federation.settings import DPFTSDESettings
    from fbo_torch.objectives.synthetic import GPSampleContinuousFederation
    from fbo_torch.optim.domain import Domain
    from fbo_torch.simulate.dp_fts_de import DPFTSDERunner

    monkeypatch.delenv("FBO_SYNC_FREE", raising=False)
    obj = GPSampleContinuousFederation(
        dim=2,
        num_groups=1,
        agents_per_group=4,
        perturbation=0.05,
        perturb_first=True,
        num_basis=64,
        lengthscale=0.2,
        seed=0,
    )
    settings = DPFTSDESettings(
        num_iterations=3,
        num_init=3,
        num_features=30,
        rff_lengthscale=0.2,
        num_regions=2,
        sample_rate=0.6,
        noise_multiplier=1.0,
        clip_norm=5.0,
        gp_refit_every=2,
        gp_sample_features=32,
    )
    domain = Domain(
        obj.bounds, raw_samples=64, num_restarts=2, maxiter=10, raw_samples_rff=64, num_restarts_rff=2, maxiter_rff=10
    )

    def run():
        r = DPFTSDERunner(obj, settings, num_inits=2, domain=domain, seed=0, accountant="rdp")
        res = r.run()
        return r.agents.train_X.clone(), res.loss, res.used_server

    one, two = _at_threads(1, run), _at_threads(2, run)
    for a, b in zip(one, two, strict=True):
        assert torch.equal(a, b)


def test_without_autograd_runs_in_inference_mode_and_returns_ordinary_tensors():
    seen = []

    def fn(a, b):
        seen.append(torch.is_inference_mode_enabled())
        return a * b, (a + b).cos_()

    a, b = torch.rand(5, dtype=torch.float64), torch.rand(5, dtype=torch.float64)
    out = without_autograd(fn, a, b)
    assert seen == [True] and not torch.is_inference_mode_enabled()
    assert all(not t.is_inference() for t in out)
    torch.testing.assert_close(out[0], a * b, rtol=0, atol=0)
    torch.testing.assert_close(out[1], (a + b).cos(), rtol=0, atol=0)
    # ordinary tensors: usable where autograd records
    w = torch.ones(5, dtype=torch.float64, requires_grad=True)
    (out[0] * w).sum().backward()
    torch.testing.assert_close(w.grad, out[0], rtol=0, atol=0)
