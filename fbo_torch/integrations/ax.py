r"""Federated Thompson sampling (FTS) as the generation step of Ax experiments.

Each agent is an ordinary Ax experiment, driven through Ax's ``Client``
(``ax.api.client.Client``, Ax >= 1.3). Its generation strategy is a few Sobol
trials, then :class:`FTSGenerationNode`, an Ax ``ExternalGenerationNode``
that makes FTS Algorithm 1's choice for every trial: with probability ``p_t``
the trial maximizes a Thompson sample of the agent's own GP, otherwise it
maximizes ``φ(x)ᵀω_n`` of a message ``ω_n`` drawn from ``P_N`` among the
messages the agent holds. The choice and the acquisition are fbo_torch's
:class:`~fbo_torch.acquisition.FederatedThompsonSampling` (which draws through
:func:`~fbo_torch.federation.schedules.draw_sources` and
:class:`~fbo_torch.federation.schedules.AgentDistribution`), maximized with
BoTorch's ``optimize_acqf``.

An agent's message is an :class:`~fbo_torch.federation.AgentMessage`: one draw
``ω ~ N(ν, σ²Σ⁻¹)`` of the :class:`~fbo_torch.models.RFFBayesianLinear`
posterior on the data of its experiment, on the shared
:class:`~fbo_torch.features.RandomFourierFeatures`:

* inputs: the search space mapped to a unit cube (:class:`UnitCube`), so agents
  whose search spaces have different bounds still share one map and the map's
  lengthscale is a fraction of each parameter's range: a float range parameter
  by its bounds (log-scaled ones by their logarithm); an integer range
  parameter and an ordered choice relaxed to a continuous coordinate, each
  value owning an equal cell, and rounded back; an unordered choice one-hot
  (one coordinate per value, the largest wins), as BoTorch's ``Round`` and
  one-hot input transforms relax them;
* outputs: the objective as Ax defines it, an expression to **maximize**:
  ``"-loss"`` gives ``y = -loss`` (a scalarized objective ``"2*a - b"`` gives
  ``2a - b``), standardized per agent. ``φ(x)ᵀω`` is therefore always a
  function to maximize, whether the sender minimizes or maximizes.

:class:`AxFederation` holds the agents: :meth:`AxFederation.add_agent` gives an
Ax ``Client`` (or an ``Experiment``) its Sobol + FTS generation strategy, and
:meth:`AxFederation.exchange` has every agent with data send a fresh message
to every other agent. Each agent keeps the latest message of every sender; in
one-shot mode (the default, as in the FTS paper) a message that generated a
trial is dropped, so it is used for at most one trial, and once an agent holds
no message its trials come from its own GP. The user never reads the
acquisition's ``source``.

Float and integer range parameters (linear or log scale), ordered and
unordered choice parameters and fixed parameters (passed through) are
supported; logit-scaled and derived parameters, parameter constraints,
multi-objective and outcome-constrained optimization configs are refused with
a ``ValueError``. Pending trials are not modelled: every trial is an
independent Thompson draw, as in parallel Thompson sampling. A generation
strategy holding :class:`FTSGenerationNode` cannot be saved by Ax's JSON or
SQL storage.

Requires the ``ax`` extra (``pip install 'fbo_torch[ax]'``, Python >= 3.11).

Example:
    >>> import math
    >>> from ax.api.client import Client
    >>> from ax.api.configs import ChoiceParameterConfig, RangeParameterConfig
    >>> from fbo_torch import RandomFourierFeatures
    >>> from fbo_torch.integrations.ax import AxFederation
    >>> def branin(p):  # Branin at (x1, x2), plus a penalty for two of the three variants
    ...     x1, x2 = p["x1"], p["x2"]
    ...     b = (x2 - 5.1 / (4 * math.pi**2) * x1**2 + 5 / math.pi * x1 - 6) ** 2
    ...     b += 10 * (1 - 1 / (8 * math.pi)) * math.cos(x1)
    ...     return b + 10 + {"a": 0.0, "b": 1.0, "c": 3.0}[p["variant"]]
    >>> federation = AxFederation(RandomFourierFeatures(dim=5, num_features=200, lengthscale=0.2, seed=0))
    >>> clients = []
    >>> for n in range(3):
    ...     client = Client(random_seed=n)
    ...     client.configure_experiment(parameters=[
    ...         RangeParameterConfig(name="x1", parameter_type="float", bounds=(-5.0, 10.0)),
    ...         RangeParameterConfig(name="x2", parameter_type="int", bounds=(0, 15)),
    ...         ChoiceParameterConfig(name="variant", parameter_type="str", values=["a", "b", "c"], is_ordered=False)])
    ...     client.configure_optimization(objective="-branin")   # minimize branin
    ...     federation.add_agent(client, num_initial_trials=5)   # 5 coordinates: x1, x2, variant one-hot
    ...     clients.append(client)
    >>> for round in range(10):
    ...     federation.exchange()       # agents with data send fresh messages to the others
    ...     for client in clients:
    ...         for index, params in client.get_next_trials(max_trials=1).items():
    ...             client.complete_trial(index, raw_data={"branin": branin(params)})
    >>> federation.agents[0].history    # which trials used which agent's message
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

try:
    from ax.adapter.registry import Generators
    from ax.api.client import Client
    from ax.core.arm import Arm
    from ax.core.data import Data
    from ax.core.experiment import Experiment
    from ax.core.experiment_status import ExperimentStatus
    from ax.core.parameter import ChoiceParameter, FixedParameter, ParameterType, RangeParameter
    from ax.core.search_space import SearchSpace
    from ax.core.trial_status import TrialStatus
    from ax.core.types import TParameterization
    from ax.generation_strategy.external_generation_node import ExternalGenerationNode
    from ax.generation_strategy.generation_node import GenerationNode
    from ax.generation_strategy.generation_strategy import GenerationStrategy
    from ax.generation_strategy.generator_spec import GeneratorSpec
    from ax.generation_strategy.transition_criterion import MaxTrialsAwaitingData, MinTrials
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "fbo_torch.integrations.ax needs Ax (ax-platform >= 1.3.1, Python >= 3.11): "
        "install the extra with `pip install 'fbo_torch[ax]'`."
    ) from err

from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.model import Model
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf
from gpytorch.mlls import ExactMarginalLogLikelihood

from fbo_torch.acquisition.fts import FederatedThompsonSampling
from fbo_torch.features import RandomFourierFeatures
from fbo_torch.federation.messages import AgentMessage
from fbo_torch.federation.schedules import PtSchedule
from fbo_torch.models.rff_blr import RFFBayesianLinear
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.validation import check_int, check_positive

__all__ = [
    "AxFederation",
    "FTSGenerationNode",
    "FTSStep",
    "UnitCube",
    "agent_message",
    "fts_generation_strategy",
    "objective_data",
    "objective_weights",
]

#: Name of the FTS node in the generation strategies built here.
FTS_NODE = "FTS"

#: A model of the agent's own objective from unit-cube inputs ``n x d`` and
#: outcomes ``n x 1`` (to maximize): single-output, unbatched, fitted.
ModelFactory = Callable[[Tensor, Tensor], Model]


# --------------------------------------------------------------------------- search space
@dataclass(frozen=True)
class UnitCube:
    r"""The map between an Ax search space and ``[0, 1]^d``.

    Each parameter takes coordinates, in the search space's order:

    * a float range parameter, one: ``u = (x - lower) / (upper - lower)``, or
      the same on ``log x`` for a log-scaled one;
    * an integer range parameter, one: the integers ``lower..upper`` widened to
      ``[lower - 0.5, upper + 0.5]`` (its logarithm for a log-scaled one), so
      each value owns an equal cell; a point maps back to the nearest integer
      (as :class:`~fbo_torch.objectives.search_space.Integer` does);
    * an ordered choice of ``k`` values, one: the index ``0..k-1`` relaxed
      the same way;
    * an unordered choice of ``k`` values, ``k``: one-hot; a point maps back
      to the value of its largest coordinate.

    The models and messages see the relaxed continuous cube; a candidate is
    rounded to a valid parameterization only when it becomes a trial, as
    BoTorch's ``Round`` and one-hot input transforms relax mixed spaces. Fixed
    parameters take no coordinate and are passed through unchanged.

    Attributes:
        names: The ``d`` coordinates' names: a parameter's name, or
            ``"name=value"`` for a one-hot coordinate.
        parameters: The Ax parameters that take coordinates.
        fixed: Values of the fixed parameters.
    """

    names: tuple[str, ...]
    parameters: tuple[RangeParameter | ChoiceParameter, ...]
    fixed: Mapping[str, Any]

    @classmethod
    def from_search_space(cls, search_space: SearchSpace) -> UnitCube:
        r"""Check that ``search_space`` is supported and build its map.

        Raises:
            ValueError: A logit-scaled or derived parameter, parameter
                constraints, a hierarchical search space, or nothing to optimize.
        """
        if search_space.parameter_constraints:
            raise ValueError(
                "The search space has parameter constraints "
                f"({', '.join(str(c) for c in search_space.parameter_constraints)}); "
                "FTS on Ax supports box-bounded parameters only."
            )
        if search_space.is_hierarchical:
            raise ValueError("The search space is hierarchical; FTS on Ax supports flat search spaces only.")
        names, params, fixed = [], [], {}
        for name, p in search_space.parameters.items():
            if isinstance(p, FixedParameter):
                fixed[name] = p.value
            elif (
                isinstance(p, RangeParameter)
                and not p.logit_scale
                and p.parameter_type in (ParameterType.FLOAT, ParameterType.INT)
            ):
                names.append(name)
                params.append(p)
            elif isinstance(p, ChoiceParameter):  # (hierarchical ones are refused above)
                names.extend([name] if p.is_ordered else [f"{name}={v}" for v in p.values])
                params.append(p)
            else:
                kind = type(p).__name__
                if isinstance(p, RangeParameter):
                    kind = "logit-scaled" if p.logit_scale else f"{p.parameter_type.name.lower()} range parameter"
                raise ValueError(
                    f"Parameter {name!r} ({kind}) is not supported: FTS on Ax supports float and integer range "
                    "parameters (linear or log scaling), ordered and unordered choice parameters, and fixed parameters."
                )
        if not names:
            raise ValueError("The search space has no parameter to optimize.")
        return cls(tuple(names), tuple(params), dict(fixed))

    @property
    def dim(self) -> int:
        """``d``, the number of coordinates (a one-hot choice of ``k`` values takes ``k``)."""
        return len(self.names)

    def _span(self, p: RangeParameter | ChoiceParameter) -> tuple[float, float]:
        """The interval a relaxed parameter's coordinate maps onto (log scale for a log-scaled range)."""
        if isinstance(p, ChoiceParameter):
            return -0.5, len(p.values) - 0.5
        lo, hi = float(p.lower), float(p.upper)
        if p.parameter_type == ParameterType.INT:
            lo, hi = lo - 0.5, hi + 0.5
        return (math.log(lo), math.log(hi)) if p.log_scale else (lo, hi)

    def _coordinates(self, p: RangeParameter | ChoiceParameter, value: Any) -> list[float]:
        if isinstance(p, ChoiceParameter):
            if value not in p.values:
                raise ValueError(f"Parameter {p.name!r} has value {value!r}, not one of its choices {p.values}.")
            index = p.values.index(value)
            if not p.is_ordered:
                return [1.0 if i == index else 0.0 for i in range(len(p.values))]
            value = index
        x = float(value)
        if isinstance(p, RangeParameter) and p.log_scale:
            x = math.log(max(x, torch.finfo(torch.float64).tiny))
        a, b = self._span(p)
        return [(x - a) / (b - a)]

    def to_unit(self, parameterizations: Sequence[Mapping[str, Any]]) -> Tensor:
        r"""``n x d`` float64 unit-cube coordinates of ``n`` parameterizations."""
        rows = []
        for params in parameterizations:
            try:
                rows.append([u for p in self.parameters for u in self._coordinates(p, params[p.name])])
            except KeyError as err:
                raise ValueError(f"A parameterization lacks parameter {err.args[0]!r}: {dict(params)}.") from None
        return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), self.dim)

    def from_unit(self, u: Tensor) -> TParameterization:
        r"""The parameterization at unit-cube point ``u`` (``d``): clamped into the bounds, integers and
        ordered choices rounded to the nearest value, a one-hot choice the value of its largest coordinate."""
        if u.shape != (self.dim,):
            raise ValueError(
                f"`u` must be a point of the {self.dim}-dimensional unit cube, got shape {tuple(u.shape)}."
            )
        coords = u.detach().to(dtype=torch.float64, device="cpu").clamp(0.0, 1.0).tolist()
        out: dict[str, Any] = {}
        i = 0
        for p in self.parameters:
            if isinstance(p, ChoiceParameter) and not p.is_ordered:
                k = len(p.values)
                block = coords[i : i + k]
                out[p.name] = p.values[max(range(k), key=block.__getitem__)]
                i += k
                continue
            a, b = self._span(p)
            z = a + coords[i] * (b - a)
            i += 1
            if isinstance(p, ChoiceParameter):
                out[p.name] = p.values[min(max(math.floor(z + 0.5), 0), len(p.values) - 1)]
                continue
            v = math.exp(z) if p.log_scale else z
            if p.parameter_type == ParameterType.INT:
                v = math.floor(v + 0.5)
            out[p.name] = p.cast(min(max(v, p.lower), p.upper))
        out.update(self.fixed)
        return out


