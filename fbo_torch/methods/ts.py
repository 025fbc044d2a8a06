r"""Standard Thompson sampling: every agent alone, no messages (``algorithm: ts``).

Each agent maximizes its own acquisition — a Thompson sample of its GP
(``own_acquisition: ts``, the papers' baseline) or an analytic acquisition
(``logei``, ``ucb``: the local engine) — and never hears from peers. It is the
reference every federated algorithm is measured against, in both experiment kinds.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fbo_torch.methods.base import Method, register_method
from fbo_torch.protocol.schedules import OWN


@register_method
class StandardTS(Method):
    """Standard TS (or the agent's own analytic acquisition) for every run at once; no peers."""

    name = "ts"
    kinds = ("fts", "dp_fts_de")

    def step(self, t: int) -> tuple[Tensor, Tensor]:
        r = self.runner
        X_next, _ = r.agents.own_proposals(t)
        return X_next, torch.full((r.num_runs,), OWN, dtype=torch.long, device=r.device)


__all__ = ["StandardTS"]
