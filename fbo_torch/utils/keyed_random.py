r"""Counter-based random numbers: one reproducible stream per agent, on any device.

A federation needs random numbers that belong to an *agent*, not to a batch:
agent 17's Thompson sample in round 5 must be the same whether it is computed
in a simulator that batches 10,000 agents, alone on a phone (a Flower client),
or after a resume. ``torch.Generator`` cannot give that without one generator
(and one kernel launch) per agent, and a CPU generator feeding CUDA tensors
costs a host-device copy per draw.

Here every random number is a pure function of an integer **key** and a
**counter**: ``u = mix64(key + (j + 1)·γ)`` for the ``j``-th number of a row,
with SplitMix64's increment ``γ`` and finalizer ``mix64`` (Steele, Lea &
Flood, 2014; the generator behind Java's ``SplittableRandom``). Keys are
derived by folding integers into a parent key (``fold(key, round)``), so a
tensor of ``B`` agent keys yields ``B`` independent streams in one batched
tensor computation of about 15 elementwise operations, whatever ``B``.

Properties:

* **Batch-independent**: row ``b`` of ``uniform(keys, n)`` depends only on
  ``keys[b]`` and ``n``'s first entries (a prefix of a longer draw is the
  shorter draw).
* **Device-independent**: the integer arithmetic (64-bit wrap-around
  multiplication, logical shifts, xor) is exact on every CPU and GPU, so
  uniforms are **bit-identical on CPU and CUDA**. Normals go through
  ``log``/``cos`` (Box–Muller) and agree across devices to a few ulp.
* **No host synchronization**, no generator state to checkpoint: a round's
  draws are recomputed from ``(seed, agent, round, purpose)``.

This is not a cryptographic generator. SplitMix64 passes BigCrush; we only
need independent-looking streams for Monte Carlo and randomized search, and the
tests check moments and independence of the draws.
"""

from __future__ import annotations

import hashlib
import math
from typing import overload

import torch
from torch import Tensor

_M64 = (1 << 64) - 1


