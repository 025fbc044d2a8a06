r"""Federated Thompson sampling for target agents, and the standard-TS baseline.

One :class:`FTSRunner` runs ``R`` independent repetitions at once — every
(target agent, initialization) pair — as one batch of target
:class:`~fbo_torch.federation.agents.Agents` (their GPs, Thompson samples and
maximizations are batched tensor computations), and the messages of all other
agents are drawn from their own :class:`~fbo_torch.federation.agents.Agents`'
RFF posteriors. Every random number comes from a keyed stream of the run (or
agent), so runs do not depend on each other or on the device.

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

With ``together=True`` there is no separate history: every agent of the
federation is a target, the agents of one initialization optimize at the same
time and are each other's peers (a federation of tuning agents, as in the
many-task benchmarks of federated optimization), and before every iteration
each agent sends one fresh message, drawn from its RFF posterior on its own
observations so far.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from botorch.acquisition.acquisition import AcquisitionFunction
from botorch.acquisition.analytic import LogExpectedImprovement
from torch import Tensor

from fbo_torch.acquisition.rgpe import RGPE
from fbo_torch.acquisition.taf import TransferAcquisitionFunction
from fbo_torch.federation.agents import Agents, observe_initial
from fbo_torch.federation.fidelity import fidelity_scores, learn_peer_choice, peer_predictions, redundancy
from fbo_torch.federation.message_average import MessageAverage
from fbo_torch.federation.schedules import OWN, AgentDistribution, PtSchedule, draw_sources
from fbo_torch.federation.search import maximize_rff_samples
from fbo_torch.federation.settings import HISTORIES, FTSSettings, HistorySettings, MethodSettings
from fbo_torch.models.agent_posteriors import AgentRFFPosteriors
from fbo_torch.objectives.base import Objective
from fbo_torch.optim.domain import Domain
from fbo_torch.sampling.rff_paths import RFFSamplePaths
from fbo_torch.simulate.common import cpu_state, maximize_acquisition
from fbo_torch.simulate.presets import apply_setup
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.validation import check_int

#: Methods whose other agents send messages.
FEDERATED = ("fts", "rgpe", "taf", "peer_prior")
#: Methods whose messages are ``ω`` draws.
DRAWS = ("fts", "peer_prior")


class FederationHistory:
    r"""The other agents' observations, shared by every method of an experiment.

    Args:
        objective: The federation.
        domain: Its search domain.
        t_n: Observations per agent.
        mode: ``"random"`` or ``"ts"``.
        num_init: Random points before TS (``"ts"`` mode).
        gp_kernel: Kernel of the agents' GPs (``"ts"`` mode; ``None``: ``setup``'s, ``"botorch"`` for ``modern``).
        seed: Seed of this history.
        device: Where tensors live.
        setup: ``"modern"`` or ``"authors"`` (:mod:`fbo_torch.simulate.presets`): how the agents'
            GPs are refit and sampled.
    """

    def __init__(
        self,
        objective: Objective,
        domain: Domain,
        t_n: int,
        mode: str = HistorySettings.mode,
        num_init: int = HistorySettings.num_init,
        gp_kernel: str | None = HistorySettings.gp_kernel,
        seed: int = 0,
        device: torch.device | str = "cpu",
        setup: str = "modern",
    ) -> None:
        if mode not in HISTORIES:
            raise ValueError(f"`history` must be one of {HISTORIES}, got {mode!r}.")
        t_n = check_int("t_n", t_n, minimum=1)
        self.mode, self.t_n, self.seed = mode, t_n, int(seed)
        domain = domain.to(device)
        A = objective.num_agents
        self.keys = kr.fold(kr.root_key(self.seed, "history"), torch.arange(A, device=domain.bounds.device))
        n0 = t_n if mode == "random" else min(num_init, t_n)
        X = domain.random(A, n0, keys=kr.fold(self.keys, "initial-points"))
        Y, _ = observe_initial(objective, X, torch.arange(A, device=X.device), self.keys)
        # the other agents ran standard TS as the target's own GP does in this setup (refits, restarts, samples)
        self.settings = apply_setup(
            MethodSettings(num_iterations=1), setup, {"gp_kernel": gp_kernel} if gp_kernel is not None else None
        )
        self.agents = Agents(self.keys, X, Y.unsqueeze(-1), domain, self.settings, capacity=t_n - n0)
        self.rounds = t_n - n0
        for t in range(1, self.rounds + 1):
            self.step(objective, t)

    def step(self, objective: Objective, round: int) -> tuple[Tensor, Tensor]:
        """Every agent runs one iteration of standard TS; returns the queries and observations."""
        X_next, _ = self.agents.own_proposals(round)
        agents = torch.arange(self.agents.num_agents, device=X_next.device)
        y, _, _ = self.agents.evaluate(objective, agents, X_next, round)
        return X_next, y

    @property
    def train_X(self) -> Tensor:
        return self.agents.train_X

    @property
    def train_Y(self) -> Tensor:
        return self.agents.train_Y


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
        failed: ``R x T`` booleans, the evaluation failed.
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
    failed: Tensor | None = None


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
            points depend only on ``seed`` and the run, so every method starts alike.
        device: ``"cpu"`` or ``"cuda"``.
        name: Label for results.
        together: The targets are each other's peers (module docstring): ``targets``
            must be every agent of the objective, ``history`` is not used, and FTS
            communicates ``"every-round"``.
        initial_points: Optional ``R x n0 x d`` initial points of the runs (in run order:
            target-major, ``num_inits`` per target), e.g. another library's designs for a
            paired comparison; default: ``settings.num_init`` uniform points from each run's key.
        max_memory: Working-memory budget of the agents' own proposals (bytes or a size like
            ``"4GiB"``; default half the device's free memory): beyond it agents run in chunks, with
            the same results (:mod:`~fbo_torch.federation.chunks`).
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
        together: bool = False,
        initial_points: Tensor | None = None,
        max_memory: int | str | None = None,
    ) -> None:
        self.objective, self.settings = objective, settings
        self.device = dev = torch.device(device)
        self.name = name or settings.algorithm.upper()
        self.domain = (domain or Domain(objective.bounds, objective.candidates)).to(dev)
        targets = torch.as_tensor(targets, dtype=torch.long).reshape(-1)
        num_inits = check_int("num_inits", num_inits, minimum=1)
        A = objective.num_agents
        if ((targets < 0) | (targets >= A)).any():
            raise ValueError(f"`targets` must lie in [0, {A}), got {targets.tolist()}.")
        G = targets.numel()
        self.targets = targets.repeat_interleave(num_inits).to(dev)  # R
        self.inits = torch.arange(num_inits).repeat(G).to(dev)
        R = self.targets.numel()
        self.schedule = PtSchedule(settings.p_t, settings.p1_equals_p2)
        self.t = 0
        self.seed = int(seed)
        self.faults = settings.fault_injector()
        # one stream per run, from (target, initialization): the same for every method
        self.keys = kr.fold(kr.fold(kr.root_key(self.seed, "fts-runs"), self.targets), self.inits)
        if initial_points is None:
            X0 = self.domain.random(R, settings.num_init, keys=kr.fold(self.keys, "initial-points"))
        else:
            X0 = self._check_initial_points(initial_points, R)
        y0, f0 = observe_initial(objective, X0, self.targets, self.keys)
        self.best = f0.max(-1).values.unsqueeze(-1)
        self.sources = torch.empty(R, 0, dtype=torch.long, device=dev)
        self.failed = torch.zeros(R, 0, dtype=torch.bool, device=dev)
        self.together = bool(together) and settings.algorithm in FEDERATED
        if together:
            self._check_together(targets, A)
        self.features = None
        if self.together:
            self.features = settings.features(objective.dim, device=dev)
        self.agents = Agents(
            self.keys,
            X0,
            y0.unsqueeze(-1),
            self.domain,
            settings,
            self.features,
            capacity=settings.num_iterations,
            max_memory=max_memory,
        )
        self.wall_time = 0.0
        self.elapsed: list[float] = []

        self.dist = None
        if settings.algorithm in FEDERATED:
            if history is None and not self.together:
                raise ValueError(
                    "FTS needs a FederationHistory with the other agents' observations "
                    "(or `together=True`: the targets are each other's peers)."
                )
            if others is None:
                others = self._default_others(targets)
            others = torch.as_tensor(others, dtype=torch.bool).to(dev)
            if others.shape != (G, A):
                raise ValueError(f"`others` must be {G} x {A} booleans, got {tuple(others.shape)}.")
            mask = others.repeat_interleave(num_inits, dim=0)
            mask[torch.arange(R, device=dev), self.targets] = False  # never a target's own message
            if not mask.any(-1).all():
                raise ValueError("Every target needs at least one other agent to receive messages from.")
            probs = mask.to(torch.float64) / mask.sum(-1, keepdim=True)
            self.dist = AgentDistribution(A, probs=probs, device=dev)
            self.peers = [torch.nonzero(row).squeeze(-1) for row in mask]
            # R x K indices of each run's peers (padded by repeating a peer; padding is scored twice
            # and scattered to the same place, so it changes nothing)
            K = int(mask.sum(-1).max())
            order = torch.sort(mask.to(torch.int8), dim=-1, descending=True, stable=True).indices[:, :K]
            first = order[:, :1].expand(-1, K)
            self.peer_index = torch.where(mask.gather(1, order), order, first)
            if settings.algorithm == "peer_prior":
                if settings.peer_trust:
                    raise ValueError(
                        "`peer_trust` scales FTS's probability of following a peer; peer_prior "
                        "follows none (its prior's floor and decay bound the peers' influence)."
                    )
                self.message_average = MessageAverage(settings.message_memory)
            if self.together:
                # run of (agent b, initialization i): targets are 0..A-1 in order, num_inits runs each
                run_of = torch.arange(R, device=dev).view(A, num_inits)
                self.peer_runs = run_of[:, self.inits].T.contiguous()  # R x A: run r's peer b is run peer_runs[r, b]
                self.others = self.agents
                self.history_rounds = 0
            else:
                assert history is not None  # checked above
                self.features = settings.features(objective.dim, device=dev)
                extra = settings.num_iterations if settings.communication == "every-round" else 0
                self.others = Agents(
                    history.keys.to(dev),
                    history.train_X.to(dev),
                    history.train_Y.to(dev),
                    self.domain,
                    dataclasses.replace(settings, gp_refit_every=1, own_acquisition="ts"),
                    self.features,
                    capacity=extra,
                    max_memory=max_memory,
                )  # the other agents run standard TS
                self.others.gp_updates = history.agents.gp_updates
                self.others.gp_params = history.agents.gp_params
                self.history_rounds = history.rounds
            self._receive_messages(0)

    def _check_initial_points(self, X0: Tensor, R: int) -> Tensor:
        X0 = torch.as_tensor(X0)
        if X0.ndim != 3 or X0.shape[0] != R or X0.shape[1] < 1 or X0.shape[2] != self.objective.dim:
            raise ValueError(
                f"`initial_points` must be {R} x n0 x {self.objective.dim} (one design per run), got {tuple(X0.shape)}."
            )
        X0 = X0.to(device=self.device, dtype=self.domain.bounds.dtype)
        lo, hi = self.domain.bounds
        if not bool(torch.isfinite(X0).all()) or bool(((X0 < lo) | (X0 > hi)).any()):
            raise ValueError("`initial_points` must be finite and inside the domain's bounds.")
        return X0

    def _check_together(self, targets: Tensor, A: int) -> None:
        if not torch.equal(targets.cpu(), torch.arange(A)):
            raise ValueError(
                f"`together=True` needs every agent as a target, in order (0..{A - 1}), got targets {targets.tolist()}."
            )
        if self.settings.algorithm in ("rgpe", "taf"):
            raise ValueError(
                f"`together=True` supports algorithms 'fts', 'peer_prior' (and 'ts'), not {self.settings.algorithm!r}."
            )
        if self.settings.algorithm in DRAWS and self.settings.communication != "every-round":
            raise ValueError(
                "`together=True`: agents that optimize together send a fresh message every round; "
                "set `communication: every-round`."
            )

    def _receive_messages(self, round: int) -> None:
        """Messages from the other agents' current posteriors: ω draws (FTS) or whole posteriors."""
        if self.settings.algorithm in DRAWS and self.together:
            # every agent sends one draw (from its key and the round); its peers all receive it
            sent = self.agents.message(round)  # R x M
            self.omegas = sent[self.peer_runs]  # R x A x M
            if self.settings.algorithm == "peer_prior":
                self._peer_optima(sent, round, self.agents.round_keys(round, "peer-optima"), self.peer_runs)
        elif self.settings.algorithm in DRAWS:
            # every run receives its own draw from every agent: base samples keyed by (run, round)
            rff = self.others.rff
            assert rff is not None and self.features is not None  # FTS's others hold the shared map
            n = rff._n
            M = self.features.num_features
            A = self.others.num_agents
            k = kr.fold(
                kr.fold(kr.fold(self.keys, "message"), round).unsqueeze(-1), torch.arange(A, device=self.device)
            )
            base = kr.normal(k, M + n)  # R x A x (M + n)
            self.omegas = rff.sample_weights(torch.Size([self.num_runs]), base_samples=base)  # R x A x M
            if self.settings.algorithm == "peer_prior":
                keys = kr.fold(kr.fold(self.keys, "peer-optima").unsqueeze(-1), torch.arange(A, device=self.device))
                self._peer_optima(self.omegas.reshape(-1, M), round, kr.fold(keys.reshape(-1), round), None)
        else:
            self.posteriors = AgentRFFPosteriors.from_model(self.others.rff)

    def _peer_optima(self, messages: Tensor, round: int, keys: Tensor, gather: Tensor | None) -> None:
        r"""``peer_prior``: add this round's messages to each sender's running average and take
        its maximizer (every sender once: ``messages`` is ``S x M``, one row per sending slot);
        :attr:`peer_centers` becomes ``R x A x d`` (``gather``: ``R x A`` slots of the senders,
        else the slots are already ``R·A`` in order)."""
        assert self.features is not None  # peer_prior's shared map
        avg = self.message_average.update(messages)
        # a bump's center needs no more precision than the bump's width: a lighter search than a query's
        d = self.domain
        centers, _ = d.maximize(
            RFFSamplePaths(self.features, avg),
            avg.shape[0],
            keys=keys,
            raw_samples=d.raw_samples,
            num_restarts=4,
            maxiter=10,
        )
        R, A = self.num_runs, self.objective.num_agents
        self.peer_centers = centers.view(R, A, -1) if gather is None else centers[gather]
        self._averaged_slots = avg.view(R, A, -1) if gather is None else avg[gather]

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
    def X(self) -> Tensor:
        """``R x n x d`` queries of the targets so far."""
        return self.agents.train_X

    @property
    def Y(self) -> Tensor:
        return self.agents.train_Y

    @property
    def others_X(self) -> Tensor:
        return self.others.train_X

    @property
    def done(self) -> bool:
        return self.t >= self.settings.num_iterations

    def step(self) -> None:
        """One BO iteration for every run."""
        t0 = time.perf_counter()
        self.t += 1
        t = self.t
        if self.settings.algorithm in ("rgpe", "taf"):
            self._transfer_step(t, t0)
            return
        R = self.num_runs
        if self.settings.algorithm == "peer_prior":
            self._prior_step(t, t0)
            return
        if self.settings.algorithm == "ts":
            sources = torch.full((R,), OWN, dtype=torch.long, device=self.device)
        else:
            # OWN where the coin says so or no message is left
            sources = draw_sources(self._p_t(t), self.dist, keys=kr.fold(self.agents.keys, t))
        # FTS: only the runs whose source is OWN use their own proposal (the others' rows may be NaN)
        X_next, _ = self.agents.own_proposals(t, which=sources < 0 if self.settings.algorithm == "fts" else None)
        if self.settings.algorithm == "fts":
            assert self.features is not None and self.dist is not None  # FTS has both
            omega = self.omegas[torch.arange(R, device=self.device), sources.clamp_min(0)]
            X_msg, _ = maximize_rff_samples(
                self.features, omega, self.domain, keys=self.agents.round_keys(t, "message-maximize")
            )
            X_next = torch.where((sources >= 0).unsqueeze(-1), X_msg, X_next)
            if self.settings.communication == "one-shot":
                self.dist.remove(sources)
        self._observe(X_next, sources, t, t0)

    def _prior_step(self, t: int, t0: float) -> None:
        r"""``peer_prior``: every run maximizes its own acquisition weighted by its peers' prior
        (bumps at the maximizers of their averaged messages, weighted by ``P_N``, exponent ``β/t``)."""
        s = self.settings
        if s.agent_weights == "learned":
            self._p_t(t)  # re-weights P_N from the (averaged) messages' ranking of each run's data
        assert self.dist is not None  # peer_prior's P_N
        probs = self.dist.probs  # R x A, 0 for the run's own agent and non-peers
        log_w = torch.where(probs > 0, probs.clamp_min(1e-300).log(), -torch.inf)
        X_next, _ = self.agents.prior_guided_proposals(
            t, self.peer_centers, log_w, s.prior_strength / t, s.prior_width, s.prior_floor
        )
        sources = torch.full((self.num_runs,), OWN, dtype=torch.long, device=self.device)
        self._observe(X_next, sources, t, t0)

    def _p_t(self, t: int) -> float | Tensor:
        r"""``p_t`` of iteration ``t``; with learned ``P_N`` or peer trust, first score every
        peer's message on each target's observations (one batched ``R x A x n x n`` comparison)
        and update ``P_N`` (and ``p_t`` per run)."""
        p = self.schedule(t)
        s = self.settings
        if s.algorithm not in DRAWS or (s.agent_weights == "uniform" and not s.peer_trust):
            return p
        assert self.features is not None and self.dist is not None  # FTS and peer_prior have both
        # score only each run's possible peers (R x K, K = the most any run has), not all A agents;
        # peer_prior scores the averaged messages whose maximizers it uses
        slots = self._averaged_slots if s.algorithm == "peer_prior" else self.omegas
        omegas = slots.gather(1, self.peer_index.unsqueeze(-1).expand(-1, -1, slots.shape[-1]))
        preds = peer_predictions(self.features, omegas, self.X)  # R x K x n
        peer_scores = fidelity_scores(preds, self.Y.squeeze(-1), self.agents.mask)
        scores = torch.zeros_like(self.dist.base).scatter_(1, self.peer_index, peer_scores.to(self.dist.base.dtype))
        padding = torch.cat(
            [
                torch.zeros_like(self.peer_index[:, :1], dtype=torch.bool),
                self.peer_index[:, 1:] == self.peer_index[:, :1],
            ],
            dim=1,
        )
        copies = torch.ones_like(self.dist.base).scatter_(1, self.peer_index, redundancy(omegas, ~padding))
        return learn_peer_choice(self.dist, scores, self.agents.mask.sum(-1), p, s.agent_weights, s.peer_trust, copies)

    def _observe(self, X_next: Tensor, sources: Tensor, t: int, t0: float) -> None:
        _, f, ok = self.agents.evaluate(self.objective, self.targets, X_next, t, self.faults)
        self.best = torch.cat([self.best, torch.maximum(self.best[:, -1:], f.unsqueeze(-1))], dim=1)
        self.sources = torch.cat([self.sources, sources.unsqueeze(-1)], dim=1)
        self.failed = torch.cat([self.failed, (~ok).unsqueeze(-1)], dim=1)
        if self.settings.algorithm in FEDERATED and self.settings.communication == "every-round":
            self._others_step(t)
        self.wall_time += time.perf_counter() - t0
        self.elapsed.append(self.wall_time)

    def _transfer_step(self, t: int, t0: float) -> None:
        r"""RGPE / TAF: one acquisition per run (each run has its own target data);
        within a run every agent's posterior is evaluated in one batched op."""
        s = self.settings
        gp_all = self.agents.gp()
        X_next = torch.empty(self.num_runs, self.objective.dim, dtype=self.X.dtype, device=self.device)
        gen = torch.Generator().manual_seed(kr.fold(kr.root_key(self.seed, "transfer"), t) & (2**62 - 1))
        for r in range(self.num_runs):
            keep = self.agents.mask[r]
            Xr, Yr = self.X[r][keep], self.Y[r][keep]
            gp = gp_all.to_botorch(index=r)
            peers = self.posteriors.subset(self.peers[r])
            acqf: AcquisitionFunction
            if s.algorithm == "rgpe":
                model = RGPE.from_data(gp, peers, Xr, Yr, num_samples=s.rgpe_samples, generator=gen)
                acqf = LogExpectedImprovement(model, best_f=Yr.max())
            else:
                acqf = TransferAcquisitionFunction(gp, peers, Xr, Yr, bandwidth=s.taf_bandwidth)
            X_next[r] = maximize_acquisition(acqf, self.domain, generator=gen)
        sources = torch.full((self.num_runs,), OWN, dtype=torch.long, device=self.device)
        self._observe(X_next, sources, t, t0)

    def _others_step(self, t: int) -> None:
        """The other agents run one TS iteration each and send fresh draws (together: the
        targets, which have just observed, send theirs)."""
        if self.together:
            self._receive_messages(t)
            return
        round = self.history_rounds + t  # the other agents' rounds continue their history's
        X_next, _ = self.others.own_proposals(round)
        agents = torch.arange(self.others.num_agents, device=self.device)
        self.others.evaluate(self.objective, agents, X_next, round)
        self._receive_messages(t)

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
            failed=self.failed.cpu(),
        )

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly where this runner is."""
        state = {
            "t": self.t,
            "best": self.best.cpu(),
            "sources": self.sources.cpu(),
            "failed": self.failed.cpu(),
            "agents": cpu_state(self.agents.state_dict()),
            "objective_rng": self.objective.rng_state(),
            "wall_time": self.wall_time,
            "elapsed": self.elapsed,
        }
        if self.settings.algorithm in FEDERATED:
            assert self.dist is not None  # every federated algorithm's P_N
            state.update(dist=self.dist.state_dict(), omegas=getattr(self, "omegas", None))
            if self.settings.algorithm == "peer_prior":
                state.update(
                    message_average=self.message_average.state_dict(),
                    peer_centers=self.peer_centers,
                    averaged_slots=self._averaged_slots,
                )
            if not self.together:
                state["others"] = cpu_state(self.others.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        dev = self.device
        self.t = int(state["t"])
        self.best, self.sources = state["best"].to(dev), state["sources"].to(dev)
        self.failed = state["failed"].to(dev)
        self.agents.load_state_dict(state["agents"])
        self.objective.set_rng_state(state["objective_rng"])
        self.wall_time = float(state["wall_time"])
        self.elapsed = list(state["elapsed"])
        if self.settings.algorithm in FEDERATED:
            assert self.dist is not None  # every federated algorithm's P_N
            self.dist.load_state_dict(state["dist"])
            if not self.together:
                self.others.load_state_dict(state["others"])
            if self.settings.algorithm == "peer_prior":
                self.message_average.load_state_dict(state["message_average"])
                self.peer_centers = state["peer_centers"].to(dev)
                self._averaged_slots = state["averaged_slots"].to(dev)
            if self.settings.algorithm in DRAWS:
                self.omegas = state["omegas"].to(dev)
            else:
                self._receive_messages(self.t)
