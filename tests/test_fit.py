"""Choosing the shared map from data: the fitted lengthscale, the suggested M, and the unit-cube warnings."""

import math
import warnings

import pytest
import torch
from botorch.exceptions.warnings import InputDataWarning
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize

from fbo_torch import RandomFourierFeatures, RFFBayesianLinear, SharedRFFKernel
from fbo_torch.fit import fit_shared_features, intrinsic_dimension, suggest_num_features

f64 = torch.float64
TRUE_LS = 0.2
NOISE = 1e-2


def gp_draw(n, d, g, lengthscale=TRUE_LS, noise=NOISE):
    """n points uniform in [0, 1]^d and a noisy draw of a GP with an RBF kernel (unit signal variance)."""
    X = torch.rand(n, d, generator=g, dtype=f64)
    K = torch.exp(-torch.cdist(X, X).pow(2) / (2 * lengthscale**2)) + 1e-9 * torch.eye(n, dtype=f64)
    f = torch.linalg.cholesky(K) @ torch.randn(n, generator=g, dtype=f64)
    return X, f + noise**0.5 * torch.randn(n, generator=g, dtype=f64)


def lengthscale_std(X, lengthscale=TRUE_LS, noise=NOISE):
    r"""Asymptotic std of the ML lengthscale: ``√(I⁻¹)_ℓℓ`` with ``I_ij = ½ tr(K⁻¹∂_iK K⁻¹∂_jK)`` over (ℓ, σ₀², σ²)."""
    D2 = torch.cdist(X, X).pow(2)
    R = torch.exp(-D2 / (2 * lengthscale**2))
    eye = torch.eye(X.shape[0], dtype=f64)
    K = R + noise * eye
    A = [torch.linalg.solve(K, dK) for dK in (R * D2 / lengthscale**3, R, eye)]
    info = torch.tensor([[0.5 * torch.trace(a @ b) for b in A] for a in A])
    return torch.linalg.inv(info)[0, 0].sqrt().item()


def box(X, lo, hi):
    return lo + X * (hi - lo)


def test_recovers_the_lengthscale_of_gp_data():
    """Three agents' data (sizes 80, 80, 60) from a GP with lengthscale 0.2 on a raw box: median of their fits.

    Each ML estimate has an asymptotic std of ~0.015-0.018 at these sizes (Fisher information, computed here); the
    median of three is within 3 of the largest.
    """
    g = torch.Generator().manual_seed(0)
    lo, hi = torch.tensor([-5.0, 0.0], dtype=f64), torch.tensor([10.0, 15.0], dtype=f64)
    data = [gp_draw(n, 2, g) for n in (80, 80, 60)]
    tol = 3 * max(lengthscale_std(X) for X, _ in data)
    raw = [(box(X, lo, hi), 3.0 + 40 * y) for X, y in data]  # raw units: the fit normalizes and standardizes
    fit = fit_shared_features(raw, bounds=torch.stack([lo, hi]))
    assert fit.lengthscales.shape == (3,)
    assert abs(fit.lengthscale - TRUE_LS) < tol, (fit.lengthscales, tol)
    assert fit.lengthscale == pytest.approx(float(fit.lengthscales.median()))
    assert 0 < fit.noise_variance < 5 * NOISE  # standardized outcomes of a unit-variance draw: about NOISE
    # a ready map: normalized units, the suggested M, models normalize with the same bounds
    rff = fit.features
    assert isinstance(rff, RandomFourierFeatures) and rff.num_features == fit.suggested_num_features
    assert torch.allclose(rff.lengthscale, torch.full((2,), fit.lengthscale, dtype=f64))
    tf = fit.input_transform()
    assert isinstance(tf, Normalize) and torch.equal(tf.bounds, torch.stack([lo, hi]))
    # pooled: one fit on all data, e.g. three agents' samples of one function
    X, y = gp_draw(180, 2, g)
    split = [(box(X[i::3], lo, hi), y[i::3]) for i in range(3)]
    pooled = fit_shared_features(split, bounds=torch.stack([lo, hi]), combine="pooled")
    assert pooled.lengthscales.shape == (1,) and abs(pooled.lengthscale - TRUE_LS) < 3 * lengthscale_std(X)
    # raw units: the map's lengthscale per dimension is lengthscale x box width, and no transform is needed
    in_raw = fit_shared_features(raw, bounds=torch.stack([lo, hi]), units="raw", num_features=256)
    assert torch.allclose(in_raw.features.lengthscale, in_raw.lengthscale * (hi - lo))
    assert in_raw.input_transform() is None


