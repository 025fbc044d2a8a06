r"""DP-FTS-DE with every agent optimizing at once (DP-FTS-DE Algorithms 1-2).

All ``N`` agents of a federation, times ``R`` independent repetitions, form one
batch of ``B = R·N`` agents (:class:`~fbo_torch.federation.agents.Agents`:
their exact GPs, RFF posteriors and Thompson samples are batched tensor
computations) and one server (:class:`~fbo_torch.federation.server.DPFTSDEServer`)
aggregates all repetitions in one call. The agent and server steps are the
same functions a deployment runs for one agent (:mod:`fbo_torch.flower`);
every random number comes from the agent's (or federation's) keyed stream,
so a round reads nothing back from a GPU until its end.

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

Faults (``settings.faults``): an agent whose evaluation fails (NaN, an
exception, or injected) records the failure and its models skip the point;
an agent whose message is lost is left out of that round's aggregate (the
server aggregates over the agents that reported) and still takes its own
step with its own GP sample or the broadcast.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.federation.agents import Agents
from fbo_torch.federation.faults import FaultInjector, evaluate_agents
from fbo_torch.federation.partition import SubRegionPartition
from fbo_torch.federation.schedules import PtSchedule
from fbo_torch.federation.server import DPFTSDEServer
from fbo_torch.federation.weights import ExplorationWeights
from fbo_torch.objectives.base import Objective
from fbo_torch.runners.common import Domain, broadcast_queries
from fbo_torch.runners.settings import MethodSettings
from fbo_torch.utils import keyed_random as kr
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
        broadcast_maximization: ``"shared"`` (the broadcast is the same for every
            agent of a federation, so it is maximized once per federation) or
            ``"per_agent"`` (every agent maximizes it with its own random
            restarts, as the authors' code does).
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
    broadcast_maximization: str = "shared"

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
        if self.broadcast_maximization not in ("shared", "per_agent"):
            raise ValueError(
                f"`broadcast_maximization` must be 'shared' or 'per_agent', got {self.broadcast_maximization!r}."
            )
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
        failed: ``B x T`` booleans, the evaluation failed (NaN, exception or injected).
        epsilon: ``T`` ε after each round (primary accountant; NaN if not private,
            ``inf`` for non-private releases).
        released: ``T`` booleans, the server released in that round.
        fraction_clipped / num_sampled / fraction_reported: ``T`` means over repetitions.
        signal_norm / noise_norm: ``T x P`` means over repetitions of the norms of each
            region's aggregate ``Σ w clip(ω)/q`` and of its noise.
        data_norm / sample_norm: ``T x P``: the aggregate's two parts, from the agents'
            posterior means ``ν`` and from the sampling randomness ``ω − ν``.
    """

    name: str
    loss: Tensor
    best_value: Tensor
    agents: Tensor
    runs: Tensor
    used_server: Tensor
    failed: Tensor
    epsilon: list[float]
    released: list[bool]
    fraction_clipped: list[float]
    num_sampled: list[float]
    fraction_reported: list[float]
    signal_norm: list[list[float]]
    noise_norm: list[list[float]]
    data_norm: list[list[float]]
    sample_norm: list[list[float]]
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
        seed: Seed of every random stream (initial points depend only on the
            seed and the partition, so methods with the same ``P`` start alike,
            and agents' own Thompson samples use common random numbers across methods).
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
        dev = self.device
        self.agent_of = torch.arange(N, device=dev).repeat(R)
        self.run_of = torch.arange(R, device=dev).repeat_interleave(N)
        self.schedule = PtSchedule(settings.p_t, settings.p1_equals_p2)
        self.seed = int(seed)
        self.t = 0
        self.wall_time = 0.0
        self.faults = FaultInjector(*settings.fault_rates())
        # one stream per agent of each repetition, one per federation (server, shared broadcast search)
        self.agent_keys = federation_agent_keys(self.seed, self.run_of, self.agent_of)
        self.federation_keys = federation_keys(self.seed, torch.arange(R, device=dev))

        self.server = None
        self.features = None
        self.accountant_name = None
        self.delta = None
        if settings.algorithm == "fts_de":
            self.features = settings.features(objective.dim, device=dev)
            self.server = DPFTSDEServer(N, self.domain.bounds, settings, self.federation_keys, accountant, delta)
            if self.server.private:
                self.accountant_name, self.delta = accountant, self.server.ledger.delta
        self.agents, best0 = start_agents(
            objective, settings, self.domain, self.agent_keys, self.agent_of, self.features,
            self.server.partition if self.server is not None else None,
        )
        self.best = best0.unsqueeze(-1)  # B x 1
        self.used_server = torch.zeros(self.B, 0, dtype=torch.bool, device=dev)
        self.failed = torch.zeros(self.B, 0, dtype=torch.bool, device=dev)
        self.epsilons: list[float] = []
        self.released: list[bool] = []
        # per round: server statistics (fraction clipped, sampled, reported, P signal and P noise
        # norms, averaged over repetitions); device tensors until read at the end or a checkpoint
        self._stats: list[list[float]] = []
        self._pending: list[tuple[int, Tensor]] = []

    @property
    def done(self) -> bool:
        return self.t >= self.settings.num_iterations

    @property
    def X(self) -> Tensor:
        """``B x n x d`` queries of every agent so far (row ``r·N + n``)."""
        return self.agents.train_X

    @property
    def Y(self) -> Tensor:
        return self.agents.train_Y

    @property
    def ledger(self):
        """The server's privacy ledger (``None`` when not private)."""
        return None if self.server is None else self.server.ledger

    @property
    def partition(self):
        return None if self.server is None else self.server.partition

    @property
    def assignment(self) -> Tensor | None:
        return None if self.server is None else self.server.assignment

    # ------------------------------------------------------------------- round
    def step(self) -> None:
        """One round for every agent of every repetition (no host synchronization inside)."""
        t0 = time.perf_counter()
        self.t += 1
        t, s = self.t, self.settings
        p = self.schedule(t)
        communicating = self.server is not None and self.server.will_release(p)
        X_srv = None
        if communicating:
            omegas = self.agents.message(t).view(self.R, self.N, -1)
            dropped = self.faults.dropped(self.agent_keys, t).view(self.R, self.N)
            broadcast = self.server.release(omegas, t, reported=None if self.faults.dropout_rate == 0 else ~dropped)
            rec = self.server.last_record
            data_norm, sample_norm = self._signal_parts(omegas, rec, t)
            self._pending.append((t - 1, torch.cat([
                rec.fraction_clipped.unsqueeze(-1), rec.num_sampled.to(rec.fraction_clipped).unsqueeze(-1),
                (rec.num_reported.to(rec.fraction_clipped) / self.N).unsqueeze(-1), rec.signal_norm, rec.noise_norm,
                data_norm, sample_norm,
            ], -1).mean(0)))
            self.epsilons.append(self.server.epsilon if s.noise_multiplier > 0 else math.inf)
            X_srv = self._maximize_broadcast(broadcast, t)  # B x d
        else:
            self.epsilons.append(self.epsilons[-1] if self.epsilons else (0.0 if s.is_private else math.nan))
        self.released.append(communicating)
        self._stats.append([])

        _, used, ok, f = agent_round(self.agents, self.objective, self.agent_of, t, p, X_srv, self.faults)
        self.best = torch.cat([self.best, torch.maximum(self.best[:, -1:], f.unsqueeze(-1))], dim=1)
        self.used_server = torch.cat([self.used_server, used.unsqueeze(-1)], dim=1)
        self.failed = torch.cat([self.failed, (~ok).unsqueeze(-1)], dim=1)
        self.wall_time += time.perf_counter() - t0

    def _signal_parts(self, omegas: Tensor, rec, t: int) -> tuple[Tensor, Tensor]:
        r"""Norms (``R x P``) of the two parts of each region's aggregate ``Σ w c ω / q``
        (``c`` the clipping factor): the *data* part ``Σ w c ν / q`` (agents' posterior means)
        and the *sampled* part ``Σ w c (ω − ν) / q`` (Thompson-sampling randomness). A
        diagnostic only the simulator can compute (the server never sees ``ν``)."""
        agg = self.server.aggregator
        W = agg.region_weights(t) if callable(agg.region_weights) else agg.region_weights
        W = W.to(omegas)
        P = W.shape[0]
        nu = self.agents.rff.weight_mean.view(self.R, self.N, -1)
        norms = omegas.norm(dim=-1, keepdim=True)
        c = torch.clamp((agg.clip_norm / math.sqrt(P)) / norms.clamp_min(torch.finfo(norms.dtype).tiny), max=1.0)
        c = c * rec.sampled.unsqueeze(-1).to(c)
        data = W @ (c * nu) / agg.sample_rate
        sample = W @ (c * (omegas - nu)) / agg.sample_rate
        return data.norm(dim=-1), sample.norm(dim=-1)

    def _maximize_broadcast(self, broadcast: Tensor, t: int) -> Tensor:
        """Each agent's maximizer of ``φ(x)ᵀω^(i[x])``: once per federation, or per agent."""
        return broadcast_points(self.settings, self.features, broadcast, self.server.region_bounds, self.domain, t,
                                self.federation_keys, self.agent_keys, self.run_of)

    def run(self, callback: Callable[[DPFTSDERunner], None] | None = None) -> DPFTSDEResult:
        while not self.done:
            self.step()
            if callback is not None:
                callback(self)
        return self.result()

    def round_stats(self) -> list[list[float]]:
        """Per-round server statistics on the host (``[]`` for rounds without a release);
        device values are read once here, not inside the rounds."""
        if self._pending:
            rows = torch.stack([v for _, v in self._pending]).cpu().tolist()
            for (i, _), row in zip(self._pending, rows):
                self._stats[i] = row
            self._pending = []
        return self._stats

    def result(self) -> DPFTSDEResult:
        loss = self.objective.loss(self.best.T, agents=self.agent_of).T
        stats = self.round_stats()
        P = self.server.num_regions if self.server is not None else 1
        nan = math.nan

        def col(i: int) -> list[float]:
            return [row[i] if row else nan for row in stats]

        return DPFTSDEResult(
            name=self.name,
            loss=loss.cpu(),
            best_value=self.best.cpu(),
            agents=self.agent_of.cpu(),
            runs=self.run_of.cpu(),
            used_server=self.used_server.cpu(),
            failed=self.failed.cpu(),
            epsilon=list(self.epsilons),
            released=list(self.released),
            fraction_clipped=col(0),
            num_sampled=col(1),
            fraction_reported=col(2),
            signal_norm=[row[3 : 3 + P] if row else [nan] * P for row in stats],
            noise_norm=[row[3 + P : 3 + 2 * P] if row else [nan] * P for row in stats],
            data_norm=[row[3 + 2 * P : 3 + 3 * P] if row else [nan] * P for row in stats],
            sample_norm=[row[3 + 3 * P : 3 + 4 * P] if row else [nan] * P for row in stats],
            wall_time=self.wall_time,
            parameters_per_agent=self.settings.num_features if self.settings.algorithm == "fts_de" else 0,
            settings=asdict(self.settings),
            accountant=self.accountant_name,
            delta=self.delta,
        )

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit for bit; the privacy ledger is saved with the
        data of the same round, so a resumed run never forgets a release."""
        return {
            "t": self.t, "best": self.best.cpu(), "used_server": self.used_server.cpu(), "failed": self.failed.cpu(),
            "agents": {k: (v.cpu() if isinstance(v, Tensor) else v) for k, v in self.agents.state_dict().items()},
            "objective_rng": self.objective.rng_state(), "wall_time": self.wall_time,
            "epsilons": self.epsilons, "released": self.released, "stats": self.round_stats(),
            "server": None if self.server is None else self.server.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        dev = self.device
        self.t = int(state["t"])
        self.best, self.used_server = state["best"].to(dev), state["used_server"].to(dev)
        self.failed = state["failed"].to(dev)
        self.agents.load_state_dict(state["agents"])
        self.objective.set_rng_state(state["objective_rng"])
        self.wall_time = float(state["wall_time"])
        self.epsilons, self.released = list(state["epsilons"]), list(state["released"])
        self._stats = [list(r) for r in state["stats"]]
        self._pending = []
        if self.server is not None:
            self.server.load_state_dict(state["server"])


def start_agents(
    objective: Objective,
    settings: DPFTSDESettings,
    domain: Domain,
    keys: Tensor,
    agent_ids: Tensor,
    features: RandomFourierFeatures | None,
    partition: SubRegionPartition | None,
) -> tuple[Agents, Tensor]:
    r"""``B`` agents after their initial queries, and their best initial (noiseless) values ``B``.

    The simulator calls it with every agent of every repetition, a deployed
    agent (:mod:`fbo_torch.flower`) with its own key and index: both get the
    same points (each from the agent's key) and the same models.

    Args:
        keys: ``B`` agent keys (:func:`federation_agent_keys`). agent_ids: ``B``
            agent indices in the objective (agent ``n`` explores region ``n mod P``).
        features: The shared map (``None`` for TS). partition: The server's
            sub-regions (distributed initialization when ``P > 1``), or ``None``.
    """
    spread = (settings.algorithm == "fts_de" and settings.distributed_init and partition is not None
              and partition.num_regions > 1)
    X0 = initial_points(domain, keys, settings.num_init, partition if spread else None, agent_ids)
    y0, F0 = observe_initial(objective, X0, agent_ids, keys)
    agents = Agents(keys, X0, y0.unsqueeze(-1), domain, settings, features, capacity=settings.num_iterations)
    return agents, F0.max(-1).values


def agent_round(
    agents: Agents,
    objective: Objective,
    agent_ids: Tensor,
    round: int,
    p: float,
    X_broadcast: Tensor | None,
    faults: FaultInjector | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""The agents' half of round ``round`` after the broadcast: choose, evaluate, observe.

    Returns:
        ``(X_next, used_broadcast, ok, f)``: ``B x d`` queries, ``B`` booleans
        (the query came from the broadcast), ``B`` booleans (the evaluation
        succeeded) and ``B`` noiseless values of the queries (``-inf`` where
        the evaluation failed; for the records, never seen by the models).
    """
    X_next, used = agents.next_queries(round, p, X_broadcast)
    _, ok = agents.evaluate(objective, agent_ids, X_next, round, faults)
    f, _ = evaluate_agents(objective, X_next, agent_ids, noiseless=True)
    return X_next, used, ok, torch.where(ok & torch.isfinite(f), f, -torch.inf)


def broadcast_points(
    settings: DPFTSDESettings,
    features: RandomFourierFeatures,
    broadcast: Tensor,
    region_bounds: Tensor,
    domain: Domain,
    round: int,
    federation_keys: Tensor,
    agent_keys: Tensor,
    run_of: Tensor,
) -> Tensor:
    r"""``B x d``: each agent's maximizer of its federation's broadcast ``φ(x)ᵀω^(i[x])``.

    Args:
        broadcast: ``R x P x M`` releases of ``R`` federations. federation_keys: ``R`` keys.
        agent_keys: ``B`` keys. run_of: ``B`` federation of each agent.

    With ``broadcast_maximization="shared"`` one maximization per federation
    (its key) serves all its agents; with ``"per_agent"`` each agent maximizes
    with its own key. A deployed agent passes ``R = B = 1``.
    """
    if settings.broadcast_maximization == "shared":
        return broadcast_queries(features, broadcast, region_bounds, domain, round, federation_keys)[run_of]
    return broadcast_queries(features, broadcast[run_of], region_bounds, domain, round, agent_keys)


def federation_agent_keys(seed: int, runs: Tensor, agents: Tensor) -> Tensor:
    """Keys of agent ``agents[b]`` in repetition ``runs[b]`` (the same key in a deployment of repetition 0)."""
    return kr.fold(kr.fold(kr.root_key(seed, "agents"), runs), agents)


def federation_keys(seed: int, runs: Tensor) -> Tensor:
    """Keys of the federations (server streams, shared broadcast maximization)."""
    return kr.fold(kr.root_key(seed, "federation"), runs)


def initial_points(domain: Domain, keys: Tensor, num: int, partition=None, agents: Tensor | None = None) -> Tensor:
    r"""``B x num x d`` initial points of each agent, from its key.

    With a ``partition`` (distributed exploration), agent ``n`` draws inside
    region ``n mod P``; on a finite domain, uniformly among that region's candidates.
    """
    init_keys = kr.fold(keys, "initial-points")
    if partition is None:
        return domain.random(keys.shape[0], num, keys=init_keys)
    regions = agents % partition.num_regions  # the papers' assignment: agent n explores region n mod P
    if domain.candidates is None:
        rb = partition.region_bounds()[regions]  # B x 2 x d
        u = kr.uniform(init_keys, num * domain.dim, dtype=domain.bounds.dtype).view(-1, num, domain.dim)
        return rb[:, 0:1] + u * (rb[:, 1:2] - rb[:, 0:1])
    cand_region = partition.region_of(domain.candidates)  # C
    member = cand_region.unsqueeze(0) == regions.unsqueeze(-1)  # B x C
    count = member.sum(-1)
    if not bool((count > 0).all()):
        raise ValueError("Some sub-region contains no candidate point; use fewer regions.")
    order = torch.argsort((~member).to(torch.int8), dim=-1, stable=True)  # members first
    pick = (kr.uniform(init_keys, num) * count.unsqueeze(-1)).long().clamp_max(count.unsqueeze(-1) - 1)
    return domain.candidates[order.gather(1, pick)]


def observe_initial(objective: Objective, X0: Tensor, agents: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
    r"""Observations ``B x n0`` of the initial points and their noiseless values (``-inf`` where failed)."""
    y, _ = evaluate_agents(objective, X0, agents, kr.fold(keys, "evaluate-init"))
    f, _ = evaluate_agents(objective, X0, agents, noiseless=True)
    return y, torch.where(torch.isfinite(y) & torch.isfinite(f), f, -torch.inf)
