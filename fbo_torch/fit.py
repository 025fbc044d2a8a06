r"""Choosing the shared feature map from data: its lengthscale and its number of features.

Every agent of a federation must build the *same* map ``φ``, so its
lengthscale cannot be refitted by each agent as a GP's would be: it is fixed
before the run, from data the federation may use (pooled initial evaluations,
public data, or each agent's initial data). A guess is costly: on Branin a
peer's posterior error doubles between ``ℓ = 0.2`` and ``0.1`` (normalized
units), and a lengthscale meant for normalized inputs applied to raw ones gives
an RFF GP no better than the mean (``docs/design.md``).

:func:`fit_shared_features` fits it by maximum marginal likelihood, BoTorch's
way (``SingleTaskGP`` + ``fit_gpytorch_mll``), with an isotropic RBF kernel on
inputs normalized to the unit cube by the search space's bounds, per dataset
(the median over datasets; agents' functions may differ, so their data are not
pooled by default) or pooled. The map it returns has its lengthscale **in
normalized units**: every agent's model then uses ``Normalize(d, bounds=bounds)``
(:meth:`SharedFeatureFit.input_transform`), and messages carry those bounds
(:mod:`fbo_torch.protocol.input_space`).

:func:`suggest_num_features` picks ``M`` for that lengthscale. A GP with
lengthscale ``ℓ`` on ``[0, 1]^d`` has about ``r(ℓ, d) = μ₁(ℓ)^{-d}`` "independent
directions" (:func:`intrinsic_dimension`: the trace of its kernel operator over the
largest eigenvalue; ``μ₁`` is the top eigenvalue of the 1-D operator, and the
isotropic RBF kernel on the cube is a product of 1-D ones). An ``M``-feature
approximation ``K̂`` of the kernel matrix on a dense design of the cube has relative
spectral error ``‖K̂ − K‖/‖K‖ ≈ √(r/M)`` (matrix Bernstein with the intrinsic
dimension; measured for the papers' normalized map in ``docs/design.md``), so
``M = ⌈r/ε²⌉`` features give error about ``ε``. With too few features the RFF
posterior cannot represent the functions the GP allows and is overconfident.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch import Tensor

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.utils.validation import check_finite, check_input_bounds, check_int, check_positive, check_tensor

Dataset = tuple[Tensor, Tensor]


@dataclass(frozen=True)
class SharedFeatureFit:
    r"""What :func:`fit_shared_features` found.

    Attributes:
        features: The ready :class:`~fbo_torch.features.RandomFourierFeatures`
            (lengthscale ``lengthscale`` in normalized units, or ``lengthscale·(upper − lower)``
            per dimension with ``units="raw"``).
        lengthscale: The fitted isotropic lengthscale, normalized units.
        lengthscales: Each dataset's fitted lengthscale (one entry when pooled).
        outputscale: Fitted signal variance ``σ₀²`` of standardized outcomes (median).
        noise_variance: Fitted noise variance of standardized outcomes (median).
        bounds: ``2 x d`` box that defines the normalized units.
        num_features: ``M`` of ``features``.
        suggested_num_features: ``M`` from :func:`suggest_num_features`.
        intrinsic_dimension: ``r(ℓ, d)`` of :func:`intrinsic_dimension`.
        units: ``"normalized"`` or ``"raw"``: the units of ``features``' lengthscale.
    """

    features: RandomFourierFeatures
    lengthscale: float
    lengthscales: Tensor
    outputscale: float
    noise_variance: float
    bounds: Tensor
    num_features: int
    suggested_num_features: int
    intrinsic_dimension: float
    units: str

    def input_transform(self) -> Normalize | None:
        r"""A fresh ``Normalize(d, bounds=bounds)`` for every model on this map (``None`` with ``units="raw"``)."""
        if self.units == "raw":
            return None
        return Normalize(self.bounds.shape[-1], bounds=self.bounds.clone())


def fit_shared_features(
    data: Dataset | Sequence[Dataset],
    bounds: Tensor | None = None,
    num_features: int | None = None,
    seed: int = 0,
    combine: str = "median",
    units: str = "normalized",
    outputscale: float | None = None,
    normalize: bool = True,
    kernel_error: float = 0.2,
    max_features: int = 4096,
) -> SharedFeatureFit:
    r"""Fit the shared map's lengthscale to data by marginal likelihood and build the map.

    Each dataset's inputs are normalized by ``bounds`` and its outcomes
    standardized; a ``SingleTaskGP`` with an isotropic ``ScaleKernel(RBFKernel())``
    (no lengthscale prior: the marginal likelihood alone) is fitted with
    ``fit_gpytorch_mll``, datasets of equal size in one batched model, each started
    from the best point of a (lengthscale, noise) grid (:data:`SCREEN_LENGTHSCALES`,
    ``SCREEN_NOISES``) so the fit lands in the basin of the global maximum.

    Args:
        data: One ``(X, Y)`` pair (``n x d`` and ``n`` or ``n x 1``; ``X`` may be
            ``B x n x d`` with ``Y`` ``B x n x 1``: ``B`` datasets), or a sequence of
            pairs (e.g. each agent's initial data; sizes may differ).
        bounds: ``2 x d`` search-space bounds that define normalized units
            (default: the bounding box of all inputs; pass the search space's).
        num_features: ``M``; default :func:`suggest_num_features`. A given ``M``
            below the suggestion is used, with a warning.
        seed: The map's seed.
        combine: ``"median"`` (fit each dataset, take the median lengthscale:
            robust when agents' functions differ) or ``"pooled"`` (one fit on all
            data, each dataset standardized first).
        units: ``"normalized"`` (default: models use
            :meth:`SharedFeatureFit.input_transform`) or ``"raw"`` (the map's
            lengthscale is ``ℓ·(upper − lower)`` per dimension, for models without
            an input transform).
        outputscale: The map's ``σ₀²``; default the fitted one (standardized
            outcomes, so near 1: models should use ``Standardize`` outcomes).
        normalize: The map's ``normalize`` (the papers' ``‖φ(x)‖² = σ₀²``).
        kernel_error: Target relative spectral error ``ε`` of the kernel
            approximation for :func:`suggest_num_features`.
        max_features: Cap on the suggested ``M``.

    Returns:
        A :class:`SharedFeatureFit` (``.features`` is the map).

    Example:
        >>> fit = fit_shared_features([(X_a, Y_a), (X_b, Y_b)], bounds=Branin().bounds)
        >>> rff = fit.features            # every agent builds RandomFourierFeatures.from_config(rff.config())
        >>> gp = SingleTaskGP(X, Y, covar_module=SharedRFFKernel(rff), input_transform=fit.input_transform())
    """
    if combine not in ("median", "pooled"):
        raise ValueError(f"`combine` must be 'median' or 'pooled', got {combine!r}.")
    if units not in ("normalized", "raw"):
        raise ValueError(f"`units` must be 'normalized' or 'raw', got {units!r}.")
    datasets = _as_datasets(data)
    d = datasets[0][0].shape[-1]
    like = datasets[0][0]
    if bounds is None:
        X_all = torch.cat([X for X, _ in datasets])
        bounds = torch.stack([X_all.amin(0), X_all.amax(0)])
        if not bool((bounds[1] > bounds[0]).all()):
            raise ValueError("The inputs are constant in some dimension, so they define no box: pass `bounds`.")
    else:
        check_input_bounds("bounds", bounds, d)
        if bounds.ndim != 2:
            raise ValueError(f"`bounds` must be 2 x d, got shape {tuple(bounds.shape)}.")
    bounds = bounds.to(like).detach()
    lo, width = bounds[0], bounds[1] - bounds[0]
    sets = [((X - lo) / width, _standardize(y, i)) for i, (X, y) in enumerate(datasets)]
    if combine == "pooled":
        sets = [(torch.cat([U for U, _ in sets]), torch.cat([y for _, y in sets]))]
    ls, os_, noise = _fit_datasets(sets)
    ell = float(ls.median())
    rank = intrinsic_dimension(ell, d)
    suggested = suggest_num_features(ell, d, kernel_error=kernel_error, max_features=max_features)
    if num_features is None:
        num_features = suggested
    else:
        num_features = check_int("num_features", num_features, minimum=1)
        if num_features < suggested:
            warnings.warn(
                f"num_features = {num_features} is below the {suggested} features suggested for lengthscale {ell:.3g} "
                f"in {d} dimensions (kernel approximation error about "
                f"{math.sqrt(rank / num_features):.2g} instead of {kernel_error}): the RFF posterior may be "
                "overconfident.",
                UserWarning,
                stacklevel=2,
            )
    sigma2 = float(os_.median()) if outputscale is None else float(outputscale)
    map_ls = ell if units == "normalized" else (ell * width).tolist()
    features = RandomFourierFeatures(
        d, num_features, lengthscale=map_ls, outputscale=sigma2, seed=seed, normalize=normalize, device=like.device
    )
    return SharedFeatureFit(
        features=features,
        lengthscale=ell,
        lengthscales=ls,
        outputscale=float(os_.median()),
        noise_variance=float(noise.median()),
        bounds=bounds,
        num_features=num_features,
        suggested_num_features=suggested,
        intrinsic_dimension=rank,
        units=units,
    )


def intrinsic_dimension(lengthscale: float, dim: int) -> float:
    r"""``r(ℓ, d) = μ₁(ℓ)^{-d}``: trace over top eigenvalue of the RBF kernel operator on ``[0, 1]^d``.

    ``μ₁(ℓ)`` is the largest eigenvalue of ``f ↦ ∫₀¹ exp(−(x−y)²/2ℓ²) f(y) dy``
    (the operator's trace is 1), computed by the midpoint (Nyström) rule on ``m``
    nodes spaced ``ℓ/8`` or finer (``m ≤ 1024``); below ``ℓ = 1/(8·1024)`` the
    edge-free limit ``√(2π)ℓ``. The ``d``-dimensional operator is a product of 1-D
    ones, so its top eigenvalue is ``μ₁^d``.

    Example:
        >>> intrinsic_dimension(0.2, 2)   # about 5 directions; 0.05 in 2-D: about 64
    """
    check_positive("lengthscale", lengthscale)
    dim = check_int("dim", dim, minimum=1)
    return _top_eigenvalue_1d(float(lengthscale)) ** (-dim)


@lru_cache(maxsize=256)
def _top_eigenvalue_1d(lengthscale: float) -> float:
    m = math.ceil(8 / lengthscale)
    if m > 1024:
        return math.sqrt(2 * math.pi) * lengthscale
    m = max(m, 64)
    x = (torch.arange(m, dtype=torch.float64) + 0.5) / m
    K = torch.exp(-((x[:, None] - x[None, :]) ** 2) / (2 * lengthscale**2)) / m
    return min(1.0, float(torch.linalg.eigvalsh(K)[-1]))


def suggest_num_features(
    lengthscale: float | Sequence[float] | Tensor, dim: int, kernel_error: float = 0.2, max_features: int = 4096
) -> int:
    r"""Features ``M = ⌈r(ℓ, d)/ε²⌉`` for relative kernel error about ``ε`` (see the module docstring).

    Args:
        lengthscale: Lengthscale in normalized units (unit-cube inputs); ``d``
            values (ARD) multiply their 1-D intrinsic dimensions.
        dim: Input dimension ``d``.
        kernel_error: Target relative spectral error ``ε`` of the approximated
            kernel matrix (0.2: 25 features per intrinsic dimension).
        max_features: Cap; a larger need is capped with a warning.

    Returns:
        The number of features ``M`` (at most ``max_features``).

    Example:
        >>> suggest_num_features(0.2, 2)    # 129
        >>> suggest_num_features(0.1, 4)    # 4096, with a warning (about 7,400 needed)
    """
    dim = check_int("dim", dim, minimum=1)
    check_positive("kernel_error", kernel_error)
    max_features = check_int("max_features", max_features, minimum=1)
    ls = torch.as_tensor(lengthscale, dtype=torch.float64).reshape(-1)
    if ls.numel() not in (1, dim):
        raise ValueError(f"`lengthscale` must be a scalar or have d = {dim} entries, got {ls.numel()}.")
    check_positive("lengthscale", ls)
    rank = math.prod(intrinsic_dimension(v, 1) for v in ls.expand(dim).tolist())
    need = math.ceil(rank / kernel_error**2)
    if need > max_features:
        warnings.warn(
            f"Lengthscale {ls.tolist()} in {dim} dimensions needs about {need} random features for kernel error "
            f"{kernel_error}; using max_features = {max_features} (error about {math.sqrt(rank / max_features):.2g}).",
            UserWarning,
            stacklevel=2,
        )
        return max_features
    return need


def _as_datasets(data: Dataset | Sequence[Dataset]) -> list[tuple[Tensor, Tensor]]:
    """A list of ``(X n x d, y n)`` float64 pairs."""
    if isinstance(data, tuple) and len(data) == 2 and all(isinstance(t, Tensor) for t in data):
        X, Y = cast("tuple[Tensor, Tensor]", data)  # checked just above
        if X.ndim == 3:
            Y = Y.reshape(*X.shape[:2]) if Y.numel() == X.shape[0] * X.shape[1] else Y
            return _as_datasets([(X[b], Y[b]) for b in range(X.shape[0])])
        data = [(X, Y)]
    if not isinstance(data, Sequence) or len(data) == 0:
        raise ValueError("`data` must be an (X, Y) pair or a non-empty sequence of (X, Y) pairs.")
    out: list[tuple[Tensor, Tensor]] = []
    for i, pair in enumerate(data):
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ValueError(f"`data[{i}]` must be an (X, Y) pair of tensors.")
        X, Y = pair
        check_tensor(f"data[{i}][0]", X)
        check_tensor(f"data[{i}][1]", Y)
        if X.ndim != 2:
            raise ValueError(f"`data[{i}]`: X must be n x d, got shape {tuple(X.shape)}.")
        y = Y.reshape(-1)
        if y.shape[0] != X.shape[0] or (Y.ndim == 2 and Y.shape[-1] != 1) or Y.ndim > 2:
            raise ValueError(f"`data[{i}]`: Y must be n or n x 1 with n = {X.shape[0]}, got shape {tuple(Y.shape)}.")
        if X.shape[0] < 3:
            raise ValueError(f"`data[{i}]` has {X.shape[0]} points; a marginal-likelihood fit needs at least 3.")
        if out and X.shape[-1] != out[0][0].shape[-1]:
            raise ValueError(f"`data[{i}]` has d = {X.shape[-1]} inputs, `data[0]` has {out[0][0].shape[-1]}.")
        X, y = X.detach().to(torch.float64), y.detach().to(device=X.device, dtype=torch.float64)
        check_finite(f"data[{i}][0]", X)
        check_finite(f"data[{i}][1]", y)
        out.append((X, y))
    return out


def _standardize(y: Tensor, i: int) -> Tensor:
    std = y.std()
    if not bool(std > 0):
        raise ValueError(f"`data[{i}]` has constant outcomes: they carry no information about the lengthscale.")
    return (y - y.mean()) / std


def _fit_datasets(sets: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
    """Each dataset's lengthscale, outputscale and noise; datasets of equal size share one batched fit."""
    by_n: dict[int, list[int]] = {}
    for j, (U, _) in enumerate(sets):
        by_n.setdefault(U.shape[0], []).append(j)
    out = torch.empty(3, len(sets), dtype=sets[0][0].dtype, device=sets[0][0].device)
    for idx in by_n.values():
        fitted = _fit_group(torch.stack([sets[j][0] for j in idx]), torch.stack([sets[j][1] for j in idx]))
        out[:, idx] = torch.stack(fitted)
    return out[0], out[1], out[2]


def _fit_group(U: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Lengthscale, outputscale and noise of ``B`` datasets (``B x n x d``, ``B x n``): screen, then fit."""
    B = U.shape[0]
    ls0, noise0 = _screen(U, y)
    batch = torch.Size([B])
    covar = ScaleKernel(RBFKernel(batch_shape=batch), batch_shape=batch).to(U)
    covar.base_kernel.lengthscale = ls0.view(B, 1, 1)
    covar.outputscale = torch.ones(B, dtype=U.dtype, device=U.device)
    model = SingleTaskGP(U, y.unsqueeze(-1), covar_module=covar, outcome_transform=None)
    noise_min = float(model.likelihood.noise_covar.raw_noise_constraint.lower_bound)
    model.likelihood.noise = noise0.clamp_min(2 * noise_min).view(B, 1)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    return (
        covar.base_kernel.lengthscale.detach().reshape(B),
        covar.outputscale.detach().reshape(B),
        model.likelihood.noise.detach().reshape(B),
    )


#: Grid of the screening step: lengthscales (normalized units) and noise variances (standardized outcomes).
SCREEN_LENGTHSCALES = tuple(float(v) for v in torch.logspace(math.log10(0.02), math.log10(2.0), 13))
SCREEN_NOISES = (1e-4, 1e-2, 1e-1, 0.5)
#: Kernel-matrix entries per chunk of the screening grid.
SCREEN_CHUNK = 2**24


def _screen(U: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    r"""The grid point (lengthscale, noise; unit signal variance, zero mean) of highest marginal likelihood.

    The marginal likelihood of a lengthscale is often multimodal (a short-lengthscale
    mode that explains noise as signal); a local optimizer started from a default
    lands in either. The grid picks the basin, and ``fit_gpytorch_mll`` then refines
    from it: every dataset is fitted once.
    """
    B, n, _ = U.shape
    grid_ls = torch.tensor(SCREEN_LENGTHSCALES, dtype=U.dtype, device=U.device)
    grid_noise = torch.tensor(SCREEN_NOISES, dtype=U.dtype, device=U.device)
    ls, noise = (t.reshape(-1) for t in torch.meshgrid(grid_ls, grid_noise, indexing="ij"))  # G
    D2 = torch.cdist(U, U).pow(2)  # B x n x n
    eye = torch.eye(n, dtype=U.dtype, device=U.device)
    per = max(1, SCREEN_CHUNK // max(1, B * n * n))
    values = []
    for s0 in range(0, ls.numel(), per):
        ell, v = ls[s0 : s0 + per].view(-1, 1, 1, 1), noise[s0 : s0 + per].view(-1, 1, 1, 1)
        K = torch.exp(-D2 / (2 * ell * ell)) + v * eye  # g x B x n x n
        L, info = torch.linalg.cholesky_ex(K)
        z = torch.linalg.solve_triangular(L, y.unsqueeze(-1).expand(K.shape[0], B, n, 1), upper=False)
        logdet = 2 * torch.diagonal(L, dim1=-2, dim2=-1).log().sum(-1)
        value = -0.5 * (z.squeeze(-1).pow(2).sum(-1) + logdet)
        values.append(torch.where(info == 0, value, -torch.inf))
    best = torch.cat(values).argmax(0)  # B
    return ls[best], noise[best]


__all__ = [
    "SharedFeatureFit",
    "fit_shared_features",
    "intrinsic_dimension",
    "suggest_num_features",
]