def _check_features(features: object, cube: UnitCube | None = None) -> RandomFourierFeatures:
    if not isinstance(features, RandomFourierFeatures):
        raise TypeError(f"`features` must be a fbo_torch RandomFourierFeatures, got {type(features).__name__}.")
    if cube is not None and features.dim != cube.dim:
        raise ValueError(
            f"`features` maps {features.dim}-dimensional inputs but the experiment's search space has {cube.dim} "
            f"coordinates {list(cube.names)}; build the shared RandomFourierFeatures with dim={cube.dim}."
        )
    return features


# --------------------------------------------------------------------------- data
def objective_weights(experiment: Experiment) -> dict[str, float]:
    r"""``{metric signature: weight}`` of the expression Ax maximizes (``"-loss"``: ``{"loss": -1}``).

    Raises:
        ValueError: No optimization config, a multi-objective one, or one with
            outcome constraints.
    """
    config = experiment.optimization_config
    if config is None:
        raise ValueError("The experiment has no objective: call Client.configure_optimization(objective=...) first.")
    objective = config.objective
    if objective.is_multi_objective:
        raise ValueError(f"FTS on Ax needs a single objective, got the multi-objective {objective.expression!r}.")
    if config.all_constraints:
        raise ValueError(
            "FTS on Ax does not handle outcome constraints; remove "
            f"{[str(c) for c in config.all_constraints]} from the optimization config."
        )
    return {sig: float(w) for sig, w in objective.metric_weights}


