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

With ``aggregation = "secure"`` the same round runs the secure mechanism of
a deployment (:mod:`fbo_torch.federation.secure`): the server draws the
coins, every agent turns its ``ω`` into its integer vector with its own
noise share (all agents at once, from their own secrets), the survivors'
vectors are added modulo ``m`` — exactly the sum secure aggregation reveals —
and the server commits and decodes it. A federation whose sum has fewer than
``min_survivors`` vectors releases nothing that round, and its agents take
their own proposals.

Faults (``settings.faults``): an agent whose evaluation fails (NaN, an
exception, or injected) records the failure and its models skip the point;
an agent whose message is lost is left out of that round's aggregate (the
server aggregates over the agents that reported) and still takes its own
step with its own GP sample or the broadcast.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from fbo_torch.federation.agents import agent_messages, agent_round, broadcast_points, start_agents
from fbo_torch.federation.aggregator import AggregationRecord, clip_vectors
from fbo_torch.federation.secure import agent_secret, research_master
from fbo_torch.federation.server import DPFTSDEServer
from fbo_torch.federation.settings import DPFTSDESettings
from fbo_torch.objectives.base import Objective
from fbo_torch.optim.domain import Domain
from fbo_torch.privacy import DEFAULT_ACCOUNTANT
from fbo_torch.privacy.ledger import PrivacyLedger
from fbo_torch.protocol.keys import federation_agent_keys, federation_keys
from fbo_torch.protocol.partition import SubRegionPartition
from fbo_torch.protocol.randomness import ServerRandomness
from fbo_torch.protocol.schedules import PtSchedule
from fbo_torch.simulate.common import Runner
from fbo_torch.utils.validation import check_int

#: Most numbers (inputs and values) of every agent's queries a result keeps (``queries``, ``observations``): a
#: federation of 1,000 agents with 100 queries in d = 9. Larger runs keep none (their records would outgrow
#: the rest), so their accounting has no posterior gain (:mod:`fbo_torch.experiments.posterior_gain`).
MAX_RECORDED_QUERIES = 1_000_000


