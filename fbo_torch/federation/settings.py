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
Each field is declared once, with its default, a one-line doc and its check
(:func:`~fbo_torch.utils.schema.setting`); the constructors run the checks, then
the rules that involve several fields and the algorithm's own
(:meth:`~fbo_torch.methods.base.Method.check`). These classes hold the only
defaults and the only checks of their fields. The YAML experiment file
(:mod:`fbo_torch.experiments.config`), a Flower run config
(:mod:`fbo_torch.flower.config`) and Python code build them and add no
defaults of their own. The two experiment kinds start from their papers'
settings where these differ (:data:`KIND_DEFAULTS`, the one table of them):

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

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.federation.faults import FaultInjector
from fbo_torch.federation.free_riders import FreeRiders
from fbo_torch.federation.release import get_release
from fbo_torch.methods.base import OWN_ACQUISITIONS, Method, get_method
from fbo_torch.models.gp_spec import GP_SPECS
from fbo_torch.privacy import ACCOUNTANTS, DEFAULT_ACCOUNTANT
from fbo_torch.privacy.accountants import check_delta, check_noise_multiplier, check_sample_rate
from fbo_torch.protocol.fidelity import check_agent_weights
from fbo_torch.protocol.reciprocity import RECIPROCITY_SIGNALS
from fbo_torch.protocol.schedules import PtSchedule
from fbo_torch.protocol.weights import ExplorationWeights
from fbo_torch.utils.schema import (
    Choice,
    Flag,
    Integer,
    Number,
    Optional,
    Probability,
    Rule,
    check_fields,
    document,
    kind_defaults,
    setting,
    type_error,
)
from fbo_torch.utils.validation import check_int

#: Values of ``gp_warp``.
GP_WARPS = ("none", "auto")
#: Values of ``message_outputs``.
MESSAGE_OUTPUTS = ("raw", "standardized", "warped")
#: Values of ``communication``.
COMMUNICATION = ("one-shot", "every-round")
#: Values of ``history.mode``.
HISTORIES = ("random", "ts", "together")

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

#: The defaults an experiment kind's paper chose where it differs from :class:`MethodSettings`' (the FTS
#: paper's): the only place a default differs between kinds (the module docstring's table shows it).
KIND_DEFAULTS: dict[str, dict[str, Any]] = {
    "fts": {},
    "dp_fts_de": {
        "num_iterations": 40,
        "num_init": 10,
        "num_features": 50,
        "p1_equals_p2": False,
        "gp_refit_every": 5,
    },
}


def _signed_64(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        raise ValueError(f"`{key}` must be a signed 64-bit integer, got {value!r}.")


def _even_features(key: str, value: Any) -> None:
    check_int(key, value, minimum=2)
    if value % 2:
        raise ValueError(f"`{key}` must be even ([sin, cos] pairs), got {value}.")


def _accountants(key: str, value: Any) -> None:
    names = list(ACCOUNTANTS)
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"`{key}` must be a list of {names}, got {value!r}.")
    for i, name in enumerate(value):
        Choice(names)(f"{key}[{i}]", name)


def _channels(key: str, value: Any) -> None:
    # the channels a value may name are the transfer method's to check (Method.check); any other
    # algorithm ignores them
    if not isinstance(value, (list, tuple)) or not all(isinstance(c, str) for c in value):
        raise ValueError(type_error(key, "a list of strings", value))


def _algorithm(kind: str) -> Rule:
    return Rule(lambda key, value: get_method(value, kind, key=key), "no-such-algorithm")


