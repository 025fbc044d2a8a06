"""GPyTorch kernels: :class:`~fbo_torch.kernels.shared_rff_kernel.SharedRFFKernel`, the shared
random-feature map as a kernel."""

import warnings
from typing import Any

from fbo_torch.kernels.shared_rff_kernel import SharedRFFKernel

__all__ = ["SharedRFFKernel"]


def _deprecated_alias(module: str, name: str, stacklevel: int) -> Any:
    if name == "RFFKernel":  # the old name, confusable with gpytorch.kernels.RFFKernel
        warnings.warn(
            f"{module}.RFFKernel was renamed SharedRFFKernel (it is not gpytorch.kernels.RFFKernel: "
            "see SharedRFFKernel's docstring); the old name will be removed.",
            DeprecationWarning,
            stacklevel=stacklevel + 1,
        )
        return SharedRFFKernel
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def __getattr__(name: str) -> Any:
    return _deprecated_alias(__name__, name, stacklevel=2)
