import math

import pytest
import torch

from fbo_torch.features import RandomFourierFeatures

f64 = torch.float64


def se_kernel(X1, X2, lengthscale, outputscale=1.0):
    d2 = ((X1.unsqueeze(-2) - X2.unsqueeze(-3)) / lengthscale).pow(2).sum(-1)
    return outputscale * torch.exp(-0.5 * d2)


@pytest.mark.parametrize("normalize", [False, True])
def test_kernel_error_shrinks_like_inverse_sqrt_M(normalize):
    # sup error over random pairs, averaged over seeds, for M = 100 ... 6400
    gen = torch.Generator().manual_seed(0)
    X1 = torch.rand(300, 3, generator=gen, dtype=f64)
    X2 = torch.rand(300, 3, generator=gen, dtype=f64)
    ls = torch.tensor([0.3, 0.5, 0.4], dtype=f64)
    exact = se_kernel(X1, X2, ls, 1.5)
    Ms = [100, 400, 1600, 6400]
    errs = []
    for M in Ms:
        e = []
        for seed in range(6):
            rff = RandomFourierFeatures(3, M, lengthscale=ls, outputscale=1.5, seed=seed, normalize=normalize)
            e.append((rff.kernel(X1, X2) - exact).abs().max().item())
        errs.append(sum(e) / len(e))
    slope = (math.log(errs[-1]) - math.log(errs[0])) / (math.log(Ms[-1]) - math.log(Ms[0]))
    assert -0.65 < slope < -0.35, (errs, slope)
    assert errs[-1] < errs[0] / 5


def test_feature_formula_matches_paper():
    rff = RandomFourierFeatures(2, 7, lengthscale=0.5, outputscale=2.0, seed=3, normalize=False)
    X = torch.rand(4, 2, dtype=f64)
    expected = math.sqrt(2 * 2.0 / 7) * torch.cos(X @ rff.spectral.T + rff.phase)
    torch.testing.assert_close(rff(X), expected)
    rffn = RandomFourierFeatures(2, 7, lengthscale=0.5, outputscale=2.0, seed=3, normalize=True)
    torch.testing.assert_close(rffn(X).pow(2).sum(-1), torch.full((4,), 2.0, dtype=f64))
    # normalized features are the plain ones rescaled
    torch.testing.assert_close(
        rffn(X) / rffn(X).norm(dim=-1, keepdim=True), expected / expected.norm(dim=-1, keepdim=True)
    )


def test_spectral_distribution_uses_lengthscale():
    # s_i ~ N(0, diag(l)^-2): the per-dimension std of the samples is 1/l
    ls = torch.tensor([0.1, 2.0], dtype=f64)
    rff = RandomFourierFeatures(2, 20000, lengthscale=ls, seed=0)
    std = rff.spectral.std(dim=0)
    torch.testing.assert_close(std, 1 / ls, rtol=0.03, atol=0)
    assert rff.phase.min() >= 0 and rff.phase.max() <= 2 * math.pi
    assert abs(rff.phase.mean().item() - math.pi) < 0.05


def test_shapes_batch_dims():
    rff = RandomFourierFeatures(3, 11, seed=0)
    X = torch.rand(2, 5, 4, 3, dtype=f64)
    assert rff(X).shape == (2, 5, 4, 11)


def test_same_seed_identical_and_fingerprint():
    a = RandomFourierFeatures(2, 50, lengthscale=0.2, seed=5)
    b = RandomFourierFeatures(2, 50, lengthscale=0.2, seed=5)
    assert torch.equal(a.spectral, b.spectral) and torch.equal(a.phase, b.phase)
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 16
    # float32 copy of the same map has the same identity and close values
    c = RandomFourierFeatures(2, 50, lengthscale=0.2, seed=5, dtype=torch.float32)
    assert c.fingerprint == a.fingerprint
    torch.testing.assert_close(c.spectral.double(), a.spectral, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(seed=6),
        dict(lengthscale=0.21),
        dict(num_features=51),
        dict(outputscale=2.0),
        dict(normalize=False),
        dict(lengthscale=[0.2, 0.3]),
    ],
)
def test_fingerprint_changes(kwargs):
    base = dict(dim=2, num_features=50, lengthscale=0.2, seed=5)
    a = RandomFourierFeatures(**base)
    b = RandomFourierFeatures(**{**base, **kwargs})
    assert a.fingerprint != b.fingerprint


