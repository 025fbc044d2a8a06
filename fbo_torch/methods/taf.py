r"""TAF (Wistuba, Schilling & Schmidt-Thieme 2018), the FTS paper's adapted baseline: ``algorithm: taf``.

The transfer acquisition function (:class:`~fbo_torch.acquisition.taf.TransferAcquisitionFunction`):
the target's EI plus its peers' predicted improvements, weighted by kernel-smoothed
ranking agreement (bandwidth ``taf_bandwidth``). Each peer also sends its incumbent.
"""

from __future__ import annotations

from typing import Any

import torch
from botorch.acquisition.acquisition import AcquisitionFunction
from botorch.models import SingleTaskGP
from torch import Tensor

from fbo_torch.acquisition.taf import TransferAcquisitionFunction
from fbo_torch.methods.base import register_method
from fbo_torch.methods.posteriors import PosteriorMethod
from fbo_torch.models.agent_posteriors import AgentRFFPosteriors


@register_method
class TAF(PosteriorMethod):
    """TAF for every run (one acquisition per run)."""

    name = "taf"
    uses = ("taf_bandwidth",)

    @classmethod
    def parameters_per_agent(cls, settings: Any, dim: int) -> int:
        return super().parameters_per_agent(settings, dim) + 1  # and the peer's incumbent value

    def acquisition(
        self, gp: SingleTaskGP, peers: AgentRFFPosteriors, X: Tensor, Y: Tensor, generator: torch.Generator
    ) -> AcquisitionFunction:
        return TransferAcquisitionFunction(gp, peers, X, Y, bandwidth=self.runner.settings.taf_bandwidth)


__all__ = ["TAF"]
