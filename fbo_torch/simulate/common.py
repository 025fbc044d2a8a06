r"""What the simulators share: :class:`~fbo_torch.simulate.common.Runner` (the round loop, the queries,
a checkpoint's common part) and :func:`~fbo_torch.simulate.common.cpu_state` (checkpoints' tensors on the host)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch
from torch import Tensor

if TYPE_CHECKING:
    from fbo_torch.federation.agents import Agents
    from fbo_torch.federation.settings import MethodSettings
    from fbo_torch.objectives.base import Objective

_ResultT = TypeVar("_ResultT")
_RunnerT = TypeVar("_RunnerT", bound="Runner[Any]")


def cpu_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with every tensor value moved to the host (other values unchanged), for a checkpoint."""
    return {k: (v.cpu() if isinstance(v, Tensor) else v) for k, v in state.items()}


class Runner(Generic[_ResultT]):
    r"""The part of :class:`~fbo_torch.simulate.fts.FTSRunner` and
    :class:`~fbo_torch.simulate.dp_fts_de.DPFTSDERunner` that is the same: rounds until
    ``settings.num_iterations``, every run's queries in ``agents``, and the checkpoint of the round
    counter, best values, failures, agents, objective's random state and wall time.

    A subclass sets these attributes in its constructor and implements :meth:`step` and :meth:`result`.
    """

    objective: Objective
    settings: MethodSettings
    device: torch.device
    agents: Agents
    t: int
    best: Tensor
    failed: Tensor
    wall_time: float

    @property
    def done(self) -> bool:
        """Whether the run has had ``settings.num_iterations`` rounds."""
        return self.t >= self.settings.num_iterations

    @property
    def X(self) -> Tensor:
        """``runs x n x d`` queries so far (``agents.train_X``; the subclass says what a run is)."""
        return self.agents.train_X

    @property
    def Y(self) -> Tensor:
        """``runs x n x 1`` their values (``agents.train_Y``)."""
        return self.agents.train_Y

    def step(self) -> None:
        """One round for every run."""
        raise NotImplementedError

    def result(self) -> _ResultT:
        """The result so far.

        Returns:
            The subclass's result.
        """
        raise NotImplementedError

    def run(self: _RunnerT, callback: Callable[[_RunnerT], None] | None = None) -> _ResultT:
        """Iterate until ``settings.num_iterations``; ``callback(self)`` after each step.

        Args:
            callback: Called with the runner after each round.

        Returns:
            :meth:`result`.
        """
        while not self.done:
            self.step()
            if callback is not None:
                callback(self)
        return self.result()

    def runner_state(self) -> dict[str, Any]:
        """The checkpoint's common part, on the host (a subclass's ``state_dict`` adds its own).

        Returns:
            ``t``, ``best``, ``failed``, ``agents``, ``objective_rng`` and ``wall_time``.
        """
        return {
            "t": self.t,
            "best": self.best.cpu(),
            "failed": self.failed.cpu(),
            "agents": cpu_state(self.agents.state_dict()),
            "objective_rng": self.objective.rng_state(),
            "wall_time": self.wall_time,
        }

    def load_runner_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`runner_state` saved (tensors onto the runner's device).

        Args:
            state: A ``state_dict`` of this runner.
        """
        self.t = int(state["t"])
        self.best, self.failed = state["best"].to(self.device), state["failed"].to(self.device)
        self.agents.load_state_dict(state["agents"])
        self.objective.set_rng_state(state["objective_rng"])
        self.wall_time = float(state["wall_time"])
