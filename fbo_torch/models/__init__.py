from fbo_torch.models.agent_posteriors import AgentRFFPosteriors
from fbo_torch.models.batched_gp import GP_SPECS, BatchedExactGP, GPSpec
from fbo_torch.models.rff_blr import RFFBayesianLinear, cholesky_rank_one_update

__all__ = [
    "GP_SPECS",
    "AgentRFFPosteriors",
    "BatchedExactGP",
    "GPSpec",
    "RFFBayesianLinear",
    "cholesky_rank_one_update",
]
