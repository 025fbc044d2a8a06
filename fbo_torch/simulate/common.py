r"""Helpers of the simulators' baselines.

* :func:`maximize_acquisition` — one BoTorch acquisition (RGPE, TAF) with
  ``optimize_acqf`` over a :class:`~fbo_torch.optim.domain.Domain`.
* :func:`derive_seed` — a seed for libraries that use the global RNG.
* :func:`cpu_state` — a state dict with its tensors on the host, for checkpoints.
"""

from __future__ import annotations

from typing import Any

import torch
from botorch.optim.optimize import optimize_acqf
from torch import Tensor

from fbo_torch.optim.batched import default_max_points
from fbo_torch.optim.domain import Domain


def derive_seed(generator: torch.Generator) -> int:
    """A fresh integer seed drawn from ``generator`` (for libraries that use the global RNG)."""
    return int(torch.randint(2**62, (1,), generator=generator, device=generator.device).item())


def cpu_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with every tensor value moved to the host (other values unchanged), for a checkpoint."""
    return {k: (v.cpu() if isinstance(v, Tensor) else v) for k, v in state.items()}


def maximize_acquisition(acqf: Any, domain: Domain, generator: torch.Generator | None = None) -> Tensor:
    r"""Maximize one BoTorch acquisition function (``b x 1 x d -> b``) over ``domain``.

    Exact on a finite domain (scored in chunks); ``optimize_acqf`` on a box.
    Returns the ``d``-vector maximizer.
    """
    if domain.candidates is not None:
        C = domain.candidates
        chunk = max(1, domain.max_points or default_max_points(C.device))
        with torch.no_grad():
            vals = torch.cat([acqf(C[s : s + chunk].unsqueeze(-2)) for s in range(0, C.shape[0], chunk)])
        return C[vals.argmax()]
    seed = derive_seed(generator) if generator is not None else None
    with torch.random.fork_rng(enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        X, _ = optimize_acqf(acqf, domain.bounds, q=1, num_restarts=domain.num_restarts, raw_samples=domain.raw_samples)
    return X.squeeze(0).detach()