def test_state_dict_round_trip():
    a = RandomFourierFeatures(3, 40, lengthscale=[0.1, 0.2, 0.3], outputscale=0.7, seed=9, normalize=False)
    sd = a.state_dict()
    b = RandomFourierFeatures(3, 40, seed=123)  # different map, same shape
    b.load_state_dict(sd)
    X = torch.rand(6, 3, dtype=f64)
    assert torch.equal(a(X), b(X))
    assert a.fingerprint == b.fingerprint and b.seed == 9 and b.normalize is False
    c = RandomFourierFeatures.from_state_dict(sd)
    assert torch.equal(a(X), c(X)) and c.fingerprint == a.fingerprint
    with pytest.raises(ValueError, match="num_features"):
        RandomFourierFeatures(3, 41).load_state_dict(sd)


def test_device_and_dtype_follow(device):
    a = RandomFourierFeatures(2, 30, seed=1, device=device)
    ref = RandomFourierFeatures(2, 30, seed=1)
    assert a.spectral.device.type == device.type
    X = torch.rand(5, 2, dtype=f64)
    out = a(X.to(device))
    assert out.device.type == device.type and out.dtype == f64
    torch.testing.assert_close(out.cpu(), ref(X))
    out32 = a(X.to(device, torch.float32))
    assert out32.dtype == torch.float32
    assert a.fingerprint == ref.fingerprint


