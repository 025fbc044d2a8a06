r"""Typed hyperparameter search spaces for tuning objectives and YAML configs.

Bayesian optimization works in the unit cube ``[0, 1]^d``; a model is trained
with native hyperparameter values (``C = 0.3``, ``batch_size = 32``, ...). A
:class:`SearchSpace` is the ordered list of named parameters that maps between
the two, batched over tensors:

    >>> space = SearchSpace([Real("C", 1e-4, 10, log=True), Real("gamma", 1e-2, 10, log=True)])
    >>> space.to_native(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    tensor([[0.0316, 0.3162]], dtype=torch.float64)
    >>> space.to_dict(torch.tensor([0.5, 0.5]))
    {'C': 0.0316..., 'gamma': 0.3162...}

Mappings (``u`` in ``[0, 1]``, ``v`` native):

* :class:`Real`, linear: ``v = low + u (high - low)``.
* :class:`Real`, ``log=True``: ``log v = log low + u (log high - log low)``, so
  ``u = 0.5`` maps to the geometric mean ``√(low · high)``. Needs ``low > 0``.
* :class:`Integer`: the integers ``low, ..., high`` are widened to the
  continuous range ``[low - 0.5, high + 0.5]``, ``u`` is mapped onto that range
  (linearly, or in log space with ``log=True``, which needs ``low >= 1``) and the
  result is **rounded half up in native space** (``floor(z + 0.5)``) and clipped
  to ``[low, high]``. With the linear mapping every integer therefore owns an
  equal share ``1 / (high - low + 1)`` of the unit interval, the end points
  included; :meth:`SearchSpace.from_native` maps an integer back to the centre
  of its cell (in the transformed space), so ``to_native(from_native(v)) == v``.

Real parameters round-trip exactly up to floating-point error:
``from_native(to_native(U)) ≈ U`` and ``to_native(from_native(V)) ≈ V``.

YAML / dict form (:meth:`SearchSpace.from_dict`, :meth:`SearchSpace.to_config`)::

    C:          {low: 1.0e-4, high: 10, log: true}
    gamma:      {low: 1.0e-2, high: 10, log: true}
    batch_size: {low: 20, high: 60, type: int}
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fbo_torch.objectives.base import Objective
from fbo_torch.utils.validation import check_finite, check_floating, check_last_dim, check_tensor

#: Unit-cube points may stray this far outside ``[0, 1]`` (optimizer round-off)
#: before :meth:`SearchSpace.to_native` refuses them; they are clipped.
UNIT_TOL = 1e-6

_REAL_TYPES = ("real", "float", "continuous")
_INT_TYPES = ("int", "integer")
_CONFIG_KEYS = ("low", "high", "log", "type")


def _number(name: str, what: str, value: Any) -> float:
    # PyYAML reads ``1e-4`` (no dot) as a string; accept numeric strings.
    if isinstance(value, bool):
        raise TypeError(f"`{name}`: `{what}` must be a number, got {value!r}.")
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise TypeError(f"`{name}`: `{what}` must be a number, got the string {value!r}.") from None
    if isinstance(value, Tensor) and value.numel() == 1:
        return float(value.item())
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"`{name}`: `{what}` must be a number, got {type(value).__name__}.") from None


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"A parameter name must be a non-empty string, got {name!r}.")
    return name


@dataclass(frozen=True)
class Real:
    r"""A continuous hyperparameter on ``[low, high]``.

    Args:
        name: Parameter name (unique within a search space).
        low: Lower bound.
        high: Upper bound, ``> low``.
        log: Map the unit interval in log space (for scale parameters such as
            learning rates, L2 penalties, SVM ``C`` and ``γ``); needs ``low > 0``.
    """

    name: str
    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        _check_name(self.name)
        low = _number(self.name, "low", self.low)
        high = _number(self.name, "high", self.high)
        if not isinstance(self.log, bool):
            raise TypeError(f"`{self.name}`: `log` must be a bool, got {self.log!r}.")
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError(f"`{self.name}`: bounds must be finite, got low={low}, high={high}.")
        if not low < high:
            raise ValueError(f"`{self.name}`: `low` must be < `high`, got low={low}, high={high}.")
        if self.log and low <= 0:
            raise ValueError(f"`{self.name}`: a log-scale parameter needs low > 0, got low={low}.")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    is_integer = False

    # the transformed interval [a, b] that u in [0, 1] is mapped onto linearly
    def _span(self) -> tuple[float, float]:
        if self.log:
            return math.log(self.low), math.log(self.high)
        return self.low, self.high


@dataclass(frozen=True)
class Integer:
    r"""An integer hyperparameter taking the values ``low, low + 1, ..., high``.

    See the module docstring for the mapping: the unit interval is split into
    ``high - low + 1`` cells (equal width for ``log=False``), one per integer,
    by rounding half up in native space.

    Args:
        name: Parameter name (unique within a search space).
        low: Smallest value (an integer).
        high: Largest value (an integer ``> low``).
        log: Map the unit interval in log space (cells shrink for large values);
            needs ``low >= 1``.
    """

    name: str
    low: int
    high: int
    log: bool = False

    def __post_init__(self) -> None:
        _check_name(self.name)
        vals = []
        for what, v in (("low", self.low), ("high", self.high)):
            f = _number(self.name, what, v)
            if not (math.isfinite(f) and f == int(f)):
                raise ValueError(f"`{self.name}`: `{what}` of an integer parameter must be an integer, got {v!r}.")
            vals.append(int(f))
        low, high = vals
        if not isinstance(self.log, bool):
            raise TypeError(f"`{self.name}`: `log` must be a bool, got {self.log!r}.")
        if not low < high:
            raise ValueError(f"`{self.name}`: `low` must be < `high`, got low={low}, high={high}.")
        if self.log and low < 1:
            raise ValueError(f"`{self.name}`: a log-scale integer parameter needs low >= 1, got low={low}.")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    is_integer = True

    def _span(self) -> tuple[float, float]:
        a, b = self.low - 0.5, self.high + 0.5
        if self.log:
            return math.log(a), math.log(b)
        return a, b


#: A parameter of a search space: :class:`Real` or :class:`Integer`.
Parameter = Real | Integer


class SearchSpace:
    r"""An ordered set of named hyperparameters, mapped to/from ``[0, 1]^d``.

    Args:
        parameters: The :class:`Real` / :class:`Integer` parameters, in the
            order of the unit-cube coordinates.

    Attributes:
        parameters: The parameters (a tuple).
        names: Their names, in order.
        dim: Number of parameters ``d``.
        bounds: ``2 x d`` unit-cube bounds (float64), what BO optimizes over.
        native_bounds: ``2 x d`` native ``[low, high]`` per parameter (float64).
    """

    def __init__(self, parameters: Sequence[Parameter]) -> None:
        if isinstance(parameters, (Real, Integer)) or not isinstance(parameters, Sequence):
            raise TypeError(
                f"`parameters` must be a sequence of Real/Integer parameters, got {type(parameters).__name__}."
            )
        params = tuple(parameters)
        if not params:
            raise ValueError("`parameters` must hold at least one parameter.")
        for i, p in enumerate(params):
            if not isinstance(p, (Real, Integer)):
                raise TypeError(f"`parameters[{i}]` must be a Real or Integer, got {type(p).__name__}.")
        names = [p.name for p in params]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"Parameter names must be unique, got duplicates {dup}.")
        self.parameters: tuple[Parameter, ...] = params
        self._index = {n: i for i, n in enumerate(names)}
        spans = [p._span() for p in params]
        self._a = torch.tensor([s[0] for s in spans], dtype=torch.float64)
        self._b = torch.tensor([s[1] for s in spans], dtype=torch.float64)
        self._log = torch.tensor([p.log for p in params])
        self._int = torch.tensor([p.is_integer for p in params])

    # ------------------------------------------------------------ structure
    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parameters]

    @property
    def dim(self) -> int:
        return len(self.parameters)

    @property
    def bounds(self) -> Tensor:
        return torch.stack([torch.zeros(self.dim, dtype=torch.float64), torch.ones(self.dim, dtype=torch.float64)])

    @property
    def native_bounds(self) -> Tensor:
        return torch.tensor(
            [[float(p.low) for p in self.parameters], [float(p.high) for p in self.parameters]],
            dtype=torch.float64,
        )

    def __len__(self) -> int:
        return self.dim

    def __iter__(self) -> Iterator[Parameter]:
        return iter(self.parameters)

    def __getitem__(self, name: str) -> Parameter:
        try:
            return self.parameters[self._index[name]]
        except KeyError:
            raise KeyError(f"No parameter named {name!r}; the search space has {self.names}.") from None

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def index(self, name: str) -> int:
        """Position of parameter ``name`` in the unit-cube coordinates."""
        self[name]
        return self._index[name]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SearchSpace) and self.parameters == other.parameters

    def __hash__(self) -> int:
        return hash(self.parameters)

    def __repr__(self) -> str:
        inner = ", ".join(repr(p) for p in self.parameters)
        return f"SearchSpace([{inner}])"

    # -------------------------------------------------------------- mapping
    def _consts(self, ref: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        a, b = self._a.to(device=ref.device, dtype=ref.dtype), self._b.to(device=ref.device, dtype=ref.dtype)
        return a, b, self._log.to(ref.device), self._int.to(ref.device)

    def to_native(self, U: Tensor) -> Tensor:
        r"""Map unit-cube points to native values.

        Args:
            U: ``... x d`` points in ``[0, 1]^d`` (values up to ``1e-6`` outside
                are clipped; further out raises ``ValueError``).

        Returns:
            ``... x d`` native values, same dtype/device as ``U``; ``0`` and ``1``
            map exactly onto ``low`` and ``high``; integer parameters hold
            integral values (see the module docstring for the rounding).
        """
        check_tensor("U", U)
        check_floating("U", U)
        check_last_dim("U", U, self.dim)
        check_finite("U", U)
        if ((U < -UNIT_TOL) | (U > 1 + UNIT_TOL)).any():
            raise ValueError(
                f"`U` must lie in the unit cube [0, 1]^{self.dim}, got values in "
                f"[{U.amin().item():.4g}, {U.amax().item():.4g}]."
            )
        U = U.clamp(0.0, 1.0)
        a, b, is_log, is_int = self._consts(U)
        z = a + U * (b - a)
        z = torch.where(is_log, torch.exp(z), z)
        z = torch.where(is_int, torch.floor(z + 0.5), z)
        nb = self.native_bounds.to(U)
        z = torch.minimum(torch.maximum(z, nb[0]), nb[1])
        # the corners map exactly onto the bounds (exp(log(low)) may be off by an ulp)
        return torch.where(U == 0, nb[0], torch.where(U == 1, nb[1], z))

    def from_native(self, V: Tensor) -> Tensor:
        r"""Map native values to unit-cube points (inverse of :meth:`to_native`).

        Args:
            V: ``... x d`` native values inside ``[low, high]`` per parameter
                (relative tolerance ``1e-9``); integer parameters are rounded half
                up to the nearest integer first.

        Returns:
            ``... x d`` points in ``[0, 1]^d``, same dtype/device as ``V``.
            Integers map to the centre of their cell.
        """
        check_tensor("V", V)
        if not V.is_floating_point():
            V = V.to(torch.float64)
        check_last_dim("V", V, self.dim)
        check_finite("V", V)
        nb = self.native_bounds.to(V)
        tol = 1e-9 * torch.maximum(nb.abs().amax(0), torch.ones_like(nb[0]))
        bad = (V < nb[0] - tol) | (V > nb[1] + tol)
        if bad.any():
            col = int(bad.reshape(-1, self.dim).any(0).nonzero()[0])
            p = self.parameters[col]
            vals = V[..., col]
            raise ValueError(
                f"`V`: values of `{p.name}` must lie in [{p.low}, {p.high}], got values in "
                f"[{vals.amin().item():.6g}, {vals.amax().item():.6g}]."
            )
        a, b, is_log, is_int = self._consts(V)
        V = torch.minimum(torch.maximum(V, nb[0]), nb[1])
        V = torch.where(is_int, torch.floor(V + 0.5), V)
        z = torch.where(is_log, torch.log(V.clamp_min(torch.finfo(V.dtype).tiny)), V)
        return ((z - a) / (b - a)).clamp(0.0, 1.0)

    # ---------------------------------------------------------- named values
    def _row_to_dict(self, row: Sequence[float]) -> dict[str, float | int]:
        return {
            p.name: (int(round(v)) if p.is_integer else float(v)) for p, v in zip(self.parameters, row, strict=True)
        }

    def to_dict(self, u: Tensor | Sequence[float]) -> dict[str, float | int]:
        r"""Native named values of one unit-cube point.

        Args:
            u: A ``d`` point (tensor or sequence) in ``[0, 1]^d``.

        Returns:
            ``{name: value}`` in parameter order; ``int`` for integer parameters,
            ``float`` otherwise.
        """
        u = torch.as_tensor(u, dtype=torch.float64) if not isinstance(u, Tensor) else u
        if not u.is_floating_point():
            u = u.to(torch.float64)
        if u.ndim != 1:
            raise ValueError(f"`u` must be a single point of shape (d,) = ({self.dim},), got {tuple(u.shape)}.")
        return self._row_to_dict(self.to_native(u.detach()).cpu().tolist())

    def to_dicts(self, U: Tensor) -> list[Any]:
        r"""Native named values of a batch of unit-cube points.

        Args:
            U: ``... x d`` points (at least 2 dimensions).

        Returns:
            Nested lists of ``{name: value}`` dicts with the batch shape ``...``
            (e.g. ``k x q x d`` gives ``k`` lists of ``q`` dicts).
        """
        check_tensor("U", U)
        if U.ndim < 2:
            raise ValueError(f"`U` must have shape ... x d with at least one batch dimension, got {tuple(U.shape)}.")
        batch = tuple(U.shape[:-1])
        rows = [self._row_to_dict(r) for r in self.to_native(U.detach()).reshape(-1, self.dim).cpu().tolist()]

        def nest(flat: list[Any], shape: tuple[int, ...]) -> list[Any]:
            if len(shape) == 1:
                return flat
            step = math.prod(shape[1:])
            return [nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]

        return nest(rows, batch)

    def from_values(
        self,
        values: Mapping[str, float],
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> Tensor:
        r"""Unit-cube point of named native values (inverse of :meth:`to_dict`).

        Args:
            values: ``{name: native value}`` with exactly the parameters' names.
            dtype: Floating dtype of the result.
            device: Device of the result.

        Returns:
            A ``d`` tensor in ``[0, 1]^d``.
        """
        if not isinstance(values, Mapping):
            raise TypeError(f"`values` must be a mapping name -> value, got {type(values).__name__}.")
        unknown = sorted(set(values) - set(self.names))
        missing = [n for n in self.names if n not in values]
        if unknown or missing:
            raise ValueError(
                f"`values` must name exactly the parameters {self.names}; unknown: {unknown}, missing: {missing}."
            )
        row = [_number(n, "value", values[n]) for n in self.names]
        return self.from_native(torch.tensor(row, dtype=dtype, device=device))

    # ----------------------------------------------------------- dict / YAML
    @classmethod
    def from_dict(cls, config: SearchSpace | Mapping[str, Mapping[str, Any]]) -> SearchSpace:
        r"""Build a search space from its dict / YAML form.

        Args:
            config: ``{name: {"low": ..., "high": ..., "log": bool, "type":
                "real" | "int"}}`` in coordinate order. ``log`` defaults to
                ``False`` and ``type`` to ``"real"`` (``"float"``/``"continuous"``
                and ``"integer"`` are accepted too). Numeric strings such as
                ``"1e-4"`` (which PyYAML does not read as floats) are accepted.
                A :class:`SearchSpace` is returned as it is.

        Returns:
            The :class:`SearchSpace`.

        Raises:
            ValueError: Unknown keys, missing ``low``/``high``, ``low >= high``,
                ``log`` with ``low <= 0`` (``< 1`` for integers), unknown type.
        """
        if isinstance(config, SearchSpace):
            return config
        if not isinstance(config, Mapping):
            raise TypeError(
                "A search-space config must be a mapping {name: {low, high, log, type}}, "
                f"got {type(config).__name__}."
            )
        if not config:
            raise ValueError("A search-space config must define at least one parameter.")
        params: list[Parameter] = []
        for name, spec in config.items():
            _check_name(name)
            if not isinstance(spec, Mapping):
                raise TypeError(
                    f"Search-space entry `{name}` must be a mapping with keys {list(_CONFIG_KEYS)}, "
                    f"got {type(spec).__name__}."
                )
            unknown = sorted(set(map(str, spec)) - set(_CONFIG_KEYS))
            if unknown:
                raise ValueError(
                    f"Search-space entry `{name}` has unknown key(s) {unknown}; allowed: {list(_CONFIG_KEYS)}."
                )
            missing = [k for k in ("low", "high") if k not in spec]
            if missing:
                raise ValueError(f"Search-space entry `{name}` is missing {missing}.")
            kind = str(spec.get("type", "real")).lower()
            log = spec.get("log", False)
            if not isinstance(log, bool):
                raise TypeError(f"Search-space entry `{name}`: `log` must be true/false, got {log!r}.")
            if kind in _REAL_TYPES:
                params.append(Real(name, spec["low"], spec["high"], log=log))
            elif kind in _INT_TYPES:
                params.append(Integer(name, spec["low"], spec["high"], log=log))
            else:
                raise ValueError(
                    f"Search-space entry `{name}`: unknown type {spec.get('type')!r}; "
                    f"use one of {list(_REAL_TYPES + _INT_TYPES)}."
                )
        return cls(params)

    def to_config(self) -> dict[str, dict[str, Any]]:
        """The dict / YAML form accepted by :meth:`from_dict`."""
        return {
            p.name: {"low": p.low, "high": p.high, "log": p.log, "type": "int" if p.is_integer else "real"}
            for p in self.parameters
        }


def as_search_space(
    search_space: SearchSpace | Mapping[str, Mapping[str, Any]] | None,
    default: SearchSpace,
    required: Sequence[str],
) -> SearchSpace:
    r"""Resolve an objective's ``search_space`` argument.

    Args:
        search_space: A :class:`SearchSpace`, its dict form, or ``None``.
        default: Used when ``search_space`` is ``None``.
        required: The parameter names the objective needs (exactly these, any
            order).

    Returns:
        The :class:`SearchSpace`.
    """
    if search_space is None:
        return default
    if isinstance(search_space, Mapping):
        search_space = SearchSpace.from_dict(search_space)
    if not isinstance(search_space, SearchSpace):
        raise TypeError(
            f"`search_space` must be a SearchSpace, its dict form or None, got {type(search_space).__name__}."
        )
    if sorted(search_space.names) != sorted(required):
        raise ValueError(
            f"`search_space` must define exactly the parameters {sorted(required)}, got {search_space.names}."
        )
    return search_space


class TuningObjective(Objective):
    r"""Base for hyperparameter-tuning objectives whose inputs live in ``[0, 1]^d``.

    Inputs are unit-cube points mapped through ``search_space``; values are a
    score in ``[0, 1]`` to maximize (AUC, accuracy) and :meth:`loss` is
    ``1 - best`` (``1 - AUC``, validation error), what the papers plot.
    Subclasses set ``search_space``, ``num_agents``, ``value_name`` and
    ``loss_name`` (``bounds`` follows from the search space).
    """

    search_space: SearchSpace
    _loss_name: str = "1 - value"

    # Objective declares `bounds` as the attribute its subclasses set; here it follows from the search space
    @property
    def bounds(self) -> Tensor:  # type: ignore[override]
        return self.search_space.bounds

    def loss(self, best_values: Tensor, agents: Tensor | None = None) -> Tensor:
        r"""``1 - best_values`` (shape ``... x k``), e.g. ``1 - AUC`` or validation error."""
        return 1.0 - best_values

    @property
    def loss_name(self) -> str:
        return self._loss_name

    def native_configs(self, X: Tensor) -> list[list[dict[str, float | int]]]:
        r"""Native named hyperparameters of ``X`` (``k x q x d``), for logging.

        Returns:
            ``k`` lists of ``q`` ``{name: value}`` dicts.
        """
        check_tensor("X", X)
        if X.ndim != 3:
            raise ValueError(f"`X` must have shape k x q x d, got {tuple(X.shape)}.")
        return self.search_space.to_dicts(X)
