r"""Products whose rounding does not depend on how many problems share a batch.

ATen computes a batched product whose (broadcast) batch holds a single element as an
unbatched one (``mm``, and a matrix-vector product as BLAS's ``gemv``), and a larger batch
with a batched kernel; the two round differently (by about one unit in the last place).
A run's result would then depend on how many problems happen to share its batch — the
number of runs launched together, or the problems a batched optimizer still moves after
the others converged (:func:`~fbo_torch.optim.quasi_newton.minimize_batched` drops them) —
and a subset of runs re-run alone would not reproduce the same runs recorded among others
(``benchmarks/reproduce.py``). :func:`matmul` computes a batch of one as the first of two
copies, so every batch goes through the batched kernel, whose rounding is the same for every
batch size (``tests/utils/test_batch_invariant.py``).

That kernel's rounding is the same for every batch *size*, but MKL (torch's BLAS on x86 CPUs)
picks its code path by the operands' memory alignment, so a problem at another offset in a
batch (among other problems than before) rounds differently, by the same ulp. Its conditional
numerical reproducibility mode ``STRICT`` takes the alignment out; ``import fbo_torch`` asks for
it (``MKL_CBWR=AUTO,STRICT``, unless the variable is set) before MKL's first computation, and
:func:`blas_mode` says which mode MKL runs in (recorded with every result). Together: a run
gives the same bits alone, among two runs or among a hundred, on one machine and CPU type.
"""

from __future__ import annotations

import ctypes
import math
import os

import torch
from torch import Tensor

#: ``mkl_cbwr_get``'s mode bits (Intel's ``mkl_cbwr.h``): the code branch, and the strict flag.
_CBWR_BRANCHES = {1: "off", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSE4_2", 8: "AVX", 9: "AVX2", 10: "AVX512_MIC"}
_CBWR_STRICT = 0x10000


def matmul(a: Tensor, b: Tensor) -> Tensor:
    r"""``a @ b`` for batched operands, rounded as in a batch of two or more problems.

    Args:
        a: ``batch_shape x m x k`` (``batch_shape`` broadcast against ``b``'s).
        b: ``batch_shape x k x n``.

    Returns:
        ``batch_shape x m x n``, each problem's product bit for bit the same whatever the
        batch size (a batch of one costs twice that product; any other, nothing more).
    """
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(f"`a` and `b` must be matrices or batches of them, got {a.dim()}-D and {b.dim()}-D.")
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if math.prod(batch) != 1:
        return a @ b
    # two copies that keep each operand's memory layout (a transposed view stays transposed):
    # the batched kernel reads them as it reads every problem of a larger batch
    a2 = a.reshape(-1, *a.shape[-2:])[:1].expand(2, *a.shape[-2:])
    b2 = b.reshape(-1, *b.shape[-2:])[:1].expand(2, *b.shape[-2:])
    return (a2 @ b2)[0].reshape(*batch, a.shape[-2], b.shape[-1])


def blas_mode() -> str:
    r"""The conditional numerical reproducibility mode MKL computes in: ``"AUTO,STRICT"`` (what
    ``import fbo_torch`` asks for: this CPU's fastest branch, independent of memory alignment),
    ``"off"`` (MKL's default, alignment-dependent: the mode was set after MKL's first computation,
    or by the user), another branch, or ``"unavailable"`` where torch has no MKL to ask.

    Returns:
        The mode, as ``MKL_CBWR`` spells it.
    """
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        get = lib.mkl_serv_cbwr_get  # the symbol behind mkl_cbwr_get in torch's static MKL
    except (OSError, AttributeError):
        return "unavailable"
    get.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
    mode = get(-1)  # MKL_CBWR_ALL
    if mode < 0:
        return "unavailable"
    branch = _CBWR_BRANCHES.get(mode & 0xFFFF, str(mode & 0xFFFF))
    return branch + (",STRICT" if mode & _CBWR_STRICT else "")


__all__ = ["blas_mode", "matmul"]