def _signed(x: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    x &= _M64
    return x - (1 << 64) if x >= 1 << 63 else x


_GAMMA = _signed(0x9E3779B97F4A7C15)
_C1 = _signed(0xBF58476D1CE4E5B9)
_C2 = _signed(0x94D049BB133111EB)


def _shr(z: Tensor, k: int, out: Tensor) -> Tensor:
    """Logical right shift of int64 bits into ``out`` (may be ``z``): torch's ``>>`` is arithmetic,
    so the ``k`` sign copies it shifts in are masked off."""
    return torch.bitwise_right_shift(z, k, out=out).bitwise_and_((1 << (64 - k)) - 1)


def mix64(z: Tensor) -> Tensor:
    r"""SplitMix64's finalizer on an int64 tensor (bits as unsigned 64-bit)."""
    return _mix64_(z.clone())


def _mix64_(z: Tensor) -> Tensor:
    r""":func:`mix64` in place on a tensor the caller owns, with one scratch tensor: the same
    operations, without a fresh ``z``-sized tensor per operation (on a CPU each costs its pages'
    faults)."""
    t = torch.empty_like(z)
    for shift, mult in ((30, _C1), (27, _C2), (31, None)):
        z.bitwise_xor_(_shr(z, shift, out=t))
        if mult is not None:
            z.mul_(mult)
    return z


def _mix64_int(z: int) -> int:
    """:func:`mix64` for one Python integer (host side; used to build keys)."""
    z &= _M64
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & _M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def stream_id(name: str) -> int:
    """A stable 63-bit integer for a purpose name (``"omega"``, ``"raw_points"``, ...)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") >> 1


def root_key(seed: int, *parts: int | str) -> int:
    r"""A key (Python int, as int64 bits) from a seed and further integers or names."""
    k = _mix64_int(int(seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019)
    for p in parts:
        k = _mix64_int(k ^ (_mix64_int(stream_id(p) if isinstance(p, str) else int(p)) + 0x9E3779B97F4A7C15))
    return _signed(k)


@overload
def fold(keys: int, value: int | str) -> int: ...
@overload
def fold(keys: Tensor, value: Tensor | int | str) -> Tensor: ...
@overload
def fold(keys: Tensor | int, value: Tensor) -> Tensor: ...
@overload
def fold(keys: Tensor | int, value: Tensor | int | str) -> Tensor | int: ...
def fold(keys: Tensor | int, value: Tensor | int | str) -> Tensor | int:
    r"""Child keys: ``keys`` (int64 tensor, or a Python int) combined with ``value``.

    ``value`` may be an int, a purpose name, or an int64 tensor broadcasting
    with ``keys`` (e.g. agent indices). ``fold(k, a)`` for distinct ``a`` gives
    unrelated streams; folding is how a key for (agent, round, purpose) is made.
    """
    if isinstance(value, str):
        value = stream_id(value)
    if not isinstance(keys, Tensor) and not isinstance(value, Tensor):
        return _signed(_mix64_int((keys & _M64) ^ ((_mix64_int(int(value)) + 0x9E3779B97F4A7C15) & _M64)))
    if not isinstance(keys, Tensor) and isinstance(value, Tensor):  # (both ints returned above)
        keys = torch.full((), _signed(keys), dtype=torch.int64, device=value.device)  # a fill: no host copy
    assert isinstance(keys, Tensor)
    v: Tensor | int
    if isinstance(value, Tensor):
        v = mix64(value.to(device=keys.device, dtype=torch.int64)) + _GAMMA
    else:
        v = _signed(_mix64_int(int(value)) + 0x9E3779B97F4A7C15)
    return _mix64_(keys ^ v)


def random_bits(keys: Tensor, n: int, offset: int = 0) -> Tensor:
    r"""``keys.shape x n`` int64 words of each key's stream (counters ``offset .. offset+n-1``)."""
    if keys.dtype != torch.int64:
        raise TypeError(f"`keys` must be an int64 tensor, got {keys.dtype}.")
    j = torch.arange(offset + 1, offset + n + 1, dtype=torch.int64, device=keys.device)
    return _mix64_(keys.unsqueeze(-1) + j * _GAMMA)


def uniform(keys: Tensor, n: int, dtype: torch.dtype = torch.float64, offset: int = 0) -> Tensor:
    r"""Uniform ``[0, 1)`` numbers, ``keys.shape x n``, 53 random bits each.

    Bit-identical on every device. ``dtype`` other than float64 is a cast of
    the float64 values (float32 may round up to exactly 1.0 for the top 2⁻²⁵
    of the range; use float64 where that matters).
    """
    bits = random_bits(keys, n, offset)
    bits = _shr(bits, 11, out=bits)  # the top 53 bits
    u = bits.to(torch.float64).mul_(2.0**-53)
    return u if dtype == torch.float64 else u.to(dtype)


def normal(keys: Tensor, n: int, dtype: torch.dtype = torch.float64, offset: int = 0) -> Tensor:
    r"""Standard normals, ``keys.shape x n``, by Box–Muller on the key's stream.

    Uses counters ``offset .. offset + 2⌈n/2⌉ - 1``: each pair of uniforms gives
    two normals (``r cos θ``, ``r sin θ``).
    """
    m = (n + 1) // 2
    u = uniform(keys, 2 * m, offset=offset)
    u1, u2 = u[..., :m], u[..., m:]
    r = u1.neg().log1p_().mul_(-2.0).sqrt_()  # √(−2 log(1 − u1)); 1 − u1 ∈ (0, 1]: finite
    theta = u2.mul_(2.0 * math.pi)
    z = torch.empty_like(u)  # [r cos θ, r sin θ], written in place
    torch.cos(theta, out=z[..., :m]).mul_(r)
    torch.sin(theta, out=z[..., m:]).mul_(r)
    z = z[..., :n]
    return z if dtype == torch.float64 else z.to(dtype)


def gumbel(keys: Tensor, n: int, dtype: torch.dtype = torch.float64, offset: int = 0) -> Tensor:
    r"""Standard Gumbel numbers ``-log(-log u)``, ``keys.shape x n`` (finite)."""
    g = uniform(keys, n, offset=offset).clamp_(min=2.0**-60).log_().neg_().log_().neg_()  # −log(−log u)
    return g if dtype == torch.float64 else g.to(dtype)


def keys_from_generator(
    shape: tuple[int, ...] | torch.Size, generator: torch.Generator | None, device: torch.device | str | None = None
) -> Tensor:
    r"""Fresh keys drawn from a ``torch.Generator`` (or the global RNG), for callers
    that hold a generator rather than keys; moved to ``device``."""
    gdev = generator.device if generator is not None else torch.device("cpu")
    k = torch.randint(-(2**63), 2**63 - 1, tuple(shape), dtype=torch.int64, generator=generator, device=gdev)
    return k.to(device) if device is not None else k


__all__ = [
    "fold",
    "gumbel",
    "keys_from_generator",
    "mix64",
    "normal",
    "random_bits",
    "root_key",
    "stream_id",
    "uniform",
]