def objective_data(
    experiment: Experiment, data: Data | None = None, cube: UnitCube | None = None
) -> tuple[Tensor, Tensor]:
    r"""The experiment's observations as ``(X, Y)`` on the unit cube, ``Y`` to maximize.

    ``Y`` is Ax's objective expression evaluated on each arm's latest data:
    ``"acc"`` gives ``acc``, ``"-loss"`` gives ``-loss``, ``"2*a - b"`` gives
    ``2a - b`` (the expression Ax maximizes). Arms missing an objective metric
    are left out; repeated observations of an arm in one trial are averaged.

    Args:
        experiment: An Ax ``Experiment`` with a single (or scalarized) objective.
        data: Its data (``experiment.lookup_data()`` if ``None``).
        cube: Its :class:`UnitCube` (built from the search space if ``None``).

    Returns:
        ``X``: ``n x d`` float64 unit-cube inputs; ``Y``: ``n x 1`` float64.

    Raises:
        ValueError: An unsupported objective (see :func:`objective_weights`).
    """
    cube = cube if cube is not None else UnitCube.from_search_space(experiment.search_space)
    weights = objective_weights(experiment)
    df = (data if data is not None else experiment.lookup_data()).df
    df = df[df["metric_signature"].isin(list(weights))]
    if len(df) == 0:
        return torch.empty(0, cube.dim, dtype=torch.float64), torch.empty(0, 1, dtype=torch.float64)
    table = df.pivot_table(index=["trial_index", "arm_name"], columns="metric_signature", values="mean")
    if set(table.columns) != set(weights):
        table = table.iloc[0:0]
    table = table.dropna()
    y = sum(float(w) * table[sig].to_numpy(dtype="float64") for sig, w in weights.items())
    arms = experiment.arms_by_name
    X = cube.to_unit([arms[arm].parameters for _, arm in table.index])
    Y = torch.as_tensor(y, dtype=torch.float64).reshape(-1, 1)
    return X, Y


