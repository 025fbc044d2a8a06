r"""The interface every federated objective implements.

An objective bundles the black-box functions of ``num_agents`` agents that share
one box domain. All agents are evaluated in one call, which is what lets the
runners batch a whole federation:

    values = objective(X)        # X: num_agents x q x d  ->  num_agents x q
    Y, F = objective.observe(X, keys)   # keyed observations and their noiseless values, one evaluation

Values are *to be maximized* (e.g. AUC or validation accuracy for tuning tasks).

Your own objective
------------------
A class named in an experiment file as ``objective: {type: "my_pkg.my_module:MyObjective", ...}``
(or registered by name with :func:`fbo_torch.objectives.register`) is built with
the section's other keys as keyword arguments, checked against its ``__init__``
signature like a built-in type's. It is an objective in one of two ways:

1. A subclass of :class:`Objective` (recommended): ``__init__`` sets ``bounds``
   and ``num_agents``, the class implements ``_evaluate``; everything else is
   inherited and may be overridden.
2. Any class whose instances have the *required* members below; fbo_torch
   wraps such an instance with :func:`as_objective` and supplies the rest.

Required:

* ``bounds``: ``2 x d`` floating-point tensor, every lower bound below its upper bound.
* ``num_agents``: integer ``N >= 1``.
* ``_evaluate(X, agents, noise)`` or ``__call__(X, agents)``: ``X`` is
  ``k x q x d`` (inside ``bounds``, float64), ``agents`` the ``k`` agent indices
  (long tensor) whose functions to evaluate, one row of ``q`` points each;
  returns ``k x q`` values to maximize. ``_evaluate`` is asked for noisy
  (``noise=True``) or noiseless values; ``__call__``'s values are taken as both.

Optional (the default when absent):

* ``observe(X, keys, agents)``: ``(Y, F)``, the ``k x q`` observations and their
  noiseless values from one evaluation, ``keys`` the ``k`` int64 keys of the agents'
  noise streams (default: ``F`` from the evaluation and ``Y = F`` plus
  ``N(0, noise_variance)`` drawn from the keyed streams).
* ``noise_variance``: additive observation-noise variance (``0``).
* ``optimum``: ``N`` maxima of the noiseless functions; the loss is then simple
  regret ``optimum - best`` (otherwise ``-best``).
* ``loss(best_values, agents)`` and ``loss_name``: the loss plotted and tabulated,
  lower is better, e.g. ``1 - best`` named ``"validation error"``.
* ``candidates``: ``C x d`` finite domain (``None``: the continuous box).
* ``value_name``: what a value is (``"f"``).
* ``group_of_agent`` (``N`` group indices) and ``targets`` (target agents): used
  by FTS experiments as for the built-in synthetic objectives.
"""

from __future__ import annotations

import copy
import inspect
import math
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor

from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.validation import check_bounds, check_finite, check_in_bounds, check_int, check_tensor


