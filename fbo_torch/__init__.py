r"""fbo_torch: federated Bayesian optimization on PyTorch, GPyTorch and BoTorch.

Federated Thompson sampling (FTS, Dai et al. 2020) and its differentially
private, distributed-exploration extension (DP-FTS-DE, Dai et al. 2021), built
from BoTorch models and acquisition functions that batch every agent of a
federation into one tensor computation.

Importing the package registers its models and kernel with BoTorch's pathwise
sampling (:mod:`fbo_torch.sampling.pathwise`), so ``draw_matheron_paths``,
``get_matheron_path_model`` and ``PathwiseThompsonSampling`` accept them.
"""

from typing import Any

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.fit import SharedFeatureFit, fit_shared_features
from fbo_torch.kernels import SharedRFFKernel, _deprecated_alias
from fbo_torch.models import BatchedExactGP, RFFBayesianLinear
from fbo_torch.optim.optimize import optimize_acqf_batched
from fbo_torch.sampling import pathwise as _pathwise  # noqa: F401  (registers with BoTorch)

__version__ = "0.1.0"

__all__ = [
    "BatchedExactGP",
    "RFFBayesianLinear",
    "RandomFourierFeatures",
    "SharedFeatureFit",
    "SharedRFFKernel",
    "fit_shared_features",
    "optimize_acqf_batched",
]


def __getattr__(name: str) -> Any:
    return _deprecated_alias(__name__, name, stacklevel=2)