def agent_message(
    experiment: Experiment,
    features: RandomFourierFeatures,
    agent_id: int,
    noise_variance: float = 1e-2,
    generator: torch.Generator | None = None,
    data: Data | None = None,
) -> AgentMessage:
    r"""An agent's FTS message: ``ω ~ N(ν, σ²Σ⁻¹)`` from its experiment's data.

    The :class:`~fbo_torch.models.RFFBayesianLinear` posterior on
    ``(φ(X), standardize(Y))`` with ``X, Y`` from :func:`objective_data`, so
    ``φ(x)ᵀω`` is a Thompson sample of the agent's objective to maximize.

    Args:
        experiment: The agent's Ax experiment (with at least one observation).
        features: The shared map (``dim`` = the :class:`UnitCube`'s number of coordinates).
        agent_id: The sender's index, carried by the message.
        noise_variance: ``σ²`` on the standardized outputs.
        generator: Optional ``torch.Generator`` for the draw.
        data: The experiment's data (``experiment.lookup_data()`` if ``None``).

    Raises:
        ValueError: An unsupported experiment (see :class:`UnitCube`,
            :func:`objective_data`), a map of the wrong dimension, or no observation.
    """
    check_positive("noise_variance", noise_variance)
    cube = UnitCube.from_search_space(experiment.search_space)
    features = _check_features(features, cube)
    X, Y = objective_data(experiment, data, cube)
    if X.shape[0] == 0:
        raise ValueError(
            f"Agent {agent_id}'s experiment has no observation of its objective yet: it has nothing to send."
        )
    like = features.spectral
    model = RFFBayesianLinear(features, X.to(like), Y.to(like), noise_variance, outcome_transform=Standardize(m=1))
    omega = model.sample_weights(generator=generator)
    return AgentMessage(
        omega=omega, agent_id=int(agent_id), num_observations=X.shape[0], fingerprint=features.fingerprint
    )