def size_argument(cls: Any, kwargs: dict[str, Any], name: str) -> float:
    r"""The number keyword ``name`` of ``cls``'s constructor has with ``kwargs`` (its default when absent), for a
    :meth:`Objective.memory_estimate`; 0 when it is not a number (the constructor then refuses it itself)."""
    value = kwargs.get(name, inspect.signature(cls).parameters[name].default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0.0
    return max(float(value), 0.0)


class Objective(ABC):
    r"""Black-box functions of ``num_agents`` agents on a common domain.

    Subclasses implement ``_evaluate`` and set ``bounds`` (``2 x d``) and
    ``num_agents``; they may set ``optimum`` (per-agent maximum of the
    noiseless function) and ``candidates`` (a finite domain ``C x d``).

    Attributes:
        bounds: ``2 x d`` lower/upper bounds of the domain.
        num_agents: Number of agents.
        optimum: ``num_agents`` maximum values, or ``None`` when unknown.
        candidates: ``C x d`` finite domain, or ``None`` for a continuous box.
        value_name: What a value is (``"f"``, ``"AUC"``, ``"accuracy"``).
    """

    bounds: Tensor
    num_agents: int
    optimum: Tensor | None = None
    candidates: Tensor | None = None
    value_name: str = "f"

    @property
    def dim(self) -> int:
        return self.bounds.shape[-1]

    @classmethod
    def memory_estimate(cls, **kwargs: Any) -> dict[str, float]:
        r"""Bytes the constructor would allocate with keyword arguments ``kwargs``, by the argument that
        drives each term (``{}``: nothing grows with an argument). :func:`~fbo_torch.objectives.build_objective`
        compares the total with the machine's memory *before* it builds the objective, and refuses one that
        does not fit with one line naming the largest term's argument. An estimate of the dominant arrays.
        """
        return {}

    def __call__(
        self, X: Tensor, agents: Tensor | None = None, keys: Tensor | None = None, validate: bool = True
    ) -> Tensor:
        r"""Noisy observations for all agents (or the subset ``agents``).

        Args:
            X: ``k x q x d`` inputs, one row of ``q`` points per agent, where
                ``k = num_agents`` or ``k = len(agents)``.
            agents: Optional ``k`` agent indices (long tensor).
            keys: Optional ``k`` int64 keys: the observation noise (additive
                ``N(0, noise_variance)`` where the objective has one) is drawn
                from each agent's keyed stream (:mod:`fbo_torch.utils.keyed_random`)
                instead of :attr:`noise_generator`, so an agent's observation does
                not depend on the batch or the device.
            validate: Check shapes, finiteness and bounds (reads device values on
                the host; engines that produce in-bounds points pass ``False``).

        Returns:
            ``k x q`` observed values (to maximize), on ``X``'s device/dtype.
        """
        if keys is not None:
            return self.observe(X, keys, agents, validate)[0]
        X, agents = self._check(X, agents) if validate else (X, self._agents(X, agents))
        return self._evaluate(X, agents, noise=True)

    def observe(
        self, X: Tensor, keys: Tensor, agents: Tensor | None = None, validate: bool = True
    ) -> tuple[Tensor, Tensor]:
        r"""Keyed noisy observations and their noiseless values, from one evaluation.

        The noiseless values are computed once and the observation noise is
        added to them from each agent's keyed stream, so a training-based
        objective (CNN, SVM, logistic regression: their randomness is fixed by
        their seeds, they have no additive noise) trains each query once and
        both values are the same.

        Args:
            X: ``k x q x d`` inputs (as in ``__call__``).
            keys: ``k`` int64 noise keys.
            agents: Optional ``k`` agent indices.
            validate: As in ``__call__``.

        Returns:
            ``(Y, F)``: ``k x q`` observations (equal to ``self(X, agents, keys)``)
            and ``k x q`` noiseless values (equal to :meth:`evaluate_true`).
        """
        X, agents = self._check(X, agents) if validate else (X, self._agents(X, agents))
        values = self._evaluate(X, agents, noise=False)
        var = float(getattr(self, "noise_variance", 0.0) or 0.0)
        if var <= 0:
            return values, values
        return values + var**0.5 * kr.normal(keys.to(X.device), X.shape[1], dtype=values.dtype), values

    def evaluate_true(self, X: Tensor, agents: Tensor | None = None, validate: bool = True) -> Tensor:
        """Noiseless values (same shapes as ``__call__``)."""
        X, agents = self._check(X, agents) if validate else (X, self._agents(X, agents))
        return self._evaluate(X, agents, noise=False)

    def _agents(self, X: Tensor, agents: Tensor | None) -> Tensor:
        if agents is None:
            return torch.arange(self.num_agents, device=X.device)
        return torch.as_tensor(agents, device=X.device).reshape(-1)

    def loss(self, best_values: Tensor, agents: Tensor | None = None) -> Tensor:
        r"""What the papers plot, lower is better, from the best value found so far.

        Simple regret ``optimum - best`` when the optimum is known; otherwise
        ``-best``. Tuning objectives override this (e.g. ``1 - AUC``).

        Args:
            best_values: ``... x k`` best (noiseless) values per agent.
            agents: The agents the last dimension refers to (default: all).

        Returns:
            ``... x k`` losses.
        """
        if self.optimum is None:
            return -best_values
        opt = self.optimum.to(best_values)
        if agents is not None:
            opt = opt[agents.to(opt.device)]
        return opt - best_values

    @property
    def loss_name(self) -> str:
        return "simple regret" if self.optimum is not None else f"-{self.value_name}"

    # ------------------------------------------------------ observation noise
    #: Generator of the observation noise (None for deterministic objectives).
    noise_generator: torch.Generator | None = None

    def reseed(self, seed: int) -> None:
        """Restart the observation-noise stream (runners call this per method,
        so every method sees a reproducible stream)."""
        if self.noise_generator is not None:
            self.noise_generator.manual_seed(int(seed))

    def rng_state(self) -> Tensor | None:
        return None if self.noise_generator is None else self.noise_generator.get_state()

    def set_rng_state(self, state: Tensor | None) -> None:
        if state is not None and self.noise_generator is not None:
            self.noise_generator.set_state(state)

    def _add_noise(self, values: Tensor, noise: bool) -> Tensor:
        """``values`` plus ``N(0, noise_variance)`` drawn from :attr:`noise_generator` (when ``noise``)."""
        var = float(getattr(self, "noise_variance", 0.0) or 0.0)
        if not noise or var == 0.0:
            return values
        eps = torch.randn(values.shape, dtype=values.dtype, generator=self.noise_generator)
        return values + math.sqrt(var) * eps.to(values.device)

    def _on(self, device: torch.device, name: str) -> Tensor:
        """Tensor attribute ``name`` (on the CPU) on ``device``, copied once and cached,
        so evaluating on a GPU does not copy the objective's constants at every call."""
        return self._device_copy(device, name)

    def _module_on(self, device: torch.device, name: str) -> torch.nn.Module:
        """Module attribute ``name`` (e.g. a feature map) on ``device``, cached as in :meth:`_on`."""
        return self._device_copy(device, name)

    def _device_copy(self, device: torch.device, name: str) -> Any:
        cache = self.__dict__.setdefault("_device_cache", {})
        key = (name, str(device))
        if key not in cache:
            obj = getattr(self, name)
            cache[key] = copy.deepcopy(obj).to(device) if isinstance(obj, torch.nn.Module) else obj.to(device)
        return cache[key]

    @abstractmethod
    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        """Evaluate validated ``X`` (``k x q x d``) for the ``k`` agents in ``agents``."""

    # ------------------------------------------------------------------ checks
    def _check(self, X: Tensor, agents: Tensor | None) -> tuple[Tensor, Tensor]:
        check_tensor("X", X)
        if agents is None:
            agents = torch.arange(self.num_agents, device=X.device)
        else:
            agents = torch.as_tensor(agents, device=X.device).reshape(-1)
            if agents.is_floating_point() or agents.dtype == torch.bool:
                raise TypeError(f"`agents` must hold integer indices, got dtype {agents.dtype}.")
            if ((agents < 0) | (agents >= self.num_agents)).any():
                raise ValueError(f"`agents` must lie in [0, {self.num_agents}), got {agents.tolist()}.")
        k = agents.numel()
        if X.ndim != 3 or X.shape[0] != k or X.shape[-1] != self.dim:
            raise ValueError(
                f"`X` must have shape k x q x d = {k} x q x {self.dim} (one row of q points per "
                f"agent), got {tuple(X.shape)}."
            )
        check_finite("X", X)
        check_in_bounds("X", X, self.bounds)
        return X, agents


# ----------------------------------------------------------------- user-defined objectives

#: Where the objective protocol is written down (for error messages).
PROTOCOL = "the objective protocol in fbo_torch.objectives.base"


def _defines(cls: type, name: str) -> bool:
    """Whether ``cls`` or one of its bases other than ``object`` defines ``name``."""
    return any(name in vars(k) for k in cls.__mro__ if k is not object)


def check_objective_class(cls: Any, name: str = "objective") -> type:
    r"""Refuse what cannot be an objective class, before anything is built.

    ``cls`` must be a class that subclasses :class:`Objective` without abstract
    methods left, or defines ``_evaluate(X, agents, noise)`` or ``__call__(X, agents)``
    (see the module docstring). Instance attributes (``bounds``, ``num_agents``)
    are checked by :func:`as_objective` once an instance exists.

    Args:
        cls: The candidate class.
        name: How messages name it (e.g. ``"'my_pkg.mod:MyObjective'"``).

    Returns:
        ``cls``.

    Raises:
        TypeError: ``cls`` is not a class, or not an objective class.
    """
    if not isinstance(cls, type):
        raise TypeError(f"{name} is a {type(cls).__name__}, not a class; give a class that follows {PROTOCOL}.")
    if issubclass(cls, Objective):
        if inspect.isabstract(cls):
            missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
            raise TypeError(f"{name} subclasses Objective but does not implement {missing}.")
        return cls
    if not (_defines(cls, "_evaluate") or _defines(cls, "__call__")):
        raise TypeError(
            f"{name} is not an objective: it neither subclasses fbo_torch.objectives.base.Objective nor defines "
            f"`_evaluate(X, agents, noise)` or `__call__(X, agents)` (required, with `bounds` and `num_agents`; "
            f"see {PROTOCOL})."
        )
    return cls


def _check_instance(obj: Any, name: str) -> None:
    """The required attributes of an objective instance: ``bounds``, ``num_agents``, and the optional ones' shapes."""
    for attr in ("bounds", "num_agents"):
        if not hasattr(obj, attr):
            raise TypeError(
                f"{name} has no `{attr}` (required: `bounds`, a 2 x d tensor, and `num_agents`; see {PROTOCOL})."
            )
    try:
        bounds = check_tensor(f"{name}.bounds", obj.bounds)
        if not bounds.is_floating_point():
            raise TypeError(f"`{name}.bounds` must be a floating-point tensor, got dtype {bounds.dtype}.")
        check_bounds(f"{name}.bounds", bounds)
        N = check_int(f"{name}.num_agents", obj.num_agents, minimum=1)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{err} (see {PROTOCOL})") from None
    d = bounds.shape[-1]
    optimum = getattr(obj, "optimum", None)
    if optimum is not None and (not isinstance(optimum, Tensor) or optimum.shape != (N,)):
        shape = tuple(optimum.shape) if isinstance(optimum, Tensor) else type(optimum).__name__
        raise ValueError(
            f"`{name}.optimum` must be None or a tensor of shape ({N},) (one maximum per agent), got {shape}."
        )
    candidates = getattr(obj, "candidates", None)
    if candidates is not None and (
        not isinstance(candidates, Tensor) or candidates.ndim != 2 or candidates.shape[-1] != d
    ):
        shape = tuple(candidates.shape) if isinstance(candidates, Tensor) else type(candidates).__name__
        raise ValueError(f"`{name}.candidates` must be None or a C x {d} tensor, got {shape}.")


class WrappedObjective(Objective):
    r"""An :class:`Objective` around an instance that follows the objective protocol without
    subclassing :class:`Objective` (see the module docstring and :func:`as_objective`).

    Validation, keyed observation noise, ``dim`` and the defaults of the optional
    members come from :class:`Objective`; what the wrapped instance defines wins,
    and any other attribute (``group_of_agent``, ``targets``, ...) is read from it.

    Args:
        inner: The wrapped instance.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.num_agents = int(inner.num_agents)
        self.optimum = getattr(inner, "optimum", None)
        self.candidates = getattr(inner, "candidates", None)
        self.value_name = getattr(inner, "value_name", Objective.value_name)
        self.noise_variance = float(getattr(inner, "noise_variance", 0.0) or 0.0)

    # Objective declares `bounds` as the attribute its subclasses set; here it is the wrapped instance's
    @property
    def bounds(self) -> Tensor:  # type: ignore[override]
        return self.inner.bounds

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not yet set (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"WrappedObjective({self.inner!r})"

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        if _defines(type(self.inner), "_evaluate"):
            return self.inner._evaluate(X, agents, noise)
        return self.inner(X, agents)

    def observe(
        self, X: Tensor, keys: Tensor, agents: Tensor | None = None, validate: bool = True
    ) -> tuple[Tensor, Tensor]:
        if not _defines(type(self.inner), "observe"):
            return super().observe(X, keys, agents, validate)
        X, agents = self._check(X, agents) if validate else (X, self._agents(X, agents))
        return self.inner.observe(X, keys, agents)

    def loss(self, best_values: Tensor, agents: Tensor | None = None) -> Tensor:
        if _defines(type(self.inner), "loss"):
            return self.inner.loss(best_values, agents)
        return super().loss(best_values, agents)

    @property
    def loss_name(self) -> str:
        if hasattr(self.inner, "loss_name"):
            return str(self.inner.loss_name)
        return super().loss_name

    def reseed(self, seed: int) -> None:
        if hasattr(self.inner, "reseed"):
            self.inner.reseed(seed)

    def rng_state(self) -> Any:
        return self.inner.rng_state() if hasattr(self.inner, "rng_state") else None

    def set_rng_state(self, state: Any) -> None:
        if state is not None and hasattr(self.inner, "set_rng_state"):
            self.inner.set_rng_state(state)


def as_objective(obj: Any, name: str = "objective") -> Objective:
    r"""``obj`` as an :class:`Objective`, after checking it follows the objective protocol.

    An :class:`Objective` is returned as it is; an instance of another class that
    defines the required members is wrapped in a :class:`WrappedObjective`.

    Args:
        obj: An objective instance.
        name: How messages name it.

    Returns:
        An :class:`Objective` (``obj`` itself, or ``obj`` wrapped).

    Raises:
        TypeError, ValueError: A required member is missing or malformed
            (``bounds`` not a ``2 x d`` tensor with lower < upper, ``num_agents`` not an
            integer >= 1, ``optimum`` or ``candidates`` of the wrong shape); the message
            names it.
    """
    check_objective_class(type(obj), name)
    _check_instance(obj, name)
    return obj if isinstance(obj, Objective) else WrappedObjective(obj)
