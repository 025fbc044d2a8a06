r"""FTS as an Ax generation node: ``FTSGenerationNode`` and the Sobol + FTS strategy.

Requires the ``ax`` extra (``pip install 'fbo_torch[ax]'``, Python >= 3.11).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from fbo_torch.integrations._ax_extra import ax_missing

try:
    from ax.adapter.registry import Generators
    from ax.core.arm import Arm
    from ax.core.data import Data
    from ax.core.experiment import Experiment
    from ax.core.experiment_status import ExperimentStatus
    from ax.core.trial_status import TrialStatus
    from ax.core.types import TParameterization
    from ax.generation_strategy.external_generation_node import ExternalGenerationNode
    from ax.generation_strategy.generation_node import GenerationNode
    from ax.generation_strategy.generation_strategy import GenerationStrategy
    from ax.generation_strategy.generator_spec import GeneratorSpec
    from ax.generation_strategy.transition_criterion import MaxTrialsAwaitingData, MinTrials
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ax_missing(__name__) from err

from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.model import Model
from botorch.models.transforms.outcome import Standardize
from botorch.optim.optimize import optimize_acqf
from gpytorch.mlls import ExactMarginalLogLikelihood

from fbo_torch.acquisition.fts import FederatedThompsonSampling
from fbo_torch.features import RandomFourierFeatures
from fbo_torch.integrations.ax_messages import agent_message, objective_data
from fbo_torch.integrations.ax_unit_cube import UnitCube, _check_features
from fbo_torch.protocol.messages import AgentMessage
from fbo_torch.protocol.schedules import PtSchedule
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.validation import check_int, check_positive

__all__ = ["FTS_NODE", "FTSGenerationNode", "FTSStep", "ModelFactory", "fts_generation_strategy"]

#: Name of the FTS node in the generation strategies built here.
FTS_NODE = "FTS"

#: A model of the agent's own objective from unit-cube inputs ``n x d`` and
#: outcomes ``n x 1`` (to maximize): single-output, unbatched, fitted.
ModelFactory = Callable[[Tensor, Tensor], Model]


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
    ``history`` and, in one-shot mode, drops the message it used. A
    maximizer that repeats an arm of the experiment (a Thompson sample often
    peaks on the boundary) is replaced by a uniform random point, the rule of
    the FTS authors' code (``repeated_query: random`` in the simulator); Ax's
    own deduplication would redraw up to five times and then fall back to Sobol.

    Args:
        features: The shared :class:`~fbo_torch.features.RandomFourierFeatures`.
        agent_id: This agent's index (its messages carry it; it ignores its own).
        p_t: A :class:`~fbo_torch.protocol.schedules.PtSchedule` spec:
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
        if isinstance(source, int):  # else "own"
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

    Returns:
        An Ax ``GenerationStrategy``: the Sobol node, then ``node``.
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