@dataclass
class DPFTSDEResult:
    r"""Records of one method.

    Attributes:
        loss: ``B x (T+1)`` loss of each (repetition, agent); row ``r·N + n``.
        agents / runs: ``B`` objective agent and repetition of each row.
        used_server: ``B x T`` booleans, the query came from the broadcast.
        failed: ``B x T`` booleans, the evaluation failed (NaN, exception or injected).
        epsilon: ``T`` ε after each round (primary accountant; NaN if not private,
            ``inf`` for non-private releases). With secure aggregation: ε against
            other agents and outsiders.
        epsilon_server: ``T`` ε against the server after each round (secure
            aggregation; ``None`` otherwise).
        released: ``T`` booleans, the server released in that round.
        fraction_clipped / num_sampled / fraction_reported: ``T`` means over repetitions.
        signal_norm / noise_norm: ``T x P`` means over repetitions of the norms of each
            region's aggregate ``Σ w clip(ω)/q`` and of its noise.
        data_norm / sample_norm: ``T x P``: the aggregate's two parts, from the agents'
            posterior means ``ν`` and from the sampling randomness ``ω − ν``.
        queries / observations: ``B x n x d`` and ``B x n``, every row's queries and what they returned (NaN
            where the evaluation failed); ``None`` above :data:`MAX_RECORDED_QUERIES` numbers.
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
    epsilon_server: list[float] | None = None
    queries: Tensor | None = None
    observations: Tensor | None = None


class DPFTSDERunner(Runner[DPFTSDEResult]):
    r"""Runs DP-FTS-DE (or TS) for all agents and ``num_inits`` repetitions at once.

    A run is one agent of one repetition: ``X`` is ``B x n x d`` with ``B = R N``, row ``r·N + n``.

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
        server_randomness: The server's coins and noise. Default: the
            federations' seeded streams (reproducible — research only: anyone
            who knows the seed can recompute the noise). Pass a
            :class:`~fbo_torch.protocol.randomness.SecretServerRandomness` for
            noise that only its secret reproduces (what a deployment uses).
        agent_master: With secure aggregation, the 32-byte secret every agent's own
            secret is derived from (:func:`~fbo_torch.federation.secure.agent_secret`;
            deployed agents draw theirs from the OS). Default: derived from ``seed``
            (reproducible, research only).
        max_memory: Working-memory budget of the agents' own proposals
            (:func:`~fbo_torch.federation.chunks.round_budget`).
    """

    settings: DPFTSDESettings

    def __init__(
        self,
        objective: Objective,
        settings: DPFTSDESettings,
        num_inits: int,
        domain: Domain | None = None,
        seed: int = 0,
        device: torch.device | str = "cpu",
        name: str | None = None,
        accountant: str = DEFAULT_ACCOUNTANT,
        delta: float | None = None,
        server_randomness: ServerRandomness | None = None,
        agent_master: bytes | None = None,
        max_memory: int | str | None = None,
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
        self.faults = settings.fault_injector()
        # one stream per agent of each repetition, one per federation (server, shared broadcast search)
        self.agent_keys = federation_agent_keys(self.seed, self.run_of, self.agent_of)
        self.federation_keys = federation_keys(self.seed, torch.arange(R, device=dev))

        self.server = None
        self.features = None
        self.accountant_name = None
        self.delta = None
        if settings.method.federated():
            self.features = settings.features(objective.dim, device=dev)
            randomness = server_randomness if server_randomness is not None else self.federation_keys
            self.server = DPFTSDEServer(N, self.domain.bounds, settings, randomness, accountant, delta)
            ledger = self.server.ledger  # a private server's
            if ledger is not None:
                self.accountant_name, self.delta = ledger.mechanism, ledger.delta
            if self.server.secure:
                master = research_master(self.seed) if agent_master is None else agent_master
                self.agent_secrets = [
                    agent_secret(master, r, n)
                    for r, n in zip(self.run_of.tolist(), self.agent_of.tolist(), strict=True)
                ]
        self.agents, best0 = start_agents(
            objective,
            settings,
            self.domain,
            self.agent_keys,
            self.agent_of,
            self.features,
            self.server.partition if self.server is not None else None,
            max_memory=max_memory,
        )
        self.best = best0.unsqueeze(-1)  # B x 1
        self.used_server = torch.zeros(self.B, 0, dtype=torch.bool, device=dev)
        self.failed = torch.zeros(self.B, 0, dtype=torch.bool, device=dev)
        # per round: server statistics (fraction clipped, sampled, reported, P signal and P noise
        # norms, averaged over repetitions); device tensors until read at the end or a checkpoint
        self._stats: list[list[float]] = []
        self._pending: list[tuple[int, Tensor]] = []

    @property
    def epsilons(self) -> list[float]:
        """ε after each round so far (the server's records; NaN without a server)."""
        return self.server.epsilons if self.server is not None else [math.nan] * self.t

    @property
    def released(self) -> list[bool]:
        """Whether the server released in each round so far."""
        return self.server.released if self.server is not None else [False] * self.t

    @property
    def ledger(self) -> PrivacyLedger | None:
        """The server's privacy ledger (``None`` when not private)."""
        return None if self.server is None else self.server.ledger

    @property
    def partition(self) -> SubRegionPartition | None:
        return None if self.server is None else self.server.partition

    @property
    def assignment(self) -> Tensor | None:
        return None if self.server is None else self.server.assignment

    @property
    def _server(self) -> DPFTSDEServer:
        """The server of an FTS-DE run (what a round's server steps below use)."""
        if self.server is None:
            raise RuntimeError("a TS run has no server.")
        return self.server

    # ------------------------------------------------------------------- round
    def step(self) -> None:
        """One round for every agent of every repetition (no host synchronization inside)."""
        t0 = time.perf_counter()
        self.t += 1
        t = self.t
        p = self.schedule(t)
        X_srv = received = None
        if self.server is not None and self.server.plan(t, p):
            omegas = agent_messages(self.agents, t, self.faults).view(self.R, self.N, -1)
            dropped = self.faults.dropped(self.agent_keys, t).view(self.R, self.N)
            if self.server.secure:
                broadcast, received = self._secure_round(omegas, ~dropped, t)
            else:
                broadcast = self.server.release(omegas, reported=None if self.faults.dropout_rate == 0 else ~dropped)
            rec = self.server.last_record
            if broadcast is not None:
                # a release leaves its record, with the reports
                assert rec is not None and rec.valid is not None and rec.num_reported is not None
                if self.faults.affects_messages:  # hostile rows may be non-finite: the diagnostic sees what was used
                    omegas = torch.where(
                        rec.valid.unsqueeze(-1) & torch.isfinite(omegas).all(-1, keepdim=True), omegas, 0.0
                    )
                data_norm, sample_norm = self._signal_parts(omegas, rec, t)
                if self.server.secure:
                    rec.signal_norm, rec.noise_norm = self._secure_norms(omegas, rec, broadcast, t)
                assert rec.signal_norm is not None and rec.noise_norm is not None  # the release's, or just above
                self._pending.append(
                    (
                        t - 1,
                        torch.cat(
                            [
                                rec.fraction_clipped.unsqueeze(-1),
                                rec.num_sampled.to(rec.fraction_clipped).unsqueeze(-1),
                                (rec.num_reported.to(rec.fraction_clipped) / self.N).unsqueeze(-1),
                                rec.signal_norm,
                                rec.noise_norm,
                                data_norm,
                                sample_norm,
                            ],
                            -1,
                        ).mean(0),
                    )
                )
                X_srv = self._maximize_broadcast(broadcast, t)  # B x d
        self._stats.append([])

        _, used, ok, f = agent_round(self.agents, self.objective, self.agent_of, t, p, X_srv, self.faults, received)
        self.best = torch.cat([self.best, torch.maximum(self.best[:, -1:], f.unsqueeze(-1))], dim=1)
        self.used_server = torch.cat([self.used_server, used.unsqueeze(-1)], dim=1)
        self.failed = torch.cat([self.failed, (~ok).unsqueeze(-1)], dim=1)
        self.wall_time += time.perf_counter() - t0

    def _secure_round(self, omegas: Tensor, survivors: Tensor, t: int) -> tuple[Tensor | None, Tensor | None]:
        r"""A secure round for every federation: the server's coins, the agents' integer vectors (one
        batched call), the survivors' modular sum, the server's commit and decoding. Returns the
        ``R x P x M`` broadcast (or ``None``) and ``B`` booleans: the agent's federation released (``None``
        when all did)."""
        server = self._server
        mech = server.mechanism
        assert mech is not None  # a secure server's
        sampled, ratios = server.secure_cohort(self.R, like=omegas)
        y, clipped = mech.contributions(
            omegas.reshape(self.B, -1), sampled.reshape(self.B), ratios.T[self.agent_of], self.agent_secrets, t
        )
        survivors = survivors.cpu()
        total = mech.modular_sum(y.view(self.R, self.N, -1), survivors)
        released = server.commit_secure(survivors)
        broadcast = server.reveal_secure(total) if bool(released.any()) else None
        if broadcast is None:
            return None, None
        rec = server.last_record
        assert rec is not None  # reveal_secure released
        took = clipped.view(self.R, self.N) & survivors
        n = rec.num_sampled.to(torch.float64)
        rec.clipped = took
        rec.fraction_clipped = torch.where(n > 0, took.sum(-1) / n.clamp_min(1), 0.0)
        dev = self.device
        for name in ("sampled", "num_sampled", "clipped", "fraction_clipped", "num_reported", "valid", "num_invalid"):
            setattr(rec, name, getattr(rec, name).to(dev))
        # every federation released: nothing to mask (its agents then skip their own proposal when p_t = 0,
        # as a deployed agent that received a broadcast does)
        return broadcast.to(dev), None if bool(released.all()) else released.to(dev)[self.run_of]

    def _secure_norms(self, omegas: Tensor, rec: AggregationRecord, broadcast: Tensor, t: int) -> tuple[Tensor, Tensor]:
        """``R x P`` norms of a secure release's data part ``Σ w clip(ω)/q`` (what the central release would
        hold) and of the rest (rounding and the summed noise shares): a diagnostic of the simulator only."""
        agg = self._server.aggregator
        W = agg.weights(t).to(omegas)
        P = W.shape[0]
        clipped, _ = clip_vectors(omegas, agg.clip_norm / math.sqrt(P))
        signal = W @ (clipped * rec.sampled.unsqueeze(-1).to(omegas)) / agg.sample_rate
        return signal.norm(dim=-1), (broadcast - signal).norm(dim=-1)

    def _signal_parts(self, omegas: Tensor, rec: AggregationRecord, t: int) -> tuple[Tensor, Tensor]:
        r"""Norms (``R x P``) of the two parts of each region's aggregate ``Σ w c ω / q``
        (``c`` the clipping factor): the *data* part ``Σ w c ν / q`` (agents' posterior means)
        and the *sampled* part ``Σ w c (ω − ν) / q`` (Thompson-sampling randomness). A
        diagnostic only the simulator can compute (the server never sees ``ν``)."""
        agg = self._server.aggregator
        W = agg.region_weights(t) if callable(agg.region_weights) else agg.region_weights
        W = W.to(omegas)
        P = W.shape[0]
        assert self.agents.rff is not None  # FTS-DE agents hold the shared map's posterior
        nu = self.agents.rff.weight_mean.view(self.R, self.N, -1)
        norms = omegas.norm(dim=-1, keepdim=True)
        c = torch.clamp((agg.clip_norm / math.sqrt(P)) / norms.clamp_min(torch.finfo(norms.dtype).tiny), max=1.0)
        c = c * rec.sampled.unsqueeze(-1).to(c)
        data = W @ (c * nu) / agg.sample_rate
        sample = W @ (c * (omegas - nu)) / agg.sample_rate
        return data.norm(dim=-1), sample.norm(dim=-1)

    def _maximize_broadcast(self, broadcast: Tensor, t: int) -> Tensor:
        """Each agent's maximizer of ``φ(x)ᵀω^(i[x])``: once per federation, or per agent."""
        assert self.features is not None  # set with the server (FTS-DE)
        return broadcast_points(
            self.settings,
            self.features,
            broadcast,
            self._server.region_bounds,
            self.domain,
            t,
            self.federation_keys,
            self.agent_keys,
            self.run_of,
        )

    def round_stats(self) -> list[list[float]]:
        """Per-round server statistics on the host (``[]`` for rounds without a release);
        device values are read once here, not inside the rounds."""
        if self._pending:
            rows = torch.stack([v for _, v in self._pending]).cpu().tolist()
            for (i, _), row in zip(self._pending, rows, strict=True):
                self._stats[i] = row
            self._pending = []
        return self._stats

    def result(self) -> DPFTSDEResult:
        loss = self.objective.loss(self.best.T, agents=self.agent_of).T
        stats = self.round_stats()
        P = self.server.num_regions if self.server is not None else 1
        nan = math.nan
        kept = self.X.numel() + self.X.shape[0] * self.X.shape[1] <= MAX_RECORDED_QUERIES

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
            parameters_per_agent=self.settings.method.parameters_per_agent(self.settings, self.objective.dim),
            settings=asdict(self.settings),
            accountant=self.accountant_name,
            delta=self.delta,
            epsilon_server=None
            if self.server is None or not self.server.secure
            else [r.epsilon_server for r in self.server.rounds],
            queries=self.X.cpu() if kept else None,
            observations=self.Y.squeeze(-1).cpu() if kept else None,
        )

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit for bit; the privacy ledger is saved with the
        data of the same round, so a resumed run never forgets a release."""
        return {
            **self.runner_state(),
            "used_server": self.used_server.cpu(),
            "stats": self.round_stats(),
            "server": None if self.server is None else self.server.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_runner_state(state)
        self.used_server = state["used_server"].to(self.device)
        self._stats = [list(r) for r in state["stats"]]
        self._pending = []
        if self.server is not None:
            self.server.load_state_dict(state["server"])
