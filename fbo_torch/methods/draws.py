r"""What methods whose peers send RFF weight draws share: receiving them, and learned ``P_N``.

FTS, the peer prior and the multi-channel transfer all hear the same message
from every peer, one draw ``ω_n ~ N(ν_n, σ²Σ_n⁻¹)`` of its RFF posterior per
round (:meth:`~fbo_torch.federation.agents.Agents.message`), and may weight
their peers by how well each message ranks the agent's own observations
(:mod:`~fbo_torch.protocol.fidelity`; ``agent_weights: learned``, or
``corroborated`` with the sybil defence). :class:`DrawMethod` does both for every
run at once:

* agents that optimize *together* each send one draw, which all their peers receive;
* a target among *other agents with a history* receives its own draw from each of
  them (base samples keyed by run and round), so runs stay independent.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from fbo_torch.methods.base import Method
from fbo_torch.protocol.fidelity import (
    fidelity_scores,
    learn_peer_choice,
    peer_counts,
    peer_predictions,
    reference_points,
)
from fbo_torch.utils import keyed_random as kr


class DrawMethod(Method):
    r"""Base of the methods whose peers send one ``ω`` draw per round (not registered itself).

    Attributes:
        omegas: ``R x A x M`` the latest draw of every agent as each run received it
            (the run's own agent and non-peers included; ``runner.dist``
            says whom a run may use), free-riders' as they send them.
    """

    message = "draw"
    #: Settings fields of learned ``P_N`` and trust (read by every draw method that uses them).
    weight_fields: ClassVar[tuple[str, ...]] = ("agent_weights", "peer_trust")

    omegas: Tensor
    _reference: Tensor | None = None
    #: The round-0 draws (what ``free_riders`` of kind ``stale`` send every round).
    first: Tensor | None = None
    #: ``R`` booleans: the run's agent's latest draw repeats, bit for bit, one that it or any other agent sent
    #: the round before (agents together).
    replayed: Tensor | None = None
    #: Per message name, the senders' values of the latest rounds by round (what ``copied`` riders forward).
    _rounds: dict[str, dict[int, Tensor]]

    def __init__(self, runner: Any) -> None:
        super().__init__(runner)
        self._rounds = {}

    def receive(self, round: int) -> None:
        """Every peer's draw of round ``round`` for every run (:attr:`omegas`); free-riders'
        (``free_riders``) replaced by what they send (:meth:`~fbo_torch.federation.free_riders.FreeRiders.replace`)."""
        r = self.runner
        riders = r.free_riders
        if r.together:
            sent = r.agents.message(round)  # R x M: each run's agent sends one draw
            if riders is not None:
                if round == 0:
                    self.first = sent
                assert self.first is not None
                sent = self.as_sent(sent, self.first, kr.fold(r.agents.keys, round), round=round)
            last = getattr(self, "omegas", None)  # R x A x M: what every agent sent last, its own row included
            self.omegas = sent[r.peer_runs]  # R x A x M
            # a posterior draw is fresh every round: a vector sent before, by the agent itself or by anyone
            # it could have received it from, is a replay, not a contribution
            self.replayed = (
                torch.zeros(sent.shape[0], dtype=torch.bool, device=sent.device)
                if last is None
                else (sent.unsqueeze(-2) == last).all(-1).any(-1)
            )
            self.sent(sent, round)
            return
        rff = r.others.rff
        assert rff is not None and r.features is not None  # the other agents hold the shared map
        M = r.features.num_features
        A = r.others.num_agents
        k = kr.fold(kr.fold(kr.fold(r.keys, "message"), round).unsqueeze(-1), torch.arange(A, device=r.device))
        base = kr.normal(k, M + rff._n)  # R x A x (M + n)
        self.omegas = rff.sample_weights(torch.Size([r.num_runs]), base_samples=base)  # R x A x M
        if riders is not None:
            if round == 0:
                self.first = self.omegas
            assert self.first is not None
            self.omegas = self.as_sent(self.omegas, self.first, k, round=round)
        self.sent(None, round)

    def as_sent(
        self,
        values: Tensor,
        first: Tensor,
        keys: Tensor,
        constant: Tensor | None = None,
        noise: Tensor | None = None,
        *,
        round: int,
        name: str = "draw",
    ) -> Tensor:
        r"""What the senders of ``values`` send: free-riders' rows replaced by their kind's
        (:meth:`~fbo_torch.federation.free_riders.FreeRiders.replace`; ``free_riders`` must be set).

        Args:
            values: One row per sender: ``R x k``, the runs' own agents (agents together), or
                ``... x A x k``, the peers (the history's agents, any leading dimensions).
            first: The senders' first values (what ``stale`` riders send), the shape of ``values``.
            keys: The senders' keys of this round (``noise``), ``values.shape[:-1]``.
            constant: What ``constant`` riders send (``None``: zeros, a flat draw).
            noise: What ``noise`` riders send (``None``: standard normal draws from ``keys``).
            round: The round the values are sent in.
            name: The message (``"draw"``, or another channel's): ``copied`` riders forward the values of
                the same name their honest agent sent in round ``round − 1`` (their own in round 0).

        Returns:
            ``values`` as sent, the same shape.
        """
        r = self.runner
        assert r.free_riders is not None
        kept = self._rounds.setdefault(name, {})
        kept[round] = values
        for old in [k for k in kept if k < round - 1]:
            del kept[old]
        before = kept.get(round - 1)  # what a copier received last round (none in round 0: it sends its own)
        if r.together:
            rows = torch.arange(r.num_runs, device=values.device)
            rider = r.rider[r.targets]
            # the next honest agent's run
            copied = values if before is None else before[r.peer_runs[rows, r.copied_from[r.targets]]]
        else:
            rider = r.rider.expand(values.shape[:-1])
            copied = values if before is None else before[..., r.copied_from, :]
        return r.free_riders.replace(values, rider, keys, first, copied, constant=constant, noise=noise)

    def sent(self, sent: Tensor | None, round: int) -> None:
        r"""Hook after :meth:`receive`: ``sent`` is the ``R x M`` draws the runs' own agents sent
        (agents that optimize together), ``None`` when each run received its own draws."""

    def scored_messages(self) -> Tensor:
        """``R x A x M`` messages the peers are scored by (the latest draws; subclasses may average them)."""
        return self.omegas

    def peer_scores(self) -> tuple[Tensor, Tensor]:
        r"""Every peer's fidelity score on each run's observations and its near-duplicate count:
        ``(scores, copies)``, ``R x A`` each (0 and 1 for the run's own agent and non-peers), from one
        batched ``R x K x n x n`` comparison over each run's possible peers (``K`` the most any run has)."""
        r = self.runner
        assert r.features is not None and r.dist is not None  # a draw method's runner has both
        slots = self.scored_messages()
        omegas = slots.gather(1, r.peer_index.unsqueeze(-1).expand(-1, -1, slots.shape[-1]))
        preds = peer_predictions(r.features, omegas, r.X)  # R x K x n
        peer_scores = fidelity_scores(preds, r.Y.squeeze(-1), r.agents.mask)
        scores = torch.zeros_like(r.dist.base).scatter_(1, r.peer_index, peer_scores.to(r.dist.base.dtype))
        padding = torch.cat(
            [torch.zeros_like(r.peer_index[:, :1], dtype=torch.bool), r.peer_index[:, 1:] == r.peer_index[:, :1]],
            dim=1,
        )
        counts = peer_counts(r.settings.agent_weights, r.features, omegas, peer_scores, self.reference(), ~padding)
        copies = torch.ones_like(r.dist.base).scatter_(1, r.peer_index, counts.to(r.dist.base.dtype))
        return scores, copies

    def reference(self) -> Tensor | None:
        r"""``C x d`` the points ``agent_weights: corroborated`` compares the peers' maximizers on
        (:func:`~fbo_torch.protocol.fidelity.reference_points` of the runner's domain: its candidates, or a
        fixed Sobol set of its box); ``None`` for the other weights."""
        r = self.runner
        if r.settings.agent_weights != "corroborated":
            return None
        if self._reference is None:
            self._reference = reference_points(r.domain.bounds, r.domain.candidates).to(r.device)
        return self._reference

    def learned_p_t(self, t: int) -> float | Tensor:
        r"""``p_t`` of iteration ``t``; with learned ``P_N`` or peer trust, first score every peer's
        message on each run's observations (:meth:`peer_scores`) and update ``P_N`` (and ``p_t`` per run)."""
        r = self.runner
        s = r.settings
        p = r.schedule(t)
        if s.agent_weights == "uniform" and not s.peer_trust:
            return p
        assert r.dist is not None
        scores, copies = self.peer_scores()
        return learn_peer_choice(r.dist, scores, r.agents.mask.sum(-1), p, s.agent_weights, s.peer_trust, copies)

    def state_dict(self) -> dict[str, Any]:
        return {
            "omegas": getattr(self, "omegas", None),
            "first": self.first,
            "replayed": self.replayed,
            "rounds": dict(self._rounds),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.omegas = state["omegas"].to(self.runner.device)
        dev = self.runner.device
        for name in ("first", "replayed"):
            value = state.get(name)
            setattr(self, name, None if value is None else value.to(dev))
        self._rounds = {
            name: {int(k): v.to(dev) for k, v in kept.items()} for name, kept in state.get("rounds", {}).items()
        }


__all__ = ["DrawMethod"]
