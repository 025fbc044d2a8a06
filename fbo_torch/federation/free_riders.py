r"""Free-riders for studies of incentives: chosen agents send nothing useful in place of their draw.

A free-rider runs its own optimization and follows its peers' messages as every agent does, but
what it sends (FTS's message, one draw ``ω`` of its RFF posterior; with ``algorithm: transfer`` also
its incumbent and its GP's lengthscales, :class:`~fbo_torch.methods.transfer.Transfer`) is replaced by
one of:

* ``constant``: the zero vector every round (a flat function: its maximizer says nothing);
* ``noise``: a fresh draw of the RFF prior ``N(0, I)`` every round, unrelated to its data;
* ``stale``: its round-0 message (fitted to its initial points) every round, never updated;
* ``copied``: the message the next honest agent of its federation (by index, cyclically) sent in the
  previous round — nothing of its own, though what it forwards is useful. Messages travel round by
  round: a server collects every message of a round before it relays any, so the freshest message a
  copier can forward is one it received the round before (in round 0, having received nothing, it sends
  its own).

The replacement is one tensor operation over every sender (:meth:`FreeRiders.replace`), in the
batched runner (:class:`~fbo_torch.simulate.fts.FTSRunner`, through
:class:`~fbo_torch.methods.draws.DrawMethod`). The setting is ``free_riders: {agents: [...],
kind: ...}`` of an FTS-kind method whose peers send draws.

Free-riders may also lie about their peers where reciprocity asks every receiver to score what it
received (``reciprocity_signal: scores`` or ``ranks``, :mod:`~fbo_torch.protocol.reciprocity`):
``report: collude`` (default ``honest``) makes each of them report its fellow free-riders as the most
useful peers and every honest agent as the least (:meth:`FreeRiders.reported`) — the strategy that
lowers the honest agents' standing and raises the riders' most under either signal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fbo_torch.utils import keyed_random as kr

#: What a free-rider sends (module docstring).
FREE_RIDER_KINDS = ("constant", "noise", "stale", "copied")
#: What free-riders report to reciprocity about their peers: the truth, or fellow riders best and honest agents worst.
FREE_RIDER_REPORTS = ("honest", "collude")
#: The score a colluding free-rider reports (``+`` for a fellow rider, ``−`` for an honest agent): far beyond any
#: fidelity score (units of its null spread) yet finite, so a posterior computed from it with no evidence stays 1/2.
COLLUDING_SCORE = 1e6


@dataclass(frozen=True)
class FreeRiders:
    r"""Which agents free-ride, and what they send instead of their draw.

    Attributes:
        agents: The free-riders' indices (distinct, non-negative; below the objective's agent count,
            which the runner checks).
        kind: One of :data:`FREE_RIDER_KINDS`.
        report: One of :data:`FREE_RIDER_REPORTS`: what the free-riders report about their peers
            (:meth:`reported`).
    """

    agents: tuple[int, ...]
    kind: str
    report: str = "honest"

    @classmethod
    def from_config(cls, value: Any, key: str = "free_riders") -> FreeRiders | None:
        """From a ``free_riders:`` mapping ``{agents: [...], kind: ..., report: ...}`` (``report``
        optional; ``None``: no free-riders); any other value is a ``ValueError`` naming ``key`` (or
        ``key.agents``, ``key.kind``, ``key.report``)."""
        if value is None:
            return None
        if not isinstance(value, dict) or not {"agents", "kind"} <= set(value) <= {"agents", "kind", "report"}:
            raise ValueError(
                f"`{key}` must be a mapping with keys `agents` (a list of agent indices), `kind` "
                f"(one of {list(FREE_RIDER_KINDS)}) and optionally `report` (one of {list(FREE_RIDER_REPORTS)}), "
                f"or null, got {value!r}."
            )
        report = value.get("report", "honest")
        if report not in FREE_RIDER_REPORTS:
            raise ValueError(f"`{key}.report` must be one of {list(FREE_RIDER_REPORTS)}, got {report!r}.")
        agents, kind = value["agents"], value["kind"]
        ok = isinstance(agents, (list, tuple)) and len(agents) > 0
        ok = ok and all(isinstance(a, int) and not isinstance(a, bool) and a >= 0 for a in agents)
        if not ok or len(set(agents)) != len(agents):
            raise ValueError(f"`{key}.agents` must be a non-empty list of distinct agent indices >= 0, got {agents!r}.")
        if kind not in FREE_RIDER_KINDS:
            raise ValueError(f"`{key}.kind` must be one of {list(FREE_RIDER_KINDS)}, got {kind!r}.")
        return cls(tuple(int(a) for a in agents), str(kind), str(report))

    def mask(self, num_agents: int, device: torch.device | str | None = None, key: str = "free_riders") -> Tensor:
        """``A`` booleans: the free-riders among ``num_agents`` agents (``ValueError`` naming ``key.agents``
        for an index out of range, or for a ``copied`` federation without an honest agent to copy)."""
        bad = [a for a in self.agents if a >= num_agents]
        if bad:
            raise ValueError(f"`{key}.agents` names agent(s) {bad}, but the objective has {num_agents} agents.")
        if self.kind == "copied" and len(self.agents) >= num_agents:
            raise ValueError(f"`{key}.agents` with `kind: copied` must leave at least one honest agent to copy.")
        out = torch.zeros(num_agents, dtype=torch.bool, device=device)
        out[list(self.agents)] = True
        return out

    @staticmethod
    def copied_from(rider: Tensor) -> Tensor:
        """``A`` indices: the agent each agent's ``copied`` message comes from, the next honest agent
        after it (cyclically; an honest agent's own index for itself)."""
        A = rider.numel()
        ar = torch.arange(A, device=rider.device)
        after = (ar.unsqueeze(-1) + torch.arange(1, A + 1, device=rider.device)) % A  # A x A, itself last
        first = (~rider)[after].to(torch.int8).argmax(-1, keepdim=True)
        return torch.where(rider, after.gather(1, first).squeeze(-1), ar)

    def reported(self, scores: Tensor, receiver_rider: Tensor, sender_rider: Tensor) -> Tensor:
        r"""What the receivers report to reciprocity about the peers they received: ``scores`` with a
        colluding free-rider's row replaced (``report: collude``; ``honest``: ``scores`` itself).

        A colluding rider reports ``±``:data:`COLLUDING_SCORE` (``+`` for every fellow rider, ``−`` for every
        honest agent): as ranks (``reciprocity_signal: ranks``) its fellow riders come first and the honest
        agents last, as helpful posteriors (``scores``) 1 and 0 once the rider has the observations to score
        anything (1/2 before, as every receiver's) — the largest shift a single report can make in the
        riders' favour under either signal.

        Args:
            scores: ``batch_shape x A`` each receiver's score of every sender's message.
            receiver_rider: ``batch_shape`` booleans: the receiver is a free-rider.
            sender_rider: ``A`` (or ``batch_shape x A``) booleans: the sender is a free-rider.

        Returns:
            ``batch_shape x A``: the scores as reported.
        """
        if self.report == "honest":
            return scores
        lie = torch.where(sender_rider, COLLUDING_SCORE, -COLLUDING_SCORE).to(scores.dtype).expand_as(scores)
        return torch.where(receiver_rider.unsqueeze(-1), lie, scores)

    def replace(
        self,
        messages: Tensor,
        rider: Tensor,
        keys: Tensor,
        first: Tensor,
        copied: Tensor,
        constant: Tensor | None = None,
        noise: Tensor | None = None,
    ) -> Tensor:
        r"""``batch_shape x M`` messages as sent: the free-riders' replaced (module docstring).

        Args:
            messages: ``batch_shape x M`` the senders' draws of this round.
            rider: ``batch_shape`` booleans, the sender is a free-rider.
            keys: ``batch_shape`` keys of the senders' round (the ``noise`` kind's draws).
            first: ``batch_shape x M`` the senders' round-0 draws (``stale``).
            copied: ``batch_shape x M`` what the senders would copy this round (``copied``: the previous
                round's messages of the agents they copy).
            constant: What the ``constant`` kind sends, broadcastable to ``messages`` (default zeros:
                a flat message). Other messages than draws pass their own uninformative value.
            noise: What the ``noise`` kind sends, ``batch_shape x M`` (default standard normal draws from
                ``keys``: the RFF prior). Other messages than draws pass their own prior's draws.

        Returns:
            ``batch_shape x M``: a free-rider's row replaced by what its kind sends, every other row unchanged.
        """
        M = messages.shape[-1]
        if self.kind == "constant":
            sent = torch.zeros_like(messages) if constant is None else constant.expand_as(messages)
        elif self.kind == "noise":
            sent = kr.normal(kr.fold(keys, "free-rider-noise"), M, dtype=messages.dtype) if noise is None else noise
        elif self.kind == "stale":
            sent = first
        else:
            sent = copied
        return torch.where(rider.unsqueeze(-1), sent.to(messages.dtype), messages)


__all__ = ["COLLUDING_SCORE", "FREE_RIDER_KINDS", "FREE_RIDER_REPORTS", "FreeRiders"]
