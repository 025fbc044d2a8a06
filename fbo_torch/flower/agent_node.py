r"""One deployed agent: its data, objective and models, and its step of a round.

:class:`AgentNode` is what a ClientApp holds for its agent. It is the
simulator's :class:`~fbo_torch.federation.agents.Agents` with ``B = 1`` (the
agent's own key and index) driven by the same functions
(:func:`~fbo_torch.federation.agents.start_agents`,
:func:`~fbo_torch.federation.agents.broadcast_points`,
:func:`~fbo_torch.federation.agents.agent_round`), so agent ``n`` computes
in a deployment what row ``n`` of the simulator computes.

The agent lives in the node's ``context.state`` between messages:
:meth:`AgentNode.state_dict` is a dict of tensors only (an ``ArrayRecord``),
and ``AgentNode(config, n, state)`` rebuilds the node from it without
evaluating anything. A process that handles several messages (Flower may run
a ClientApp in a fresh process per message, or keep one) keeps its nodes in
:class:`LiveNodes`: a node starts (evaluates its initial points) once per run
and is rebuilt only when the process holds no node equal to the stored state.
The objective a node evaluates is agent ``n`` of the run config's objective,
or, in a federation of node-local objectives, the node's own black box named
in its node config (:meth:`~fbo_torch.flower.config.FlowerRunConfig.node_objective`):
the node builds it and nothing about it leaves the node.
Nothing here imports ``flwr``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fbo_torch.federation.agents import Agents, agent_messages, agent_round, broadcast_points, start_agents
from fbo_torch.flower.config import FlowerRunConfig, ObjectiveMismatch, node_objective_spec
from fbo_torch.flower.floor import PrivacyFloorError
from fbo_torch.flower.identity import IdentityError
from fbo_torch.protocol.partition import SubRegionPartition


class FeatureMapMismatch(ValueError):
    """The server's random-feature map is not this agent's: vectors would mean different functions."""


#: Errors by which a node refuses the federation for good (the server then never contacts it again):
#: a different feature map, an objective that does not fit the federation's domain, a run config below
#: the node's privacy floor, or secure rounds without the identity the node needs for them.
REFUSALS = (FeatureMapMismatch.__name__, ObjectiveMismatch.__name__, PrivacyFloorError.__name__, IdentityError.__name__)


@dataclass(frozen=True)
class AgentReply:
    r"""What an agent sends back after a round.

    Attributes:
        agent_id: The agent's index ``n``.
        fingerprint: Its feature map's fingerprint (``""`` for TS).
        omega: ``M`` draw ``ω_n`` for the next release, or ``None`` when not asked.
        num_observations: Observations so far (failed ones included).
        best_value: Best noiseless value found so far (reported only with ``report-best``).
        used_broadcast: The round's query came from the broadcast.
        failed: The round's evaluation failed.
    """

    agent_id: int
    fingerprint: str
    omega: Tensor | None
    num_observations: int
    best_value: float
    used_broadcast: bool
    failed: bool


class AgentNode:
    r"""Agent ``agent_id`` of a deployment, built from the run config.

    Args:
        config: The run config (the same on every node and the server).
        agent_id: ``n`` (a SuperNode's ``partition-id``).
        state: The node's saved :meth:`state_dict`: the agent continues from it
            and nothing is evaluated. ``None``: a fresh agent, after its initial
            queries.
        objective: The objective the node evaluates when the process already built it
            (``None``: :meth:`~fbo_torch.flower.config.FlowerRunConfig.node_objective`
            of ``node_config``).
        node_config: The SuperNode's node config (its own ``objective``, if any).

    Raises:
        ObjectiveMismatch: The node's objective does not fit the federation (see
            :meth:`~fbo_torch.flower.config.FlowerRunConfig.node_objective`).
    """

    def __init__(
        self,
        config: FlowerRunConfig,
        agent_id: int,
        state: dict[str, Tensor] | None = None,
        objective: Any | None = None,
        node_config: Mapping[str, Any] | None = None,
    ) -> None:
        n = int(agent_id)
        if not 0 <= n < config.num_agents:
            raise ValueError(f"agent id (partition-id) {n} is outside 0..{config.num_agents - 1}.")
        self.config, self.agent_id = config, n
        self.objective_key = ""  # which node objective it holds (set by LiveNodes)
        self.settings = config.dp_settings()
        self.objective = config.node_objective(node_config or {}, n) if objective is None else objective
        self.domain = config.build_domain(self.objective)
        self.ids = torch.tensor([n])
        self.keys = config.agent_keys(self.ids)
        self.federation_key = config.federation_key()
        self.faults = self.settings.fault_injector()
        fts = self.settings.method.federated()
        self.features = self.settings.features(self.objective.dim) if fts else None
        if not state:
            partition = SubRegionPartition(self.domain.bounds, self.settings.num_regions) if fts else None
            self.agents, self.best = start_agents(
                self.objective, self.settings, self.domain, self.keys, self.ids, self.features, partition
            )  # best: 1
            self.round = 0
            return
        if int(state["agent_id"]) != n:
            raise ValueError(f"the node state holds agent {int(state['agent_id'])}, not agent {n}.")
        n0 = self.settings.num_init  # the stored initial observations stand in for the start-up's
        X, Y = state["X"].to(self.domain.bounds.device), state["Y"].to(self.domain.bounds.device)
        self.agents = Agents(
            self.keys,
            X[:, :n0],
            Y[:, :n0].unsqueeze(-1),
            self.domain,
            self.settings,
            self.features,
            capacity=self.settings.num_iterations,
        )
        agents_state: dict[str, Any] = {k: state[k] for k in ("keys", "X", "Y", "valid")}
        agents_state["n"] = int(state["n"])
        agents_state["gp_params"] = state.get("gp_params")
        agents_state["gp_updates"] = int(state["gp_updates"])
        if "rff_n" in state:
            agents_state["rff_n"] = int(state["rff_n"])
            agents_state["rff_buffers"] = {k[4:]: v for k, v in state.items() if k.startswith("rff.")}
        self.agents.load_state_dict(agents_state)
        self.best = state["best"].clone()
        self.round = int(state["round"])

    @property
    def fingerprint(self) -> str:
        return "" if self.features is None else self.features.fingerprint

    def check_features(self, fingerprint: str) -> None:
        """Refuse a server whose feature map differs from this agent's."""
        if fingerprint != self.fingerprint:
            raise FeatureMapMismatch(
                f"agent {self.agent_id} refuses the round: the server's random-feature map has fingerprint "
                f"{fingerprint!r}, this agent's {self.fingerprint!r}; both sides must build the map from the "
                "same arguments (num-features, rff-lengthscale, rff seed, dimension)."
            )

    def step(
        self, round: int, p: float, broadcast: Tensor | None, region_bounds: Tensor | None, omega_round: int
    ) -> AgentReply:
        r"""Take round ``round`` (``0``: set-up only) and draw ``ω`` for round ``omega_round`` (0: none).

        Args:
            round: The round ``t`` (``>= 1``), or 0 before the first round.
            p: ``p_t``.
            broadcast: ``P x M`` release of round ``t``, or ``None`` (no release).
            region_bounds: ``P x 2 x d`` sub-regions the broadcast refers to.
            omega_round: The round whose release the server asks ``ω`` for.

        Returns:
            The :class:`AgentReply` the node sends back.
        """
        used = failed = False
        if round > 0:
            if round <= self.round:
                raise ValueError(f"agent {self.agent_id} already took round {round} (it is at round {self.round}).")
            X_srv = None
            if broadcast is not None:
                if self.features is None:
                    raise ValueError(
                        f"agent {self.agent_id} runs without a shared feature map (algorithm "
                        f"{self.settings.algorithm!r}): it cannot follow a broadcast."
                    )
                if region_bounds is None:
                    raise ValueError("`region_bounds` (P x 2 x d) must come with a `broadcast`.")
                X_srv = broadcast_points(
                    self.settings,
                    self.features,
                    broadcast.unsqueeze(0),
                    region_bounds,
                    self.domain,
                    round,
                    self.federation_key,
                    self.keys,
                    torch.zeros(1, dtype=torch.long),
                )
            _, used_t, ok, f = agent_round(self.agents, self.objective, self.ids, round, p, X_srv, self.faults)
            self.best = torch.maximum(self.best, f)
            used, failed = bool(used_t[0]), not bool(ok[0])
            self.round = round
        omega = agent_messages(self.agents, omega_round, self.faults)[0] if omega_round > 0 else None
        return AgentReply(self.agent_id, self.fingerprint, omega, self.agents.n, float(self.best[0]), used, failed)

    # ---------------------------------------------------------- node state
    def state_dict(self) -> dict[str, Tensor]:
        """The agent's state as tensors only (Flower's ``ArrayRecord`` of the node state)."""
        state = self.agents.state_dict()
        out = {k: v for k, v in state.items() if isinstance(v, Tensor)}
        for k in ("n", "gp_updates", "rff_n"):
            if k in state:
                out[k] = torch.tensor(int(state[k]))
        for k, v in state.get("rff_buffers", {}).items():
            out["rff." + k] = v
        out["best"] = self.best
        out["round"] = torch.tensor(self.round)
        out["agent_id"] = torch.tensor(self.agent_id)
        return out

    def holds(self, config: FlowerRunConfig, agent_id: int, state: dict[str, Tensor] | None) -> bool:
        """Whether this node is agent ``agent_id`` of ``config`` exactly as ``state`` saved it."""
        if not state or self.config != config or self.agent_id != int(agent_id):
            return False
        mine = self.state_dict()
        return mine.keys() == state.keys() and all(_same_values(v, state[k]) for k, v in mine.items())


