from fbo_torch.models.agent_gp import build_agent_gps, draw_thompson_paths, fit_agent_gps, warm_start
from fbo_torch.models.agent_posteriors import AgentRFFPosteriors
from fbo_torch.models.rff_blr import RFFBayesianLinear, cholesky_rank_one_update

__all__ = [
    "AgentRFFPosteriors",
    "RFFBayesianLinear",
    "build_agent_gps",
    "cholesky_rank_one_update",
    "draw_thompson_paths",
    "fit_agent_gps",
    "warm_start",
]
