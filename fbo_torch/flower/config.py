r"""The run configuration of a Flower deployment, and what both sides build from it.

A Flower run config is a flat mapping of scalars (``[tool.flwr.app.config]`` in
the app's ``pyproject.toml``, overridden by ``flwr run --run-config``). The
ServerApp and every ClientApp read the same mapping, so
:class:`FlowerRunConfig` turns it into the federation's objects
(:class:`~fbo_torch.federation.settings.DPFTSDESettings`, the objective, the
:class:`~fbo_torch.optim.domain.Domain`, the shared feature map and the keys):
a deployment and :class:`~fbo_torch.simulate.dp_fts_de.DPFTSDERunner` with
``num_inits=1`` and the same seed then run the same computation.

This module does not import ``flwr``.

Keys (kebab-case, as Flower writes them). Every field of
:class:`~fbo_torch.federation.settings.DPFTSDESettings` is a key of its own
(``num-init``, ``noise-multiplier``, ``gp-sample-features``, ...; ``num-rounds``
is ``num_iterations``; ``faults`` is a JSON object), and so are the
:class:`~fbo_torch.federation.settings.PrivacySettings` fields ``accountant`` and
``delta``: their defaults are those classes' defaults, with none of their own
here. A TOML value cannot be null, so ``0`` (or ``"none"``) means ``None`` for
``clip-norm`` (no clipping, only with ``z = 0``), ``max-epsilon`` (no budget)
and ``delta`` (the deployment default :func:`~fbo_torch.privacy.deployment_delta`,
``min(1e-5, 0.01/N)``, rather than the papers' ``1/N^1.1``; a δ ≥ ``1/N`` is refused).

The keys of the deployment itself:

============================  =======================================================
``method``                    ``"dp-fts-de"`` (the FTS family: FTS with ``P = 1``,
                              ``z = 0``) or ``"ts"`` (no communication)
``num-agents``                ``N``, agents of the federation (one per SuperNode)
``objective``                 JSON ``{"type": ..., **kwargs}`` for
                              :func:`~fbo_torch.objectives.build_objective`;
                              ``agents_per_group`` defaults to ``N``
``seed``                      the agents' keyed streams and the shared broadcast
                              search (public: every node reads it); never the
                              server's coins or noise, which come from the server's
                              own secret (:mod:`fbo_torch.flower.server_state`)
``domain``                    JSON of :class:`~fbo_torch.optim.domain.Domain`'s options
``allow-large-delta``         accept a δ ≥ ``1/N`` (a guarantee that allows leaking
                              one agent's data in full); off by default
``secure-mode``               draw the server's noise with the mitigation of
                              floating-point attacks (Opacus' secure mode); on by default
``round-timeout``             seconds the server waits for replies in a round
``min-nodes-timeout``         seconds it waits for ``N`` nodes to connect
``report-best``               agents report their best value in clear (for the demo's
                              print-out); off by default
``summary-path``              the server writes its round log there as JSON ("": no file)
``secagg-num-shares``         with ``aggregation = "secure"``: neighbours of each node in
                              SecAgg+ (itself included); 0: every pair (SecAgg)
``secagg-threshold``          Shamir threshold of SecAgg+; 0: ``min_survivors`` with every
                              pair, a majority of the ring otherwise
============================  =======================================================

``aggregation = "secure"`` (with ``dropout-tolerance`` and ``lattice-scale``, settings
fields like the others) runs every release through secure aggregation with
distributed noise (:mod:`fbo_torch.flower.secagg`); ``lattice-scale = 0`` means the
automatic scale. A deployment without ``noise-multiplier`` is not private (``z = 0``, the
settings' default, as in FTS); the server says so when it starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

from fbo_torch.federation.keys import federation_agent_keys, federation_keys
from fbo_torch.federation.secure import SecureMechanism
from fbo_torch.federation.settings import DPFTSDESettings, PrivacySettings
from fbo_torch.objectives import build_objective
from fbo_torch.optim.domain import Domain, check_options
from fbo_torch.privacy import deployment_delta

METHODS = ("dp-fts-de", "ts")
#: Run config keys that name a settings field differently (Flower's word for ``T``).
RENAMED = {"num-rounds": "num_iterations"}
#: Settings fields a run config does not set: ``algorithm`` comes from ``method``.
NOT_KEYS = ("algorithm",)
#: :class:`PrivacySettings` fields a deployment takes (``max_epsilon`` is the method's, ``max-epsilon``).
PRIVACY_KEYS = ("accountant", "delta")
#: Keys whose ``0`` means ``None`` (TOML has no null).
ZERO_IS_NONE = ("clip_norm", "max_epsilon", "delta", "lattice_scale")


def _kebab(name: str) -> str:
    return {v: k for k, v in RENAMED.items()}.get(name, name.replace("_", "-"))


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
_KINDS = {int: "int", float: "float", bool: "bool", str: "str"}


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


def _typed(key: str, field_name: str, value: Any, hint: Any) -> Any:
    r"""A run config value for a field annotated ``hint``: scalars converted strictly, ``dict`` from JSON,
    ``None`` from ``"none"`` (or from ``0`` for :data:`ZERO_IS_NONE`) where the field is optional."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    optional = type(None) in args
    kinds = [a for a in args if a is not type(None)]
    if optional and (isinstance(value, str) and value.strip().lower() in ("none", "null", "")):
        return None
    if optional and field_name in ZERO_IS_NONE and not isinstance(value, bool) and value in (0, "0"):
        return None
    if any(typing.get_origin(k) is dict or k is dict for k in kinds):
        return _json(key, value)
    for kind in (bool, int, float, str):
        if kind in kinds:
            return _scalar(key, value, _KINDS[kind])
    return value  # Any: as TOML gave it (e.g. p-t, a number or an expression)


