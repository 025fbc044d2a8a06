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
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from fbo_torch.federation.agents import Agents, observe_initial
from fbo_torch.federation.free_riders import FreeRiders
from fbo_torch.federation.settings import HISTORIES, OWN_MODEL_FIELDS, FTSSettings, HistorySettings, MethodSettings
from fbo_torch.methods.base import Method, get_method
from fbo_torch.methods.draws import DrawMethod
from fbo_torch.objectives.base import Objective
from fbo_torch.optim.domain import Domain
from fbo_torch.protocol.fairness import behind_ranks
from fbo_torch.protocol.fidelity import helpful_posterior
from fbo_torch.protocol.reciprocity import (
    flag_free_riders,
    flag_low_rated,
    peer_ratings,
    rating_record,
    reciprocal_share,
    round_ratings,
    sender_usefulness,
)
from fbo_torch.protocol.schedules import AgentDistribution, PtSchedule
from fbo_torch.simulate.common import Runner, cpu_state
from fbo_torch.simulate.presets import DEFAULT_SETUP, apply_setup
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.validation import check_int


class FederationHistory:
    r"""The other agents' observations, shared by every method of an experiment.

    Args:
        objective: The federation.
        domain: Its search domain.
        t_n: Observations per agent.
        mode: ``"random"`` or ``"ts"``.
        num_init: Random points before TS (``"ts"`` mode).
        gp_kernel: Kernel of the agents' GPs (``"ts"`` mode; ``None``: ``setup``'s).
        seed: Seed of this history.
        device: Where tensors live.
        setup: A name in :data:`~fbo_torch.simulate.presets.SETUPS` (``"engine"``, ``"paper"``,
            ``"authors"``): how the agents model and search their functions.
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
        setup: str = DEFAULT_SETUP,
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

    def continuation(self, settings: MethodSettings) -> MethodSettings:
        r"""The settings with which these agents go on after their history, as the peers of a method
        with ``settings``: standard TS (a hyperparameter refit every round) with the history's own
        model (:data:`~fbo_torch.federation.settings.OWN_MODEL_FIELDS`, so its fitted GPs carry
        over), and the method's shared map and messages."""
        own: dict[str, Any] = {name: getattr(self.settings, name) for name in OWN_MODEL_FIELDS}
        if hasattr(settings, "algorithm"):
            own["algorithm"] = "ts"
            # free-riding and reciprocity are the method's (what its runs receive, whom they may follow)
            own.update(free_riders=None, reciprocity=False, fairness=0.0)
        return dataclasses.replace(settings, **own, gp_refit_every=1, own_acquisition="ts")


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
        observations: ``R x (n_init + T)`` what each query returned (NaN where the evaluation failed).
        targets: ``R`` target agent of each run; ``inits``: ``R`` initialization index.
        wall_time: Seconds spent.
        elapsed: ``T`` cumulative seconds after each iteration (all runs together).
        parameters_per_agent: Numbers each other agent sends per message (``M``; 0 for TS).
        excluded: With ``reciprocity``, ``R x T`` booleans: the run's agent was flagged as a free-rider
            before iteration ``t`` (``reciprocity_signal: scores``: lost its share's coin; ``ranks``: rated
            low with confidence, :func:`~fbo_torch.protocol.reciprocity.flag_low_rated`), so it could not
            follow a peer (``None`` without reciprocity).
        behind: With ``fairness > 0``, ``R x T`` the run's agent's rank in its federation before iteration
            ``t`` (:func:`~fbo_torch.protocol.fairness.behind_ranks`: 0 best, 1 worst; ``None`` without).
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
    excluded: Tensor | None = None
    behind: Tensor | None = None
    observations: Tensor | None = None


