r"""Where agents search: a box or a finite set, and the settings of its batched maximizer.

:class:`Domain` is the one place the maximizer's options live: a federation's
agents, the YAML ``domain:`` section and a Flower run config's ``domain`` key
all build one (:meth:`Domain.option_defaults` lists the options).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from fbo_torch.optim.batched import (
    REFINE,
    SCREENS,
    BatchedFunction,
    default_max_points,
    maximize_batched,
    maximize_discrete,
)
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.schema import Choice, Integer, Number, Optional, Rule, check_value, document, setting
from fbo_torch.utils.validation import check_bounds, check_finite, check_last_dim, check_ndim

#: ``screen_dtype`` / ``refine_dtype`` names accepted in place of a ``torch.dtype``.
SCREEN_DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: The options that hold a dtype (given by name in YAML).
DTYPE_OPTIONS = ("screen_dtype", "refine_dtype")
_AT_LEAST_1 = Integer(minimum=1)


def dtype_name(dtype: torch.dtype | None) -> str | None:
    """``torch.float32`` -> ``"float32"`` (``None`` stays ``None``)."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


def options_of(domain: Domain) -> dict[str, Any]:
    return {name: getattr(domain, name) for name in Domain.option_defaults()}


def _dtype(key: str, value: Any) -> None:
    if (
        value is not None
        and not (isinstance(value, str) and value in SCREEN_DTYPES)
        and not any(value is dtype for dtype in SCREEN_DTYPES.values())
    ):
        raise ValueError(f"`{key}` must be 'float32', 'float64' or null, got {value!r}.")


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    r"""Validated maximizer options (a subset of :meth:`Domain.option_defaults`), each by its declared check.

    Args:
        options: ``{option: value}``.

    Returns:
        The options, ``screen_dtype`` and ``refine_dtype`` given by name as a ``torch.dtype``.

    Raises:
        ValueError: An unknown option, or a value its check refuses (the message names the option).
    """
    allowed = Domain.option_defaults()
    out = dict(options)
    for name, value in out.items():
        if name not in allowed:
            raise ValueError(f"unknown domain option `{name}`; expected one of {sorted(allowed)}.")
        check_value(Domain, name, value)
        if name in DTYPE_OPTIONS and isinstance(value, str):
            out[name] = SCREEN_DTYPES[value]
    return out


