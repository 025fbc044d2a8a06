r"""fbo_torch: federated Bayesian optimization on PyTorch, GPyTorch and BoTorch.

Federated Thompson sampling (FTS, Dai et al. 2020) and its differentially
private, distributed-exploration extension (DP-FTS-DE, Dai et al. 2021), built
from BoTorch models and acquisition functions that batch every agent of a
federation into one tensor computation.
"""

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.kernels import RFFKernel
from fbo_torch.models import RFFBayesianLinear, draw_thompson_paths, fit_agent_gps

__version__ = "0.1.0"

__all__ = [
    "RFFBayesianLinear",
    "RFFKernel",
    "RandomFourierFeatures",
    "draw_thompson_paths",
    "fit_agent_gps",
]