class FTSRunner(Runner[FTSResult]):
    r"""Runs FTS (or TS) for ``R = len(targets) x num_inits`` repetitions at once.

    A run is one initialization of one target: ``X`` is ``R x n x d``, the targets' queries.

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
        max_memory: Working-memory budget of the agents' own proposals
            (:func:`~fbo_torch.federation.chunks.round_budget`).
    """

    settings: FTSSettings

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
        method_cls = get_method(settings.algorithm, "fts")
        method_cls.check(settings)
        self.objective, self.settings = objective, settings
        self.device = dev = torch.device(device)
        self.name = name or settings.algorithm.upper()
        self.domain = (domain or Domain(objective.bounds, objective.candidates)).to(dev)
        targets = torch.as_tensor(targets, dtype=torch.long).reshape(-1)
        num_inits = check_int("num_inits", num_inits, minimum=1)
        A = objective.num_agents
        if ((targets < 0) | (targets >= A)).any():
            raise ValueError(f"`targets` must lie in [0, {A}), got {targets.tolist()}.")
        federated = method_cls.federated()
        if together:
            self._check_together(targets, A)
            method_cls.check_history(settings, "together")
        elif federated:
            if history is None:
                raise ValueError(
                    f"{settings.algorithm!r} needs a FederationHistory with the other agents' observations "
                    "(or `together=True`: the targets are each other's peers)."
                )
            method_cls.check_history(settings, history.mode)
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
        self.together = bool(together) and federated
        self.features = settings.features(objective.dim, device=dev) if federated else None
        self.agents = Agents(
            self.keys,
            X0,
            y0.unsqueeze(-1),
            self.domain,
            settings,
            self.features if self.together else None,
            capacity=settings.num_iterations,
            max_memory=max_memory,
        )
        self.wall_time = 0.0
        self.elapsed: list[float] = []

        self.dist: AgentDistribution | None = None
        if federated:
            if others is None:
                others = self._default_others(targets)
            others = torch.as_tensor(others, dtype=torch.bool).to(dev)
            if others.shape != (G, A):
                raise ValueError(f"`others` must be {G} x {A} booleans, got {tuple(others.shape)}.")
            mask = others.repeat_interleave(num_inits, dim=0)
            mask[torch.arange(R, device=dev), self.targets] = False  # never a target's own message
            self.peer_mask = mask  # R x A: whose messages each run receives
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
            if self.together:
                # run of (agent b, initialization i): targets are 0..A-1 in order, num_inits runs each
                run_of = torch.arange(R, device=dev).view(A, num_inits)
                self.peer_runs = run_of[:, self.inits].T.contiguous()  # R x A: run r's peer b is run peer_runs[r, b]
                self.others = self.agents
                self.history_rounds = 0
            else:
                assert history is not None  # checked above
                extra = settings.num_iterations if settings.communication == "every-round" else 0
                self.others = Agents(
                    history.keys.to(dev),
                    history.train_X.to(dev),
                    history.train_Y.to(dev),
                    self.domain,
                    history.continuation(settings),
                    self.features,
                    capacity=extra,
                    max_memory=max_memory,
                )  # the other agents go on as their history ran: standard TS with its GP
                self.others.gp_updates = history.agents.gp_updates
                self.others.gp_params = history.agents.gp_params
                self.others.warp_choice = history.agents.warp_choice
                self.history_rounds = history.rounds
        # free-riders (settings.free_riders): A booleans and whom a `copied` rider copies
        self.free_riders = FreeRiders.from_config(getattr(settings, "free_riders", None)) if federated else None
        if self.free_riders is not None:
            self.rider = self.free_riders.mask(A, dev)
            self.copied_from = FreeRiders.copied_from(self.rider)
        # reciprocity: per run, how often its agent's messages were followed in its federation and improved
        self.reciprocity = bool(getattr(settings, "reciprocity", False)) and self.together
        self.reciprocity_signal = str(getattr(settings, "reciprocity_signal", "improvements"))
        replays = bool(getattr(settings, "reciprocity_replays", False))
        self.reciprocity_replays = replays and self.reciprocity  # together: fresh messages every round
        # fairness: per run and round, its agent's rank among its federation's incumbents (0 best, 1 worst)
        self.fairness = float(getattr(settings, "fairness", 0.0)) if self.together else 0.0
        self.behind: Tensor | None = None
        self.behind_history = torch.zeros(R, 0, dtype=torch.float64, device=dev)
        self.sent_follows = torch.zeros(R, dtype=torch.float64, device=dev)
        self.sent_wins = torch.zeros(R, dtype=torch.float64, device=dev)
        # reciprocity_signal: ranks: per run, its agent's rating record (rating_record's five sums)
        self.ratings = torch.zeros(5, R, dtype=torch.float64, device=dev)
        self.may_follow: Tensor | None = None
        self.excluded = torch.zeros(R, 0, dtype=torch.bool, device=dev)
        self.num_inits = num_inits
        self.method: Method = method_cls(self)
        if federated:
            self.method.receive(0)

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
    def others_X(self) -> Tensor:
        return self.others.train_X

    def step(self) -> None:
        """One BO iteration for every run (the method's :meth:`~fbo_torch.methods.base.Method.step`)."""
        t0 = time.perf_counter()
        self.t += 1
        t = self.t
        if self.fairness > 0:
            self._rank_incumbents()
        if self.reciprocity:
            if self.reciprocity_signal == "improvements":
                self.may_follow = ~self.flagged()
            elif self.reciprocity_signal == "scores":
                self.may_follow = self._share_coin(t)
            else:
                self.may_follow = ~self._rated_low()
            if self.reciprocity_replays:
                assert isinstance(self.method, DrawMethod) and self.method.replayed is not None
                self.may_follow = self.may_follow & ~self.method.replayed
            self.excluded = torch.cat([self.excluded, (~self.may_follow).unsqueeze(-1)], dim=1)
            before = torch.where(self.agents.mask, self.Y.squeeze(-1), -torch.inf).amax(-1)
        X_next, sources = self.method.step(t)
        y, f, ok = self.agents.evaluate(self.objective, self.targets, X_next, t, self.faults)
        if self.reciprocity:
            self._count_follows(sources, ok & (y > before))
        self.best = torch.cat([self.best, torch.maximum(self.best[:, -1:], f.unsqueeze(-1))], dim=1)
        self.sources = torch.cat([self.sources, sources.unsqueeze(-1)], dim=1)
        self.failed = torch.cat([self.failed, (~ok).unsqueeze(-1)], dim=1)
        self.method.observed(t, y, ok, sources)
        if self.method.federated() and self.settings.communication == "every-round":
            self._others_step(t)
        self.wall_time += time.perf_counter() - t0
        self.elapsed.append(self.wall_time)

    def flagged(self) -> Tensor:
        r"""``R`` booleans: the run's agent is flagged as a free-rider in its federation (the agents of
        its initialization) by :func:`~fbo_torch.protocol.reciprocity.flag_free_riders` on the follow
        and improvement counts so far, every federation at once."""
        flags, _, _ = flag_free_riders(self._by_federation(self.sent_follows), self._by_federation(self.sent_wins))
        return self._by_run(flags)

    def _by_federation(self, per_run: Tensor) -> Tensor:
        r"""``R x ...`` per run as ``inits x A x ...``: federation ``i`` holds the runs of initialization ``i``,
        one per agent (runs are target-major: agent ``a``, initialization ``i`` at ``a·inits + i``)."""
        A, inits = self.objective.num_agents, self.num_inits
        return per_run.view(A, inits, *per_run.shape[1:]).transpose(0, 1)

    def _by_run(self, per_federation: Tensor) -> Tensor:
        r"""``inits x A x ...`` per federation and agent back as ``R x ...`` per run (:meth:`_by_federation`)."""
        return per_federation.transpose(0, 1).reshape(-1, *per_federation.shape[2:])

    def _share_coin(self, t: int) -> Tensor:
        r"""``R`` booleans for ``reciprocity_signal: scores``: the run's agent may follow a peer this round,
        with probability its :func:`~fbo_torch.protocol.reciprocity.reciprocal_share` in its federation: its
        latest message's mean helpful posterior as its receivers score it on their observations
        (:func:`~fbo_torch.protocol.fidelity.helpful_posterior`), relative to the federation's median sender."""
        scores = self._reported_scores()  # R x A: receiver run, sender agent
        helpful = helpful_posterior(scores, self.agents.mask.sum(-1))
        receives = self._by_federation(self.peer_mask)  # inits x A x A: [federation, receiver, sender]
        share = reciprocal_share(sender_usefulness(self._by_federation(helpful), receives))  # inits x A
        mine = self._by_run(share)
        u = kr.uniform(kr.fold(kr.fold(self.agents.keys, "reciprocity"), t), 1).squeeze(-1)
        return u < mine

    def _rated_low(self) -> Tensor:
        r"""``R`` booleans for ``reciprocity_signal: ranks``: this round's ratings of the run's agent's latest
        message by its receivers (their scores as ranks among the peers each received,
        :func:`~fbo_torch.protocol.reciprocity.peer_ratings`) added to its record, then
        :func:`~fbo_torch.protocol.reciprocity.flag_low_rated` on the record: rated low with confidence."""
        scores = self._reported_scores()  # R x A: receiver run, sender agent
        receives = self._by_federation(self.peer_mask)  # inits x A x A: [federation, receiver, sender]
        mean, count = round_ratings(peer_ratings(self._by_federation(scores), receives), receives)  # inits x A
        # each round weighs its receivers' mean number of observations minus one
        pairs = self._by_federation((self.agents.mask.sum(-1).to(torch.float64) - 1).clamp_min(1))  # receivers
        weight = (receives.to(torch.float64) * pairs.unsqueeze(-1)).sum(-2) / count.clamp_min(1)  # inits x A senders
        self.ratings += rating_record(*(self._by_run(v) for v in (mean, count, weight)))
        flags, _ = flag_low_rated(self.ratings)
        return flags

    def _reported_scores(self) -> Tensor:
        r"""``R x A``: what each run's agent reports to reciprocity about every sender's latest message — its
        fidelity scores on its own observations (:meth:`~fbo_torch.methods.draws.DrawMethod.peer_scores`), a
        colluding free-rider's replaced (:meth:`~fbo_torch.federation.free_riders.FreeRiders.reported`)."""
        assert isinstance(self.method, DrawMethod)  # reciprocity needs a method whose agents follow peers' draws
        scores, _ = self.method.peer_scores()  # R x A: receiver run, sender agent
        if self.free_riders is None:
            return scores
        return self.free_riders.reported(scores, self.rider[self.targets], self.rider)

    def _rank_incumbents(self) -> None:
        """``behind`` (``R``) and ``peer_behind`` (``R x A``): each agent's rank among its federation's
        incumbents (its best valid observation so far), for ``fairness``."""
        best = torch.where(self.agents.mask, self.Y.squeeze(-1), -torch.inf).amax(-1)
        ranks = behind_ranks(self._by_federation(best))  # inits x A
        self.behind = self._by_run(ranks)
        self.peer_behind = ranks[self.inits]  # R x A: the ranks of run r's federation
        self.behind_history = torch.cat([self.behind_history, self.behind.unsqueeze(-1)], dim=1)

    def _count_follows(self, sources: Tensor, improved: Tensor) -> None:
        r"""Add round's follows to the senders' counts: who followed whom (``sources``) and whether it
        improved the follower's incumbent (``improved``: its observation beat its best before)."""
        rows = torch.arange(self.num_runs, device=self.device)
        sender = self.peer_runs[rows, sources.clamp_min(0)]
        followed = (sources >= 0).to(torch.float64)
        self.sent_follows.index_add_(0, sender, followed)
        self.sent_wins.index_add_(0, sender, followed * improved.to(torch.float64))

    def _others_step(self, t: int) -> None:
        """The other agents run one TS iteration each and send fresh messages (together: the
        targets, which have just observed, send theirs)."""
        if not self.together:
            round = self.history_rounds + t  # the other agents' rounds continue their history's
            X_next, _ = self.others.own_proposals(round)
            agents = torch.arange(self.others.num_agents, device=self.device)
            self.others.evaluate(self.objective, agents, X_next, round)
        self.method.receive(t)

    def result(self) -> FTSResult:
        loss = self.objective.loss(self.best.T, agents=self.targets).T  # loss() wants agents last
        return FTSResult(
            name=self.name,
            loss=loss.cpu(),
            best_value=self.best.cpu(),
            sources=self.sources.cpu(),
            queries=self.X.cpu(),
            observations=self.Y.squeeze(-1).cpu(),
            targets=self.targets.cpu(),
            inits=self.inits.cpu(),
            wall_time=self.wall_time,
            parameters_per_agent=self.method.parameters_per_agent(self.settings, self.objective.dim),
            settings=asdict(self.settings),
            elapsed=list(self.elapsed),
            failed=self.failed.cpu(),
            excluded=self.excluded.cpu() if self.reciprocity else None,
            behind=self.behind_history.cpu() if self.fairness > 0 else None,
        )

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly where this runner is."""
        state = {
            **self.runner_state(),
            "sources": self.sources.cpu(),
            "elapsed": self.elapsed,
            "method": cpu_state(self.method.state_dict()),
            "sent_follows": self.sent_follows.cpu(),
            "sent_wins": self.sent_wins.cpu(),
            "ratings": self.ratings.cpu(),
            "excluded": self.excluded.cpu(),
            "behind": self.behind_history.cpu(),
        }
        if self.dist is not None:
            state["dist"] = self.dist.state_dict()
            if not self.together:
                state["others"] = cpu_state(self.others.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        dev = self.device
        self.load_runner_state(state)
        self.sources = state["sources"].to(dev)
        self.elapsed = list(state["elapsed"])
        if self.dist is not None:
            self.dist.load_state_dict(state["dist"])
            if not self.together:
                self.others.load_state_dict(state["others"])
        self.method.load_state_dict(state["method"])
        if "sent_follows" in state:  # checkpoints from before reciprocity have none (and ran without it)
            self.sent_follows = state["sent_follows"].to(dev)
            self.sent_wins = state["sent_wins"].to(dev)
            self.excluded = state["excluded"].to(dev)
        if "ratings" in state:  # checkpoints from before reciprocity_signal: ranks have none (and ran without it)
            self.ratings = state["ratings"].to(dev)
        if "behind" in state:  # checkpoints from before fairness have none (and ran without it)
            self.behind_history = state["behind"].to(dev)