def _fit_single_task_gp(train_X: Tensor, train_Y: Tensor) -> Model:
    """BoTorch's ``SingleTaskGP`` with standardized outcomes, fitted by maximum marginal likelihood."""
    model = SingleTaskGP(train_X, train_Y, outcome_transform=Standardize(m=1))
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    return model


# --------------------------------------------------------------------------- the node
@dataclass(frozen=True)
class FTSStep:
    r"""One FTS candidate of an agent.

    Attributes:
        t: The FTS iteration (1 for the first FTS candidate of the agent).
        p_t: Probability the candidate used the agent's own GP.
        source: ``"own"``, or the ``agent_id`` of the message it maximized.
        num_messages: Messages the agent held when it drew.
        repeated: The maximizer repeated an arm of the experiment (or a pending
            one) and was replaced by a uniform random point.
    """

    t: int
    p_t: float
    source: str | int
    num_messages: int
    repeated: bool = False


class FTSGenerationNode(ExternalGenerationNode):
    r"""Ax generation node: one FTS iteration (Algorithm 1) per candidate.

    :meth:`update_generator_state` fits the agent's own GP on the experiment's
    data (unit-cube inputs, objective to maximize); each
    :meth:`get_next_candidate` builds a
    :class:`~fbo_torch.acquisition.FederatedThompsonSampling` from that GP and
    the messages held (``p_t`` from the schedule at the agent's FTS iteration
    ``t``; ``P_N`` uniform over the held messages), maximizes it over the unit
    cube with BoTorch's ``optimize_acqf``, records the source in
    :attr:`history` and, in one-shot mode, drops the message it used. A
    maximizer that repeats an arm of the experiment (a Thompson sample often
    peaks on the boundary) is replaced by a uniform random point, the rule of
    the FTS authors' code (``repeated_query: random`` in the simulator); Ax's
    own deduplication would redraw up to five times and then fall back to Sobol.

    Args:
        features: The shared :class:`~fbo_torch.features.RandomFourierFeatures`.
        agent_id: This agent's index (its messages carry it; it ignores its own).
        p_t: A :class:`~fbo_torch.federation.schedules.PtSchedule` spec:
            ``"1-1/sqrt(t)"`` (default), ``"1-1/t^2"``, ``"1-1/t"``, a constant
            in ``[0, 1]`` or a callable ``t -> p_t``.
        one_shot: Use each received message for at most one candidate.
        noise_variance: ``σ²`` of this agent's messages (standardized outputs).
        seed: Seed of the agent's draws (FTS choices, GP samples, messages).
        model_factory: ``(train_X n x d, train_Y n x 1) -> fitted Model`` for
            the own GP; BoTorch's ``SingleTaskGP`` with ``Standardize`` by default.
        num_restarts / raw_samples: ``optimize_acqf`` options.
        name: The node's name in the generation strategy.

    Attributes:
        history: The :class:`FTSStep` of every candidate generated so far.
    """

    def __init__(
        self,
        features: RandomFourierFeatures,
        agent_id: int = 0,
        p_t: PtSchedule | str | float | Callable[[int], float] = "1-1/sqrt(t)",
        one_shot: bool = True,
        noise_variance: float = 1e-2,
        seed: int = 0,
        model_factory: ModelFactory | None = None,
        num_restarts: int = 10,
        raw_samples: int = 512,
        name: str = FTS_NODE,
    ) -> None:
        super().__init__(name=name, suggested_experiment_status=ExperimentStatus.OPTIMIZATION)
        self.features = _check_features(features)
        self.agent_id = check_int("agent_id", agent_id, minimum=0)
        self.p_t = p_t if isinstance(p_t, PtSchedule) else PtSchedule(p_t)
        if not isinstance(one_shot, bool):
            raise TypeError(f"`one_shot` must be a bool, got {type(one_shot).__name__}.")
        self.one_shot = one_shot
        check_positive("noise_variance", noise_variance)
        self.noise_variance = float(noise_variance)
        self.seed = check_int("seed", seed)
        self.model_factory = model_factory if model_factory is not None else _fit_single_task_gp
        self.num_restarts = check_int("num_restarts", num_restarts, minimum=1)
        self.raw_samples = check_int("raw_samples", raw_samples, minimum=1)
        self.history: list[FTSStep] = []
        self._inbox: dict[int, AgentMessage] = {}
        self._messages_sent = 0
        self._model: Model | None = None
        self._cube: UnitCube | None = None
        self._seen: set[str] = set()
        key = kr.root_key(self.seed, "ax-agent", self.agent_id)
        self._generator = torch.Generator().manual_seed(kr.fold(key, "fts"))

    # ------------------------------------------------------------ messages
    @property
    def inbox(self) -> list[AgentMessage]:
        r"""The messages this agent can still use, one per sender (ordered by sender)."""
        return [self._inbox[s] for s in sorted(self._inbox)]

    def receive(self, message: AgentMessage) -> None:
        r"""Keep ``message`` for later candidates, replacing the sender's previous one.

        Raises:
            ValueError: A message built on another feature map, or this agent's own.
        """
        if not isinstance(message, AgentMessage):
            raise TypeError(f"`message` must be an AgentMessage, got {type(message).__name__}.")
        if message.fingerprint != self.features.fingerprint:
            raise ValueError(
                f"The message from agent {message.agent_id} was built on a different random-feature map "
                f"(fingerprint {message.fingerprint} != {self.features.fingerprint}); every agent of a "
                "federation must use the same RandomFourierFeatures."
            )
        if message.agent_id == self.agent_id:
            raise ValueError(f"Agent {self.agent_id} cannot receive its own message.")
        self._inbox[message.agent_id] = message

    def num_observations(self) -> int:
        r"""Observations of the objective in the agent's experiment (what its message is built on)."""
        return objective_data(self.experiment)[0].shape[0]

    def message(self) -> AgentMessage:
        r"""This agent's next message, drawn from the current data of its experiment."""
        key = kr.fold(kr.root_key(self.seed, "ax-agent", self.agent_id), "message")
        generator = torch.Generator().manual_seed(kr.fold(key, self._messages_sent))
        msg = agent_message(self.experiment, self.features, self.agent_id, self.noise_variance, generator)
        self._messages_sent += 1
        return msg

    # --------------------------------------------------- ExternalGenerationNode
    def update_generator_state(self, experiment: Experiment, data: Data) -> None:
        r"""Fit the agent's own GP on the experiment's data."""
        cube = UnitCube.from_search_space(experiment.search_space)
        _check_features(self.features, cube)
        X, Y = objective_data(experiment, data, cube)
        if X.shape[0] == 0:
            raise ValueError(
                f"Agent {self.agent_id} has no observation of its objective: complete its initial trials "
                "with data before FTS trials are generated."
            )
        self._cube = cube
        self._model = self.model_factory(X, Y)
        self._seen = set(experiment.arms_by_signature_for_deduplication)

    def get_next_candidate(self, pending_parameters: list[TParameterization]) -> TParameterization:
        r"""One FTS draw and its maximizer, as Ax parameters."""
        if self._model is None or self._cube is None:
            raise RuntimeError("`update_generator_state` must run before `get_next_candidate`.")
        t = len(self.history) + 1
        p = self.p_t(t)
        senders = sorted(self._inbox)
        messages = [self._inbox[s] for s in senders]
        acqf = FederatedThompsonSampling(
            self._model, messages, self.features, p_t=p if messages else 1.0, generator=self._generator
        )
        bounds = torch.stack([torch.zeros(self._cube.dim), torch.ones(self._cube.dim)]).to(torch.float64)
        X, _ = optimize_acqf(acqf, bounds=bounds, q=1, num_restarts=self.num_restarts, raw_samples=self.raw_samples)
        source = acqf.source
        if source != "own":
            source = senders[source]
            if self.one_shot:
                del self._inbox[source]
        params = self._cube.from_unit(X.reshape(-1))
        pending = {Arm(parameters=q).signature for q in pending_parameters}
        repeated = Arm(parameters=params).signature in self._seen | pending
        if repeated:
            u = torch.rand(self._cube.dim, generator=self._generator, dtype=torch.float64)
            params = self._cube.from_unit(u)
        self._seen.add(Arm(parameters=params).signature)
        self.history.append(FTSStep(t=t, p_t=p, source=source, num_messages=len(messages), repeated=repeated))
        return params


