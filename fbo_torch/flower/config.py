r"""The run configuration of a Flower deployment, and what both sides build from it.

A Flower run config is a flat mapping of scalars (``[tool.flwr.app.config]`` in
the app's ``pyproject.toml``, overridden by ``flwr run --run-config``). The
ServerApp and every ClientApp read the same mapping, so
:class:`FlowerRunConfig` turns it into the federation's objects
(:class:`~fbo_torch.federation.settings.DPFTSDESettings`, the objective, the
:class:`~fbo_torch.optim.domain.Domain`, the shared feature map and the keys):
a deployment and :class:`~fbo_torch.runners.dp_fts_de.DPFTSDERunner` with
``num_inits=1`` and the same seed then run the same computation.

This module does not import ``flwr``.

Keys (kebab-case, as Flower writes them):

============================  =======================================================
``method``                    ``"dp-fts-de"`` (the FTS family: FTS with ``P = 1``,
                              ``z = 0``) or ``"ts"`` (no communication)
``num-agents``                ``N``, agents of the federation (one per SuperNode)
``num-rounds``                ``T``
``sample-rate``               ``q``
``noise-multiplier``          ``z`` (0: non-private)
``clip-norm``                 ``S`` (0: no clipping, only with ``z = 0``)
``num-regions``               ``P``
``max-epsilon``               stop releasing before ε would exceed it (0: no budget)
``accountant``, ``delta``     the ledger's accountant and δ (0: the deployment default
                              :func:`~fbo_torch.privacy.deployment_delta`,
                              ``min(1e-5, 0.01/N)``; a δ ≥ ``1/N`` is refused)
``allow-large-delta``         accept a δ ≥ ``1/N`` (a guarantee that allows leaking
                              one agent's data in full); off by default
``secure-mode``               draw the server's noise with the mitigation of
                              floating-point attacks (Opacus' secure mode); on by default
``objective``                 JSON ``{"type": ..., **kwargs}`` for
                              :func:`~fbo_torch.objectives.build_objective`;
                              ``agents_per_group`` defaults to ``N``
``seed``                      the agents' keyed streams and the shared broadcast
                              search (public: every node reads it); never the
                              server's coins or noise, which come from the server's
                              own secret (:mod:`fbo_torch.flower.server_state`)
``num-init``, ``num-features``, ``rff-lengthscale``  as in the settings
``settings``                  JSON of any other ``DPFTSDESettings`` fields
``domain``                    JSON of :class:`Domain` maximizer options
``round-timeout``             seconds the server waits for replies in a round
``min-nodes-timeout``         seconds it waits for ``N`` nodes to connect
``report-best``               agents report their best value in clear (for the demo's
                              print-out); off by default
``summary-path``              the server writes its round log there as JSON ("": no file)
============================  =======================================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

METHODS = ("dp-fts-de", "ts")


def _json(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return dict(value)
    if value in (None, ""):
        return {}
    try:
        out = json.loads(value)
    except (TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"run config `{name}` must be a JSON object, got {value!r} ({err}).") from None
    if not isinstance(out, dict):
        raise ValueError(f"run config `{name}` must be a JSON object, got {value!r}.")
    return out


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _scalar(name: str, value: Any, kind: str) -> Any:
    """A run config value as ``kind`` (``"int"``, ``"float"``, ``"bool"``, ``"str"``); anything else is an error."""
    try:
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
            raise ValueError
    except (TypeError, ValueError):
        expected = {"int": "an integer", "float": "a number", "bool": "true or false"}[kind]
        raise ValueError(f"run config `{name}` must be {expected}, got {value!r}.") from None
    return value if isinstance(value, str) else str(value)


@dataclass(frozen=True)
class FlowerRunConfig:
    r"""A deployment's run config, typed (see the module docstring for the keys)."""

    method: str = "dp-fts-de"
    num_agents: int = 4
    num_rounds: int = 3
    sample_rate: float = 1.0
    noise_multiplier: float = 1.0
    clip_norm: float = 1.0
    num_regions: int = 2
    max_epsilon: float = 0.0
    accountant: str = "rdp"
    delta: float = 0.0
    allow_large_delta: bool = False
    secure_mode: bool = True
    objective: dict[str, Any] = field(default_factory=lambda: {"type": "gp_grid"})
    seed: int = 0
    num_init: int = 5
    num_features: int = 50
    rff_lengthscale: float = 0.03
    settings: dict[str, Any] = field(default_factory=dict)
    domain: dict[str, Any] = field(default_factory=dict)
    round_timeout: float = 120.0
    min_nodes_timeout: float = 120.0
    report_best: bool = False
    summary_path: str = ""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"run config `method` must be one of {METHODS}, got {self.method!r}.")
        if int(self.num_agents) < 1 or int(self.num_rounds) < 1:
            raise ValueError(f"`num-agents` and `num-rounds` must be >= 1, got {self.num_agents}, {self.num_rounds}.")
        if not (0.0 <= float(self.delta) < 1.0):
            raise ValueError(f"run config `delta` must be in [0, 1) (0: the deployment default), got {self.delta}.")
        if self.delta > 0 and self.delta * self.num_agents >= 1.0 and not self.allow_large_delta:
            raise ValueError(
                f"run config `delta` = {self.delta:g} is >= 1/N = {1 / self.num_agents:g}: such a guarantee allows "
                "releasing one agent's data in full. Use a smaller delta (0: the deployment default "
                "min(1e-5, 0.01/N)), or set `allow-large-delta = true` to accept it.")
        self.dp_settings()  # validates the rest

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> FlowerRunConfig:
        """From Flower's ``context.run_config`` (kebab-case keys; unknown keys are an error)."""
        names = {f.name.replace("_", "-"): f for f in fields(cls)}
        unknown = sorted(set(run_config) - set(names))
        if unknown:
            raise ValueError(f"unknown run config key(s) {unknown}; expected a subset of {sorted(names)}.")
        kwargs: dict[str, Any] = {}
        for key, value in run_config.items():
            f = names[key]
            if f.name in ("objective", "settings", "domain"):
                value = _json(key, value)
            else:
                value = _scalar(key, value, f.type)
            kwargs[f.name] = value
        return cls(**kwargs)

    # ------------------------------------------------------------ builders
    def dp_settings(self) -> Any:
        """The :class:`~fbo_torch.federation.settings.DPFTSDESettings` of the run."""
        from fbo_torch.federation.settings import DPFTSDESettings

        base = dict(
            algorithm="fts_de" if self.method == "dp-fts-de" else "ts",
            num_iterations=int(self.num_rounds), num_init=int(self.num_init), num_features=int(self.num_features),
            rff_lengthscale=float(self.rff_lengthscale), num_regions=int(self.num_regions),
            sample_rate=float(self.sample_rate), noise_multiplier=float(self.noise_multiplier),
            clip_norm=float(self.clip_norm) if self.clip_norm > 0 else None,
            max_epsilon=float(self.max_epsilon) if self.max_epsilon > 0 else None,
        )
        clash = sorted(set(self.settings) & (set(base) | {"algorithm"}))
        if clash:
            keys = ", ".join(f"`{k.replace('_', '-')}`" for k in clash)
            raise ValueError(f"run config `settings` sets {clash}, which the run config's own keys set ({keys} and "
                             "`method`); set them there, once.")
        base.update(self.settings)
        return DPFTSDESettings(**base)

    def build_objective(self) -> Any:
        """The federation's objective (every node builds it; node ``n`` evaluates agent ``n`` only)."""
        from fbo_torch.objectives import build_objective

        spec = dict(self.objective)
        spec.setdefault("agents_per_group", int(self.num_agents))
        obj = build_objective(spec)
        if obj.num_agents != self.num_agents:
            raise ValueError(f"the objective has {obj.num_agents} agents but `num-agents` is {self.num_agents}.")
        return obj

    def build_domain(self, objective: Any) -> Any:
        from fbo_torch.optim.domain import Domain

        return Domain(objective.bounds, objective.candidates, **self.domain).to("cpu")

    @property
    def ledger_delta(self) -> float:
        """The ledger's δ: ``delta``, or the deployment default for ``N`` agents when 0."""
        from fbo_torch.privacy import deployment_delta

        return float(self.delta) if self.delta > 0 else deployment_delta(int(self.num_agents))

    #: Keys that do not change what the federation computes or releases (left out of its fingerprint).
    TRANSPORT_KEYS = ("round_timeout", "min_nodes_timeout", "report_best", "summary_path")

    def fingerprint(self) -> str:
        """SHA-256 of the keys that define the federation (all but :attr:`TRANSPORT_KEYS`)."""
        import hashlib

        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self.TRANSPORT_KEYS}
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def agent_keys(self, agent_ids: Tensor) -> Tensor:
        """Keys of agents ``agent_ids`` (repetition 0 of the simulator)."""
        from fbo_torch.federation.keys import federation_agent_keys

        return federation_agent_keys(int(self.seed), torch.zeros_like(agent_ids), agent_ids)

    def federation_key(self) -> Tensor:
        """The federation's key (``1``): the server's stream and the shared broadcast search."""
        from fbo_torch.federation.keys import federation_keys

        return federation_keys(int(self.seed), torch.zeros(1, dtype=torch.long))
