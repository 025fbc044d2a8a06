r"""The map between an Ax search space and the unit cube the FTS models and messages see.

Agents whose search spaces have different bounds still share one
:class:`~fbo_torch.features.RandomFourierFeatures` map on ``[0, 1]^d``, and the
map's lengthscale is a fraction of each parameter's range (see
:mod:`fbo_torch.integrations.ax`).

Requires the ``ax`` extra (``pip install 'fbo_torch[ax]'``, Python >= 3.11).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fbo_torch.integrations._ax_extra import ax_missing

try:
    from ax.core.parameter import ChoiceParameter, FixedParameter, ParameterType, RangeParameter
    from ax.core.search_space import SearchSpace
    from ax.core.types import TParameterization
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ax_missing(__name__) from err

from fbo_torch.features import RandomFourierFeatures

__all__ = ["UnitCube"]


@dataclass(frozen=True)
class UnitCube:
    r"""The map between an Ax search space and ``[0, 1]^d``.

    Each parameter takes coordinates, in the search space's order:

    * a float range parameter, one: ``u = (x - lower) / (upper - lower)``, or
      the same on ``log x`` for a log-scaled one;
    * an integer range parameter, one: the integers ``lower..upper`` widened to
      ``[lower - 0.5, upper + 0.5]`` (its logarithm for a log-scaled one), so
      each value owns an equal cell; a point maps back to the nearest integer
      (as :class:`~fbo_torch.objectives.search_space.Integer` does);
    * an ordered choice of ``k`` values, one: the index ``0..k-1`` relaxed
      the same way;
    * an unordered choice of ``k`` values, ``k``: one-hot; a point maps back
      to the value of its largest coordinate.

    The models and messages see the relaxed continuous cube; a candidate is
    rounded to a valid parameterization only when it becomes a trial, as
    BoTorch's ``Round`` and one-hot input transforms relax mixed spaces. Fixed
    parameters take no coordinate and are passed through unchanged.

    Attributes:
        names: The ``d`` coordinates' names: a parameter's name, or
            ``"name=value"`` for a one-hot coordinate.
        parameters: The Ax parameters that take coordinates.
        fixed: Values of the fixed parameters.
    """

    names: tuple[str, ...]
    parameters: tuple[RangeParameter | ChoiceParameter, ...]
    fixed: Mapping[str, Any]

    @classmethod
    def from_search_space(cls, search_space: SearchSpace) -> UnitCube:
        r"""Check that ``search_space`` is supported and build its map.

        Raises:
            ValueError: A logit-scaled or derived parameter, parameter
                constraints, a hierarchical search space, or nothing to optimize.
        """
        if search_space.parameter_constraints:
            raise ValueError(
                "The search space has parameter constraints "
                f"({', '.join(str(c) for c in search_space.parameter_constraints)}); "
                "FTS on Ax supports box-bounded parameters only."
            )
        if search_space.is_hierarchical:
            raise ValueError("The search space is hierarchical; FTS on Ax supports flat search spaces only.")
        names: list[str] = []
        params: list[RangeParameter | ChoiceParameter] = []
        fixed: dict[str, Any] = {}
        for name, p in search_space.parameters.items():
            if isinstance(p, FixedParameter):
                fixed[name] = p.value
            elif (
                isinstance(p, RangeParameter)
                and not p.logit_scale
                and p.parameter_type in (ParameterType.FLOAT, ParameterType.INT)
            ):
                names.append(name)
                params.append(p)
            elif isinstance(p, ChoiceParameter):  # (hierarchical ones are refused above)
                names.extend([name] if p.is_ordered else [f"{name}={v}" for v in p.values])
                params.append(p)
            else:
                kind = type(p).__name__
                if isinstance(p, RangeParameter):
                    kind = "logit-scaled" if p.logit_scale else f"{p.parameter_type.name.lower()} range parameter"
                raise ValueError(
                    f"Parameter {name!r} ({kind}) is not supported: FTS on Ax supports float and integer range "
                    "parameters (linear or log scaling), ordered and unordered choice parameters, and fixed parameters."
                )
        if not names:
            raise ValueError("The search space has no parameter to optimize.")
        return cls(tuple(names), tuple(params), dict(fixed))

    @property
    def dim(self) -> int:
        """``d``, the number of coordinates (a one-hot choice of ``k`` values takes ``k``)."""
        return len(self.names)

    def _span(self, p: RangeParameter | ChoiceParameter) -> tuple[float, float]:
        """The interval a relaxed parameter's coordinate maps onto (log scale for a log-scaled range)."""
        if isinstance(p, ChoiceParameter):
            return -0.5, len(p.values) - 0.5
        lo, hi = float(p.lower), float(p.upper)
        if p.parameter_type == ParameterType.INT:
            lo, hi = lo - 0.5, hi + 0.5
        return (math.log(lo), math.log(hi)) if p.log_scale else (lo, hi)

    def _coordinates(self, p: RangeParameter | ChoiceParameter, value: Any) -> list[float]:
        if isinstance(p, ChoiceParameter):
            if value not in p.values:
                raise ValueError(f"Parameter {p.name!r} has value {value!r}, not one of its choices {p.values}.")
            index = p.values.index(value)
            if not p.is_ordered:
                return [1.0 if i == index else 0.0 for i in range(len(p.values))]
            value = index
        x = float(value)
        if isinstance(p, RangeParameter) and p.log_scale:
            x = math.log(max(x, torch.finfo(torch.float64).tiny))
        a, b = self._span(p)
        return [(x - a) / (b - a)]

    def to_unit(self, parameterizations: Sequence[Mapping[str, Any]]) -> Tensor:
        r"""``n x d`` float64 unit-cube coordinates of ``n`` parameterizations."""
        rows = []
        for params in parameterizations:
            try:
                rows.append([u for p in self.parameters for u in self._coordinates(p, params[p.name])])
            except KeyError as err:
                raise ValueError(f"A parameterization lacks parameter {err.args[0]!r}: {dict(params)}.") from None
        return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), self.dim)

    def from_unit(self, u: Tensor) -> TParameterization:
        r"""The parameterization at unit-cube point ``u`` (``d``): clamped into the bounds, integers and
        ordered choices rounded to the nearest value, a one-hot choice the value of its largest coordinate."""
        if u.shape != (self.dim,):
            raise ValueError(
                f"`u` must be a point of the {self.dim}-dimensional unit cube, got shape {tuple(u.shape)}."
            )
        coords = u.detach().to(dtype=torch.float64, device="cpu").clamp(0.0, 1.0).tolist()
        out: dict[str, Any] = {}
        i = 0
        for p in self.parameters:
            if isinstance(p, ChoiceParameter) and not p.is_ordered:
                k = len(p.values)
                block = coords[i : i + k]
                out[p.name] = p.values[max(range(k), key=block.__getitem__)]
                i += k
                continue
            a, b = self._span(p)
            z = a + coords[i] * (b - a)
            i += 1
            if isinstance(p, ChoiceParameter):
                out[p.name] = p.values[min(max(math.floor(z + 0.5), 0), len(p.values) - 1)]
                continue
            v = math.exp(z) if p.log_scale else z
            if p.parameter_type == ParameterType.INT:
                v = math.floor(v + 0.5)
            out[p.name] = p.cast(min(max(v, p.lower), p.upper))
        out.update(self.fixed)
        return out


def _check_features(features: object, cube: UnitCube | None = None) -> RandomFourierFeatures:
    if not isinstance(features, RandomFourierFeatures):
        raise TypeError(f"`features` must be a fbo_torch RandomFourierFeatures, got {type(features).__name__}.")
    if cube is not None and features.dim != cube.dim:
        raise ValueError(
            f"`features` maps {features.dim}-dimensional inputs but the experiment's search space has {cube.dim} "
            f"coordinates {list(cube.names)}; build the shared RandomFourierFeatures with dim={cube.dim}."
        )
    return features