def fts_generation_strategy(
    node: FTSGenerationNode, num_initial_trials: int = 5, seed: int | None = None
) -> GenerationStrategy:
    r"""Ax generation strategy: ``num_initial_trials`` Sobol trials, then ``node``.

    The Sobol node is built as Ax's own (``Client.configure_generation_strategy``):
    it generates at most ``num_initial_trials`` trials (failed and abandoned ones
    not counted) and hands over once that many are completed with data, since
    FTS needs observations for its own GP.

    Args:
        node: The agent's :class:`FTSGenerationNode`.
        num_initial_trials: Sobol trials before FTS (>= 1).
        seed: Seed of the Sobol sequence.
    """
    if not isinstance(node, FTSGenerationNode):
        raise TypeError(f"`node` must be an FTSGenerationNode, got {type(node).__name__}.")
    k = check_int("num_initial_trials", num_initial_trials, minimum=1)
    not_failed = [TrialStatus.FAILED, TrialStatus.ABANDONED]
    sobol = GenerationNode(
        name="Sobol",
        generator_specs=[GeneratorSpec(generator_enum=Generators.SOBOL, generator_kwargs={"seed": seed})],
        transition_criteria=[
            MinTrials(threshold=k, transition_to=node.name, use_all_trials_in_exp=True, not_in_statuses=not_failed),
            MinTrials(
                threshold=k,
                transition_to=node.name,
                use_all_trials_in_exp=True,
                only_in_statuses=[TrialStatus.COMPLETED],
                count_only_trials_with_data=True,
            ),
        ],
        pausing_criteria=[MaxTrialsAwaitingData(threshold=k, not_in_statuses=not_failed, use_all_trials_in_exp=True)],
        should_deduplicate=True,
        suggested_experiment_status=ExperimentStatus.INITIALIZATION,
    )
    return GenerationStrategy(nodes=[sobol, node], name=f"Sobol+{node.name}")


