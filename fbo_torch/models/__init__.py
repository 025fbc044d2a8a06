"""BoTorch models of the agents: their RFF weight posteriors
(:class:`~fbo_torch.models.rff_blr.RFFBayesianLinear`), their exact GPs as batched tensors
(:class:`~fbo_torch.models.batched_gp.BatchedExactGP`) and other agents' posteriors rebuilt from messages."""

from fbo_torch.models.agent_posteriors import AgentRFFPosteriors
from fbo_torch.models.batched_gp import BatchedExactGP
from fbo_torch.models.gp_posterior import BatchedGPPosterior
from fbo_torch.models.gp_spec import GP_SPECS, GPSpec
from fbo_torch.models.rff_blr import RFFBayesianLinear
from fbo_torch.models.weight_posterior import RFFWeightPosterior, cholesky_rank_one_update

__all__ = [
    "GP_SPECS",
    "AgentRFFPosteriors",
    "BatchedExactGP",
    "BatchedGPPosterior",
    "GPSpec",
    "RFFBayesianLinear",
    "RFFWeightPosterior",
    "cholesky_rank_one_update",
]
