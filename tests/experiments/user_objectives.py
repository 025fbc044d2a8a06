"""Objective classes as a user would write them, imported by dotted path (``user_objectives:Bowl``) in
tests/experiments/test_custom_objective.py (which puts this folder on ``sys.path``)."""

from __future__ import annotations

import torch
from torch import Tensor

from fbo_torch.objectives.base import Objective


class Bowl(Objective):
    r"""An :class:`Objective` subclass: agent ``n`` maximizes ``-(x - c_n)^2`` on ``[0, 1]``, with
    ``c_n = center + n * spread`` and maximum 0 (so the loss is simple regret)."""

    def __init__(self, num_agents: int = 3, center: float = 0.5, spread: float = 0.05) -> None:
        self.num_agents = num_agents
        self.bounds = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
        self.centers = center + spread * torch.arange(num_agents, dtype=torch.float64)
        self.optimum = torch.zeros(num_agents, dtype=torch.float64)

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        c = self.centers.to(X)[agents].view(-1, 1)
        return -(X[..., 0] - c).square()


class DuckBowl:
    r"""The same functions without subclassing :class:`Objective`: ``bounds``, ``num_agents`` and
    ``__call__(X, agents)``, plus an own loss (distance of the best value to 1) and its name."""

    loss_name = "one minus best"

    def __init__(self, num_agents: int = 4, width: float = 1.0) -> None:
        self.num_agents = num_agents
        self.bounds = torch.tensor([[0.0], [width]], dtype=torch.float64)
        self.calls = 0

    def __call__(self, X: Tensor, agents: Tensor) -> Tensor:
        self.calls += 1
        return 1.0 - (X[..., 0] - 0.3 - 0.1 * agents.to(X).view(-1, 1)).square()

    def loss(self, best_values: Tensor, agents: Tensor | None = None) -> Tensor:
        return 1.0 - best_values


class NoBounds:
    """Defines ``__call__`` but forgets ``bounds``: refused once built."""

    def __init__(self) -> None:
        self.num_agents = 2

    def __call__(self, X: Tensor, agents: Tensor) -> Tensor:
        return X.sum(-1)


class Abstract(Objective):
    """Subclasses :class:`Objective` without implementing ``_evaluate``."""


class Unrelated:
    """Neither an :class:`Objective` nor callable."""

    def __init__(self, size: int = 1) -> None:
        self.size = size


def factory(num_agents: int = 2) -> Bowl:
    """A function, not a class."""
    return Bowl(num_agents)


class Crashes(Bowl):
    r"""A :class:`Bowl` whose simulator crashes: on every call, or (``agents_failing``) for those agents only."""

    def __init__(self, num_agents: int = 3, agents_failing: list[int] | None = None) -> None:
        super().__init__(num_agents)
        self.agents_failing = agents_failing

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        if self.agents_failing is None or any(a in self.agents_failing for a in agents.tolist()):
            raise RuntimeError("my simulator crashed")
        return super()._evaluate(X, agents, noise)


class NaNAbove(Bowl):
    r"""A :class:`Bowl` that returns NaN for ``x > threshold`` (a diverged training run, say)."""

    def __init__(self, num_agents: int = 3, threshold: float = 0.5) -> None:
        super().__init__(num_agents)
        self.threshold = threshold

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        values = super()._evaluate(X, agents, noise)
        return torch.where(X[..., 0] > self.threshold, torch.nan, values)


class WrongShape(Bowl):
    """Returns its values with an extra leading dimension (``1 x k x q``)."""

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        return super()._evaluate(X, agents, noise).unsqueeze(0)