# --------------------------------------------------------------------------- the federation
class AxFederation:
    r"""Ax agents that exchange FTS messages.

    Args:
        features: The shared :class:`~fbo_torch.features.RandomFourierFeatures`
            (``dim`` = the number of coordinates of every agent's :class:`UnitCube`).
        p_t: Default ``p_t`` schedule of the agents (see :class:`FTSGenerationNode`).
        one_shot: Each received message is used for at most one trial (default).
        noise_variance: Default ``σ²`` of the agents' messages.
        seed: Base seed: agent ``n``'s draws use ``(seed, n)``.
        num_restarts / raw_samples: Default ``optimize_acqf`` options.

    Attributes:
        agents: The agents' :class:`FTSGenerationNode`, indexed by ``agent_id``.
    """

    def __init__(
        self,
        features: RandomFourierFeatures,
        p_t: str | float | Callable[[int], float] = "1-1/sqrt(t)",
        one_shot: bool = True,
        noise_variance: float = 1e-2,
        seed: int = 0,
        num_restarts: int = 10,
        raw_samples: int = 512,
    ) -> None:
        self.features = _check_features(features)
        self.seed = check_int("seed", seed)
        # validated by FTSGenerationNode; checked here so a bad default fails at once
        PtSchedule(p_t)
        check_positive("noise_variance", noise_variance)
        self._defaults = dict(
            p_t=p_t,
            one_shot=one_shot,
            noise_variance=noise_variance,
            num_restarts=num_restarts,
            raw_samples=raw_samples,
        )
        self.agents: list[FTSGenerationNode] = []

    def add_agent(
        self,
        client: Client | Experiment,
        num_initial_trials: int = 5,
        model_factory: ModelFactory | None = None,
        **options: Any,
    ) -> FTSGenerationNode:
        r"""Make ``client``'s experiment agent ``len(agents)`` of the federation.

        Gives it the generation strategy of :func:`fts_generation_strategy`:
        with a ``Client`` through ``Client.set_generation_strategy`` (call
        ``client.get_next_trials`` as usual); with an ``Experiment``, the
        strategy is ``node.generation_strategy`` (call its ``gen``).

        Args:
            client: An Ax ``Client`` whose experiment and objective are configured,
                or an Ax ``Experiment``.
            num_initial_trials: Sobol trials before FTS.
            model_factory: The agent's own GP (see :class:`FTSGenerationNode`).
            options: Overrides of the federation's defaults for this agent
                (``p_t``, ``one_shot``, ``noise_variance``, ``num_restarts``, ``raw_samples``).

        Returns:
            The agent's :class:`FTSGenerationNode`.

        Raises:
            ValueError: An unsupported search space or objective, a search
                space whose dimension differs from ``features.dim``, or a
                ``Client`` with no experiment (checked once the strategy is set:
                such a client cannot run FTS, start a new one).
        """
        unknown = set(options) - set(self._defaults)
        if unknown:
            raise TypeError(f"Unknown agent options {sorted(unknown)}; expected some of {sorted(self._defaults)}.")
        if not isinstance(client, (Client, Experiment)):
            raise TypeError(
                f"`client` must be an ax.api.client.Client or an ax Experiment, got {type(client).__name__}."
            )
        agent_id = len(self.agents)
        node = FTSGenerationNode(
            self.features,
            agent_id=agent_id,
            seed=self.seed,
            model_factory=model_factory,
            **{**self._defaults, **options},
        )
        strategy = fts_generation_strategy(
            node, num_initial_trials, seed=kr.root_key(self.seed, "sobol", agent_id) % 2**31
        )
        if isinstance(client, Client):
            try:
                client.set_generation_strategy(strategy)  # also sets strategy.experiment
            except AssertionError as err:  # Ax's none_throws: no experiment configured
                raise ValueError(
                    f"`client` has no experiment: call client.configure_experiment first ({err})."
                ) from None
        else:
            strategy.experiment = client
        cube = UnitCube.from_search_space(strategy.experiment.search_space)
        _check_features(self.features, cube)
        objective_weights(strategy.experiment)
        self.agents.append(node)
        return node

    def deliver(self, message: AgentMessage) -> None:
        r"""Give ``message`` to every agent but its sender (e.g. one received from another process)."""
        for node in self.agents:
            if node.agent_id != message.agent_id:
                node.receive(message)

    def exchange(self) -> list[AgentMessage]:
        r"""Every agent with observations draws a fresh message from its data and
        sends it to every other agent (replacing the sender's previous message).

        Returns:
            The messages sent, in agent order.
        """
        sent = [node.message() for node in self.agents if node.num_observations() > 0]
        for msg in sent:
            self.deliver(msg)
        return sent
