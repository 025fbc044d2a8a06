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
            instead of allocating a tensor of its size (a fresh allocation of a few MB page-faults
            on every call: measured 2.9 ms instead of 0.27 ms for the product above).

    Returns:
        ``... x batch_shape x C``.

    On the GPU path one batched GEMV (one kernel, ``a`` read once). On a CPU an
    elementwise product and a sum over ``F``: measured on a 2-core AMD EPYC
    (torch 2.13, one thread), a batched ``matmul`` with a single column runs at
    ~1 GFLOP/s — 0.88 ms for ``200 x 16 x 256`` in float64 or float32 — against
    0.27 ms (float64) / 0.13 ms (float32) for product and sum. Both sum the same
    ``F`` products; they differ by rounding only (order of the sum, fused multiply-adds).
    """
    if gpu_path(a.device):
        return (a @ w).squeeze(-1)
    return (a.mul_(w.mT) if overwrite else a * w.mT).sum(-1)


def cos_(a: Tensor) -> Tensor:
    r"""``a.cos_()``: the cosine in place (``a`` must not record gradients).

    On a CPU with at most two torch threads, a contiguous float32 tensor takes NumPy's
    cosine (its SIMD float32 kernel): measured on a 2-core AMD EPYC (AVX-512, torch 2.13,
    NumPy 2.4) 0.28 ms for 2^19 values against torch's 0.68 ms on one thread and 0.34 ms
    on two, with a maximum error of 0.57 float32 epsilon against torch's 0.30 (arguments
    up to ±200). Float32 path evaluations are what the maximizers screen raw points with
    (ranking only); a float32 result therefore depends, in its last bits, on the number of
    torch threads. Everything else (float64, a GPU, more threads) takes torch's.
    """
    if (a.dtype == torch.float32 and a.device.type == "cpu" and not gpu_path(a.device)
            and torch.get_num_threads() <= 2 and a.is_contiguous() and not a.requires_grad):
        out = a.numpy()
        np.cos(out, out=out)
        torch.autograd.graph.increment_version(a)  # written behind autograd's back: say so
        return a
    return a.cos_()


__all__ = ["cos_", "gpu_path", "rowdot"]
