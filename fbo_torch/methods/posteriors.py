r"""What RGPE and TAF share: peers that send their whole RFF posterior, one acquisition per run.

In the FTS paper's adapted baselines every other agent sends its RFF posterior
(``ν_n``, ``Σ_n``: ``M + M²`` numbers; TAF's also its incumbent), and each target
builds a transfer acquisition from them and its own GP
(:mod:`~fbo_torch.acquisition.rgpe`, :mod:`~fbo_torch.acquisition.taf`), maximized
with BoTorch's ``optimize_acqf``. Each run has its own target data, so the runs
are maximized one after another (within a run every peer's posterior is
evaluated in one batched operation); these baselines are not on the hot path of
the batched engine.
"""

from __future__ import annotations

from typing import Any

import torch
from botorch.acquisition.acquisition import AcquisitionFunction
from botorch.models import SingleTaskGP
from torch import Tensor

from fbo_torch.methods.base import Method
from fbo_torch.models.agent_posteriors import AgentRFFPosteriors
from fbo_torch.optim.optimize import maximize_acquisition
from fbo_torch.protocol.schedules import OWN
from fbo_torch.utils import keyed_random as kr


class PosteriorMethod(Method):
    """Base of RGPE and TAF (not registered itself): receive the peers' posteriors, one acquisition per run."""

    message = "posterior"
    histories = ("random", "ts")

    posteriors: AgentRFFPosteriors

    def receive(self, round: int) -> None:
        rff = self.runner.others.rff
        assert rff is not None  # the other agents hold the shared map
        self.posteriors = AgentRFFPosteriors.from_model(rff)

    def acquisition(
        self, gp: SingleTaskGP, peers: AgentRFFPosteriors, X: Tensor, Y: Tensor, generator: torch.Generator
    ) -> AcquisitionFunction:
        """The run's acquisition from its GP, its peers' posteriors and its data ``X``, ``Y``."""
        raise NotImplementedError

    def step(self, t: int) -> tuple[Tensor, Tensor]:
        r = self.runner
        gp_all = r.agents.gp()
        X_next = torch.empty(r.num_runs, r.objective.dim, dtype=r.X.dtype, device=r.device)
        gen = torch.Generator().manual_seed(kr.fold(kr.root_key(r.seed, "transfer"), t) & (2**62 - 1))
        for i in range(r.num_runs):
            keep = r.agents.mask[i]
            acqf = self.acquisition(
                gp_all.to_botorch(index=i), self.posteriors.subset(r.peers[i]), r.X[i][keep], r.Y[i][keep], gen
            )
            X_next[i] = maximize_acquisition(acqf, r.domain, generator=gen)
        return X_next, torch.full((r.num_runs,), OWN, dtype=torch.long, device=r.device)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.receive(self.runner.t)  # the posteriors follow from the other agents' restored state


__all__ = ["PosteriorMethod"]
