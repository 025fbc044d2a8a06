r"""What the DP-FTS-DE server does in a round (DP-FTS-DE Algorithm 1, lines 5-12).

:class:`DPFTSDEServer` is the server's half of a round, written once: the
batched simulator calls it with ``R`` independent federations (repetitions)
at once, a deployment (:mod:`fbo_torch.flower`) with ``R = 1``. It holds

* the sub-region partition and the agents' assignment (distributed exploration),
* the weight schedule :class:`~fbo_torch.federation.ExplorationWeights`,
* the mechanism :class:`~fbo_torch.federation.DPAggregator` (Poisson
  subsampling, clipping, weighted averages, Gaussian noise),
* the :class:`~fbo_torch.privacy.PrivacyLedger`, which decides whether one
  more release fits the budget and records every release.

Every random number of federation ``r`` comes from its key, folded with the
round (Poisson coins also with the agent index), so the simulator and a
deployment release the same vectors. No device value is read on the host.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from fbo_torch.federation.aggregator import AggregationRecord, DPAggregator
from fbo_torch.federation.partition import SubRegionPartition
from fbo_torch.federation.weights import ExplorationWeights
from fbo_torch.utils.validation import check_int


class DPFTSDEServer:
    r"""The server of ``R`` independent DP-FTS-DE federations of ``N`` agents.

    Args:
        num_agents: ``N`` agents per federation (agent ``n`` explores region ``n mod P``).
        bounds: ``2 x d`` domain (partitioned into ``settings.num_regions`` sub-regions).
        settings: DP-FTS-DE settings (``num_regions``, ``weights``, ``weight_a``,
            ``weight_b``, ``const_rounds``, ``decay_rounds``, ``sample_rate``,
            ``clip_norm``, ``noise_multiplier``, ``local_threshold``, ``max_epsilon``).
        keys: ``R`` int64 keys of the federations' server streams.
        accountant / delta: The privacy ledger's accountant and δ (default ``1/N^1.1``);
            only used when ``noise_multiplier > 0``. ``accountant=None`` runs the
            mechanism without a ledger (benchmarks of the mechanism only: no
            privacy claim is recorded).
    """

    def __init__(
        self,
        num_agents: int,
        bounds: Tensor,
        settings: Any,
        keys: Tensor,
        accountant: str | None = "rdp",
        delta: float | None = None,
    ) -> None:
        N = check_int("num_agents", num_agents, minimum=1)
        self.num_agents, self.settings, self.keys = N, settings, keys
        P = settings.num_regions
        self.partition = SubRegionPartition(bounds, P)
        self.assignment = self.partition.assign_agents(N)
        self.region_bounds = self.partition.region_bounds()
        membership = self.partition.membership(self.assignment)
        weights = ExplorationWeights(
            membership, settings.weight_a, settings.weight_b, settings.const_rounds, settings.decay_rounds,
            mode=settings.weights if P > 1 else "uniform",
        )
        clip = settings.clip_norm if settings.clip_norm is not None else math.inf
        self.aggregator = DPAggregator(settings.sample_rate, clip, settings.noise_multiplier, weights)
        self.ledger = None
        self.private = settings.noise_multiplier > 0
        if self.private and accountant is not None:
            from fbo_torch.privacy import PrivacyLedger

            self.ledger = PrivacyLedger(
                accountant=accountant, delta=delta, num_agents=N if delta is None else None,
                max_epsilon=settings.max_epsilon,
            )
        self.stopped = False
        self.epsilons: list[float] = []

    @property
    def num_regions(self) -> int:
        return self.partition.num_regions

    def will_release(self, p_t: float) -> bool:
        r"""Whether the server releases in a round with ``p_t``.

        It stops for good once ``1 - p_t`` falls below ``local_threshold``
        (DP-FTS-DE footnote 13: agents switch to local TS) or once one more
        release would take ε above ``max_epsilon``.
        """
        if self.stopped:
            return False
        if 1.0 - p_t < self.settings.local_threshold:
            self.stopped = True
            return False
        s = self.settings
        if self.ledger is not None and not self.ledger.can_release(s.noise_multiplier, s.sample_rate):
            self.stopped = True
            return False
        return True

    def release(self, omegas: Tensor, round: int, reported: Tensor | None = None) -> Tensor:
        r"""Aggregate the agents' vectors into ``R x P x M`` broadcast vectors and account for them.

        Args:
            omegas: ``R x N x M`` vectors (rows of agents that did not report may hold anything).
            round: The round (weights schedule, random streams).
            reported: Optional ``R x N`` booleans, agents whose vector arrived.

        Returns:
            The broadcast. The ledger records the release before it is returned.
        """
        s = self.settings
        out = self.aggregator.aggregate(omegas, round=round, keys=self.keys.to(omegas.device), reported=reported)
        if len(self.aggregator.history) > 1:
            del self.aggregator.history[:-1]
        eps = self.ledger.record(s.noise_multiplier, s.sample_rate) if self.ledger is not None else math.inf
        self.epsilons.append(eps)
        return out

    @property
    def last_record(self) -> AggregationRecord | None:
        """The mechanism's record of the last release (device tensors)."""
        return self.aggregator.history[-1] if self.aggregator.history else None

    @property
    def epsilon(self) -> float:
        """ε after the last release (0 before any; ``inf`` for non-private releases)."""
        return self.epsilons[-1] if self.epsilons else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {
            "stopped": self.stopped, "epsilons": list(self.epsilons),
            "ledger": None if self.ledger is None else self.ledger.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stopped = bool(state["stopped"])
        self.epsilons = list(state["epsilons"])
        if self.ledger is not None:
            self.ledger.load_state_dict(state["ledger"])
