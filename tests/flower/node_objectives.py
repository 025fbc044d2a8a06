"""Objectives a SuperNode names in its own node config (the Flower tests' node-local black boxes)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fbo_torch.objectives import build_objective
from fbo_torch.objectives.base import Objective


class AgentOf(Objective):
    r"""Agent ``agent`` of the objective ``federation`` (a ``build_objective`` spec), as one agent's black box:
    a node that names it evaluates exactly what agent ``agent`` of a simulated ``federation`` evaluates."""

    def __init__(self, federation: dict[str, Any], agent: int) -> None:
        self.federation = build_objective(federation)
        self.agent, self.num_agents = int(agent), 1
        self.candidates = self.federation.candidates
        self.noise_variance = getattr(self.federation, "noise_variance", 0.0)

    @property  # type: ignore[override]
    def bounds(self) -> Tensor:
        return self.federation.bounds

    def _agent(self, agents: Tensor | None, X: Tensor) -> Tensor:
        assert agents is None or bool((agents == 0).all()), agents  # one agent's function: agent 0
        return torch.full((X.shape[0],), self.agent, dtype=torch.long)

    def observe(self, X: Tensor, keys: Tensor, agents: Tensor | None = None, validate: bool = True):
        return self.federation.observe(X, keys, self._agent(agents, X), validate)

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        return self.federation._evaluate(X, self._agent(agents, X), noise)


class Shifted(Objective):
    """``-(x - shift)²`` summed over ``dim`` coordinates of ``[low, high]^dim``: one agent's function."""

    def __init__(self, dim: int = 1, low: float = 0.0, high: float = 1.0, shift: float = 0.5) -> None:
        self.bounds = torch.tensor([[low] * dim, [high] * dim], dtype=torch.float64)
        self.num_agents, self.shift = 1, shift

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        return -((X - self.shift) ** 2).sum(-1)
