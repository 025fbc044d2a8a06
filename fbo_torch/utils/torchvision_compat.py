r"""Import torchvision, also on a CPU-only PyTorch with a CUDA build of torchvision.

PyPI only ships CUDA builds of torchvision. Installed next to a CPU build of
torch (e.g. ``torch==2.13.0+cpu`` with ``torchvision==0.28.0``), its compiled
extension ``torchvision/_C.so`` cannot be loaded (it links against
``libtorch_cuda``), and ``import torchvision`` then fails with

    RuntimeError: operator torchvision::nms does not exist

because ``torchvision/_meta_registrations.py`` registers fake (meta) kernels
with ``torch.library.register_fake("torchvision::nms")`` and
``("torchvision::qnms")`` at import time, and those require the operator
*schemas* to exist. (All other meta/autograd/autocast registrations are
guarded by ``torchvision.extension._has_ops()`` and are skipped.)

:func:`import_torchvision` first tries the plain import. Only if it fails with
that error does it define the two missing schemas in a ``FRAGMENT`` library,

    nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor
    qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor

drop the half-imported ``torchvision`` modules from ``sys.modules`` and import
again. ``torchvision.datasets``, ``transforms`` and ``models`` then work; the
compiled operators (``torchvision.ops.nms``, ``roi_align``, ...) stay
unavailable and raise torchvision's own "Couldn't load custom C++ ops" error
if called. On a machine where torchvision imports normally (e.g. a CUDA torch
with its matching torchvision), nothing is patched.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType

import torch

__all__ = ["import_torchvision", "torchvision_shim_applied"]

#: Operator schemas torchvision's import-time ``register_fake`` calls need.
_SHIM_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)

_INSTALL_HINT = (
    "torchvision is required for image objectives such as EMNISTCNN; install it with "
    "`pip install fbo_torch[vision]` (pick the torchvision release that matches your torch)."
)

_lock = threading.Lock()
# The Library object must stay alive: its destructor removes the definitions.
_shim_library: torch.library.Library | None = None


def torchvision_shim_applied() -> bool:
    """Whether :func:`import_torchvision` had to define the missing operator schemas."""
    return _shim_library is not None


def _op_exists(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
    except RuntimeError:
        return False
    return True


def _forget_torchvision_modules() -> None:
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]


def _apply_shim() -> None:
    global _shim_library
    missing = [s for s in _SHIM_SCHEMAS if not _op_exists(s.split("(", 1)[0])]
    if not missing:
        return
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for schema in missing:
        lib.define(schema)
    _shim_library = lib


def import_torchvision() -> ModuleType:
    r"""Import and return the ``torchvision`` module, patching a CPU-only torch if needed.

    Idempotent and thread-safe: repeated calls return the same module and
    define the operator schemas at most once.

    Returns:
        The ``torchvision`` module (with ``datasets``, ``transforms`` and
        ``models`` imported).

    Raises:
        ImportError: If torchvision is not installed (install it with
            ``pip install fbo_torch[vision]``), or if it cannot be imported
            even with the compatibility shim.

    Example:
        >>> tv = import_torchvision()
        >>> ds = tv.datasets.EMNIST("data", split="digits", download=False)
    """
    module = sys.modules.get("torchvision")
    if module is not None and hasattr(module, "datasets"):
        return module
    with _lock:
        module = sys.modules.get("torchvision")
        if module is not None and hasattr(module, "datasets"):
            return module
        try:
            import torchvision
        except ModuleNotFoundError as err:
            if err.name is not None and err.name.split(".")[0] == "torchvision":
                raise ImportError(_INSTALL_HINT) from err
            raise
        except RuntimeError as err:
            if "torchvision::" not in str(err):
                raise
            # CUDA torchvision on a CPU torch: the _C extension did not load.
            _forget_torchvision_modules()
            _apply_shim()
            try:
                import torchvision
            except RuntimeError as err2:
                _forget_torchvision_modules()
                raise ImportError(
                    "torchvision is installed but cannot be imported with this torch "
                    f"({torch.__version__}), even after defining the operator schemas "
                    f"{[s.split('(')[0] for s in _SHIM_SCHEMAS]}: {err2}. Install the "
                    "torchvision release built for your torch."
                ) from err2
        import torchvision

        return torchvision
