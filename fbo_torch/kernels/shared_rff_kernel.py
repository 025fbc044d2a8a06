r"""A GPyTorch kernel on the papers' shared random Fourier feature map."""

from __future__ import annotations

from typing import Any

import torch
from botorch.exceptions.errors import UnsupportedError
from botorch.sampling.pathwise.features.generators import GenKernelFeatures
from botorch.sampling.pathwise.utils import FeatureSelector, TensorTransform
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import Likelihood
from gpytorch.models.exact_prediction_strategies import LinearPredictionStrategy
from linear_operator.operators import (
    LinearOperator,
    LowRankRootLinearOperator,
    MatmulLinearOperator,
    RootLinearOperator,
)
from torch import Tensor

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.sampling.pathwise import RFFFeatureMap
from fbo_torch.utils.validation import warn_outside_unit_cube


class SharedRFFKernel(Kernel):
    r"""``k(x, x') = φ(x)ᵀ φ(x')`` for a shared :class:`RandomFourierFeatures` map ``φ``.

    ``SingleTaskGP(train_X, train_Y, covar_module=SharedRFFKernel(features))`` is
    then the RFF-approximated GP whose posterior equals the Bayesian linear
    regression posterior of :class:`~fbo_torch.models.RFFBayesianLinear` (FTS
    appendix B). It fits with ``fit_gpytorch_mll`` (the likelihood's noise and
    the mean are learned; the map is not) and BoTorch's pathwise sampling draws
    exact prior paths ``φ(x)ᵀw``, ``w ~ N(0, I)``, from it (registered below,
    :mod:`fbo_torch.sampling.pathwise`).

    **How it differs from** ``gpytorch.kernels.RFFKernel``: GPyTorch's kernel
    draws its frequencies from the global RNG, uses ``[cos(Wx/ℓ), sin(Wx/ℓ)]/√D``
    without phases and learns ``ℓ``. This one is the papers' map
    ``√(2σ₀²/M)·cos(Sx+b)`` (phases ``b``, optionally normalized to
    ``‖φ(x)‖² = σ₀²``), drawn from a seed every agent shares and identified by
    its ``fingerprint``; lengthscale and signal variance are part of the fixed
    map, so a kernel built here matches the features in every agent's messages.
    Wrap it in ``ScaleKernel`` to learn an output scale on top.

    The map's lengthscale is in the units of the inputs the kernel sees: the first
    time it is called on inputs outside the unit cube it warns (BoTorch's
    ``InputDataWarning``; BoTorch skips its own unit-cube check for custom
    kernels). Give the model ``input_transform=Normalize(d, bounds=...)`` and a map
    whose lengthscale is for normalized inputs
    (:func:`~fbo_torch.fit.fit_shared_features`).

    Args:
        features: The shared feature map. Alternatively pass the
            :class:`RandomFourierFeatures` arguments (``dim``, ``num_features``,
            ``lengthscale``, ``outputscale``, ``seed``, ``normalize``) as keywords.
    """

    has_lengthscale = False

    def __init__(self, features: RandomFourierFeatures | None = None, **kwargs: Any) -> None:
        rff_keys = {"dim", "num_features", "lengthscale", "outputscale", "seed", "normalize", "dtype", "device"}
        rff_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in rff_keys}
        super().__init__(**kwargs)
        if features is None:
            if "dim" not in rff_kwargs or "num_features" not in rff_kwargs:
                raise TypeError("SharedRFFKernel needs `features` or at least `dim` and `num_features`.")
            features = RandomFourierFeatures(**rff_kwargs)
        elif rff_kwargs:
            raise TypeError(f"Pass either `features` or feature arguments, not both (got {sorted(rff_kwargs)}).")
        if not isinstance(features, RandomFourierFeatures):
            raise TypeError(f"`features` must be a RandomFourierFeatures, got {type(features).__name__}.")
        self.features = features
        self._scaling_checked = False

    def forward(
        self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False, **params: Any
    ) -> Tensor | LinearOperator:
        if last_dim_is_batch:
            raise NotImplementedError("SharedRFFKernel does not support last_dim_is_batch.")
        if not self._scaling_checked:  # once: the first call sees the training inputs
            self._scaling_checked = True
            warn_outside_unit_cube("The inputs of SharedRFFKernel", x1, self.features.lengthscale, stacklevel=4)
        same = x1.shape == x2.shape and torch.equal(x1, x2)
        z1 = self.features(x1)
        z2 = z1 if same else self.features(x2)
        if diag:
            return (z1 * z2).sum(-1)
        if same:
            if z1.shape[-1] < z1.shape[-2]:
                return LowRankRootLinearOperator(z1)
            return RootLinearOperator(z1)
        return MatmulLinearOperator(z1, z2.transpose(-1, -2))

    def prediction_strategy(
        self,
        train_inputs: tuple[Tensor, ...],
        train_prior_dist: MultivariateNormal,
        train_labels: Tensor,
        likelihood: Likelihood,
    ) -> LinearPredictionStrategy:
        return LinearPredictionStrategy(train_inputs, train_prior_dist, train_labels, likelihood)

    @property
    def num_features(self) -> int:
        return self.features.num_features

    @property
    def dtype(self) -> torch.dtype:
        """The feature map's dtype (the kernel has no parameters of its own)."""
        return self.features.spectral.dtype

    @property
    def device(self) -> torch.device:
        """The feature map's device."""
        return self.features.spectral.device


class _Identity(TensorTransform):
    r"""Output transform that changes nothing: BoTorch's ``ScaleKernel`` feature generator
    chains its output scale in front of the base map's output transform, which must exist."""

    # botorch's TensorTransform.forward declares **kwargs, which its own transforms do not take
    def forward(self, values: Tensor) -> Tensor:  # type: ignore[override]
        return values


# BoTorch's pathwise sampling draws prior paths from the kernel's own features (exact, not approximated)
@GenKernelFeatures.register(SharedRFFKernel)
def _gen_kernel_features_shared_rff(
    kernel: SharedRFFKernel, *, num_inputs: int, num_outputs: int, **ignore: Any
) -> RFFFeatureMap:
    active = kernel.active_dims
    d = num_inputs if active is None else len(active)
    if d != kernel.features.dim:
        raise UnsupportedError(
            f"SharedRFFKernel maps d = {kernel.features.dim} inputs, but the model has {d} (active) inputs."
        )
    selector = None if active is None else FeatureSelector(indices=active)
    return RFFFeatureMap(
        kernel.features, input_transform=selector, output_transform=_Identity(), batch_shape=kernel.batch_shape
    )