@dataclass(frozen=True)
class FlowerRunConfig:
    r"""A deployment's run config, typed (see the module docstring for the keys).

    Attributes:
        settings: The federation's method settings (``algorithm`` from ``method``).
        privacy: Its accountant and δ.
        domain: Options of its :class:`~fbo_torch.optim.domain.Domain`.
    """

    method: str = "dp-fts-de"
    num_agents: int = 4
    objective: dict[str, Any] = field(default_factory=lambda: {"type": "gp_grid"})
    seed: int = 0
    settings: DPFTSDESettings = field(default_factory=DPFTSDESettings)
    privacy: PrivacySettings = field(default_factory=PrivacySettings)
    domain: dict[str, Any] = field(default_factory=dict)
    allow_large_delta: bool = False
    secure_mode: bool = True
    round_timeout: float = 120.0
    min_nodes_timeout: float = 120.0
    report_best: bool = False
    summary_path: str = ""
    secagg_num_shares: int = 0
    secagg_threshold: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"run config `method` must be one of {METHODS}, got {self.method!r}.")
        if int(self.num_agents) < 1:
            raise ValueError(f"run config `num-agents` must be >= 1, got {self.num_agents}.")
        algorithm = "fts_de" if self.method == "dp-fts-de" else "ts"
        if self.settings.algorithm != algorithm:
            object.__setattr__(self, "settings", dataclasses.replace(self.settings, algorithm=algorithm))
        delta = self.privacy.delta
        if delta is not None and delta * self.num_agents >= 1.0 and not self.allow_large_delta:
            raise ValueError(
                f"run config `delta` = {delta:g} is >= 1/N = {1 / self.num_agents:g}: such a guarantee allows "
                "releasing one agent's data in full. Use a smaller delta (0: the deployment default "
                "min(1e-5, 0.01/N)), or set `allow-large-delta = true` to accept it.")
        try:
            check_options(self.domain)
        except ValueError as err:
            raise ValueError(f"run config `domain`: {err}") from None
        for key in ("secagg_num_shares", "secagg_threshold"):
            if getattr(self, key) < 0:
                raise ValueError(f"run config `{key.replace('_', '-')}` must be >= 0, got {getattr(self, key)}.")
        if self.settings.aggregation == "secure" and self.settings.algorithm == "fts_de":
            try:
                SecureMechanism.from_settings(self.settings, int(self.num_agents))
            except ValueError as err:  # name the run config key, not the field
                text = str(err)
                for f in fields(DPFTSDESettings):
                    text = text.replace(f"`{f.name}`", f"`{_kebab(f.name)}`")
                raise ValueError(f"run config: {text}") from None

    @classmethod
    def keys(cls) -> dict[str, tuple[str, str]]:
        r"""Every run config key: ``{key: (where, field)}`` with ``where`` one of ``"run"``,
        ``"settings"``, ``"privacy"``."""
        out = {f.name.replace("_", "-"): ("run", f.name) for f in fields(cls) if f.name not in ("settings", "privacy")}
        out.update({_kebab(f.name): ("settings", f.name) for f in fields(DPFTSDESettings) if f.name not in NOT_KEYS})
        out.update({k: ("privacy", k) for k in PRIVACY_KEYS})
        return out

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> FlowerRunConfig:
        """From Flower's ``context.run_config`` (kebab-case keys; unknown keys are an error)."""
        keys = cls.keys()
        unknown = sorted(set(run_config) - set(keys))
        if unknown:
            raise ValueError(f"unknown run config key(s) {unknown}; expected a subset of {sorted(keys)}.")
        hints = {"run": typing.get_type_hints(cls), "settings": typing.get_type_hints(DPFTSDESettings),
                 "privacy": typing.get_type_hints(PrivacySettings)}
        parts: dict[str, dict[str, Any]] = {"run": {}, "settings": {}, "privacy": {}}
        for key, value in run_config.items():
            where, name = keys[key]
            parts[where][name] = _typed(key, name, value, hints[where][name])
        run = parts["run"]
        method = run.get("method", cls.method)
        try:
            settings = DPFTSDESettings(algorithm="fts_de" if method == "dp-fts-de" else "ts", **parts["settings"])
            privacy = PrivacySettings(**parts["privacy"])
        except ValueError as err:  # name the run config key, not the field
            text = str(err)
            for f in (*fields(DPFTSDESettings), *fields(PrivacySettings)):
                text = text.replace(f"`{f.name}`", f"`{_kebab(f.name)}`")
            raise ValueError(f"run config: {text}") from None
        return cls(settings=settings, privacy=privacy, **run)

    def to_run_config(self) -> dict[str, Any]:
        r"""The flat run config of this configuration (every key, TOML-ready): the inverse of
        :meth:`from_run_config`."""
        out: dict[str, Any] = {}
        for key, (where, name) in self.keys().items():
            value = getattr(self if where == "run" else getattr(self, where), name)
            if isinstance(value, dict):
                value = json.dumps(value)
            elif value is None:
                value = 0 if name in ZERO_IS_NONE else "none"
            out[key] = value
        return out

    # ------------------------------------------------------------ builders
    @property
    def num_rounds(self) -> int:
        """``T``, the settings' ``num_iterations`` (Flower's ``num-rounds``)."""
        return self.settings.num_iterations

    def dp_settings(self) -> DPFTSDESettings:
        """The :class:`~fbo_torch.federation.settings.DPFTSDESettings` of the run."""
        return self.settings

    def build_objective(self) -> Any:
        """The federation's objective (every node builds it; node ``n`` evaluates agent ``n`` only)."""
        spec = dict(self.objective)
        spec.setdefault("agents_per_group", int(self.num_agents))
        obj = build_objective(spec)
        if obj.num_agents != self.num_agents:
            raise ValueError(f"the objective has {obj.num_agents} agents but `num-agents` is {self.num_agents}.")
        return obj

    def build_domain(self, objective: Any) -> Domain:
        return Domain(objective.bounds, objective.candidates, **self.domain).to("cpu")

    @property
    def ledger_delta(self) -> float:
        """The ledger's δ: ``delta``, or the deployment default for ``N`` agents when unset."""
        delta = self.privacy.delta
        return float(delta) if delta is not None else deployment_delta(int(self.num_agents))

    #: Keys that do not change what the federation computes or releases (left out of its fingerprint; SecAgg+'s
    #: neighbourhoods and threshold change how the sum is computed, not the sum).
    TRANSPORT_KEYS = ("round_timeout", "min_nodes_timeout", "report_best", "summary_path", "secagg_num_shares",
                      "secagg_threshold")

    def fingerprint(self) -> str:
        """SHA-256 of the keys that define the federation (all but :attr:`TRANSPORT_KEYS`)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self.TRANSPORT_KEYS}
        data["settings"], data["privacy"] = dataclasses.asdict(self.settings), dataclasses.asdict(self.privacy)
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def agent_keys(self, agent_ids: Tensor) -> Tensor:
        """Keys of agents ``agent_ids`` (repetition 0 of the simulator)."""
        return federation_agent_keys(int(self.seed), torch.zeros_like(agent_ids), agent_ids)

    def federation_key(self) -> Tensor:
        """The federation's key (``1``): the server's stream and the shared broadcast search."""
        return federation_keys(int(self.seed), torch.zeros(1, dtype=torch.long))
