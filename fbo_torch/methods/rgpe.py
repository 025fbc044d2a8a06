r"""RGPE (Feurer, Letham & Bakshy 2018), the FTS paper's adapted baseline: ``algorithm: rgpe``.

A ranking-weighted ensemble of the target's GP and its peers' RFF posteriors
(:class:`~fbo_torch.acquisition.rgpe.RGPE`), maximized under LogEI.
"""

from __future__ import annotations

import torch
from botorch.acquisition.acquisition import AcquisitionFunction
from botorch.acquisition.analytic import LogExpectedImprovement
from botorch.models import SingleTaskGP
from torch import Tensor

from fbo_torch.acquisition.rgpe import RGPE as RGPEModel
from fbo_torch.methods.base import register_method
from fbo_torch.methods.posteriors import PosteriorMethod
from fbo_torch.models.agent_posteriors import AgentRFFPosteriors


@register_method
class RGPE(PosteriorMethod):
    """RGPE + LogEI for every run (one acquisition per run)."""

    name = "rgpe"
    uses = ("rgpe_samples",)

    def acquisition(
        self, gp: SingleTaskGP, peers: AgentRFFPosteriors, X: Tensor, Y: Tensor, generator: torch.Generator
    ) -> AcquisitionFunction:
        s = self.runner.settings
        model = RGPEModel.from_data(gp, peers, X, Y, num_samples=s.rgpe_samples, generator=generator)
        return LogExpectedImprovement(model, best_f=Y.max())


__all__ = ["RGPE"]
