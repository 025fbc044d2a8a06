r"""One deployed agent: its data, objective and models, and its step of a round.

:class:`AgentNode` is what a ClientApp holds for its agent. It is the
simulator's :class:`~fbo_torch.federation.agents.Agents` with ``B = 1`` (the
agent's own key and index) driven by the same functions
(:func:`~fbo_torch.federation.agents.start_agents`,
:func:`~fbo_torch.federation.agents.broadcast_points`,
:func:`~fbo_torch.federation.agents.agent_round`), so agent ``n`` computes
in a deployment what row ``n`` of the simulator computes.

Flower runs a ClientApp in a fresh process per message, so the agent lives in
the node's ``context.state`` between messages: :meth:`AgentNode.state_dict`
is a dict of tensors only (an ``ArrayRecord``), and :meth:`AgentNode.restore`
rebuilds the node from it and the run config. Nothing here imports ``flwr``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fbo_torch.flower.config import FlowerRunConfig


class FeatureMapMismatch(ValueError):
    """The server's random-feature map is not this agent's: vectors would mean different functions."""


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
    """

    def __init__(self, config: FlowerRunConfig, agent_id: int) -> None:
        from fbo_torch.federation.partition import SubRegionPartition
        from fbo_torch.federation.agents import start_agents

        n = int(agent_id)
        if not 0 <= n < config.num_agents:
            raise ValueError(f"agent id (partition-id) {n} is outside 0..{config.num_agents - 1}.")
        self.config, self.agent_id = config, n
        self.settings = config.dp_settings()
        self.objective = config.build_objective()
        self.domain = config.build_domain(self.objective)
        self.ids = torch.tensor([n])
        self.keys = config.agent_keys(self.ids)
        self.federation_key = config.federation_key()
        self.faults = self.settings.fault_injector()
        fts = self.settings.algorithm == "fts_de"
        self.features = self.settings.features(self.objective.dim) if fts else None
        partition = SubRegionPartition(self.domain.bounds, self.settings.num_regions) if fts else None
        self.agents, best = start_agents(self.objective, self.settings, self.domain, self.keys, self.ids,
                                         self.features, partition)
        self.best = best  # 1
        self.round = 0

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

    def step(self, round: int, p: float, broadcast: Tensor | None, region_bounds: Tensor | None,
             omega_round: int) -> AgentReply:
        r"""Take round ``round`` (``0``: set-up only) and draw ``ω`` for round ``omega_round`` (0: none).

        Args:
            round: The round ``t`` (``>= 1``), or 0 before the first round.
            p: ``p_t``.
            broadcast: ``P x M`` release of round ``t``, or ``None`` (no release).
            region_bounds: ``P x 2 x d`` sub-regions the broadcast refers to.
            omega_round: The round whose release the server asks ``ω`` for.
        """
        from fbo_torch.federation.agents import agent_messages, agent_round, broadcast_points

        used = failed = False
        if round > 0:
            if round <= self.round:
                raise ValueError(f"agent {self.agent_id} already took round {round} (it is at round {self.round}).")
            X_srv = None
            if broadcast is not None:
                X_srv = broadcast_points(self.settings, self.features, broadcast.unsqueeze(0), region_bounds,
                                         self.domain, round, self.federation_key, self.keys, torch.zeros(1, dtype=torch.long))
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

    @classmethod
    def restore(cls, config: FlowerRunConfig, agent_id: int, state: dict[str, Tensor] | None) -> AgentNode:
        """The node as it was saved (a fresh one, after its initial queries, when ``state`` is ``None``)."""
        node = cls(config, agent_id)
        if not state:
            return node
        if int(state["agent_id"]) != node.agent_id:
            raise ValueError(f"the node state holds agent {int(state['agent_id'])}, not agent {node.agent_id}.")
        agents_state: dict = {k: state[k] for k in ("keys", "X", "Y", "valid")}
        agents_state["n"] = int(state["n"])
        agents_state["gp_params"] = state.get("gp_params")
        agents_state["gp_updates"] = int(state["gp_updates"])
        if "rff_n" in state:
            agents_state["rff_n"] = int(state["rff_n"])
            agents_state["rff_buffers"] = {k[4:]: v for k, v in state.items() if k.startswith("rff.")}
        node.agents.load_state_dict(agents_state)
        node.best = state["best"].clone()
        node.round = int(state["round"])
        return node
