r"""Argument checks shared across the package.

Every public entry point validates what users hand it and raises ``TypeError``
(wrong kind of object) or ``ValueError`` (right kind, bad value) with a message
that names the argument and says what was expected.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from botorch.exceptions.warnings import InputDataWarning
from torch import Tensor

from fbo_torch.utils.schema import check_fraction, check_integer, number_error


def add_to_registry(registry: dict[str, Any], name: str, cls: type, label: str) -> None:
    """Register ``cls`` as ``registry[name]``, refusing a name another class holds.

    A class of the same module and qualified name may take its place again (the defining
    module imported a second time, e.g. reloaded), so registering is idempotent.

    Args:
        registry: Name -> class.
        name: The key.
        cls: The class.
        label: What a name is called in the message (``"algorithm"``, ``"release"``).

    Raises:
        ValueError: ``name`` is registered to another class.
    """
    old = registry.get(name)
    if old is not None and old is not cls and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"{label} {name!r} is already registered ({old.__module__}.{old.__qualname__}).")
    registry[name] = cls


def check_tensor(name: str, value: object) -> Tensor:
    """``value`` if it is a tensor, else a ``TypeError`` naming ``name``."""
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(value).__name__}.")
    return value


def check_ndim(name: str, value: Tensor, ndim: int, layout: str) -> Tensor:
    """``value`` if it is a tensor of ``ndim`` dimensions, else an error naming ``name`` and its ``layout``."""
    check_tensor(name, value)
    if value.ndim != ndim:
        raise ValueError(f"`{name}` must have {ndim} dimensions ({layout}), got shape {tuple(value.shape)}.")
    return value


def check_finite(name: str, value: Tensor) -> Tensor:
    """``value`` if every entry is finite, else a ``ValueError`` naming ``name`` and counting NaN/inf."""
    if not torch.isfinite(value).all():
        bad = (~torch.isfinite(value)).sum().item()
        raise ValueError(f"`{name}` must be finite; it holds {bad} NaN/inf value(s).")
    return value


def check_floating(name: str, value: Tensor) -> Tensor:
    """``value`` if its dtype is floating point, else a ``TypeError`` naming ``name``."""
    if not value.is_floating_point():
        raise TypeError(f"`{name}` must be a floating-point tensor, got dtype {value.dtype}.")
    return value


def check_positive(name: str, value: float | Tensor, allow_zero: bool = False) -> None:
    """Check a scalar or every entry of a tensor is positive (or >= 0)."""
    ok: Tensor | bool
    shown: object
    if isinstance(value, Tensor):
        ok = (value >= 0).all() if allow_zero else (value > 0).all()
        finite = torch.isfinite(value).all()
        ok = bool(ok and finite)
        shown = value.tolist() if value.numel() <= 8 else f"tensor of shape {tuple(value.shape)}"
    else:
        v = _number(name, value)
        ok = math.isfinite(v) and (v >= 0 if allow_zero else v > 0)
        shown = value
    if not ok:
        rel = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"`{name}` must be finite and {rel}, got {shown}.")


def _number(name: str, value: object) -> float:
    """``value`` as a float: a real number or a one-element tensor, never text or a bool (``TypeError``)."""
    if isinstance(value, (str, bytes, bool)) or (isinstance(value, Tensor) and value.is_complex()):
        raise TypeError(number_error(name, value))
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"`{name}` must be a number, got {type(value).__name__}.") from None


def check_probability(name: str, value: object, open_left: bool = False, open_right: bool = False) -> float:
    """``value`` as a float in ``[0, 1]`` (open at 0 with ``open_left``, at 1 with ``open_right``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        value = _number(name, value)  # a one-element tensor, or another object a float takes
    return check_fraction(name, value, open_left, open_right)


def check_int(name: str, value: object, minimum: int | None = None) -> int:
    """``value`` as an ``int`` (a Python or 1-element integer tensor, not a bool), at least ``minimum`` if given."""
    if isinstance(value, Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value)
    return check_integer(name, value, minimum)


def check_bounds(name: str, bounds: Tensor, dim: int | None = None) -> Tensor:
    """``bounds`` if it is a finite ``2 x d`` tensor (``d = dim`` if given) with lower < upper, else an error."""
    check_ndim(name, bounds, 2, "2 x d: lower and upper bounds")
    if bounds.shape[0] != 2:
        raise ValueError(f"`{name}` must have shape 2 x d, got {tuple(bounds.shape)}.")
    if dim is not None and bounds.shape[-1] != dim:
        raise ValueError(
            f"`{name}` must be 2 x {dim}: a lower and an upper bound for each of the inputs' {dim} dimensions, "
            f"got shape {tuple(bounds.shape)} ({bounds.shape[-1]} dimensions)."
        )
    check_finite(name, bounds)
    if not (bounds[1] > bounds[0]).all():
        raise ValueError(f"`{name}`: every upper bound must exceed its lower bound, got {bounds.tolist()}.")
    return bounds


def check_input_bounds(name: str, bounds: Tensor, dim: int | None = None) -> Tensor:
    r"""Check ``bounds`` is ``2 x d`` (``... x 2 x d`` allowed), finite, with ``upper > lower``."""
    check_tensor(name, bounds)
    if bounds.ndim < 2 or bounds.shape[-2] != 2 or (dim is not None and bounds.shape[-1] != dim):
        d = "d" if dim is None else f"d = {dim}"
        raise ValueError(f"`{name}` must be 2 x {d} (lower and upper bounds), got shape {tuple(bounds.shape)}.")
    if not bounds.is_floating_point():
        raise TypeError(f"`{name}` must be a floating-point tensor, got dtype {bounds.dtype}.")
    check_finite(name, bounds)
    if not bool((bounds[..., 1, :] > bounds[..., 0, :]).all()):
        raise ValueError(f"`{name}`: every upper bound must exceed its lower bound.")
    return bounds


def check_in_bounds(name: str, X: Tensor, bounds: Tensor, atol: float = 1e-9) -> None:
    """Every point of ``X`` (``... x d``) must lie in ``bounds`` (``2 x d``) up to ``atol``."""
    lo = bounds[0].to(X)
    hi = bounds[1].to(X)
    if ((X < lo - atol) | (X > hi + atol)).any():
        raise ValueError(
            f"`{name}` has points outside the bounds {bounds.tolist()} "
            f"(min {X.amin().item():.4g}, max {X.amax().item():.4g})."
        )


def check_last_dim(name: str, X: Tensor, dim: int) -> None:
    """``X`` must be ``... x d`` with ``d = dim`` (a ``ValueError`` naming ``name`` otherwise)."""
    if X.ndim == 0:
        raise ValueError(f"`{name}` must be ... x d with d = {dim} features in its last dimension, got a 0-d tensor.")
    if X.shape[-1] != dim:
        raise ValueError(f"`{name}` must have d = {dim} features in its last dimension, got shape {tuple(X.shape)}.")


def check_single_output(output_indices: Sequence[int] | None) -> None:
    """``output_indices`` of a single-output model's ``posterior``: ``None`` or ``[0]`` (a ``ValueError`` otherwise)."""
    if output_indices is not None and list(output_indices) != [0]:
        raise ValueError(f"`output_indices` must be None or [0] for a single-output model, got {output_indices}.")


def check_shape(name: str, shape: object) -> torch.Size:
    """``shape`` as a ``torch.Size``: a sequence of integers ``>= 0`` (``TypeError``/``ValueError`` naming ``name``)."""
    if isinstance(shape, (str, bytes)) or not isinstance(shape, (Sequence, torch.Size)):
        raise TypeError(
            f"`{name}` must be a shape (a tuple or torch.Size of integers), got {type(shape).__name__} {shape!r}."
        )
    dims = list(shape)
    if any(isinstance(v, bool) or not isinstance(v, int) for v in dims):
        raise TypeError(f"`{name}` must be a shape of integers, got {tuple(shape)!r}.")
    if any(v < 0 for v in dims):
        raise ValueError(f"`{name}` must have sizes >= 0, got {tuple(dims)}.")
    return torch.Size(dims)


def check_device(name: str, device: object) -> torch.device | None:
    r"""``device`` as a ``torch.device`` this machine has (``None`` stays ``None``): a one-line ``ValueError``
    naming ``name`` for a string that names no device, a CUDA device without CUDA (or beyond the devices
    present), and the ``meta`` device, which holds no data."""
    if device is None:
        return None
    try:
        dev = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError):
        raise ValueError(f"`{name}` must name a torch device ('cpu', 'cuda', 'cuda:1'), got {device!r}.") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"`{name}` is {device!r}, but CUDA is not available here (torch {torch.__version__}).")
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"`{name}` is {device!r}, but this machine has {count} CUDA device(s).")
    if dev.type == "meta":
        raise ValueError(f"`{name}` is the meta device, which holds no data; use 'cpu' or 'cuda'.")
    return dev


