"""Maximizers: many acquisition functions at once in one batch
(:func:`~fbo_torch.optim.batched.maximize_batched`), over a :class:`~fbo_torch.optim.domain.Domain`
(bounds or candidates and the maximizer's options)."""

from fbo_torch.optim.batched import maximize_batched, maximize_discrete, score_chunked
from fbo_torch.optim.domain import Domain
from fbo_torch.optim.optimize import optimize_acqf_batched

__all__ = ["Domain", "maximize_batched", "maximize_discrete", "optimize_acqf_batched", "score_chunked"]
