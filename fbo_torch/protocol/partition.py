r"""Sub-regions for distributed exploration (DP-FTS-DE Sec. 3.2, thesis App. C.2)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from fbo_torch.utils.constants import constant_tensor
from fbo_torch.utils.validation import check_bounds, check_int, check_last_dim, check_tensor


def _prime_factors(n: int) -> list[int]:
    out, k = [], 2
    while k * k <= n:
        while n % k == 0:
            out.append(k)
            n //= k
        k += 1
    if n > 1:
        out.append(n)
    return out


def default_splits(num_regions: int, dim: int) -> tuple[int, ...]:
    r"""How many equal pieces to cut each dimension into, for ``P`` regions.

    Follows the thesis (App. C.2): in 1-D, ``P`` equal intervals; in higher
    dimensions the prime factors of ``P`` are spread over the leading
    dimensions, largest first, e.g. ``P = 2`` halves the first dimension and
    ``P = 4`` halves the first two (``[0, .5) x [0, .5)``, ``[0, .5) x [.5, 1]``, ...).

    Args:
        num_regions: ``P``.
        dim: ``d``, the number of dimensions.

    Returns:
        ``d`` numbers of pieces, whose product is ``P``.
    """
    P = check_int("num_regions", num_regions, minimum=1)
    dim = check_int("dim", dim, minimum=1)
    splits = [1] * dim
    factors = sorted(_prime_factors(P), reverse=True)
    if dim == 1:
        return (P,)
    for f in factors:
        k = min(range(dim), key=lambda i: (splits[i], i))
        splits[k] *= f
    return tuple(splits)


class SubRegionPartition:
    r"""``P`` disjoint, equal-volume hyper-rectangles covering a box domain.

    Each dimension ``k`` is cut into ``splits[k]`` equal half-open intervals
    (the last one closed), and regions are numbered in row-major order with
    the first dimension varying slowest, matching the thesis' numbering.

    Args:
        bounds: ``2 x d`` domain bounds.
        num_regions: ``P >= 1``.
        splits: Optional explicit pieces per dimension (product must be ``P``).

    Example:
        >>> part = SubRegionPartition(torch.tensor([[0., 0.], [1., 1.]]), 4)
        >>> part.region_of(torch.tensor([[0.2, 0.7]]))   # -> tensor([1])
    """

    def __init__(self, bounds: Tensor, num_regions: int, splits: Sequence[int] | None = None) -> None:
        check_bounds("bounds", bounds)
        P = check_int("num_regions", num_regions, minimum=1)
        d = bounds.shape[-1]
        if splits is None:
            splits = default_splits(P, d)
        else:
            splits = tuple(check_int(f"splits[{i}]", s, minimum=1) for i, s in enumerate(splits))
            if len(splits) > d:
                raise ValueError(f"`splits` has {len(splits)} entries for a {d}-dimensional domain.")
            splits = splits + (1,) * (d - len(splits))
            prod = 1
            for s in splits:
                prod *= s
            if prod != P:
                raise ValueError(f"`splits` {splits} make {prod} regions, not num_regions = {P}.")
        self.bounds = bounds
        self.num_regions = P
        self.splits = tuple(splits)
        strides, acc = [], 1
        for s in reversed(self.splits):
            strides.append(acc)
            acc *= s
        self._strides = tuple(reversed(strides))

    @property
    def dim(self) -> int:
        return self.bounds.shape[-1]

    def region_of(self, X: Tensor, clamp: bool = False) -> Tensor:
        r"""Index of the sub-region containing each point: ``... x d`` → ``...`` (long).

        Points on a shared border belong to the region above it (intervals are
        half-open, the last one closed). Points outside the domain are an error,
        except for rounding: a point within a few ulps of the domain's scale
        outside a bound (e.g. ``lo + u·(hi − lo)`` rounded past ``hi``) counts as
        on that bound.

        Args:
            X: ``... x d`` points; NaN is always an error.
            clamp: Map points outside the domain to the nearest region (each
                coordinate clamped into the bounds) instead of raising.

        Returns:
            ``...`` (long) region indices.

        Raises:
            ValueError: ``X`` holds NaN, or (without ``clamp``) points outside the bounds.
        """
        check_tensor("X", X)
        check_last_dim("X", X, self.dim)
        Xd = X.detach()
        if torch.isnan(Xd).any():
            raise ValueError(f"`X` holds {int(torch.isnan(Xd).sum())} NaN value(s); a NaN point lies in no sub-region.")
        lo, hi = self.bounds[0].to(Xd), self.bounds[1].to(Xd)
        if not clamp:
            # rounding slack: a few ulps of the largest magnitude in the box arithmetic
            slack = 4 * torch.finfo(Xd.dtype).eps * torch.maximum(lo.abs(), hi.abs()).clamp_min(hi - lo)
            outside = (Xd < lo - slack) | (Xd > hi + slack)
            if outside.any():
                raise ValueError(
                    f"`X` has {int(outside.any(-1).sum())} point(s) outside the domain {self.bounds.tolist()} "
                    f"(min {Xd.amin().item():.6g}, max {Xd.amax().item():.6g}); pass clamp=True to map them "
                    "to the nearest sub-region."
                )
        s = constant_tensor(self.splits, dtype=Xd.dtype, device=Xd.device)
        cell = torch.floor((Xd - lo) / (hi - lo) * s)
        cell = torch.minimum(cell.clamp_min(0), s - 1).long()
        strides = constant_tensor(self._strides, dtype=torch.long, device=Xd.device)
        return (cell * strides).sum(-1)

    def region_bounds(self) -> Tensor:
        r"""``P x 2 x d`` bounds of every sub-region."""
        lo, hi = self.bounds[0], self.bounds[1]
        idx = torch.arange(self.num_regions, device=self.bounds.device)
        out = torch.empty(self.num_regions, 2, self.dim, dtype=self.bounds.dtype, device=self.bounds.device)
        for k, (s, stride) in enumerate(zip(self.splits, self._strides, strict=True)):
            cell = (idx // stride) % s
            width = (hi[k] - lo[k]) / s
            out[:, 0, k] = lo[k] + cell.to(self.bounds.dtype) * width
            out[:, 1, k] = lo[k] + (cell + 1).to(self.bounds.dtype) * width
        return out

    def assign_agents(self, num_agents: int) -> Tensor:
        r"""The papers' assignment: agent ``n`` explores region ``n mod P`` (``N`` long)."""
        N = check_int("num_agents", num_agents, minimum=1)
        return torch.arange(N, device=self.bounds.device) % self.num_regions

    def membership(self, assignment: Tensor) -> Tensor:
        r"""``P x N`` booleans: agent ``n`` is assigned to region ``i``."""
        regions = torch.arange(self.num_regions, device=assignment.device).unsqueeze(-1)
        return regions == assignment.unsqueeze(0)

    def sample(
        self,
        regions: Tensor,
        num_points: int,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
    ) -> Tensor:
        r"""Uniform random points inside given regions (distributed exploration).

        Args:
            regions: ``N`` region indices (one per agent).
            num_points: Points per agent.
            generator: Optional generator.
            dtype: The points' dtype (default: the bounds').

        Returns:
            ``N x num_points x d`` points, row ``n`` inside region ``regions[n]``.
        """
        n = check_int("num_points", num_points, minimum=0)
        rb = self.region_bounds()[regions.to(self.bounds.device)]  # N x 2 x d
        dtype = dtype or self.bounds.dtype
        shape = (regions.numel(), n, self.dim)
        if generator is None:
            u = torch.rand(shape, dtype=dtype, device=self.bounds.device)
        else:
            u = torch.rand(shape, dtype=dtype, device=generator.device, generator=generator).to(self.bounds.device)
        lo, hi = rb[:, 0:1, :].to(dtype), rb[:, 1:2, :].to(dtype)
        return lo + u * (hi - lo)

    def __repr__(self) -> str:
        return f"SubRegionPartition(num_regions={self.num_regions}, splits={self.splits})"
