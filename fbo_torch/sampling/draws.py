r"""Standard normal and uniform draws from an optional ``torch.Generator``.

The draws are made on the generator's own device and then moved, so a CPU
generator gives the same numbers whatever device the model lives on.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def standard_normal(shape: Sequence[int], like: Tensor, generator: torch.Generator | None = None) -> Tensor:
    r"""``shape`` standard normals with ``like``'s dtype and device, from ``generator`` if given."""
    if generator is None:
        return torch.randn(tuple(shape), dtype=like.dtype, device=like.device)
    z = torch.randn(tuple(shape), dtype=like.dtype, device=generator.device, generator=generator)
    return z.to(like.device)


def uniform(shape: Sequence[int], like: Tensor, generator: torch.Generator | None = None) -> Tensor:
    r"""``shape`` draws of ``U(0, 1)`` with ``like``'s dtype and device, from ``generator`` if given."""
    if generator is None:
        return torch.rand(tuple(shape), dtype=like.dtype, device=like.device)
    return torch.rand(tuple(shape), dtype=like.dtype, device=generator.device, generator=generator).to(like.device)


__all__ = ["standard_normal", "uniform"]
