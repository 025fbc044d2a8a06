r"""The interface every federated objective implements.

An objective bundles the black-box functions of ``num_agents`` agents that share
one box domain. All agents are evaluated in one call, which is what lets the
runners batch a whole federation:

    values = objective(X)        # X: num_agents x q x d  ->  num_agents x q
    Y, F = objective.observe(X, keys)   # keyed observations and their noiseless values, one evaluation

Values are *to be maximized* (e.g. AUC or validation accuracy for tuning tasks).
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod

import torch
from torch import Tensor

from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.validation import check_finite, check_in_bounds, check_tensor


class Objective(ABC):
    r"""Black-box functions of ``num_agents`` agents on a common domain.

    Subclasses implement :meth:`_evaluate` and set ``bounds`` (``2 x d``) and
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
            X: ``k x q x d`` inputs (as in :meth:`__call__`). keys: ``k`` int64
                noise keys. agents: Optional ``k`` agent indices. validate: As in
                :meth:`__call__`.

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
        """Noiseless values (same shapes as :meth:`__call__`)."""
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
        """Attribute ``name`` (a CPU tensor or module) on ``device``, copied once and cached,
        so evaluating on a GPU does not copy the objective's constants at every call."""
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
