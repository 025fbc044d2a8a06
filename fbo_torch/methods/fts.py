r"""Federated Thompson sampling (FTS, Dai, Low & Jaillet 2020, Algorithm 1): ``algorithm: fts``.

With probability ``p_t`` an agent maximizes its own acquisition (a Thompson
sample of its GP in the paper); otherwise it draws a peer ``n ~ P_N`` and
maximizes the peer's sampled function ``φ(x)ᵀω_n``. ``P_N`` is uniform (the paper)
or learned from how well each peer's message ranks the agent's observations
(``agent_weights: learned``), and ``peer_trust`` scales ``1 − p_t`` by the trust in
the drawn peer (:mod:`~fbo_torch.protocol.fidelity`); ``fairness: λ`` moves the following towards the
agents that are behind, and the peer followed towards the leaders (:mod:`~fbo_torch.protocol.fairness`).
With one-shot communication
a used message leaves ``P_N``; a run whose messages are used up continues alone.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from fbo_torch.acquisition.search import maximize_rff_samples
from fbo_torch.methods.base import register_method
from fbo_torch.methods.draws import DrawMethod
from fbo_torch.protocol.fairness import fair_follow_probability, fair_peer_weights
from fbo_torch.protocol.schedules import draw_sources
from fbo_torch.utils import keyed_random as kr


@register_method
class FTS(DrawMethod):
    """FTS for every run at once: the ``p_t`` coin, a peer from ``P_N``, its message's maximizer."""

    name = "fts"
    uses = DrawMethod.weight_fields
    follows_peers = True
    fair_help = True

    def step(self, t: int) -> tuple[Tensor, Tensor]:
        r = self.runner
        assert r.features is not None and r.dist is not None  # FTS's runner has both
        p_t = self.learned_p_t(t)
        dist = r.dist
        if r.behind is not None:  # fairness: agents behind follow more, and towards the leaders
            p_t = fair_follow_probability(p_t, r.behind, r.fairness)
            dist = copy.copy(r.dist)
            dist.base = fair_peer_weights(r.dist.base, r.peer_behind, r.fairness)
        if r.may_follow is not None:  # reciprocity: an agent flagged as a free-rider follows no peer
            p_t = torch.where(r.may_follow, torch.as_tensor(p_t, dtype=torch.float64, device=r.device), 1.0)
        # OWN where the coin says so or no message is left
        sources = draw_sources(p_t, dist, keys=kr.fold(r.agents.keys, t))
        # only the runs whose source is OWN use their own proposal (the others' rows may be NaN)
        X_next, _ = r.agents.own_proposals(t, which=sources < 0)
        omega = self.omegas[torch.arange(r.num_runs, device=r.device), sources.clamp_min(0)]
        X_msg, _ = maximize_rff_samples(r.features, omega, r.domain, keys=r.agents.round_keys(t, "message-maximize"))
        X_next = torch.where((sources >= 0).unsqueeze(-1), X_msg, X_next)
        if r.settings.communication == "one-shot":
            r.dist.remove(sources)
        return X_next, sources


__all__ = ["FTS"]