def _same_values(a: Tensor, b: Tensor) -> bool:
    """``a`` and ``b`` have the same dtype, shape and values (NaN equals NaN), on any device."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    if not a.is_floating_point():
        return torch.equal(a, b)
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a.masked_fill(nan, 0.0), b.masked_fill(nan, 0.0))


class LiveNodes:
    r"""The agents a process plays, kept between messages.

    :meth:`get` returns the node a message is for: the one this process kept
    when it equals the node's stored state (the usual case: the process
    handled the node's previous message), otherwise one rebuilt from that
    state (e.g. in a fresh ClientApp process), or a fresh node after its
    initial queries when nothing is stored. Either way the node computes what
    the stored state would; the initial points are evaluated once per run.
    Nodes of one run and run config share one objective (node-local objectives:
    nodes of one node config); a new run drops the nodes of the previous one.
    """

    def __init__(self) -> None:
        self._run_id: int | None = None
        self._nodes: dict[int, AgentNode] = {}
        self._objectives: list[tuple[FlowerRunConfig, str, Any]] = []

    def get(
        self,
        run_id: int,
        node_id: int,
        config: FlowerRunConfig,
        agent_id: int,
        state: dict[str, Tensor] | None,
        node_config: Mapping[str, Any] | None = None,
    ) -> AgentNode:
        r"""Node ``node_id`` of run ``run_id`` (agent ``agent_id`` of ``config``, with ``node_config``)
        as ``state`` saved it."""
        if self._run_id != int(run_id):
            self._run_id, self._nodes, self._objectives = int(run_id), {}, []
        own = node_objective_spec(node_config or {}) if config.node_local else None
        key = json.dumps([int(agent_id), own], sort_keys=True, default=str) if own is not None else ""
        node = self._nodes.pop(int(node_id), None)
        if node is None or not node.holds(config, agent_id, state) or node.objective_key != key:
            objective = next((obj for cfg, k, obj in self._objectives if cfg == config and k == key), None)
            node = AgentNode(config, agent_id, state, objective=objective, node_config=node_config)
            node.objective_key = key
            if objective is None:
                self._objectives.append((config, key, node.objective))
        self._nodes[int(node_id)] = node
        return node

    def __len__(self) -> int:
        return len(self._nodes)
