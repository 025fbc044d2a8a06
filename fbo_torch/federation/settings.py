r"""The settings of a federation: one dataclass per concern, one set of defaults.

* :class:`MethodSettings` — fields every method has: the shared random
  features, the agents' own GPs, ``p_t``, fault injection.
* :class:`FTSSettings` — an FTS experiment's method (FTS, TS, RGPE, TAF).
* :class:`DPFTSDESettings` — a DP-FTS-DE method (the FTS family with a
  server): sub-regions, weights, sampling rate, clipping, noise, budget.
* :class:`HistorySettings` — how an FTS experiment's other agents got their observations.
* :class:`PrivacySettings` — how releases are accounted: the accountant, δ, a budget.
* :class:`~fbo_torch.optim.domain.Domain` — where agents search and the maximizer's options.

The defaults are the local engine (``gp_kernel: fbo``, ``gp_warp: auto``,
``own_acquisition: logei``); the papers' agents (a Thompson sample of BoTorch's
``SingleTaskGP``) are the setup ``paper`` (:mod:`fbo_torch.simulate.presets`).
These classes hold the only defaults. The YAML experiment file
(:mod:`fbo_torch.experiments.config`), a Flower run config
(:mod:`fbo_torch.flower.config`) and Python code build them and add no
defaults of their own. The two experiment kinds start from their papers'
settings where these differ:

=========================  ===================  ====================
field                      FTS (FTS paper)      DP-FTS-DE (its paper)
=========================  ===================  ====================
``num_iterations``         50                   40
``num_init``               1                    10
``num_features``           100                  50
``p1_equals_p2``           true                 false
``gp_refit_every``         1                    5
=========================  ===================  ====================

The simulator (:mod:`fbo_torch.simulate`) and a deployment (:mod:`fbo_torch.flower`)
build their agents and server from the same settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.federation.faults import FaultInjector
from fbo_torch.federation.release import get_release
from fbo_torch.methods.base import Method, get_method
from fbo_torch.models.gp_spec import GP_SPECS
from fbo_torch.privacy import ACCOUNTANTS, DEFAULT_ACCOUNTANT
from fbo_torch.protocol.fidelity import check_agent_weights
from fbo_torch.protocol.schedules import PtSchedule
from fbo_torch.protocol.weights import ExplorationWeights
from fbo_torch.utils.validation import check_int, check_probability


def check_finite_positive(name: str, value: Any, what: str = "a finite number > 0") -> None:
    """``value`` must be a finite number > 0 (``ValueError`` naming ``name`` otherwise)."""
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"`{name}` must be {what}, got {value!r}.")


#: Values of ``own_acquisition``: what an agent maximizes on its own GP.
OWN_ACQUISITIONS = ("ts", "logei", "ucb")
#: Values of ``gp_warp``.
GP_WARPS = ("none", "auto")
#: Values of ``message_outputs``.
MESSAGE_OUTPUTS = ("raw", "standardized", "warped")


#: The fields of an agent's own model and search (its GP, warp, Thompson samples, repeats).
OWN_MODEL_FIELDS = (
    "gp_kernel",
    "gp_warp",
    "gp_sample_features",
    "gp_fit_maxiter",
    "gp_restarts",
    "gp_warm_start",
    "repeated_query",
)


@dataclass
class MethodSettings:
    r"""Fields common to :class:`FTSSettings` and :class:`DPFTSDESettings`.

    Attributes:
        num_iterations: BO iterations (rounds) ``T`` after initialization.
        num_init: Random initial points per agent.
        num_features: ``M``, random Fourier features shared by all agents.
        rff_lengthscale / rff_outputscale / rff_seed / rff_normalize: The shared map.
        rff_noise_variance: ``σ²`` in the agents' RFF posteriors.
        p_t / p1_equals_p2: Probability of using the own GP (see :class:`PtSchedule`).
        gp_kernel / gp_refit_every: The agents' own GPs: a name in
            :data:`~fbo_torch.models.batched_gp.GP_SPECS` (``"fbo"``, the default: the local
            engine's; ``"botorch"``: BoTorch's ``SingleTaskGP``, ``setup: paper``; ``"rbf"``:
            scaled RBF/ARD by maximum likelihood) and how
            often hyperparameters are re-fitted (every ``k`` GP updates; 0: only once).
        gp_fit_maxiter: Iteration cap of the batched hyperparameter fit.
        gp_restarts: Random restarts of each refit besides its first start (the
            authors' GPy fits used 10), optimized in the same batch; the best kept.
        gp_warm_start: Start each refit from the current hyperparameters (``True``)
            or from the model's default initialization, as a fresh BoTorch
            ``SingleTaskGP`` + ``fit_gpytorch_mll`` does (``False``, default).
            A warm start keeps a lengthscale that the early data favoured and
            locked more agents in a local optimum (docs/design.md, "Settings").
        repeated_query: ``"keep"``, or ``"random"``: a query that repeats one of
            the agent's earlier queries is replaced by a uniform random point
            (the authors' code does this).
        gp_warp: ``"auto"`` (the default), or ``"none"`` (``setup: paper``): each agent's GP
            models an increasing warp of its observations, chosen per agent and refit among the identity and the
            log-gap warps by the marginal likelihood of the original observations
            (:mod:`~fbo_torch.models.outcome_warp`; for heavy-tailed values such as a
            shifted Sphere's or Rosenbrock's). Thompson samples, LogEI and UCB then act
            on the warped values (argmaxes are unchanged by an increasing warp).
        message_outputs: What an agent's RFF posterior (its messages) is fitted to:
            ``"raw"`` observations (the papers), ``"standardized"`` ones, or
            ``"warped"`` (standardized after the agent's ``gp_warp``); see
            :meth:`~fbo_torch.federation.agents.Agents.message_model`.
        gp_sample_features: Random features of the pathwise prior in each GP
            Thompson sample (256; None: BoTorch's default, 1024, about 4x slower;
            the reference implementation used 100 features for its own samples).
        own_acquisition: What an agent maximizes on its own GP's branch (probability
            ``p_t``): ``"logei"`` (the default, the local engine's), BoTorch's analytic
            ``LogExpectedImprovement`` with ``best_f`` the agent's best valid observation
            so far; ``"ts"``, a Thompson sample (the papers' choice, ``setup: paper``);
            ``"ucb"``, ``UpperConfidenceBound`` with ``β = ucb_beta``
            (:mod:`fbo_torch.acquisition.batched`, all agents in one batch). RGPE and TAF
            have acquisitions of their own and ignore it; ``peer_prior`` needs an analytic one.
        ucb_beta: ``β ≥ 0`` of ``own_acquisition="ucb"``.
        faults: Fault injection for robustness studies, ``{eval_failure_rate: r,
            dropout_rate: r, byzantine_rate: r, byzantine_kind: nan | inf | huge |
            random}``: each agent's evaluation fails (returns NaN) with
            probability ``eval_failure_rate`` per round, each agent's message is
            lost with probability ``dropout_rate`` per round, and each agent is
            hostile with probability ``byzantine_rate`` (see
            :class:`~fbo_torch.federation.faults.FaultInjector`).
    """

    num_iterations: int = 50
    num_init: int = 1
    num_features: int = 100
    rff_lengthscale: float = 0.03
    rff_outputscale: float = 1.0
    rff_seed: int = 0
    rff_normalize: bool = True
    rff_noise_variance: float = 0.01
    p_t: Any = "1-1/sqrt(t)"
    p1_equals_p2: bool = True
    gp_kernel: str = "fbo"
    gp_refit_every: int = 1
    gp_sample_features: int | None = 256
    gp_fit_maxiter: int = 60
    gp_restarts: int = 0
    gp_warm_start: bool = False
    gp_warp: str = "auto"
    message_outputs: str = "raw"
    repeated_query: str = "keep"
    own_acquisition: str = "logei"
    ucb_beta: float = 2.0
    faults: dict[str, Any] | None = None

    #: The experiment kind whose methods these settings describe (``None``: no algorithm field).
    KIND: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        for key in ("rff_lengthscale", "rff_outputscale", "rff_noise_variance"):
            check_finite_positive(key, getattr(self, key))
        if (
            isinstance(self.rff_seed, bool)
            or not isinstance(self.rff_seed, int)
            or not -(2**63) <= self.rff_seed < 2**63
        ):
            raise ValueError(f"`rff_seed` must be a signed 64-bit integer, got {self.rff_seed!r}.")
        check_int("num_iterations", self.num_iterations, minimum=1)
        check_int("num_init", self.num_init, minimum=1)
        check_int("num_features", self.num_features, minimum=1)
        check_int("gp_refit_every", self.gp_refit_every, minimum=0)
        check_int("gp_fit_maxiter", self.gp_fit_maxiter, minimum=0)
        check_int("gp_restarts", self.gp_restarts, minimum=0)
        if not isinstance(self.gp_warm_start, bool):
            raise ValueError(f"`gp_warm_start` must be true or false, got {self.gp_warm_start!r}.")
        if self.repeated_query not in ("keep", "random"):
            raise ValueError(f"`repeated_query` must be 'keep' or 'random', got {self.repeated_query!r}.")
        if self.gp_warp not in GP_WARPS:
            raise ValueError(f"`gp_warp` must be one of {GP_WARPS}, got {self.gp_warp!r}.")
        if self.message_outputs not in MESSAGE_OUTPUTS:
            raise ValueError(f"`message_outputs` must be one of {MESSAGE_OUTPUTS}, got {self.message_outputs!r}.")
        if self.own_acquisition not in OWN_ACQUISITIONS:
            raise ValueError(f"`own_acquisition` must be one of {OWN_ACQUISITIONS}, got {self.own_acquisition!r}.")
        b = self.ucb_beta
        if isinstance(b, bool) or not (isinstance(b, (int, float)) and math.isfinite(b) and b >= 0):
            raise ValueError(f"`ucb_beta` must be a finite number >= 0, got {b!r}.")
        if self.gp_sample_features is not None:
            check_int("gp_sample_features", self.gp_sample_features, minimum=2)
            if self.gp_sample_features % 2:
                raise ValueError(
                    f"`gp_sample_features` must be even ([sin, cos] pairs), got {self.gp_sample_features}."
                )
        if self.gp_kernel not in GP_SPECS:
            raise ValueError(f"`gp_kernel` must be one of {sorted(GP_SPECS)}, got {self.gp_kernel!r}.")
        self.fault_injector()  # validates
        PtSchedule(self.p_t, self.p1_equals_p2)  # validates
        if self.KIND is not None:
            self.method.check(self)  # the algorithm's own rules

    @property
    def method(self) -> type[Method]:
        """The algorithm's :class:`~fbo_torch.methods.base.Method` class (from the registry)."""
        return get_method(getattr(self, "algorithm", None), self.KIND)

    def fault_injector(self) -> FaultInjector:
        """The :class:`~fbo_torch.federation.faults.FaultInjector` :attr:`faults` describes (validated)."""
        return FaultInjector.from_config(self.faults)

    def features(self, dim: int, device: torch.device | str | None = None) -> RandomFourierFeatures:
        """The shared random-feature map these settings describe."""
        return RandomFourierFeatures(
            dim,
            self.num_features,
            lengthscale=self.rff_lengthscale,
            outputscale=self.rff_outputscale,
            seed=self.rff_seed,
            normalize=self.rff_normalize,
            device=device,
        )


COMMUNICATION = ("one-shot", "every-round")
HISTORIES = ("random", "ts", "together")


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
        agent_weights: ``P_N`` of FTS: ``"uniform"`` (the papers) or ``"learned"``
            (each round, from how well every peer's message ranks the target's own
            observations; :mod:`fbo_torch.protocol.fidelity`). Other algorithms
            have no ``P_N`` and ignore it.
        peer_trust: Scale the probability of following a peer by the trust in
            ``P_N``'s draw, ``p_t' = 1 - (1 - p_t)·g``
            (:func:`~fbo_torch.protocol.fidelity.peer_trust`), so an agent whose
            peers disagree with its observations falls back to its own GP (FTS only).
        rgpe_samples: Posterior samples for RGPE's ranking weights.
        taf_bandwidth: TAF's kernel bandwidth ``ρ``.
        prior_strength / prior_width / prior_floor: ``peer_prior``'s ``β``, ``s`` and
            ``λ``: the own acquisition (``logei`` or ``ucb``) plus ``β/t`` times the log of
            a prior over the optimizer's location with a bump of width ``s`` (unit-cube
            units) at each peer's believed optimum, weighted by ``P_N``, floored at ``λ``
            (:mod:`~fbo_torch.acquisition.peer_prior`).
        message_memory: ``peer_prior``: each peer's messages are averaged over this many
            rounds before its believed optimum is taken
            (:class:`~fbo_torch.protocol.message_average.MessageAverage`).
        channels: ``transfer``: what peers share and an agent may follow
            (:mod:`~fbo_torch.methods.transfer`): ``"optima"`` (their incumbents),
            ``"function"`` (FTS's messages), ``"landscape"`` (their GPs' lengthscales, a prior
            of the agent's own fit).
        landscape_scale: ``transfer``: the smallest scale (log units) of the lengthscale prior
            learned from the peers; their spread adds to it.
    """

    algorithm: str = "fts"
    communication: str = "one-shot"
    agent_weights: str = "uniform"
    peer_trust: bool = False
    rgpe_samples: int = 256
    taf_bandwidth: float = 0.5
    prior_strength: float = 2.0
    prior_width: float = 0.1
    prior_floor: float = 0.05
    message_memory: int = 10
    channels: list[str] = field(default_factory=lambda: ["optima", "function", "landscape"])
    landscape_scale: float = 0.5

    KIND: ClassVar[str | None] = "fts"

    def __post_init__(self) -> None:
        get_method(self.algorithm, self.KIND)  # a registered algorithm of this kind
        if self.communication not in COMMUNICATION:
            raise ValueError(f"`communication` must be one of {COMMUNICATION}, got {self.communication!r}.")
        super().__post_init__()
        check_agent_weights(self.agent_weights)
        if not isinstance(self.peer_trust, bool):
            raise ValueError(f"`peer_trust` must be true or false, got {self.peer_trust!r}.")
        check_int("rgpe_samples", self.rgpe_samples, minimum=1)
        check_finite_positive("taf_bandwidth", self.taf_bandwidth)
        check_finite_positive("prior_strength", self.prior_strength)
        check_finite_positive("prior_width", self.prior_width)
        check_probability("prior_floor", self.prior_floor, open_left=True, open_right=True)
        check_int("message_memory", self.message_memory, minimum=1)
        if isinstance(self.channels, (list, tuple)):
            self.channels = list(self.channels)
        check_finite_positive("landscape_scale", self.landscape_scale)
        faults = self.fault_injector()
        if faults.affects_messages:
            key = "faults.dropout_rate" if faults.dropout_rate > 0 else "faults.byzantine_rate"
            raise ValueError(
                f"`{key}` applies to DP-FTS-DE methods (experiment: dp_fts_de), whose agents send "
                "messages each round; in FTS experiments the other agents' messages come from their "
                "histories (use `eval_failure_rate` for failing evaluations)."
            )


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
        aggregation: The release mechanism, by its registered name
            (:mod:`fbo_torch.federation.release`): ``"central"`` (the papers'
            mechanism: the server sees every ``ω`` and adds the noise; the
            default) or ``"secure"`` (secure aggregation with distributed discrete
            Gaussian noise: the server sees only the sum;
            :mod:`fbo_torch.federation.secure`).
        dropout_tolerance: ``"secure"``: the fraction ``f`` of agents whose vectors
            may be missing from a round's sum while it still releases
            (``min_survivors = N − ⌊fN⌋``); the noise shares are sized for that many.
        lattice_scale: ``"secure"``: integer lattice units per ``S`` (``None``: the
            finest the exact noise sampler allows).
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
    aggregation: str = "central"
    dropout_tolerance: float = 0.0
    lattice_scale: int | None = None

    KIND: ClassVar[str | None] = "dp_fts_de"

    def __post_init__(self) -> None:
        get_method(self.algorithm, self.KIND)  # a registered algorithm of this kind
        super().__post_init__()
        check_int("num_regions", self.num_regions, minimum=1)
        check_probability("sample_rate", self.sample_rate, open_left=True)
        z = self.noise_multiplier
        if isinstance(z, bool) or not (isinstance(z, (int, float)) and math.isfinite(z) and z >= 0):
            raise ValueError(f"`noise_multiplier` must be a finite number >= 0, got {z!r}.")
        if self.clip_norm is not None and not (isinstance(self.clip_norm, (int, float)) and self.clip_norm > 0):
            raise ValueError(f"`clip_norm` S must be > 0 (or null for no clipping), got {self.clip_norm!r}.")
        if z > 0 and self.clip_norm is None:
            raise ValueError("`clip_norm` is required when `noise_multiplier` > 0.")
        if z > 0 and self.clip_norm is not None and not math.isfinite(self.clip_norm):
            raise ValueError(
                "`clip_norm` must be finite when `noise_multiplier` > 0 (the noise std is "
                f"noise_multiplier × clip_norm), got {self.clip_norm!r}."
            )
        if self.max_epsilon is not None:
            check_finite_positive("max_epsilon", self.max_epsilon, "a finite number > 0, or null for no budget")
        check_probability("local_threshold", self.local_threshold)
        if self.broadcast_maximization not in ("shared", "per_agent"):
            raise ValueError(
                f"`broadcast_maximization` must be 'shared' or 'per_agent', got {self.broadcast_maximization!r}."
            )
        if self.weights not in ExplorationWeights.MODES:
            raise ValueError(f"`weights` must be one of {ExplorationWeights.MODES}, got {self.weights!r}.")
        check_finite_positive("weight_b", self.weight_b)
        if not (math.isfinite(self.weight_a) and self.weight_a >= self.weight_b):
            raise ValueError(
                f"`weight_a` must be a finite number >= `weight_b` ({self.weight_b}), got {self.weight_a!r}."
            )
        check_int("const_rounds", self.const_rounds, minimum=0)
        check_int("decay_rounds", self.decay_rounds, minimum=0)
        release = get_release(self.aggregation)
        check_probability("dropout_tolerance", self.dropout_tolerance, open_right=True)
        if self.lattice_scale is not None:
            check_int("lattice_scale", self.lattice_scale, minimum=1)
        release.check_settings(self)

    @property
    def is_private(self) -> bool:
        """Whether these settings release differentially private messages (the algorithm's say)."""
        return self.method.is_private(self)


@dataclass
class HistorySettings:
    r"""How the other agents got their observations before FTS (an FTS experiment's ``history:``).

    Attributes:
        mode: ``"random"`` (``t_n`` random noisy observations per agent), ``"ts"``
            (``t_n`` iterations of standard TS from ``num_init`` random points), or
            ``"together"``: no history — every agent is a target, the agents of one
            initialization optimize at the same time and are each other's peers, each
            sending a fresh message every round (``t_n``, ``num_init`` and ``gp_kernel``
            are not used; :class:`~fbo_torch.simulate.fts.FTSRunner`'s ``together``).
        t_n: Observations per agent.
        num_init: Random points before TS (``"ts"`` mode).
        gp_kernel: The other agents' GP in ``"ts"`` mode.
    """

    mode: str = "random"
    t_n: int = 40
    num_init: int = 3
    #: The other agents' GP in ``"ts"`` mode; ``None``: the scenario setup's (``botorch`` for
    #: ``modern``; ``authors`` for ``authors``, whose other refit choices the history follows too).
    gp_kernel: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in HISTORIES:
            raise ValueError(f"`mode` must be one of {HISTORIES}, got {self.mode!r}.")
        if not isinstance(self.t_n, int) or self.t_n < 1:
            raise ValueError(f"`t_n` must be an integer >= 1, got {self.t_n!r}.")
        if not isinstance(self.num_init, int) or self.num_init < 1:
            raise ValueError(f"`num_init` must be an integer >= 1, got {self.num_init!r}.")
        if self.gp_kernel is not None and self.gp_kernel not in GP_SPECS:
            raise ValueError(f"`gp_kernel` must be one of {sorted(GP_SPECS)}, got {self.gp_kernel!r}.")


@dataclass
class PrivacySettings:
    r"""How a DP-FTS-DE federation accounts its releases (YAML ``privacy:``).

    Attributes:
        accountant: The ledger's accountant (a name in
            :data:`~fbo_torch.privacy.ACCOUNTANTS`).
        delta: ``δ`` of the reported ``(ε, δ)``; ``None``: the context's default —
            the papers' ``1/N^1.1`` in experiments (reproduction), ``min(1e-5,
            0.01/N)`` in a deployment (:func:`~fbo_torch.privacy.deployment_delta`).
        max_epsilon: The default budget of every private method that sets none
            (``None``: no budget).
        extra_accountants: Accountants whose ε is reported besides the ledger's.
    """

    accountant: str = DEFAULT_ACCOUNTANT
    delta: float | None = None
    max_epsilon: float | None = None
    extra_accountants: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        names = list(ACCOUNTANTS)
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(f"`accountant` must be one of {names}, got {self.accountant!r}.")
        if not isinstance(self.extra_accountants, (list, tuple)):
            raise ValueError(f"`extra_accountants` must be a list of {names}, got {self.extra_accountants!r}.")
        self.extra_accountants = list(self.extra_accountants)
        for i, name in enumerate(self.extra_accountants):
            if name not in ACCOUNTANTS:
                raise ValueError(f"`extra_accountants[{i}]` must be one of {names}, got {name!r}.")
        if self.delta is not None and (
            isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or not 0 < self.delta < 1
        ):
            raise ValueError(f"`delta` must be a number in (0, 1), or null for the default, got {self.delta!r}.")
        if self.max_epsilon is not None:
            check_finite_positive("max_epsilon", self.max_epsilon, "a finite number > 0, or null for no budget")