@dataclass
class MethodSettings:
    r"""Fields common to :class:`FTSSettings` and :class:`DPFTSDESettings`."""

    num_iterations: int = setting(50, "BO iterations (rounds) ``T`` after initialization.", Integer(minimum=1))
    num_init: int = setting(1, "Random initial points per agent.", Integer(minimum=1))
    num_features: int = setting(100, "``M``, random Fourier features shared by all agents.", Integer(minimum=1))
    rff_lengthscale: float = setting(0.03, "Lengthscale of the shared random-feature map.", Number())
    rff_outputscale: float = setting(1.0, "Outputscale of the shared random-feature map.", Number())
    rff_seed: int = setting(0, "Seed of the shared random-feature map.", Rule(_signed_64, 2**64))
    rff_normalize: bool = setting(True, "Normalize the shared random-feature map.", Flag())
    rff_noise_variance: float = setting(0.01, "``σ²`` in the agents' RFF posteriors.", Number())
    p_t: Any = setting(
        "1-1/sqrt(t)",
        "Probability of using the own GP: a named schedule, a number in [0, 1] or a callable "
        "``t -> p_t`` (:class:`~fbo_torch.protocol.schedules.PtSchedule`).",
        Rule(lambda key, value: PtSchedule(value), 1.5),
    )
    p1_equals_p2: bool = setting(
        True, "``p_1 = p_2`` (the FTS paper); otherwise ``p_1 = 0`` (DP-FTS-DE's reading).", Flag()
    )
    gp_kernel: str = setting(
        "fbo",
        "The agents' own GPs, a name in :data:`~fbo_torch.models.gp_spec.GP_SPECS`: ``fbo`` (the local "
        "engine's), ``botorch`` (BoTorch's ``SingleTaskGP``, ``setup: paper``) or ``rbf`` (scaled RBF/ARD by "
        "maximum likelihood).",
        Choice(lambda: sorted(GP_SPECS)),
    )
    gp_refit_every: int = setting(
        1, "Re-fit the own GPs' hyperparameters every ``k`` GP updates (0: only once).", Integer(minimum=0)
    )
    gp_sample_features: int | None = setting(
        256,
        "Random features of the pathwise prior in each GP Thompson sample (None: BoTorch's default, 1024, "
        "about 4x slower; the reference implementation used 100).",
        Optional(Rule(_even_features, 3)),
    )
    gp_fit_maxiter: int = setting(60, "Iteration cap of the batched hyperparameter fit.", Integer(minimum=0))
    gp_restarts: int = setting(
        0,
        "Random restarts of each refit besides its first start (the authors' GPy fits used 10), optimized "
        "in the same batch; the best kept.",
        Integer(minimum=0),
    )
    gp_warm_start: bool = setting(
        False,
        "Start each refit from the current hyperparameters (``True``) or from the model's default "
        "initialization, as a fresh BoTorch ``SingleTaskGP`` + ``fit_gpytorch_mll`` does (``False``): a warm "
        "start keeps a lengthscale that the early data favoured and locked more agents in a local optimum "
        '(docs/design.md, "Settings").',
        Flag(),
    )
    gp_warp: str = setting(
        "auto",
        "``auto``: each agent's GP models an increasing warp of its observations, chosen per agent among the "
        "identity and the log-gap warps by the marginal likelihood (:mod:`~fbo_torch.models.outcome_warp`; "
        "for heavy-tailed values); ``none`` (``setup: paper``).",
        Choice(GP_WARPS),
    )
    message_outputs: str = setting(
        "raw",
        "What an agent's RFF posterior (its messages) is fitted to: ``raw`` observations (the papers), "
        "``standardized`` ones, or ``warped`` (standardized after the agent's ``gp_warp``).",
        Choice(MESSAGE_OUTPUTS),
    )
    repeated_query: str = setting(
        "keep",
        "``keep``, or ``random``: a query that repeats one of the agent's earlier queries is replaced by a "
        "uniform random point (the authors' code does this).",
        Choice(("keep", "random")),
    )
    own_acquisition: str = setting(
        "logei",
        "What an agent maximizes on its own GP's branch: ``logei`` (BoTorch's analytic "
        "``LogExpectedImprovement``), ``ts`` (a Thompson sample, the papers' choice, ``setup: paper``) or "
        "``ucb`` (``UpperConfidenceBound`` with ``β = ucb_beta``); RGPE and TAF ignore it.",
        Choice(OWN_ACQUISITIONS),
    )
    ucb_beta: float = setting(
        2.0,
        "``β ≥ 0`` of ``own_acquisition: ucb`` and of ``algorithm: transfer``'s exploring (UCB) arm.",
        Number(strict=False),
    )
    faults: dict[str, Any] | None = setting(
        None,
        "Fault injection for robustness studies, ``{eval_failure_rate, dropout_rate, byzantine_rate, "
        "byzantine_kind}`` (:class:`~fbo_torch.federation.faults.FaultInjector`).",
        Rule(lambda key, value: FaultInjector.from_config(value), {"no_such_fault": 1.0}),
    )
    reciprocity: bool = setting(
        False,
        "An agent may follow a peer's message only while it is not flagged as a free-rider itself, by the "
        "binomial test of the report (:func:`~fbo_torch.protocol.reciprocity.flag_free_riders`) on its "
        "federation's follow and improvement counts so far (``experiment: fts``, ``history.mode: together``; "
        "not with DP-FTS-DE).",
        Flag(),
    )

    #: The experiment kind whose methods these settings describe (``None``: no algorithm field).
    KIND: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass of an experiment kind takes that kind's defaults from :data:`KIND_DEFAULTS`."""
        super().__init_subclass__(**kwargs)
        if "KIND" in cls.__dict__ and cls.KIND is not None:
            kind_defaults(cls, KIND_DEFAULTS[cls.KIND])

    def __post_init__(self) -> None:
        check_fields(self)  # every field's own check
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


