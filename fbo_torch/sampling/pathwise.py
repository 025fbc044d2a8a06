r"""The shared random-feature map as a BoTorch pathwise ``FeatureMap``.

BoTorch draws posterior sample paths through dispatchers
(``botorch.sampling.pathwise``). :class:`RFFFeatureMap` is what fbo_torch's
registrations with them return; each registration lives with its class, so it
holds as soon as the class exists:

* :class:`~fbo_torch.kernels.SharedRFFKernel`'s kernel features
  (``gen_kernel_features``, in :mod:`fbo_torch.kernels.shared_rff_kernel`). The
  kernel *is* the finite feature map, so the prior paths ``φ(x)ᵀw``,
  ``w ~ N(0, I)``, that ``draw_kernel_feature_paths`` builds from it are exact
  prior samples (BoTorch's own RBF/Matern features are approximations); the
  ``num_features`` BoTorch asks for is ignored. ``draw_matheron_paths``,
  ``get_matheron_path_model`` and ``PathwiseThompsonSampling`` then work on
  ``SingleTaskGP(covar_module=SharedRFFKernel(...))``, also inside a
  ``ScaleKernel``.
* a ``draw_matheron_paths`` rule for :class:`~fbo_torch.models.RFFBayesianLinear`
  (in :mod:`fbo_torch.models.rff_blr`): a path is ``x ↦ φ(T(x))ᵀω`` with ``ω``
  drawn exactly from the weight posterior
  (:meth:`~fbo_torch.models.RFFBayesianLinear.sample_weights`, which in the dual
  representation *is* Matheron's rule in weight space), un-transformed by the
  model's outcome transform. ``prior_sampler``/``update_strategy`` arguments
  do not apply and are ignored. This is what ``PathwiseThompsonSampling``,
  ``get_matheron_path_model`` and
  :class:`~fbo_torch.acquisition.FederatedThompsonSampling` (own branch) use.

Paths are evaluated like BoTorch's: ``sample_shape x batch_shape x q`` for
inputs ``batch_shape x q x d``.
"""

from __future__ import annotations

import torch
from botorch.sampling.pathwise.features import FeatureMap
from botorch.sampling.pathwise.utils import TInputTransform, TOutputTransform
from torch import Size, Tensor

from fbo_torch.features import RandomFourierFeatures

__all__ = ["RFFFeatureMap"]


class RFFFeatureMap(FeatureMap):
    r"""A :class:`RandomFourierFeatures` map as a BoTorch pathwise ``FeatureMap``.

    ``feature_map(x) = output_transform(φ(input_transform(x)))``; the wrapped map
    is shared, not copied (BoTorch may set this wrapper's transforms, e.g. an
    output scale, without touching the map every agent holds).

    Args:
        features: The shared feature map ``φ`` (``M`` outputs).
        input_transform: Optional transform applied to inputs first.
        output_transform: Optional transform applied to the features.
        batch_shape: Batch shape of the kernel or model the map represents.

    Example:
        >>> fmap = RFFFeatureMap(rff)
        >>> path = GeneralizedLinearPath(fmap, weight=torch.randn(rff.num_features, dtype=torch.float64))
    """

    def __init__(
        self,
        features: RandomFourierFeatures,
        input_transform: TInputTransform | None = None,
        output_transform: TOutputTransform | None = None,
        batch_shape: Size = Size(),
    ) -> None:
        if not isinstance(features, RandomFourierFeatures):
            raise TypeError(f"`features` must be a RandomFourierFeatures, got {type(features).__name__}.")
        super().__init__()
        self.features = features
        self.input_transform = input_transform
        self.output_transform = output_transform
        self._batch_shape = Size(batch_shape)

    def forward(self, x: Tensor) -> Tensor:
        """The features ``phi(x)``: ``... x d`` inputs to ``... x M`` features."""
        return self.features(x)

    # botorch's FeatureMap annotates num_outputs and batch_shape as plain attributes; its own maps
    # define them as read-only properties too
    @property
    def num_outputs(self) -> int:  # type: ignore[override]
        if self.output_transform is None:
            return self.features.num_features
        canary = torch.empty(
            self.features.num_features, dtype=self.features.spectral.dtype, device=self.features.spectral.device
        )
        return self.output_transform(canary).shape[-1]

    @property
    def batch_shape(self) -> Size:  # type: ignore[override]  # as num_outputs
        return self._batch_shape
