r"""The peers' optima as a πBO prior on the agent's own acquisition: ``algorithm: peer_prior``.

Every run maximizes its own analytic acquisition (``logei`` or ``ucb``) plus ``β/t``
times the log of a prior over the optimizer's location: a bump of width ``s`` at
each peer's believed optimum — the maximizer of the running average of the
peer's messages (:class:`~fbo_torch.protocol.message_average.MessageAverage`) —
weighted by ``P_N`` and floored at ``λ`` (:mod:`~fbo_torch.acquisition.peer_prior`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fbo_torch.methods.base import register_method
from fbo_torch.methods.draws import DrawMethod
from fbo_torch.protocol.fidelity import LEARNED_WEIGHTS
from fbo_torch.protocol.message_average import MessageAverage
from fbo_torch.protocol.schedules import OWN
from fbo_torch.sampling.rff_paths import RFFSamplePaths
from fbo_torch.utils import keyed_random as kr


@register_method
class PeerPrior(DrawMethod):
    r"""πBO with the federation's beliefs for every run at once.

    Attributes:
        peer_centers: ``R x A x d`` each peer's believed optimizer, as each run sees it.
    """

    name = "peer_prior"
    own_acquisitions = ("logei", "ucb")
    uses = ("agent_weights", "prior_strength", "prior_width", "prior_floor", "message_memory")

    peer_centers: Tensor

    @classmethod
    def check(cls, settings: Any) -> None:
        super().check(settings)
        if getattr(settings, "peer_trust", False):
            raise ValueError(
                "`peer_trust` scales FTS's probability of following a peer; peer_prior follows none "
                "(its prior's floor and decay bound the peers' influence)."
            )

    def __init__(self, runner: Any) -> None:
        super().__init__(runner)
        self.message_average = MessageAverage(runner.settings.message_memory)

    def sent(self, sent: Tensor | None, round: int) -> None:
        r = self.runner
        if sent is not None:  # together: every sender once, gathered per run
            self._peer_optima(sent, round, r.agents.round_keys(round, "peer-optima"), r.peer_runs)
            return
        A = r.objective.num_agents
        M = self.omegas.shape[-1]
        keys = kr.fold(kr.fold(r.keys, "peer-optima").unsqueeze(-1), torch.arange(A, device=r.device))
        self._peer_optima(self.omegas.reshape(-1, M), round, kr.fold(keys.reshape(-1), round), None)

    def _peer_optima(self, messages: Tensor, round: int, keys: Tensor, gather: Tensor | None) -> None:
        r"""Add this round's messages to each sender's running average and take its maximizer
        (every sender once: ``messages`` is ``S x M``, one row per sending slot);
        :attr:`peer_centers` becomes ``R x A x d`` (``gather``: ``R x A`` slots of the senders,
        else the slots are already ``R·A`` in order)."""
        r = self.runner
        assert r.features is not None  # peer_prior's shared map
        avg = self.message_average.update(messages)
        # a bump's center needs no more precision than the bump's width: a lighter search than a query's
        d = r.domain
        centers, _ = d.maximize(
            RFFSamplePaths(r.features, avg),
            avg.shape[0],
            keys=keys,
            raw_samples=d.raw_samples,
            num_restarts=4,
            maxiter=10,
        )
        R, A = r.num_runs, r.objective.num_agents
        self.peer_centers = centers.view(R, A, -1) if gather is None else centers[gather]
        self._averaged_slots = avg.view(R, A, -1) if gather is None else avg[gather]

    def scored_messages(self) -> Tensor:
        return self._averaged_slots  # the averaged messages whose maximizers the prior uses

    def step(self, t: int) -> tuple[Tensor, Tensor]:
        r = self.runner
        s = r.settings
        if s.agent_weights in LEARNED_WEIGHTS:
            self.learned_p_t(t)  # re-weights P_N from the (averaged) messages' ranking of each run's data
        assert r.dist is not None  # peer_prior's P_N
        probs = r.dist.probs  # R x A, 0 for the run's own agent and non-peers
        log_w = torch.where(probs > 0, probs.clamp_min(1e-300).log(), -torch.inf)
        X_next, _ = r.agents.prior_guided_proposals(
            t, self.peer_centers, log_w, s.prior_strength / t, s.prior_width, s.prior_floor
        )
        return X_next, torch.full((r.num_runs,), OWN, dtype=torch.long, device=r.device)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "message_average": self.message_average.state_dict(),
            "peer_centers": self.peer_centers,
            "averaged_slots": self._averaged_slots,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        dev = self.runner.device
        self.message_average.load_state_dict(state["message_average"])
        self.peer_centers = state["peer_centers"].to(dev)
        self._averaged_slots = state["averaged_slots"].to(dev)


__all__ = ["PeerPrior"]
