r"""How the CNN trainer runs: precision, autocast, memory layout, CUDA graphs and cuDNN flags.

:class:`TrainerOptions` is what :func:`~fbo_torch.objectives.cnn.train_cnn_batched`
and the image objectives (:mod:`fbo_torch.objectives.vision`) take; none of it
changes what is trained, only how (float64 on a CPU, as the tests' references).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "float64": torch.float64,
    "double": torch.float64,
    "fp64": torch.float64,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
}


def _as_dtype(name: str, value: object, allowed: tuple[torch.dtype, ...]) -> torch.dtype:
    dtype = _DTYPES.get(value.lower()) if isinstance(value, str) else value
    if dtype not in allowed:
        names = sorted({k for k, v in _DTYPES.items() if v in allowed})
        raise ValueError(f"`{name}` must be one of {names} (or the torch dtypes), got {value!r}.")
    return dtype


def _optional_bool(name: str, value: object) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(f"`{name}` must be true, false or null (automatic), got {value!r}.")


@dataclass(frozen=True)
class TrainerOptions:
    r"""How :func:`~fbo_torch.objectives.cnn.train_cnn_batched` executes (see the module docstring).

    Args:
        dtype: Parameters, gradients and loss (``torch.float32`` or
            ``torch.float64``; strings such as ``"float64"`` are accepted).
        autocast_dtype: ``None`` (off) or ``torch.bfloat16`` / ``torch.float16``:
            the convolutions and the output layer run under
            :func:`torch.autocast` with float32 master weights. Changes results
            (bf16 has an 8-bit mantissa); validation accuracy stays close to
            float32 (``tests/objectives/test_vision.py`` states the tolerance).
            ``float16`` on CUDA only, and unscaled: bf16 is the supported choice.
        allow_tf32: Let cuDNN convolutions and cuBLAS matmuls use TF32 tensor
            cores on CUDA (changes results at the ~1e-3 level; off by default).
        channels_last: Channels-last activations; ``None`` picks: on for CPU, on
            for CUDA with autocast or TF32, off for plain float32/float64 CUDA.
        cuda_graph: Capture one training step as a CUDA graph and replay it;
            ``None``: on for CUDA. Ignored on CPU.
        cudnn_benchmark: cuDNN autotuning of convolution algorithms (CUDA).
        deterministic: Only deterministic cuDNN kernels, no autotuning (CUDA);
            bitwise reproducible runs at some cost in speed.

    Example:
        >>> TrainerOptions(dtype="float64").dtype
        torch.float64
    """

    dtype: torch.dtype = torch.float32
    autocast_dtype: torch.dtype | None = None
    allow_tf32: bool = False
    channels_last: bool | None = None
    cuda_graph: bool | None = None
    cudnn_benchmark: bool = True
    deterministic: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _as_dtype("dtype", self.dtype, (torch.float32, torch.float64)))
        if self.autocast_dtype is not None:
            ac = _as_dtype("autocast_dtype", self.autocast_dtype, (torch.bfloat16, torch.float16))
            if self.dtype != torch.float32:
                raise ValueError(f"`autocast_dtype` needs dtype float32 master weights, got dtype {self.dtype}.")
            object.__setattr__(self, "autocast_dtype", ac)
        for name in ("allow_tf32", "cudnn_benchmark", "deterministic"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"`{name}` must be true or false, got {getattr(self, name)!r}.")
        for name in ("channels_last", "cuda_graph"):
            _optional_bool(name, getattr(self, name))

    def use_channels_last(self, device: torch.device) -> bool:
        """Whether activations are channels-last on ``device``."""
        if self.channels_last is not None:
            return self.channels_last
        return device.type == "cpu" or self.autocast_dtype is not None or self.allow_tf32

    def use_cuda_graph(self, device: torch.device) -> bool:
        """Whether the training steps are replayed from a CUDA graph on ``device``."""
        return device.type == "cuda" and (self.cuda_graph is None or self.cuda_graph)


@contextmanager
def cuda_backend_flags(device: torch.device, options: TrainerOptions) -> Iterator[None]:
    r"""Set cuDNN autotuning/determinism and the TF32 policy of ``options`` for a block (CUDA only).

    Uses PyTorch's per-backend ``fp32_precision`` flags (``"ieee"`` or
    ``"tf32"`` for ``torch.backends.cudnn.conv`` and
    ``torch.backends.cuda.matmul``) where they exist (torch >= 2.9; mixing them
    with the legacy ``allow_tf32`` flags is an error there), the legacy flags
    otherwise. Everything is restored on exit. A no-op for other devices.
    """
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    saved = (cudnn.benchmark, cudnn.deterministic)
    precision = "tf32" if options.allow_tf32 else "ieee"
    targets: list[Any] | None
    old_precision: list[str] = []
    old_tf32 = (False, False)
    try:
        # torch's module-level annotations of torch.backends.cudnn omit `conv` (set on its module class)
        targets = [cudnn.conv, torch.backends.cuda.matmul]  # type: ignore[attr-defined]
        old_precision = [t.fp32_precision for t in targets]
    except AttributeError:  # torch < 2.9: only the legacy flags
        targets, old_tf32 = None, (cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    try:
        cudnn.benchmark = options.cudnn_benchmark and not options.deterministic
        cudnn.deterministic = options.deterministic
        if targets is not None:
            for t in targets:
                t.fp32_precision = precision
        else:
            cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = options.allow_tf32
        yield
    finally:
        cudnn.benchmark, cudnn.deterministic = saved
        if targets is not None:
            for t, value in zip(targets, old_precision, strict=True):
                t.fp32_precision = value
        else:
            cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old_tf32


def _autocast(device: torch.device, options: TrainerOptions) -> AbstractContextManager[None]:
    if options.autocast_dtype is None:
        return nullcontext()
    # cache_enabled=False: autocast's weight-cast cache must be off under CUDA graph capture.
    return torch.autocast(device.type, dtype=options.autocast_dtype, cache_enabled=False)


# --------------------------------------------------------------------------- helpers


__all__ = ["TrainerOptions", "cuda_backend_flags"]