@pytest.mark.cuda
def test_cuda_map_identical_to_cpu():
    a = RandomFourierFeatures(4, 64, lengthscale=0.3, seed=2, device="cuda")
    b = RandomFourierFeatures(4, 64, lengthscale=0.3, seed=2)
    assert torch.equal(a.spectral.cpu(), b.spectral) and a.fingerprint == b.fingerprint


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(dim=2, num_features=0), ValueError, "num_features"),
        (dict(dim=0, num_features=5), ValueError, "dim"),
        (dict(dim=2, num_features=5, lengthscale=0.0), ValueError, "lengthscale"),
        (dict(dim=2, num_features=5, lengthscale=[1.0, -1.0]), ValueError, "lengthscale"),
        (dict(dim=2, num_features=5, lengthscale=[1.0, 1.0, 1.0]), ValueError, "lengthscale"),
        (dict(dim=2, num_features=5, outputscale=-1.0), ValueError, "outputscale"),
        (dict(dim=2, num_features=5, seed=1.5), TypeError, "seed"),
        (dict(dim=2, num_features=2.0), TypeError, "num_features"),
        (dict(dim=2, num_features=5, dtype=torch.int64), TypeError, "dtype"),
    ],
)
def test_validation(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        RandomFourierFeatures(**kwargs)


def test_forward_validation():
    rff = RandomFourierFeatures(2, 5)
    with pytest.raises(ValueError, match="d = 2"):
        rff(torch.rand(4, 3, dtype=f64))
    with pytest.raises(TypeError, match="floating"):
        rff(torch.ones(4, 2, dtype=torch.int64))


@pytest.mark.parametrize("normalize", [False, True])
def test_in_place_path_equals_autograd_path_and_gradient_is_exact(normalize):
    # without autograd the map runs cos/scale in place; with X.requires_grad it must not,
    # and both paths give the same features; the gradient matches the closed form
    rff = RandomFourierFeatures(3, 9, lengthscale=0.4, outputscale=1.7, seed=5, normalize=normalize)
    X = torch.rand(2, 4, 3, dtype=f64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = rff(X)
    Xg = X.clone().requires_grad_(True)
    phi = rff(Xg)
    assert phi.requires_grad
    torch.testing.assert_close(phi.detach(), plain, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rff(X), plain, rtol=1e-12, atol=1e-12)  # grad mode on, X without grad
    w = torch.randn(9, dtype=f64, generator=torch.Generator().manual_seed(2))
    (phi @ w).sum().backward()
    if not normalize:  # d/dx sum_i w_i c cos(s_i x + b_i) = -c sum_i w_i sin(s_i x + b_i) s_i
        c = math.sqrt(2 * 1.7 / 9)
        expected = -(c * w * torch.sin(X @ rff.spectral.T + rff.phase)) @ rff.spectral
        torch.testing.assert_close(Xg.grad, expected)
    else:  # central differences through the no-grad (in-place) path
        h, num = 1e-6, torch.zeros_like(X)
        with torch.no_grad():
            for idx in torch.cartesian_prod(*[torch.arange(k) for k in X.shape]).tolist():
                e = torch.zeros_like(X)
                e[tuple(idx)] = h
                num[tuple(idx)] = ((rff(X + e) @ w).sum() - (rff(X - e) @ w).sum()) / (2 * h)
        torch.testing.assert_close(Xg.grad, num, rtol=1e-6, atol=1e-8)
    # a single point (d,) maps to (M,)
    assert rff(X[0, 0]).shape == (9,)


def test_state_dict_holds_only_tensors_and_config_rebuilds_the_map():
    # get_extra_state returned a dict, which broke fit_gpytorch_mll and Flower's ArrayRecord
    import json

    a = RandomFourierFeatures(3, 40, lengthscale=[0.1, 0.2, 0.3], outputscale=0.7, seed=9, normalize=False)
    sd = a.state_dict()
    assert all(isinstance(v, torch.Tensor) for v in sd.values()), {k: type(v) for k, v in sd.items()}
    assert int(sd["seed_"]) == 9 and bool(sd["normalize_"]) is False
    cfg = json.loads(json.dumps(a.config()))  # what a ConfigRecord carries
    b = RandomFourierFeatures.from_config(cfg)
    X = torch.rand(6, 3, dtype=f64)
    assert b.fingerprint == a.fingerprint and torch.equal(a(X), b(X)) and b.config() == a.config()
    # float32 maps and scalar lengthscales round-trip too (the config keeps the float64 arguments)
    c = RandomFourierFeatures(2, 30, lengthscale=0.123456789, outputscale=1.3, seed=-4, dtype=torch.float32)
    c2 = RandomFourierFeatures.from_config(json.loads(json.dumps(c.config())))
    assert (
        c2.spectral.dtype == torch.float32 and torch.equal(c2.spectral, c.spectral) and c2.fingerprint == c.fingerprint
    )
    assert c.config()["lengthscale"] == 0.123456789
    with pytest.raises(ValueError, match="unknown keys"):
        RandomFourierFeatures.from_config({**cfg, "device": "cpu"})
    with pytest.raises(ValueError, match="dtype"):
        RandomFourierFeatures.from_config({**cfg, "dtype": "float99"})
    with pytest.raises(ValueError, match="seed"):
        RandomFourierFeatures(2, 5, seed=2**63)
    with pytest.raises(ValueError, match="no tensor 'seed_'"):
        RandomFourierFeatures.from_state_dict({k: v for k, v in sd.items() if k != "seed_"})


def test_empty_input_maps_to_empty_features():
    rff = RandomFourierFeatures(2, 7, seed=0)
    assert rff(torch.empty(3, 0, 2, dtype=f64)).shape == (3, 0, 7)


def test_a_map_larger_than_memory_is_refused_before_it_is_drawn(monkeypatch):
    """Before: RandomFourierFeatures(num_features=10**9) ran past 30 s (and 10**12 failed deep in the allocator)."""
    from fbo_torch.utils.resources import MemoryLimitError

    with pytest.raises(MemoryLimitError, match="^`num_features`: a map of 1000000000000 features in dimension 2"):
        RandomFourierFeatures(2, 10**12)
    monkeypatch.setenv("FBO_MEMORY_LIMIT", "100M")  # the limit follows the machine's memory
    with pytest.raises(MemoryLimitError, match="more than the 100.0 MiB this machine has free"):
        RandomFourierFeatures(2, 10**7)
    assert RandomFourierFeatures(2, 10**5).num_features == 10**5


def test_non_finite_inputs_and_states_are_refused():
    """Before: NaN inputs gave NaN features; a state with a NaN spectral matrix or a negative lengthscale loaded."""
    rff = RandomFourierFeatures(2, 16, lengthscale=0.3, seed=1)
    X = torch.rand(4, 2, dtype=torch.float64)
    X[1, 0] = float("nan")
    with pytest.raises(ValueError, match="`X` must be finite; it holds 1 NaN/inf"):
        rff(X)
    for key, bad in (("spectral", float("nan")), ("lengthscale", -0.3), ("outputscale", 0.0)):
        state = rff.state_dict()
        state[key] = torch.full_like(state[key], bad)
        with pytest.raises(ValueError, match=f"`state_dict\\['{key}'\\]` must be finite"):
            RandomFourierFeatures.from_state_dict(state)
