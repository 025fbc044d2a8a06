"""Acquisition functions of BoTorch's kind for federated BO: FTS, RFF Thompson samples, RGPE, TAF,
every agent's LogEI / UCB as one batched function, the peers' optima as a prior, and the maximizers of
messages and broadcasts (:mod:`~fbo_torch.acquisition.search`)."""

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
