r"""fbo_torch: federated Bayesian optimization on PyTorch, GPyTorch and BoTorch.

Federated Thompson sampling (FTS, Dai et al. 2020) and its differentially
private, distributed-exploration extension (DP-FTS-DE, Dai et al. 2021), built
from BoTorch models and acquisition functions that batch every agent of a
federation into one tensor computation.

The names below are imported when first used, so ``import fbo_torch`` (and the
``fbo-torch`` command's ``--help`` and ``--version``) do not import torch.
Importing :class:`~fbo_torch.models.RFFBayesianLinear` or :class:`~fbo_torch.kernels.SharedRFFKernel` registers it with
BoTorch's pathwise sampling (:mod:`fbo_torch.sampling.pathwise`), so ``draw_matheron_paths``,
``get_matheron_path_model`` and ``PathwiseThompsonSampling`` accept them.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

#: MKL (torch's CPU BLAS) computes a product the same whatever its operands' memory alignment, so
#: that a problem's result does not depend on which others share its batch
#: (:mod:`fbo_torch.utils.batch_invariant`). Read by MKL at its first computation, so it is set on
#: import, before any; a value the user set is kept (``MKL_CBWR=AUTO``: MKL's fastest branch without
#: that guarantee). Recorded with every result (:func:`~fbo_torch.utils.batch_invariant.blas_mode`).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

#: The one source of the version: the build reads it (pyproject.toml), as do ``fbo-torch --version``,
#: run manifests and ``results.json``. A release changes it here and in CHANGELOG.md.
__version__ = "0.1.0"

#: Public name -> the module that defines it (imported on first use).
_EXPORTS = {
    "BatchedExactGP": "fbo_torch.models",
    "RFFBayesianLinear": "fbo_torch.models",
    "RandomFourierFeatures": "fbo_torch.features",
    "SharedFeatureFit": "fbo_torch.fit",
    "SharedRFFKernel": "fbo_torch.kernels",
    "fit_shared_features": "fbo_torch.fit",
    "optimize_acqf_batched": "fbo_torch.optim.optimize",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover  (type checkers see the lazy exports; "as" marks a re-export)
    from fbo_torch.features import RandomFourierFeatures as RandomFourierFeatures
    from fbo_torch.fit import SharedFeatureFit as SharedFeatureFit
    from fbo_torch.fit import fit_shared_features as fit_shared_features
    from fbo_torch.kernels import SharedRFFKernel as SharedRFFKernel
    from fbo_torch.models import BatchedExactGP as BatchedExactGP
    from fbo_torch.models import RFFBayesianLinear as RFFBayesianLinear
    from fbo_torch.optim.optimize import optimize_acqf_batched as optimize_acqf_batched


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name == "RFFKernel":  # the old name of SharedRFFKernel: its module warns
        return importlib.import_module("fbo_torch.kernels")._deprecated_alias(__name__, name, stacklevel=2)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
