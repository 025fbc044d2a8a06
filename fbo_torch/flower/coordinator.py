r"""The server's side of a deployment, as a sequence of exchanges.

A deployed round needs one exchange with the agents, not two: the reply to
exchange ``t`` carries the agent's round-``t`` results *and* its ``ω`` for the
release of round ``t + 1`` (drawn after it observed round ``t``'s point, as in
the simulator). So a run of ``T`` rounds is ``T + 1`` exchanges:

* exchange 0: agents set up (initial queries) and send ``ω`` for round 1;
* exchange ``t = 1..T``: the server releases round ``t``'s broadcast from the
  ``ω`` it received, sends it with ``p_t``; agents take round ``t`` and send
  ``ω`` for round ``t + 1`` when the server will release again.

:class:`Coordinator` holds the simulator's server,
:class:`~fbo_torch.federation.server.DPFTSDEServer` with ``R = 1`` (the
sub-region partition, the region weights, the
:class:`~fbo_torch.federation.DPAggregator` and the
:class:`~fbo_torch.privacy.PrivacyLedger`), and calls it in the simulator's
order: ``will_release(p_1)``, ``release(1)``, ``will_release(p_2)``, ... so the
ledger, the Poisson coins and the noise are the simulator's. Nothing here
imports ``flwr``.

**Agents that do not report** (a straggler past the round's timeout, a node
that went away, a refused node) are aggregated as the simulator aggregates
dropped agents: their rows are left out of the sum (``reported = False``),
nothing is renormalized, and the noise keeps its scale ``z φ_max S / q``. The
accounting with ``(z, q)`` stays valid: an agent's vector enters a release
only if its Poisson coin (probability ``q``, drawn by the server) came up *and*
it reported, so it enters with probability at most ``q``, and each vector it
contributes is clipped to the same bound; an agent that did not report
contributes nothing, so the release's distribution does not depend on its data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fbo_torch.flower.config import FlowerRunConfig


@dataclass(frozen=True)
class RoundPlan:
    r"""What the server sends every agent in one exchange.

    Attributes:
        round: ``t`` (0: set-up).
        p: ``p_t`` (0.0 in exchange 0).
        broadcast: ``P x M`` release of round ``t``, or ``None``.
        region_bounds: ``P x 2 x d`` sub-regions (``None`` for TS).
        omega_round: The round whose release the agents send ``ω`` for (0: none).
        fingerprint: The server's feature-map fingerprint (``""`` for TS).
        features: The feature map's constructor arguments (``{}`` for TS).
    """

    round: int
    p: float
    broadcast: Tensor | None
    region_bounds: Tensor | None
    omega_round: int
    fingerprint: str
    features: dict = field(default_factory=dict)


@dataclass
class RoundLog:
    r"""The server's record of one round: ``released``, ``epsilon`` after it, reporters."""

    round: int
    released: bool
    epsilon: float
    num_reported: int
    num_replied: int = 0
    best_values: dict[int, float] = field(default_factory=dict)
    num_observations: dict[int, int] = field(default_factory=dict)


class Coordinator:
    r"""The DP-FTS-DE server of one deployed federation of ``N`` agents.

    Args:
        config: The run config.
        bounds: ``2 x d`` domain (from the objective).
    """

    def __init__(self, config: FlowerRunConfig, bounds: Tensor, dim: int) -> None:
        from fbo_torch.federation.schedules import PtSchedule
        from fbo_torch.federation.server import DPFTSDEServer

        self.config = config
        self.settings = s = config.dp_settings()
        self.N = int(config.num_agents)
        self.schedule = PtSchedule(s.p_t, s.p1_equals_p2)
        self.server = None
        self.features = None
        if s.algorithm == "fts_de":
            self.features = s.features(dim)
            self.server = DPFTSDEServer(self.N, bounds.to(torch.float64), s, config.federation_key(),
                                        config.accountant, config.delta_or_none)
        M = s.num_features
        self._omegas = torch.zeros(1, self.N, M, dtype=torch.float64)
        self._reported = torch.zeros(1, self.N, dtype=torch.bool)
        self._omega_round = 0
        self.round = -1
        self.logs: list[RoundLog] = []
        self.refused: dict[int, str] = {}  # agent -> why
        self.refused_nodes: dict[int, str] = {}  # transport peer (e.g. Flower node id) -> why

    @property
    def fingerprint(self) -> str:
        return "" if self.features is None else self.features.fingerprint

    @property
    def ledger(self):
        return None if self.server is None else self.server.ledger

    @property
    def epsilon(self) -> float:
        """ε after the last round (NaN without DP, ``inf`` after a non-private release)."""
        return self.logs[-1].epsilon if self.logs else (0.0 if self.settings.is_private else math.nan)

    @property
    def done(self) -> bool:
        return self.round >= self.settings.num_iterations

    def plan(self) -> RoundPlan:
        r"""Open the next exchange: release the round's broadcast (if any) and decide the next."""
        s = self.settings
        t = self.round + 1
        broadcast, released = None, False
        if t >= 1 and self._omega_round == t:
            broadcast = self.server.release(self._omegas, t, reported=self._reported.clone())[0]
            released = True
        if t >= 1:
            eps = (self.server.epsilon if s.noise_multiplier > 0 else math.inf) if released else self.epsilon
            self.logs.append(RoundLog(t, released, eps, int(self._reported.sum()) if released else 0))
        omega_round = 0
        if t < s.num_iterations and self.server is not None and self.server.will_release(self.schedule(t + 1)):
            omega_round = t + 1
        self._omega_round = omega_round
        self._omegas.zero_()
        self._reported.zero_()
        self.round = t
        return RoundPlan(
            t, float(self.schedule(t)) if t >= 1 else 0.0, broadcast,
            None if self.server is None else self.server.region_bounds, omega_round, self.fingerprint,
            {} if self.features is None else self.features.config(),
        )

    def receive(self, agent_id: int, fingerprint: str, omega: Tensor | None, best_value: float | None = None,
                num_observations: int | None = None) -> None:
        r"""Take an agent's reply to the current exchange.

        Raises:
            ValueError: A reply from an unknown agent, a feature map that is not the
                server's (the agent is refused for the rest of the run), or a missing ``ω``.
        """
        n = int(agent_id)
        if not 0 <= n < self.N:
            raise ValueError(f"reply from agent {n}, outside 0..{self.N - 1}.")
        if fingerprint != self.fingerprint:
            self.refuse(n, f"feature map fingerprint {fingerprint!r} != the server's {self.fingerprint!r}")
            raise ValueError(f"agent {n} refused: {self.refused[n]}.")
        if n in self.refused:
            return
        if self.logs:
            self.logs[-1].num_replied += 1
            if num_observations is not None:
                self.logs[-1].num_observations[n] = int(num_observations)
            if best_value is not None and self.config.report_best:
                self.logs[-1].best_values[n] = float(best_value)
        if self._omega_round:
            if omega is None or omega.shape != (self._omegas.shape[-1],):
                raise ValueError(f"agent {n} sent no M-vector ω for round {self._omega_round}.")
            self._omegas[0, n] = omega.to(self._omegas)
            self._reported[0, n] = True

    def refuse(self, agent_id: int, reason: str) -> None:
        """Leave agent ``agent_id`` out of every later release."""
        self.refused[int(agent_id)] = reason
        self._reported[0, int(agent_id)] = False