@document
@dataclass
class Domain:
    r"""The search domain of a federation.

    Args:
        bounds: ``2 x d`` box.
        candidates: Optional ``C x d`` finite domain; maximization over it is exact.

    The defaults were chosen with ``benchmarks/maximizer_quality.py``: against
    per-agent ``optimize_acqf`` on the same budget they are as good or better on
    every measured family. The ``φ(x)ᵀω`` search is denser than the own-sample
    search because a short lengthscale makes its restarts decide the result;
    the iteration caps are what a GPU pays for in full (no early exit inside a
    CUDA graph). ``docs/design.md`` ("Domain defaults") has the measurements.

    ``screen_dtype`` and ``refine_dtype`` may be given as a name (``"float32"``, ``"float64"``),
    as in YAML's ``domain:`` section.
    """

    bounds: Tensor
    candidates: Tensor | None = None
    raw_samples: int = setting(
        1024, "Raw points screened per function of the agents' own GP samples (:func:`maximize_batched`).", _AT_LEAST_1
    )
    num_restarts: int = setting(16, "Restarts refined per own GP sample.", _AT_LEAST_1)
    refine: str | None = setting(
        "qn",
        "The gradient refinement of the restarts (:func:`maximize_batched`'s ``refine``; null: none).",
        Optional(Choice(tuple(r for r in REFINE if r is not None))),
    )
    maxiter: int = setting(25, "Refinement iterations per own GP sample.", _AT_LEAST_1)
    lr: float = setting(0.02, "Adam step size in unit-cube coordinates (``refine = adam`` only).", Number())
    max_points: int | None = setting(
        None, "Memory cap on points per batched evaluation (null: by device).", Optional(_AT_LEAST_1)
    )
    raw_samples_rff: int = setting(
        4096,
        "Raw points screened per cheap ``φ(x)ᵀω`` function (messages, server broadcasts): ``M``-feature dot "
        "products, which afford a denser search.",
        _AT_LEAST_1,
    )
    num_restarts_rff: int = setting(32, "Restarts refined per ``φ(x)ᵀω`` function.", _AT_LEAST_1)
    maxiter_rff: int = setting(30, "Refinement iterations per ``φ(x)ᵀω`` function.", _AT_LEAST_1)
    screen_dtype: torch.dtype | str | None = setting(
        torch.float32,
        "Precision of the raw-point screening (``float32``, ``float64``; null: the bounds' dtype): float32 "
        "by default, as the ranking feeds a randomized restart selection and everything after it runs in float64.",
        Rule(_dtype, "half"),
    )
    screen: str = setting(
        "auto",
        "The raw points of a box: ``sobol``, ``product`` (pairs of two Sobol sets on the two halves of the "
        "coordinates, scored as matrix products where the function allows) or ``auto`` (the product set for "
        "``d = 2, 3``, where it was measured as good as the Sobol set).",
        Choice(SCREENS),
    )
    refine_dtype: torch.dtype | str | None = setting(
        torch.float32,
        "Precision of the first phase of the refinement (``float32``, ``float64``; null: all of it in the "
        "bounds' dtype): every restart climbs in float32, the best "
        ":data:`~fbo_torch.optim.batched.POLISH_RESTARTS` of each function finish in float64, so maxima and "
        "values stay float64.",
        Rule(_dtype, "half"),
    )

    def __post_init__(self) -> None:
        check_bounds("bounds", self.bounds)
        if self.candidates is not None:
            check_ndim("candidates", self.candidates, 2, "C x d")
            check_last_dim("candidates", self.candidates, self.dim)
            if self.candidates.shape[0] == 0:
                raise ValueError("`candidates` is empty (0 x d): give at least one point, or None for the box.")
            check_finite("candidates", self.candidates)
        for name, value in check_options(options_of(self)).items():
            object.__setattr__(self, name, value)

    @classmethod
    def option_defaults(cls) -> dict[str, Any]:
        """The maximizer options and their defaults (every field but ``bounds`` and ``candidates``)."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.name not in ("bounds", "candidates")}

    def options(self) -> dict[str, Any]:
        """This domain's maximizer options, as YAML writes them (dtypes by name)."""
        out = options_of(self)
        for name in DTYPE_OPTIONS:
            out[name] = dtype_name(out[name])
        return out

    @property
    def dim(self) -> int:
        return self.bounds.shape[-1]

    @property
    def is_discrete(self) -> bool:
        return self.candidates is not None

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float64) -> Domain:
        cands = None if self.candidates is None else self.candidates.to(device=device, dtype=dtype)
        return dataclasses.replace(self, bounds=self.bounds.to(device=device, dtype=dtype), candidates=cands)

    def random(
        self, batch: int, n: int, generator: torch.Generator | None = None, keys: Tensor | None = None
    ) -> Tensor:
        r"""``batch x n x d`` uniform random points of the domain (from ``keys``: one stream per row)."""
        dev = self.bounds.device
        if self.candidates is not None:
            C = self.candidates.shape[0]
            if keys is not None:
                idx = (kr.uniform(keys.to(dev), n) * C).long().clamp_max(C - 1)
            elif generator is None:
                idx = torch.randint(C, (batch, n), device=dev)
            else:
                idx = torch.randint(C, (batch, n), generator=generator, device=generator.device).to(dev)
            return self.candidates[idx]
        shape = (batch, n, self.dim)
        if keys is not None:
            u = kr.uniform(keys.to(dev), n * self.dim, dtype=self.bounds.dtype).view(shape)
        elif generator is None:
            u = torch.rand(shape, dtype=self.bounds.dtype, device=dev)
        else:
            u = torch.rand(shape, dtype=self.bounds.dtype, device=generator.device, generator=generator).to(dev)
        return self.bounds[0] + u * (self.bounds[1] - self.bounds[0])

    def maximize(
        self,
        fn: BatchedFunction,
        batch: int,
        generator: torch.Generator | None = None,
        region_bounds: Tensor | None = None,
        raw_samples: int | None = None,
        maxiter: int | None = None,
        keys: Tensor | None = None,
        num_restarts: int | None = None,
        line_search: str = "auto",
    ) -> tuple[Tensor, Tensor]:
        r"""Maximize ``batch`` functions ``fn: batch x C x d -> batch x C``.

        On a finite domain the maximization is exact. On a box it is
        multi-start with gradient refinement; ``region_bounds`` (``batch x 2 x d``)
        restricts each problem to its own box. ``keys`` (``batch`` int64) make
        each problem's randomness its own (else drawn from ``generator``).
        ``line_search`` is :func:`~fbo_torch.optim.batched.maximize_batched`'s.
        """
        if self.candidates is not None:
            if region_bounds is None:
                return maximize_discrete(
                    fn, self.candidates, batch, self.max_points or default_max_points(self.bounds.device)
                )
            inside = (
                (self.candidates.unsqueeze(0) >= region_bounds[:, 0:1])
                & (self.candidates.unsqueeze(0) <= region_bounds[:, 1:2])
            ).all(-1)  # batch x C

            def masked(X: Tensor) -> Tensor:  # called once on all candidates (no chunking below)
                return torch.where(inside, fn(X), -torch.inf)

            return maximize_discrete(masked, self.candidates, batch, max_points=batch * self.candidates.shape[0])
        bounds = self.bounds if region_bounds is None else region_bounds
        return maximize_batched(
            fn,
            bounds,
            batch_size=batch,
            raw_samples=raw_samples or self.raw_samples,
            num_restarts=num_restarts or self.num_restarts,
            refine=self.refine,
            maxiter=maxiter or self.maxiter,
            lr=self.lr,
            max_points=self.max_points,
            generator=generator,
            keys=keys,
            validate=False,
            screen_dtype=cast("torch.dtype | None", self.screen_dtype),  # a dtype after __post_init__
            screen=self.screen,
            refine_dtype=cast("torch.dtype | None", self.refine_dtype),
            line_search=line_search,
        )


__all__ = ["DTYPE_OPTIONS", "Domain", "check_options", "dtype_name"]
