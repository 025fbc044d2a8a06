r"""DP-FTS-DE with every agent optimizing at once (DP-FTS-DE Algorithms 1-2).

All ``N`` agents of a federation, times ``R`` independent repetitions, form one
batch of ``B = R·N`` agents: their exact GPs are one batched ``SingleTaskGP``,
their RFF posteriors one :class:`~fbo_torch.models.RFFBayesianLinear` updated
by rank-one Cholesky updates, their Thompson samples are maximized together,
and the server aggregates all repetitions in one call.

Round ``t = 1..T``:

1. every agent draws ``ω_n`` from its RFF posterior and sends it;
2. the server (:class:`~fbo_torch.federation.DPAggregator`) releases ``P``
   vectors per repetition; the privacy ledger records the release;
3. each agent, with probability ``p_t``, maximizes a sample of its own GP;
   otherwise it maximizes ``x ↦ φ(x)ᵀω^(i[x])`` — one bounded maximization per
   sub-region, best kept. The broadcast is the same for all agents of a
   repetition, so this maximization is done once per repetition;
4. every agent queries its point and updates its models.

Before round 1, each agent queries ``N_init`` random points inside its assigned
sub-region (agent ``n`` → region ``n mod P``; distributed exploration).

Agents stop using the server (pure local TS, no further privacy loss) once
``1 - p_t < local_threshold`` (footnote 13) or when one more release would
exceed ``max_epsilon``. With ``algorithm="ts"`` nobody communicates.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from fbo_torch.federation.aggregator import DPAggregator
from fbo_torch.federation.partition import SubRegionPartition
from fbo_torch.federation.schedules import PtSchedule
from fbo_torch.federation.weights import ExplorationWeights
from fbo_torch.models.rff_blr import RFFBayesianLinear
from fbo_torch.objectives.base import Objective
from fbo_torch.runners.settings import MethodSettings
from fbo_torch.runners.common import AgentGPs, Domain, derive_seed, maximize_broadcast, maximize_own_samples
from fbo_torch.utils.validation import check_int, check_probability

ALGORITHMS = ("ts", "fts_de")


@dataclass
class DPFTSDESettings(MethodSettings):
    r"""Settings of one method in a DP-FTS-DE experiment (plus those of :class:`MethodSettings`).

    ``algorithm="fts_de"`` covers the papers' family: FTS (``num_regions=1``,
    ``noise_multiplier=0``), FTS-DE (``num_regions>1``, ``noise_multiplier=0``),
    DP-FTS (``num_regions=1``, ``z>0``) and DP-FTS-DE. ``"ts"`` is standard TS.
    The defaults follow the DP-FTS-DE synthetic setting (``T = 40``,
    ``N_init = 10``, ``M = 50``, ``1 - p_t = 1/√t`` for all t, so ``p_1 = 0``).

    Attributes:
        num_regions: ``P`` sub-regions.
        distributed_init: Initial points inside each agent's assigned region.
        weights: ``"adaptive"``, ``"fixed"`` or ``"uniform"`` (see ExplorationWeights).
        weight_a, weight_b, const_rounds, decay_rounds: The weight schedule.
        sample_rate: ``q``. noise_multiplier: ``z``. clip_norm: ``S`` (None: no clipping).
        local_threshold: Stop using the server once ``1 - p_t`` falls below it.
        max_epsilon: Stop releasing before ε would exceed this (needs ``z > 0``).
    """

    algorithm: str = "fts_de"
    num_iterations: int = 40
    num_init: int = 10
    num_features: int = 50
    p1_equals_p2: bool = False
    gp_refit_every: int = 5
    num_regions: int = 1
    distributed_init: bool = True
    weights: str = "adaptive"
    weight_a: float = 16.0
    weight_b: float = 1.0
    const_rounds: int = 5
    decay_rounds: int = 5
    sample_rate: float = 1.0
    noise_multiplier: float = 0.0
    clip_norm: float | None = None
    local_threshold: float = 0.0
    max_epsilon: float | None = None

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"`algorithm` must be one of {ALGORITHMS}, got {self.algorithm!r}.")
        super().__post_init__()
        check_int("num_regions", self.num_regions, minimum=1)
        check_probability("sample_rate", self.sample_rate, open_left=True)
        if not (isinstance(self.noise_multiplier, (int, float)) and self.noise_multiplier >= 0):
            raise ValueError(f"`noise_multiplier` z must be >= 0, got {self.noise_multiplier!r}.")
        if self.clip_norm is not None and not (isinstance(self.clip_norm, (int, float)) and self.clip_norm > 0):
            raise ValueError(f"`clip_norm` S must be > 0 (or null for no clipping), got {self.clip_norm!r}.")
        if self.noise_multiplier > 0 and self.clip_norm is None:
            raise ValueError("`clip_norm` is required when `noise_multiplier` > 0.")
        if self.max_epsilon is not None and not self.max_epsilon > 0:
            raise ValueError(f"`max_epsilon` must be > 0, got {self.max_epsilon!r}.")
        check_probability("local_threshold", self.local_threshold)
        if self.weights not in ExplorationWeights.MODES:
            raise ValueError(f"`weights` must be one of {ExplorationWeights.MODES}, got {self.weights!r}.")

    @property
    def is_private(self) -> bool:
        return self.algorithm == "fts_de" and self.noise_multiplier > 0


@dataclass
class DPFTSDEResult:
    r"""Records of one method.

    Attributes:
        loss: ``B x (T+1)`` loss of each (repetition, agent); row ``r·N + n``.
        agents / runs: ``B`` objective agent and repetition of each row.
        used_server: ``B x T`` booleans, the query came from the broadcast.
        epsilon: ``T`` ε after each round (primary accountant; NaN if not private,
            ``inf`` for non-private releases).
        released: ``T`` booleans, the server released in that round.
        fraction_clipped / num_sampled: ``T`` means over repetitions.
    """

    name: str
    loss: Tensor
    best_value: Tensor
    agents: Tensor
    runs: Tensor
    used_server: Tensor
    epsilon: list[float]
    released: list[bool]
    fraction_clipped: list[float]
    num_sampled: list[float]
    wall_time: float
    parameters_per_agent: int
    settings: dict[str, Any]
    accountant: str | None
    delta: float | None


class DPFTSDERunner:
    r"""Runs DP-FTS-DE (or TS) for all agents and ``num_inits`` repetitions at once.

    Args:
        objective: The federation; every agent is a target.
        settings: :class:`DPFTSDESettings`.
        num_inits: Independent repetitions ``R``.
        domain: Search domain (default: from the objective).
        seed: Seed of initial points and all decisions (initial points depend
            only on the seed and the partition, so methods with the same ``P``
            start alike).
        device: ``"cpu"`` or ``"cuda"``.
        name: Label.
        accountant: Privacy accountant name for the ledger (``"rdp"`` default;
            ``"rdp-classic"`` reproduces the papers' numbers).
        delta: δ (default ``1/N^1.1``).
    """

    def __init__(
        self,
        objective: Objective,
        settings: DPFTSDESettings,
        num_inits: int,
        domain: Domain | None = None,
        seed: int = 0,
        device: torch.device | str = "cpu",
        name: str | None = None,
        accountant: str = "rdp",
        delta: float | None = None,
    ) -> None:
        self.objective, self.settings = objective, settings
        self.device = torch.device(device)
        self.name = name or settings.algorithm
        self.domain = (domain or Domain(objective.bounds, objective.candidates)).to(self.device)
        R = check_int("num_inits", num_inits, minimum=1)
        N = objective.num_agents
        self.R, self.N, self.B = R, N, R * N
        self.agent_of = torch.arange(N, device=self.device).repeat(R)
        self.run_of = torch.arange(R, device=self.device).repeat_interleave(N)
        self.schedule = PtSchedule(settings.p_t, settings.p1_equals_p2)
        self.seed = int(seed)
        self.t = 0
        self.wall_time = 0.0

        P = settings.num_regions if settings.algorithm == "fts_de" else 1
        self.partition = SubRegionPartition(self.domain.bounds, P)
        self.assignment = self.partition.assign_agents(N)  # N
        init_gen = torch.Generator().manual_seed(self.seed)
        self.X = self._initial_points(init_gen)
        objective.reseed(self.seed + 7)
        self.Y = objective(self.X, agents=self.agent_of).unsqueeze(-1)
        F = objective.evaluate_true(self.X, agents=self.agent_of)
        self.best = F.max(-1).values.unsqueeze(-1)  # B x 1
        self.used_server = torch.zeros(self.B, 0, dtype=torch.bool, device=self.device)
        self.gps = AgentGPs(self.domain.bounds, kernel=settings.gp_kernel, refit_every=settings.gp_refit_every)
        self.gen = torch.Generator().manual_seed(self.seed + 3)
        # own GP samples and their maximization draw from their own stream, so methods
        # sharing a seed use common random numbers for the agents' own Thompson samples
        self.sample_gen = torch.Generator().manual_seed(self.seed + 8)
        self.msg_gen = torch.Generator().manual_seed(self.seed + 5)
        self.server_gen = torch.Generator().manual_seed(self.seed + 6)
        self.epsilons: list[float] = []
        self.released: list[bool] = []
        self.fraction_clipped: list[float] = []
        self.num_sampled: list[float] = []
        self.stopped = settings.algorithm == "ts"

        self.features = None
        self.server = None
        self.ledger = None
        self.accountant_name = None
        self.delta = None
        if settings.algorithm == "fts_de":
            self.features = settings.features(objective.dim, device=self.device)
            self.rff = RFFBayesianLinear(self.features, self.X, self.Y, settings.rff_noise_variance)
            self.rff.reserve(settings.num_iterations)  # no reallocation inside the rounds
            membership = self.partition.membership(self.assignment)
            weights = ExplorationWeights(
                membership, settings.weight_a, settings.weight_b, settings.const_rounds, settings.decay_rounds,
                mode=settings.weights if P > 1 else "uniform",
            )
            clip = settings.clip_norm if settings.clip_norm is not None else math.inf
            self.server = DPAggregator(settings.sample_rate, clip, settings.noise_multiplier, weights)
            if settings.is_private:
                from fbo_torch.privacy import PrivacyLedger

                self.ledger = PrivacyLedger(
                    accountant=accountant, delta=delta, num_agents=N if delta is None else None,
                    max_epsilon=settings.max_epsilon,
                )
                self.accountant_name, self.delta = accountant, self.ledger.delta

    # ------------------------------------------------------------------ setup
    def _initial_points(self, gen: torch.Generator) -> Tensor:
        n0 = self.settings.num_init
        regions = self.assignment.repeat(self.R)
        spread = self.settings.algorithm == "fts_de" and self.settings.distributed_init and self.partition.num_regions > 1
        if not spread:
            return self.domain.random(self.B, n0, generator=gen)
        if self.domain.candidates is None:
            return self.partition.sample(regions, n0, generator=gen, dtype=self.domain.bounds.dtype)
        # finite domain: uniform among the candidates of each agent's region
        cand_region = self.partition.region_of(self.domain.candidates)  # C
        member = cand_region.unsqueeze(0) == regions.unsqueeze(-1)  # B x C
        if not member.any(-1).all():
            raise ValueError("Some sub-region contains no candidate point; use fewer regions.")
        probs = member.to(torch.float64)
        idx = torch.multinomial(probs.cpu(), n0, replacement=True, generator=gen).to(self.device)
        return self.domain.candidates[idx]

    @property
    def done(self) -> bool:
        return self.t >= self.settings.num_iterations

    # ------------------------------------------------------------------- round
    def _communicating(self, p: float) -> bool:
        if self.stopped:
            return False
        if 1.0 - p < self.settings.local_threshold:
            self.stopped = True  # footnote 13: switch to local TS for good
            return False
        if self.ledger is not None and not self.ledger.can_release(self.settings.noise_multiplier, self.settings.sample_rate):
            self.stopped = True  # the privacy budget would be exceeded
            return False
        return True

    def step(self) -> None:
        """One round for every agent of every repetition."""
        t0 = time.perf_counter()
        self.t += 1
        t = self.t
        p = self.schedule(t)
        s = self.settings
        communicating = self._communicating(p)
        X_srv = None
        if communicating:
            omegas = self.rff.sample_weights(generator=self.msg_gen).view(self.R, self.N, -1)
            broadcast = self.server.aggregate(omegas, round=t, generator=self.server_gen)
            rec = self.server.history[-1]
            self.fraction_clipped.append(float(rec.fraction_clipped.double().mean()))
            self.num_sampled.append(float(rec.num_sampled.double().mean()))
            eps = self.ledger.record(s.noise_multiplier, s.sample_rate) if self.ledger is not None else math.inf
            if s.noise_multiplier == 0:
                eps = math.inf
            self.epsilons.append(eps)
            X_srv, _ = maximize_broadcast(
                self.features, broadcast, self.partition.region_bounds(), self.domain, generator=self.gen
            )
        else:
            self.fraction_clipped.append(math.nan)
            self.num_sampled.append(math.nan)
            self.epsilons.append(self.epsilons[-1] if self.epsilons else (math.nan if not s.is_private else 0.0))
        self.released.append(communicating)
        self.server_history_trim()

        p_eff = p if communicating else 1.0
        u = torch.rand(self.B, dtype=torch.float64, generator=self.gen).to(self.device)
        own = u <= p_eff
        X_next = torch.empty(self.B, self.objective.dim, dtype=self.X.dtype, device=self.device)
        if bool(own.any()):
            model = self.gps.update(self.X, self.Y)
            X_own, _ = maximize_own_samples(
                model, self.domain, seed=derive_seed(self.sample_gen), generator=self.sample_gen,
                num_features=self.settings.gp_sample_features,
            )
            X_next[own] = X_own[own]
        if not bool(own.all()):
            X_next[~own] = X_srv[self.run_of[~own]]
        y = self.objective(X_next.unsqueeze(1), agents=self.agent_of)
        f = self.objective.evaluate_true(X_next.unsqueeze(1), agents=self.agent_of)
        self.X = torch.cat([self.X, X_next.unsqueeze(1)], dim=1)
        self.Y = torch.cat([self.Y, y.unsqueeze(-1)], dim=1)
        self.best = torch.cat([self.best, torch.maximum(self.best[:, -1:], f)], dim=1)
        self.used_server = torch.cat([self.used_server, (~own).unsqueeze(-1)], dim=1)
        if self.settings.algorithm == "fts_de":
            self.rff.update(X_next.unsqueeze(1), y.unsqueeze(-1))
        self.wall_time += time.perf_counter() - t0

    def server_history_trim(self) -> None:
        """Keep only the last server record (the per-round summaries are stored separately)."""
        if self.server is not None and len(self.server.history) > 1:
            del self.server.history[:-1]

    def run(self, callback: Callable[[DPFTSDERunner], None] | None = None) -> DPFTSDEResult:
        while not self.done:
            self.step()
            if callback is not None:
                callback(self)
        return self.result()

    def result(self) -> DPFTSDEResult:
        loss = self.objective.loss(self.best.T, agents=self.agent_of).T
        return DPFTSDEResult(
            name=self.name,
            loss=loss.cpu(),
            best_value=self.best.cpu(),
            agents=self.agent_of.cpu(),
            runs=self.run_of.cpu(),
            used_server=self.used_server.cpu(),
            epsilon=list(self.epsilons),
            released=list(self.released),
            fraction_clipped=list(self.fraction_clipped),
            num_sampled=list(self.num_sampled),
            wall_time=self.wall_time,
            parameters_per_agent=self.settings.num_features if self.settings.algorithm == "fts_de" else 0,
            settings=asdict(self.settings),
            accountant=self.accountant_name,
            delta=self.delta,
        )

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume; the privacy ledger is saved with the data
        of the same round, so a resumed run never forgets a release."""
        return {
            "t": self.t, "X": self.X, "Y": self.Y, "best": self.best, "used_server": self.used_server,
            "gen": self.gen.get_state(), "sample_gen": self.sample_gen.get_state(), "msg_gen": self.msg_gen.get_state(), "server_gen": self.server_gen.get_state(),
            "torch_rng": torch.get_rng_state(), "objective_rng": self.objective.rng_state(),
            "gps": self.gps.state_dict(), "wall_time": self.wall_time, "stopped": self.stopped,
            "epsilons": self.epsilons, "released": self.released,
            "fraction_clipped": self.fraction_clipped, "num_sampled": self.num_sampled,
            "ledger": None if self.ledger is None else self.ledger.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        dev = self.device
        self.t = int(state["t"])
        self.X, self.Y = state["X"].to(dev), state["Y"].to(dev)
        self.best, self.used_server = state["best"].to(dev), state["used_server"].to(dev)
        self.gen.set_state(state["gen"])
        self.sample_gen.set_state(state["sample_gen"])
        self.msg_gen.set_state(state["msg_gen"])
        self.server_gen.set_state(state["server_gen"])
        torch.set_rng_state(state["torch_rng"])
        self.objective.set_rng_state(state["objective_rng"])
        self.gps.load_state_dict(state["gps"])
        self.wall_time, self.stopped = float(state["wall_time"]), bool(state["stopped"])
        self.epsilons, self.released = list(state["epsilons"]), list(state["released"])
        self.fraction_clipped, self.num_sampled = list(state["fraction_clipped"]), list(state["num_sampled"])
        if self.ledger is not None:
            self.ledger.load_state_dict(state["ledger"])
        if self.settings.algorithm == "fts_de":
            self.rff = RFFBayesianLinear(self.features, self.X, self.Y, self.settings.rff_noise_variance)
            self.rff.reserve(max(0, self.settings.num_iterations - self.t))
