r"""Federated Thompson sampling (FTS) as the generation step of Ax experiments.

Each agent is an ordinary Ax experiment, driven through Ax's ``Client``
(``ax.api.client.Client``, Ax >= 1.3). Its generation strategy is a few Sobol
trials, then :class:`~fbo_torch.integrations.ax_node.FTSGenerationNode`, an Ax ``ExternalGenerationNode``
that makes FTS Algorithm 1's choice for every trial: with probability ``p_t``
the trial maximizes a Thompson sample of the agent's own GP, otherwise it
maximizes ``φ(x)ᵀω_n`` of a message ``ω_n`` drawn from ``P_N`` among the
messages the agent holds. The choice and the acquisition are fbo_torch's
:class:`~fbo_torch.acquisition.FederatedThompsonSampling` (which draws through
:func:`~fbo_torch.protocol.schedules.draw_sources` and
:class:`~fbo_torch.protocol.schedules.AgentDistribution`), maximized with
BoTorch's ``optimize_acqf``.

An agent's message is an :class:`~fbo_torch.protocol.AgentMessage`: one draw
``ω ~ N(ν, σ²Σ⁻¹)`` of the :class:`~fbo_torch.models.RFFBayesianLinear`
posterior on the data of its experiment, on the shared
:class:`~fbo_torch.features.RandomFourierFeatures`:

* inputs: the search space mapped to a unit cube (:class:`~fbo_torch.integrations.ax_unit_cube.UnitCube`), so agents
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
strategy holding :class:`~fbo_torch.integrations.ax_node.FTSGenerationNode` cannot be saved by Ax's JSON or
SQL storage.

Requires the ``ax`` extra (``pip install 'fbo_torch[ax]'``, Python >= 3.11).

Example:
    >>> import math
    >>> from ax.api.client import Client
    >>> from ax.api.configs import ChoiceParameterConfig, RangeParameterConfig
    >>> from fbo_torch.integrations.ax import AxFederation
    >>> def branin(p):  # Branin at (x1, x2), plus a penalty for two of the three variants
    ...     x1, x2 = p["x1"], p["x2"]
    ...     b = (x2 - 5.1 / (4 * math.pi**2) * x1**2 + 5 / math.pi * x1 - 6) ** 2
    ...     b += 10 * (1 - 1 / (8 * math.pi)) * math.cos(x1)
    ...     return b + 10 + {"a": 0.0, "b": 1.0, "c": 3.0}[p["variant"]]
    >>> # the map's dimension comes from the first search space: x1, x2 and variant's 3 one-hot coordinates
    >>> federation = AxFederation(num_features=200, lengthscale=0.2)
    >>> clients = []
    >>> for n in range(3):
    ...     client = Client(random_seed=n)
    ...     client.configure_experiment(parameters=[
    ...         RangeParameterConfig(name="x1", parameter_type="float", bounds=(-5.0, 10.0)),
    ...         RangeParameterConfig(name="x2", parameter_type="int", bounds=(0, 15)),
    ...         ChoiceParameterConfig(name="variant", parameter_type="str",
    ...                               values=["a", "b", "c"], is_ordered=False)])
    ...     client.configure_optimization(objective="-branin")   # minimize branin
    ...     federation.add_agent(client, num_initial_trials=5)
    ...     clients.append(client)
    >>> for round in range(10):
    ...     federation.exchange()   # agents with data send fresh messages to the others
    ...     for client in clients:
    ...         for index, params in client.get_next_trials(max_trials=1).items():
    ...             client.complete_trial(index, raw_data={"branin": branin(params)})
    >>> federation.agents[0].history    # which trials used which agent's message
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fbo_torch.integrations._ax_extra import ax_missing

try:
    from ax.api.client import Client
    from ax.core.experiment import Experiment
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ax_missing(__name__) from err

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.integrations.ax_messages import agent_message, objective_data, objective_weights
from fbo_torch.integrations.ax_node import (
    FTS_NODE,
    FTSGenerationNode,
    FTSStep,
    ModelFactory,
    fts_generation_strategy,
)
from fbo_torch.integrations.ax_unit_cube import UnitCube, _check_features
from fbo_torch.protocol.messages import AgentMessage
from fbo_torch.protocol.schedules import PtSchedule
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.validation import check_int, check_positive

# UnitCube lives in fbo_torch.integrations.ax_unit_cube, objective_data / objective_weights /
# agent_message in fbo_torch.integrations.ax_messages, FTSGenerationNode / FTSStep /
# fts_generation_strategy in fbo_torch.integrations.ax_node; imported from here they still work
__all__ = [
    "FTS_NODE",
    "AxFederation",
    "FTSGenerationNode",
    "FTSStep",
    "ModelFactory",
    "UnitCube",
    "agent_message",
    "fts_generation_strategy",
    "objective_data",
    "objective_weights",
]


# --------------------------------------------------------------------------- the federation
def _experiment_of(client: Client | Experiment) -> Experiment:
    """The experiment of an Ax ``Client`` (or the ``Experiment`` itself); a ``ValueError`` when none is configured."""
    if isinstance(client, Experiment):
        return client
    try:
        return client._experiment  # Ax's Client keeps it private (a property that asserts one is set)
    except AssertionError as err:
        raise ValueError(f"`client` has no experiment: call client.configure_experiment first ({err}).") from None


class AxFederation:
    r"""Ax agents that exchange FTS messages.

    Args:
        features: The shared :class:`~fbo_torch.features.RandomFourierFeatures`
            (``dim`` = the number of coordinates of every agent's
            :class:`~fbo_torch.integrations.ax_unit_cube.UnitCube`), or ``None``
            (default): built by the first :meth:`add_agent` with the dimension of
            that agent's search space (one coordinate per float or integer
            parameter and ordered choice, one per value of an unordered choice),
            ``num_features``, ``lengthscale`` and ``seed``.
        p_t: Default ``p_t`` schedule of the agents (see :class:`~fbo_torch.integrations.ax_node.FTSGenerationNode`).
        one_shot: Each received message is used for at most one trial (default).
        noise_variance: Default ``σ²`` of the agents' messages.
        seed: Base seed: agent ``n``'s draws use ``(seed, n)``; the feature map's seed when it is built here.
        num_restarts: Default ``optimize_acqf`` restarts.
        raw_samples: Default ``optimize_acqf`` raw samples.
        num_features: ``M`` of the feature map built when ``features`` is ``None``.
        lengthscale: The lengthscale (unit-cube units) of the feature map built when ``features`` is ``None``.

    Attributes:
        agents: The agents' :class:`~fbo_torch.integrations.ax_node.FTSGenerationNode`, indexed by ``agent_id``.
        features: The shared map (``None`` until the first agent when it is built here); every agent of
            another process builds it from ``features.config()``
            (:meth:`RandomFourierFeatures.from_config <fbo_torch.features.RandomFourierFeatures.from_config>`).
    """

    def __init__(
        self,
        features: RandomFourierFeatures | None = None,
        p_t: str | float | Callable[[int], float] = "1-1/sqrt(t)",
        one_shot: bool = True,
        noise_variance: float = 1e-2,
        seed: int = 0,
        num_restarts: int = 10,
        raw_samples: int = 512,
        num_features: int = 100,
        lengthscale: float = 0.2,
    ) -> None:
        self.features = None if features is None else _check_features(features)
        self.num_features = check_int("num_features", num_features, minimum=1)
        check_positive("lengthscale", lengthscale)
        self.lengthscale = float(lengthscale)
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

        Gives it the generation strategy of :func:`~fbo_torch.integrations.ax_node.fts_generation_strategy`:
        with a ``Client`` through ``Client.set_generation_strategy`` (call
        ``client.get_next_trials`` as usual); with an ``Experiment``, the
        strategy is ``node.generation_strategy`` (call its ``gen``).

        Args:
            client: An Ax ``Client`` whose experiment and objective are configured,
                or an Ax ``Experiment``.
            num_initial_trials: Sobol trials before FTS.
            model_factory: The agent's own GP (see :class:`~fbo_torch.integrations.ax_node.FTSGenerationNode`).
            options: Overrides of the federation's defaults for this agent
                (``p_t``, ``one_shot``, ``noise_variance``, ``num_restarts``, ``raw_samples``).

        Returns:
            The agent's :class:`~fbo_torch.integrations.ax_node.FTSGenerationNode`.

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
        if self.features is None:  # the map's dimension is the first agent's search space's
            dim = UnitCube.from_search_space(_experiment_of(client).search_space).dim
            self.features = RandomFourierFeatures(dim, self.num_features, lengthscale=self.lengthscale, seed=self.seed)
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
        _check_features(self.features, cube)  # every agent's search space has the map's dimension
        objective_weights(strategy.experiment)
        self.agents.append(node)
        return node

    def deliver(self, message: AgentMessage) -> None:
        r"""Give ``message`` to every agent but its sender (e.g. one received from another process).

        Args:
            message: An :class:`~fbo_torch.protocol.AgentMessage` on this federation's feature map.
        """
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
