r"""Which code path a device takes, where a GPU and a CPU want different kernels for the same sum.

The round engine is written for a GPU (few kernel launches, fixed shapes, no
host reads) and runs the same algorithm on a CPU, where launches are cheap and
what counts is the arithmetic and the CPU kernels' speed. Where the best
kernel differs, :func:`gpu_path` decides, and the environment variable
``FBO_SYNC_FREE=1`` makes a CPU take the GPU's path (op counts, tests of the
GPU's code on a CPU: ``benchmarks/op_count.py`` sets it).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor


def gpu_path(device: torch.device) -> bool:
    """Whether computations on ``device`` take the GPU's code path: CUDA, or ``FBO_SYNC_FREE=1``."""
    return device.type == "cuda" or os.environ.get("FBO_SYNC_FREE") == "1"


def rowdot(a: Tensor, w: Tensor, overwrite: bool = False) -> Tensor:
    r"""``(a @ w).squeeze(-1)``: the dot products of the rows of ``a`` with one vector per batch.

    Args:
        a: ``... x batch_shape x C x F``.
        w: ``batch_shape x F x 1``.
        overwrite: ``a`` is not needed afterwards: a CPU may overwrite it with the products
            instead of allocating a tensor of its size (a fresh allocation of a few MB
            page-faults on every call).

    Returns:
        ``... x batch_shape x C``.

    On the GPU path one batched GEMV (one kernel, ``a`` read once). On a CPU an
    elementwise product and a sum over ``F``, because a batched ``matmul`` with a
    single column is several times slower there (see docs/design.md). Both sum the
    same ``F`` products; they differ by rounding only (order of the sum, fused
    multiply-adds). Neither depends on the number of threads: torch sums each output
    on one thread in a fixed order (it splits a sum across threads only for a single
    output of 32,768 or more products, which the engine's rows of features never are).
    """
    if gpu_path(a.device):
        return (a @ w).squeeze(-1)
    return (a.mul_(w.mT) if overwrite else a * w.mT).sum(-1)


def cos_(a: Tensor) -> Tensor:
    r"""``a.cos_()``: the cosine in place (``a`` must not record gradients).

    On a CPU (off the GPU path) a contiguous float32 tensor takes NumPy's cosine, whose
    SIMD float32 kernel on one thread is faster than torch's on one or two (see
    docs/design.md); everything else (float64, a GPU, a strided tensor) takes torch's.
    The choice depends on the device, dtype and layout only, never on the number of
    threads, so results are the same for any ``torch.set_num_threads``. The two
    kernels round differently (both within a float32 epsilon of the cosine); float32
    path evaluations are what the maximizers screen raw points and climb with (the
    maxima are then found in float64: ``maximize_batched``'s ``refine_dtype``).
    """
    if (
        a.dtype == torch.float32
        and a.device.type == "cpu"
        and not gpu_path(a.device)
        and a.is_contiguous()
        and not a.requires_grad
    ):
        out = a.numpy()
        np.cos(out, out=out)
        torch.autograd.graph.increment_version(a)  # written behind autograd's back: say so
        return a
    return a.cos_()


def without_autograd(fn: Callable[..., tuple[Tensor, ...]], *args: Tensor) -> tuple[Tensor, ...]:
    r"""``fn(*args)`` in ``torch.inference_mode``, its outputs cloned into ordinary tensors.

    For a CPU's pure computations that need no autograd (closed-form gradients: the sample
    paths' maximization, the GP fit): inference mode spares every operation autograd's
    bookkeeping (version counters, view tracking), much of a small batch's time (docs/design.md),
    with the same values. ``fn`` must keep nothing beyond the call (build its objects from
    ``args``) and call no library that caches tensors: a tensor cached in inference mode (BoTorch's
    constants) breaks that library's later autograd calls.
    """
    with torch.inference_mode():
        out = fn(*args)
    return tuple(t.clone() for t in out)


__all__ = ["cos_", "gpu_path", "rowdot", "without_autograd"]