@dataclass
class FTSSettings(MethodSettings):
    r"""Settings of one method in an FTS experiment (plus those of :class:`MethodSettings`)."""

    algorithm: str = setting(
        "fts",
        "``fts``; ``ts`` (standard TS, no communication); or the FTS paper's adapted baselines ``rgpe`` "
        "(ranking-weighted GP ensemble + LogEI) and ``taf`` (transfer acquisition function), whose agents "
        "send their whole RFF posterior; or a registered algorithm of ``experiment: fts``.",
        _algorithm("fts"),
    )
    communication: str = setting(
        "one-shot", "``one-shot`` or ``every-round``: when the other agents send messages.", Choice(COMMUNICATION)
    )
    agent_weights: str = setting(
        "uniform",
        "``P_N`` of FTS: ``uniform`` (the papers), ``learned`` (each round, from how well every peer's "
        "message ranks the target's own observations; :mod:`fbo_torch.protocol.fidelity`; no defence against "
        "sybils whose messages are decorrelated copies) or ``corroborated`` (learned weights with the sybil "
        "defence: peers whose maximizers coincide count as one and each maximizer is cross-checked by the "
        "peers outside its group; ``docs/security.md``; what the recommended ``algorithm: transfer`` uses).",
        Rule(lambda key, value: check_agent_weights(value, key), "no-such-weights"),
    )
    peer_trust: bool = setting(
        False,
        "Scale the probability of following a peer by the trust in ``P_N``'s draw, "
        "``p_t' = 1 - (1 - p_t)·g`` (:func:`~fbo_torch.protocol.fidelity.peer_trust`; FTS only).",
        Flag(),
    )
    rgpe_samples: int = setting(256, "Posterior samples for RGPE's ranking weights.", Integer(minimum=1))
    taf_bandwidth: float = setting(0.5, "TAF's kernel bandwidth ``ρ``.", Number())
    prior_strength: float = setting(
        2.0,
        "``peer_prior``'s ``β``: the own acquisition plus ``β/t`` times the log of a prior over the "
        "optimizer's location (:mod:`~fbo_torch.acquisition.peer_prior`).",
        Number(),
    )
    prior_width: float = setting(
        0.1, "``peer_prior``'s ``s``: the width (unit-cube units) of the bump at each peer's optimum.", Number()
    )
    prior_floor: float = setting(
        0.05, "``peer_prior``'s ``λ``: the floor of its prior.", Probability(open_left=True, open_right=True)
    )
    message_memory: int = setting(
        10,
        "``peer_prior``: each peer's messages are averaged over this many rounds before its believed optimum "
        "is taken (:class:`~fbo_torch.protocol.message_average.MessageAverage`).",
        Integer(minimum=1),
    )
    channels: list[str] = setting(
        None,
        "``transfer``: what peers share and an agent may follow (:mod:`~fbo_torch.methods.transfer`): "
        "``optima`` (their incumbents), ``function`` (FTS's messages), ``landscape`` (their GPs' "
        "lengthscales, a prior of the agent's own fit). The agent's own proposals — ``own_acquisition`` "
        "and, unless that is ``ucb``, UCB with ``ucb_beta`` — are arms of its bandit besides them.",
        Rule(_channels, "optima"),
        factory=lambda: ["optima", "function", "landscape"],
    )
    landscape_scale: float = setting(
        0.5,
        "``transfer``: the smallest scale (log units) of the lengthscale prior learned from the peers; "
        "their spread adds to it.",
        Number(),
    )
    reciprocity_signal: str = setting(
        "improvements",
        "What ``reciprocity: true`` rests on: ``improvements`` (the report's binomial test on how often following "
        "an agent's messages improved its followers) or ``scores`` (each round, an agent may follow a peer with "
        "probability ``min(1, u / median u)``, ``u`` its message's mean helpful posterior as its receivers score "
        "it on their own observations; :func:`~fbo_torch.protocol.reciprocity.reciprocal_share`) or ``ranks`` (the "
        "receivers' scores as ranks among their peers, averaged over the rounds so far: an agent rated in the "
        "bottom :data:`~fbo_torch.protocol.reciprocity.RATING_THRESHOLD` with confidence follows no peer; "
        ":func:`~fbo_torch.protocol.reciprocity.flag_low_rated`).",
        Choice(RECIPROCITY_SIGNALS),
    )
    reciprocity_replays: bool = setting(
        False,
        "With ``reciprocity: true`` and every-round messages, an agent whose latest message repeats, bit for bit, "
        "one that it or any other agent sent the round before follows no peer that round, whatever the signal "
        "says: an honest agent's posterior draw is fresh every round, so a replay (a ``stale``, ``constant`` or "
        "``copied`` free-rider) is proof, not evidence.",
        Flag(),
    )
    fairness: float = setting(
        0.0,
        "``λ ≥ 0``: agents whose incumbents rank behind their federation's follow peers more, leaders less, and "
        "the peer followed is drawn towards the leaders (:mod:`~fbo_torch.protocol.fairness`; ``0``: FTS as in "
        "the paper; ``algorithm: fts``, ``history.mode: together``).",
        Number(strict=False),
    )
    free_riders: dict[str, Any] | None = setting(
        None,
        "Free-riders for incentive studies, ``{agents: [...], kind: constant|noise|stale|copied, report: "
        "honest|collude}``: these agents send that in place of their draw, and with ``report: collude`` tell "
        "reciprocity that their fellow riders are the most useful peers and the honest agents the least "
        "(:mod:`~fbo_torch.federation.free_riders`; methods whose peers send draws).",
        Rule(lambda key, value: FreeRiders.from_config(value, key), {"agents": [], "kind": "noise"}),
    )

    KIND: ClassVar[str | None] = "fts"

    def __post_init__(self) -> None:
        if isinstance(self.channels, (list, tuple)):
            self.channels = list(self.channels)
        super().__post_init__()
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
    ``N_init = 10``, ``M = 50``, ``1 - p_t = 1/√t`` for all t, so ``p_1 = 0``;
    :data:`KIND_DEFAULTS`).
    """

    algorithm: str = setting(
        "fts_de",
        "``fts_de`` (FTS, FTS-DE, DP-FTS and DP-FTS-DE), ``ts`` (standard TS), or a registered algorithm of "
        "``experiment: dp_fts_de``.",
        _algorithm("dp_fts_de"),
    )
    num_regions: int = setting(1, "``P`` sub-regions.", Integer(minimum=1))
    distributed_init: bool = setting(True, "Initial points inside each agent's assigned region.", Flag())
    weights: str = setting(
        "adaptive",
        "``adaptive``, ``fixed`` or ``uniform`` (:class:`~fbo_torch.protocol.weights.ExplorationWeights`).",
        Choice(ExplorationWeights.MODES),
    )
    weight_a: float = setting(16.0, "``a`` of the weight schedule (at least ``weight_b``).", Number(minimum=None))
    weight_b: float = setting(1.0, "``b`` of the weight schedule.", Number())
    const_rounds: int = setting(5, "Rounds the weights stay constant.", Integer(minimum=0))
    decay_rounds: int = setting(5, "Rounds over which the weights then decay.", Integer(minimum=0))
    sample_rate: float = setting(
        1.0,
        "``q``, the probability an agent's message is sampled in a round.",
        Rule(lambda key, value: check_sample_rate(value, key), 1.5),
    )
    noise_multiplier: float = setting(
        0.0,
        "``z``, the noise std over the clipping norm (0: not private).",
        Rule(lambda key, value: check_noise_multiplier(value, key), -1.0),
    )
    clip_norm: float | None = setting(
        None,
        "``S``, the clipping norm of each agent's vector (None: no clipping, only with ``z = 0``).",
        Optional(Number(finite=False, what="a number > 0 (S), or null for no clipping")),
    )
    local_threshold: float = setting(0.0, "Stop using the server once ``1 - p_t`` falls below it.", Probability())
    max_epsilon: float | None = setting(
        None,
        "Stop releasing before ε would exceed this (needs ``z > 0``; None: no budget).",
        Optional(Number(what="a finite number > 0, or null for no budget")),
    )
    broadcast_maximization: str = setting(
        "shared",
        "``shared`` (the broadcast is the same for every agent of a federation, so it is maximized once per "
        "federation) or ``per_agent`` (every agent maximizes it with its own random restarts, as the "
        "authors' code does).",
        Choice(("shared", "per_agent")),
    )
    aggregation: str = setting(
        "central",
        "The release mechanism by its registered name (:mod:`fbo_torch.federation.release`): ``central`` "
        "(the papers': the server sees every ``ω`` and adds the noise) or ``secure`` (secure aggregation with "
        "distributed discrete Gaussian noise; :mod:`fbo_torch.federation.secure`).",
        Rule(lambda key, value: get_release(value), "no-such-release"),
    )
    dropout_tolerance: float = setting(
        0.0,
        "``secure``: the fraction ``f`` of agents whose vectors may be missing from a round's sum while it "
        "still releases (``min_survivors = N − ⌊fN⌋``).",
        Probability(open_right=True),
    )
    lattice_scale: int | None = setting(
        None,
        "``secure``: integer lattice units per ``S`` (None: the finest the exact noise sampler allows).",
        Optional(Integer(minimum=1)),
    )

    KIND: ClassVar[str | None] = "dp_fts_de"

    def __post_init__(self) -> None:
        super().__post_init__()
        z = self.noise_multiplier
        if z > 0 and self.clip_norm is None:
            raise ValueError("`clip_norm` is required when `noise_multiplier` > 0.")
        if z > 0 and self.clip_norm is not None and self.clip_norm == float("inf"):
            raise ValueError(
                "`clip_norm` must be finite when `noise_multiplier` > 0 (the noise std is "
                f"noise_multiplier × clip_norm), got {self.clip_norm!r}."
            )
        if self.weight_a < self.weight_b:
            raise ValueError(
                f"`weight_a` must be a finite number >= `weight_b` ({self.weight_b}), got {self.weight_a!r}."
            )
        get_release(self.aggregation).check_settings(self)

    @property
    def is_private(self) -> bool:
        """Whether these settings release differentially private messages (the algorithm's say)."""
        return self.method.is_private(self)


@dataclass
class HistorySettings:
    r"""How the other agents got their observations before FTS (an FTS experiment's ``history:``)."""

    mode: str = setting(
        "random",
        "``random`` (``t_n`` random noisy observations per agent), ``ts`` (``t_n`` iterations of standard TS "
        "from ``num_init`` random points), or ``together``: no history, every agent is a target and the "
        "agents of one initialization are each other's peers, each sending a fresh message every round.",
        Choice(HISTORIES),
    )
    t_n: int = setting(40, "Observations per agent.", Integer(minimum=1))
    num_init: int = setting(3, "Random points before TS (``ts`` mode).", Integer(minimum=1))
    gp_kernel: str | None = setting(
        None,
        "The other agents' GP in ``ts`` mode; None: the scenario setup's (``botorch`` for ``modern``, "
        "``authors`` for ``authors``, whose other refit choices the history follows too).",
        Optional(Choice(lambda: sorted(GP_SPECS))),
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class PrivacySettings:
    r"""How a DP-FTS-DE federation accounts its releases (YAML ``privacy:``)."""

    accountant: str = setting(
        DEFAULT_ACCOUNTANT,
        "The ledger's accountant, a name in :data:`~fbo_torch.privacy.ACCOUNTANTS`.",
        Choice(list(ACCOUNTANTS)),
    )
    delta: float | None = setting(
        None,
        "``δ`` of the reported ``(ε, δ)``; None: the context's default, the papers' ``1/N^1.1`` in experiments, "
        "``min(1e-5, 0.01/N)`` in a deployment (:func:`~fbo_torch.privacy.deployment_delta`).",
        Optional(Rule(lambda key, value: check_delta(value, key), 1.5)),
    )
    max_epsilon: float | None = setting(
        None,
        "The default budget of every private method that sets none (None: no budget).",
        Optional(Number(what="a finite number > 0, or null for no budget")),
    )
    extra_accountants: list[str] = setting(
        None, "Accountants whose ε is reported besides the ledger's.", Rule(_accountants, ["moments"]), factory=list
    )

    def __post_init__(self) -> None:
        check_fields(self)
        self.extra_accountants = list(self.extra_accountants)


#: The settings classes whose fields :func:`~fbo_torch.utils.schema.setting` declares.
SETTINGS_CLASSES = (MethodSettings, FTSSettings, DPFTSDESettings, HistorySettings, PrivacySettings)

for _cls in SETTINGS_CLASSES:
    document(_cls)