def test_batched_data_and_argument_checks():
    g = torch.Generator().manual_seed(1)
    pairs = [gp_draw(30, 1, g) for _ in range(2)]
    X = torch.stack([p[0] for p in pairs])
    Y = torch.stack([p[1] for p in pairs]).unsqueeze(-1)
    a = fit_shared_features((X, Y), num_features=256)
    b = fit_shared_features(pairs, bounds=torch.stack([X.amin((0, 1)), X.amax((0, 1))]), num_features=256)
    assert torch.allclose(a.lengthscales, b.lengthscales)
    with pytest.raises(ValueError, match="`combine` must be"):
        fit_shared_features(pairs, combine="mean")
    with pytest.raises(ValueError, match="constant outcomes"):
        fit_shared_features((pairs[0][0], torch.ones(30, dtype=f64)))
    with pytest.raises(ValueError, match="at least 3"):
        fit_shared_features((pairs[0][0][:2], pairs[0][1][:2]))
    with pytest.raises(ValueError, match="upper bound must exceed"):
        fit_shared_features(pairs, bounds=torch.tensor([[1.0], [0.0]], dtype=f64))


def test_num_features_below_the_suggestion_warns():
    g = torch.Generator().manual_seed(2)
    data = gp_draw(50, 2, g)
    with pytest.warns(UserWarning, match="below the .* features suggested"):
        fit = fit_shared_features(data, bounds=torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64), num_features=8)
    assert fit.num_features == 8 and fit.suggested_num_features > 8
    with pytest.warns(UserWarning, match="using max_features"):
        assert suggest_num_features(0.05, 4, max_features=1000) == 1000


@pytest.mark.parametrize(("lengthscale", "dim"), [(0.1, 1), (0.2, 2), (0.3, 3)])
def test_intrinsic_dimension_and_suggested_m_match_the_measured_kernel_error(lengthscale, dim):
    """``r = tr K / ‖K‖`` on a dense design, and ``M = r/ε²`` features give relative spectral error about ε."""
    X = torch.quasirandom.SobolEngine(dim, scramble=True, seed=0).draw(512, dtype=f64)
    K = torch.exp(-torch.cdist(X, X).pow(2) / (2 * lengthscale**2))
    norm = torch.linalg.matrix_norm(K, ord=2)
    assert intrinsic_dimension(lengthscale, dim) == pytest.approx((512 / norm).item(), rel=0.1)
    eps = 0.2
    M = suggest_num_features(lengthscale, dim, kernel_error=eps)
    assert M == math.ceil(intrinsic_dimension(lengthscale, dim) / eps**2)
    errors = []
    for seed in range(3):
        phi = RandomFourierFeatures(dim, M, lengthscale=lengthscale, seed=seed)(X)
        errors.append((torch.linalg.matrix_norm(phi @ phi.T - K, ord=2) / norm).item())
    assert 0.4 * eps < sum(errors) / 3 < 1.6 * eps, errors


def _input_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [w for w in caught if issubclass(w.category, InputDataWarning)]


def test_unit_cube_warnings():
    g = torch.Generator().manual_seed(3)
    bounds = torch.tensor([[-5.0, 0.0], [10.0, 15.0]], dtype=f64)
    U, y = gp_draw(20, 2, g)
    X, Y = box(U, bounds[0], bounds[1]), y.unsqueeze(-1)
    rff = RandomFourierFeatures(2, 50, lengthscale=0.2, seed=0)

    def kernel_gp(**kw):
        SingleTaskGP(X, Y, covar_module=SharedRFFKernel(rff), **kw).posterior(X[:3])

    caught = _input_warnings(kernel_gp)
    assert len(caught) == 1 and "not contained in the unit cube" in str(caught[0].message)
    assert not _input_warnings(lambda: kernel_gp(input_transform=Normalize(2, bounds=bounds)))
    assert len(_input_warnings(lambda: RFFBayesianLinear(rff, X, Y, 1e-2))) == 1
    assert not _input_warnings(lambda: RFFBayesianLinear(rff, X, Y, 1e-2, input_transform=Normalize(2, bounds=bounds)))
    assert not _input_warnings(lambda: RFFBayesianLinear(rff, U, Y, 1e-2))
    # padded entries (any value) are not inputs
    Xp = torch.cat([U, torch.full((3, 2), 1e6, dtype=f64)]).unsqueeze(0)
    Yp = torch.cat([Y, torch.zeros(3, 1, dtype=f64)]).unsqueeze(0)
    assert not _input_warnings(lambda: RFFBayesianLinear(rff, Xp, Yp, 1e-2, lengths=torch.tensor([20])))
