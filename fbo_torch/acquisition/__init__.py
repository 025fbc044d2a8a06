from fbo_torch.acquisition.fts import FederatedThompsonSampling
from fbo_torch.acquisition.rff_thompson import PiecewiseRFFThompsonSample, RFFThompsonSample

__all__ = ["FederatedThompsonSampling", "PiecewiseRFFThompsonSample", "RFFThompsonSample"]
