from fbo_torch.acquisition.batched import BatchedLogExpectedImprovement, BatchedUpperConfidenceBound
from fbo_torch.acquisition.fts import FederatedThompsonSampling
from fbo_torch.acquisition.rff_thompson import PiecewiseRFFThompsonSample, RFFThompsonSample
from fbo_torch.acquisition.rgpe import RGPE, compute_rgpe_weights
from fbo_torch.acquisition.taf import TransferAcquisitionFunction, compute_taf_weights

__all__ = [
    "RGPE",
    "BatchedLogExpectedImprovement",
    "BatchedUpperConfidenceBound",
    "FederatedThompsonSampling",
    "PiecewiseRFFThompsonSample",
    "RFFThompsonSample",
    "TransferAcquisitionFunction",
    "compute_rgpe_weights",
    "compute_taf_weights",
]