def check_data_device(name: str, value: Tensor) -> Tensor:
    """``value`` holds data: it is not on the ``meta`` device (``ValueError`` naming ``name``)."""
    if value.device.type == "meta":
        raise ValueError(f"`{name}` is on the meta device and holds no data; move it to 'cpu' or 'cuda' first.")
    return value


def as_int_sequence(name: str, values: Sequence[int] | Tensor) -> list[int]:
    """``values`` (a sequence or a tensor) as a list of ``int``; an error names the entry ``name[i]``."""
    if isinstance(values, Tensor):
        values = values.tolist()
    return [check_int(f"{name}[{i}]", v) for i, v in enumerate(values)]


def warn_outside_unit_cube(what: str, X: Tensor, lengthscale: Tensor, atol: float = 1e-2, stacklevel: int = 3) -> bool:
    r"""Warn (BoTorch's ``InputDataWarning``) when ``X`` leaves the unit cube by more than ``atol``.

    The shared feature map's lengthscale is in the units of the inputs it sees; a
    federation chooses it for inputs normalized to the unit cube (BoTorch's own
    check, ``check_min_max_scaling``, uses the same tolerance). Returns whether it warned.
    """
    with torch.no_grad():
        finite = X[torch.isfinite(X)]
        if finite.numel() == 0:
            return False
        lo, hi = float(finite.amin()), float(finite.amax())
    if lo >= -atol and hi <= 1 + atol:
        return False
    ls = lengthscale.detach().reshape(-1)
    ls_repr = f"{ls[0].item():.3g}" if bool((ls == ls[0]).all()) else str([round(v, 3) for v in ls.tolist()])
    warnings.warn(
        f"{what} are not contained in the unit cube (they range over [{lo:.3g}, {hi:.3g}]) and no input transform "
        f"normalizes them, but the shared feature map's lengthscale {ls_repr} is in the units of the inputs it sees. "
        "Normalize the inputs (input_transform=Normalize(d, bounds=search-space bounds)) and choose the lengthscale "
        "for normalized inputs, e.g. with fbo_torch.fit_shared_features.",
        InputDataWarning,
        stacklevel=stacklevel,
    )
    return True
