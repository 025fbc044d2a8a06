from fbo_torch.objectives.base import Objective

__all__ = ["Objective"]
