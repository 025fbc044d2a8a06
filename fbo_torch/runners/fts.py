r"""Federated Thompson sampling for target agents, and the standard-TS baseline.

One :class:`FTSRunner` runs ``R`` independent repetitions at once — every
(target agent, initialization) pair — as one batch: the targets' GPs are one
batched ``SingleTaskGP``, their Thompson samples are maximized together, and
the messages of all other agents are drawn from one batched
:class:`~fbo_torch.models.RFFBayesianLinear`.

The other agents' observations (``t_n`` of them) come from a
:class:`FederationHistory`, built once per experiment and shared by every
method so that comparisons see the same messages' sources:

* ``"random"``: ``t_n`` random noisy observations per agent (FTS App. D.1);
* ``"ts"``: every agent has run ``t_n`` iterations of standard TS from a few
  random points (FTS Sec. 5.2, "each of whom has completed a BO task").

Communication is ``"one-shot"`` (messages drawn once before FTS starts; a used
message is removed from ``P_N``; Sec. 3.1) or ``"every-round"`` (the other
agents keep running TS and send a fresh draw before every iteration; App. D.2.1).
When every message of a run is used up, that run continues with its own GP.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from fbo_torch.federation.schedules import OWN, AgentDistribution, PtSchedule, draw_sources
from fbo_torch.models.rff_blr import RFFBayesianLinear
from fbo_torch.objectives.base import Objective
from fbo_torch.runners.settings import MethodSettings
from fbo_torch.runners.common import AgentGPs, Domain, derive_seed, maximize_own_samples, maximize_rff_samples
from fbo_torch.utils.validation import check_int

ALGORITHMS = ("ts", "fts", "rgpe", "taf")
#: Methods whose other agents send messages.
FEDERATED = ("fts", "rgpe", "taf")
COMMUNICATION = ("one-shot", "every-round")
HISTORIES = ("random", "ts")


@dataclass
class FTSSettings(MethodSettings):
    r"""Settings of one method in an FTS experiment (plus those of :class:`MethodSettings`).

    Attributes:
        algorithm: ``"fts"``; ``"ts"`` (standard TS, no communication); or the
            FTS paper's adapted baselines ``"rgpe"`` (ranking-weighted GP
            ensemble + LogEI) and ``"taf"`` (transfer acquisition function), for
            which agents send their whole RFF posterior (``M + M²`` numbers;
            TAF also its incumbent).
        communication: ``"one-shot"`` or ``"every-round"``.
        rgpe_samples: Posterior samples for RGPE's ranking weights.
        taf_bandwidth: TAF's kernel bandwidth ``ρ``.
    """

    algorithm: str = "fts"
    communication: str = "one-shot"
    rgpe_samples: int = 256
    taf_bandwidth: float = 0.5

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"`algorithm` must be one of {ALGORITHMS}, got {self.algorithm!r}.")
        if self.communication not in COMMUNICATION:
            raise ValueError(f"`communication` must be one of {COMMUNICATION}, got {self.communication!r}.")
        super().__post_init__()
        check_int("rgpe_samples", self.rgpe_samples, minimum=1)
        if not self.taf_bandwidth > 0:
            raise ValueError(f"`taf_bandwidth` must be > 0, got {self.taf_bandwidth!r}.")

    @property
    def parameters_per_agent(self) -> int:
        """Numbers each other agent sends per message."""
        M = self.num_features
        return {"ts": 0, "fts": M, "rgpe": M + M * M, "taf": M + M * M + 1}[self.algorithm]


class FederationHistory:
    r"""The other agents' observations, shared by every method of an experiment.

    Args:
        objective: The federation.
        domain: Its search domain.
        t_n: Observations per agent.
        mode: ``"random"`` or ``"ts"``.
        num_init: Random points before TS (``"ts"`` mode).
        gp_kernel: Kernel of the agents' GPs (``"ts"`` mode).
        seed: Seed of this history.
        device: Where tensors live.
    """

    def __init__(
        self,
        objective: Objective,
        domain: Domain,
        t_n: int,
        mode: str = "random",
        num_init: int = 3,
        gp_kernel: str = "botorch",
        seed: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        if mode not in HISTORIES:
            raise ValueError(f"`history` must be one of {HISTORIES}, got {mode!r}.")
        t_n = check_int("t_n", t_n, minimum=1)
        self.mode, self.t_n = mode, t_n
        gen = torch.Generator().manual_seed(int(seed))
        objective.reseed(int(seed) + 11)  # the same history for every method of an experiment
        A = objective.num_agents
        n0 = t_n if mode == "random" else min(num_init, t_n)
        X = domain.random(A, n0, generator=gen)
        Y = objective(X).unsqueeze(-1)
        gps = AgentGPs(domain.bounds, kernel=gp_kernel)
        for _ in range(t_n - n0):
            gps.update(X, Y)
            X_next, _ = maximize_own_samples(gps.model, domain, seed=derive_seed(gen), generator=gen)
            y = objective(X_next.unsqueeze(1))
            X = torch.cat([X, X_next.unsqueeze(1)], dim=1)
            Y = torch.cat([Y, y.unsqueeze(-1)], dim=1)
        self.train_X, self.train_Y = X.to(device), Y.to(device)


@dataclass
class FTSResult:
    r"""Per-run records of one method.

    Attributes:
        name: Method label.
        loss: ``R x (T+1)`` loss (simple regret, or e.g. 1 − AUC) of the best
            query so far; column 0 is after initialization.
        best_value: ``R x (T+1)`` best noiseless value so far.
        sources: ``R x T`` source of each query (``-1`` own GP, else agent index;
            ``-1`` throughout for TS, RGPE and TAF).
        queries: ``R x (n_init + T) x d`` queried points.
        targets: ``R`` target agent of each run; ``inits``: ``R`` initialization index.
        wall_time: Seconds spent.
        elapsed: ``T`` cumulative seconds after each iteration (all runs together).
        parameters_per_agent: Numbers each other agent sends per message (``M``; 0 for TS).
    """

    name: str
    loss: Tensor
    best_value: Tensor
    sources: Tensor
    queries: Tensor
    targets: Tensor
    inits: Tensor
    wall_time: float
    parameters_per_agent: int
    settings: dict[str, Any] = field(default_factory=dict)
    elapsed: list[float] = field(default_factory=list)


class FTSRunner:
    r"""Runs FTS (or TS) for ``R = len(targets) x num_inits`` repetitions at once.

    Args:
        objective: The federation (all agents, shared domain).
        settings: :class:`FTSSettings`.
        targets: Target agent indices (each run's target).
        num_inits: Initializations per target.
        history: The other agents' observations (required for FTS).
        others: Optional ``len(targets) x A`` booleans: agents whose messages a
            target may use (default: all other agents of the same group, where
            the objective defines ``group_of_agent``, else all other agents).
        domain: Search domain (default: from the objective).
        seed: Seed of initial points, message draws and decisions. Initial
            points depend only on ``seed``, so every method starts alike.
        device: ``"cpu"`` or ``"cuda"``.
        name: Label for results.
    """

    def __init__(
        self,
        objective: Objective,
        settings: FTSSettings,
        targets: Tensor,
        num_inits: int,
        history: FederationHistory | None = None,
        others: Tensor | None = None,
        domain: Domain | None = None,
        seed: int = 0,
        device: torch.device | str = "cpu",
        name: str | None = None,
    ) -> None:
        self.objective, self.settings = objective, settings
        self.device = torch.device(device)
        self.name = name or settings.algorithm.upper()
        self.domain = (domain or Domain(objective.bounds, objective.candidates)).to(self.device)
        targets = torch.as_tensor(targets, dtype=torch.long).reshape(-1)
        num_inits = check_int("num_inits", num_inits, minimum=1)
        A = objective.num_agents
        if ((targets < 0) | (targets >= A)).any():
            raise ValueError(f"`targets` must lie in [0, {A}), got {targets.tolist()}.")
        G = targets.numel()
        self.targets = targets.repeat_interleave(num_inits).to(self.device)  # R
        self.inits = torch.arange(num_inits).repeat(G).to(self.device)
        R = self.targets.numel()
        self.schedule = PtSchedule(settings.p_t, settings.p1_equals_p2)
        self.t = 0
        self.seed = int(seed)

        init_gen = torch.Generator().manual_seed(self.seed)
        self.X = self.domain.random(R, settings.num_init, generator=init_gen)
        objective.reseed(self.seed + 7)
        self.Y = objective(self.X, agents=self.targets).unsqueeze(-1)
        F = objective.evaluate_true(self.X, agents=self.targets)
        self.best = F.max(-1).values.unsqueeze(-1)  # R x 1 (column per iteration)
        self.sources = torch.empty(R, 0, dtype=torch.long, device=self.device)
        self.gps = AgentGPs(self.domain.bounds, kernel=settings.gp_kernel, refit_every=settings.gp_refit_every)
        self.gen = torch.Generator().manual_seed(self.seed + 3)
        # own GP samples and their maximization draw from their own stream, so methods
        # sharing a seed use common random numbers for the agents' own Thompson samples
        self.sample_gen = torch.Generator().manual_seed(self.seed + 8)
        self.others_gen = torch.Generator().manual_seed(self.seed + 4)
        self.wall_time = 0.0
        self.elapsed: list[float] = []

        self.features = None
        self.dist = None
        if settings.algorithm in FEDERATED:
            if history is None:
                raise ValueError("FTS needs a FederationHistory with the other agents' observations.")
            if others is None:
                others = self._default_others(targets)
            others = torch.as_tensor(others, dtype=torch.bool).to(self.device)
            if others.shape != (G, A):
                raise ValueError(f"`others` must be {G} x {A} booleans, got {tuple(others.shape)}.")
            mask = others.repeat_interleave(num_inits, dim=0)
            mask[torch.arange(R, device=self.device), self.targets] = False  # never a target's own message
            if not mask.any(-1).all():
                raise ValueError("Every target needs at least one other agent to receive messages from.")
            probs = mask.to(torch.float64) / mask.sum(-1, keepdim=True)
            self.dist = AgentDistribution(A, probs=probs, device=self.device)
            self.peers = [torch.nonzero(row).squeeze(-1) for row in mask]
            self.features = settings.features(objective.dim, device=self.device)
            self.others_X, self.others_Y = history.train_X.to(self.device), history.train_Y.to(self.device)
            self.rff_model = RFFBayesianLinear(
                self.features, self.others_X, self.others_Y, settings.rff_noise_variance
            )
            if settings.communication == "every-round":  # per-round refreshes append in place
                self.rff_model.reserve(settings.num_iterations)
            self.msg_gen = torch.Generator().manual_seed(self.seed + 2)
            self.others_gps = AgentGPs(self.domain.bounds, kernel=settings.gp_kernel)
            self._receive_messages()

    def _receive_messages(self) -> None:
        """Messages from the other agents' current posteriors: ω draws (FTS) or whole posteriors."""
        if self.settings.algorithm == "fts":
            self.omegas = self.rff_model.sample_weights(torch.Size([self.num_runs]), generator=self.msg_gen)
        else:
            from fbo_torch.models.agent_posteriors import AgentRFFPosteriors

            self.posteriors = AgentRFFPosteriors.from_model(self.rff_model)

    def _default_others(self, targets: Tensor) -> Tensor:
        A = self.objective.num_agents
        groups = getattr(self.objective, "group_of_agent", None)
        if groups is None:
            return torch.ones(targets.numel(), A, dtype=torch.bool)
        return groups.unsqueeze(0) == groups[targets].unsqueeze(-1)

    @property
    def num_runs(self) -> int:
        return self.targets.numel()

    @property
    def done(self) -> bool:
        return self.t >= self.settings.num_iterations

    def step(self) -> None:
        """One BO iteration for every run."""
        t0 = time.perf_counter()
        self.t += 1
        t = self.t
        model = self.gps.update(self.X, self.Y)
        R = self.num_runs
        if self.settings.algorithm in ("rgpe", "taf"):
            self._transfer_step(model)
            return
        if self.settings.algorithm == "ts":
            sources = torch.full((R,), OWN, dtype=torch.long, device=self.device)
        else:
            sources = draw_sources(self.schedule(t), self.dist, generator=self.gen)
        X_next = torch.empty(R, self.objective.dim, dtype=self.X.dtype, device=self.device)
        own = sources == OWN
        if bool(own.any()):
            X_own, _ = maximize_own_samples(
                model, self.domain, seed=derive_seed(self.sample_gen), generator=self.sample_gen,
                num_features=self.settings.gp_sample_features,
            )
            X_next[own] = X_own[own]
        if bool((~own).any()):
            runs = torch.nonzero(~own).squeeze(-1)
            omega = self.omegas[runs, sources[runs]]
            X_msg, _ = maximize_rff_samples(self.features, omega, self.domain, generator=self.gen)
            X_next[runs] = X_msg
            if self.settings.communication == "one-shot":
                self.dist.remove(sources)
        self._observe(X_next, sources, t0)

    def _observe(self, X_next: Tensor, sources: Tensor, t0: float) -> None:
        y = self.objective(X_next.unsqueeze(1), agents=self.targets)
        f = self.objective.evaluate_true(X_next.unsqueeze(1), agents=self.targets)
        self.X = torch.cat([self.X, X_next.unsqueeze(1)], dim=1)
        self.Y = torch.cat([self.Y, y.unsqueeze(-1)], dim=1)
        self.best = torch.cat([self.best, torch.maximum(self.best[:, -1:], f)], dim=1)
        self.sources = torch.cat([self.sources, sources.unsqueeze(-1)], dim=1)
        if self.settings.algorithm in FEDERATED and self.settings.communication == "every-round":
            self._others_step()
        self.wall_time += time.perf_counter() - t0
        self.elapsed.append(self.wall_time)

    def _transfer_step(self, batched_gp: Any) -> None:
        r"""RGPE / TAF: one acquisition per run (each run has its own target data);
        within a run every agent's posterior is evaluated in one batched op."""
        from botorch.acquisition import LogExpectedImprovement

        from fbo_torch.acquisition.rgpe import RGPE
        from fbo_torch.acquisition.taf import TransferAcquisitionFunction
        from fbo_torch.runners.common import maximize_acquisition, unbatch_gp

        t0 = time.perf_counter()
        s = self.settings
        X_next = torch.empty(self.num_runs, self.objective.dim, dtype=self.X.dtype, device=self.device)
        for r in range(self.num_runs):
            gp = unbatch_gp(batched_gp, r, self.X[r], self.Y[r], self.domain.bounds, s.gp_kernel)
            peers = self.posteriors.subset(self.peers[r])
            if s.algorithm == "rgpe":
                model = RGPE.from_data(gp, peers, self.X[r], self.Y[r], num_samples=s.rgpe_samples, generator=self.gen)
                acqf = LogExpectedImprovement(model, best_f=self.Y[r].max())
            else:
                acqf = TransferAcquisitionFunction(gp, peers, self.X[r], self.Y[r], bandwidth=s.taf_bandwidth)
            X_next[r] = maximize_acquisition(acqf, self.domain, generator=self.gen)
        sources = torch.full((self.num_runs,), OWN, dtype=torch.long, device=self.device)
        self._observe(X_next, sources, t0)

    def _others_step(self) -> None:
        """The other agents run one TS iteration each and send fresh draws."""
        model = self.others_gps.update(self.others_X, self.others_Y)
        X_next, _ = maximize_own_samples(
            model, self.domain, seed=derive_seed(self.others_gen), generator=self.others_gen,
            num_features=self.settings.gp_sample_features,
        )
        y = self.objective(X_next.unsqueeze(1))
        self.others_X = torch.cat([self.others_X, X_next.unsqueeze(1)], dim=1)
        self.others_Y = torch.cat([self.others_Y, y.unsqueeze(-1)], dim=1)
        self.rff_model.update(X_next.unsqueeze(1), y.unsqueeze(-1))
        self._receive_messages()

    def run(self, callback: Callable[[FTSRunner], None] | None = None) -> FTSResult:
        """Iterate until ``num_iterations``; ``callback(self)`` after each step."""
        while not self.done:
            self.step()
            if callback is not None:
                callback(self)
        return self.result()

    def result(self) -> FTSResult:
        loss = self.objective.loss(self.best.T, agents=self.targets).T  # loss() wants agents last
        return FTSResult(
            name=self.name,
            loss=loss.cpu(),
            best_value=self.best.cpu(),
            sources=self.sources.cpu(),
            queries=self.X.cpu(),
            targets=self.targets.cpu(),
            inits=self.inits.cpu(),
            wall_time=self.wall_time,
            parameters_per_agent=self.settings.parameters_per_agent,
            settings=asdict(self.settings),
            elapsed=list(self.elapsed),
        )

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly where this runner is."""
        state = {
            "t": self.t,
            "X": self.X, "Y": self.Y, "best": self.best, "sources": self.sources,
            "gen": self.gen.get_state(), "sample_gen": self.sample_gen.get_state(), "others_gen": self.others_gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "objective_rng": self.objective.rng_state(),
            "gps": self.gps.state_dict(),
            "wall_time": self.wall_time,
            "elapsed": self.elapsed,
        }
        if self.settings.algorithm in FEDERATED:
            state.update(
                dist=self.dist.state_dict(), msg_gen=self.msg_gen.get_state(),
                others_X=self.others_X, others_Y=self.others_Y, others_gps=self.others_gps.state_dict(),
                omegas=getattr(self, "omegas", None),
            )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        dev = self.device
        self.t = int(state["t"])
        self.X, self.Y = state["X"].to(dev), state["Y"].to(dev)
        self.best, self.sources = state["best"].to(dev), state["sources"].to(dev)
        self.gen.set_state(state["gen"])
        self.sample_gen.set_state(state["sample_gen"])
        self.others_gen.set_state(state["others_gen"])
        torch.set_rng_state(state["torch_rng"])
        self.objective.set_rng_state(state["objective_rng"])
        self.wall_time = float(state["wall_time"])
        self.elapsed = list(state["elapsed"])
        self.gps.load_state_dict(state["gps"])
        if self.settings.algorithm in FEDERATED:
            self.dist.load_state_dict(state["dist"])
            self.msg_gen.set_state(state["msg_gen"])
            self.others_X, self.others_Y = state["others_X"].to(dev), state["others_Y"].to(dev)
            self.rff_model = RFFBayesianLinear(
                self.features, self.others_X, self.others_Y, self.settings.rff_noise_variance
            )
            if self.settings.communication == "every-round":
                self.rff_model.reserve(max(0, self.settings.num_iterations - self.t))
            self.others_gps.load_state_dict(state["others_gps"])
            if self.settings.algorithm == "fts":
                self.omegas = state["omegas"].to(dev)
            else:
                self._receive_messages()
