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

The keys of the deployment itself are the fields of :class:`FlowerRunConfig`
(kebab-case: ``num-agents``, ``round-timeout``, ...), each declared there once with
its default, its doc and its check (:mod:`fbo_torch.utils.schema`).

Node-local objectives. With ``objective = '{"type": "node", ...}'`` the run
config describes only the domain the federation searches: ``bounds``, a
``2 x d`` list ``[[lower...], [upper...]]``, or ``parameters``, a search space
in :meth:`~fbo_torch.objectives.search_space.SearchSpace.from_dict`'s form
(the domain is then ``[0, 1]^d`` and each node's objective must have that
``search_space``). Each SuperNode names its own black box in its node config
(``--node-config``, never seen by the server): ``objective`` is
``"package.module:ClassName"`` or a JSON ``{"type": ..., **kwargs}``, and
``objective.KEY`` keys (a ``[objective]`` table of a node config file) are
further keyword arguments (Flower's parser takes ``objective`` or ``objective.KEY``
keys, not both: with arguments, name the class ``objective.type``). It is built and validated like a YAML custom
objective (:func:`~fbo_torch.objectives.build_objective`) and must be one
agent's function (``num_agents = 1``) on the federation's domain
(:meth:`FlowerRunConfig.node_objective`).

``aggregation = "secure"`` (with ``dropout-tolerance`` and ``lattice-scale``, settings
fields like the others) runs every release through secure aggregation with
distributed noise (:mod:`fbo_torch.flower.secagg`); ``lattice-scale = 0`` means the
automatic scale. A deployment without ``noise-multiplier`` is not private (``z = 0``, the
settings' default, as in FTS); the server says so when it starts.

**The objective names code.** ``objective.type`` may be
``"package.module:ClassName"``, and importing a module runs its top-level
code. The run config comes from whoever starts the run and reaches every
node, so a node (and the server) imports only the built-in objectives, names it
registered itself (:func:`~fbo_torch.objectives.register`), and the
``module:Class`` paths its *own* configuration allows
(:func:`allowed_objectives`): the SuperNode's node config ``allow-objectives``
(``flower-supernode --node-config "allow-objectives='mypkg.objectives:MyCNN'"``;
several paths separated by commas) or the ``FBO_ALLOW_OBJECTIVES`` environment
variable of the SuperNode or SuperLink. Anything else is refused before it is
imported (:meth:`FlowerRunConfig.check_objective`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import types
import typing
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

from fbo_torch.federation.release import get_release
from fbo_torch.federation.secure import min_survivors as fewest_survivors
from fbo_torch.federation.settings import DPFTSDESettings, PrivacySettings
from fbo_torch.methods.base import get_method, method_names
from fbo_torch.objectives import REGISTRY, build_objective
from fbo_torch.objectives.base import Objective
from fbo_torch.objectives.search_space import SearchSpace
from fbo_torch.optim.domain import Domain, check_options
from fbo_torch.privacy import deployment_delta
from fbo_torch.protocol.keys import federation_agent_keys, federation_keys
from fbo_torch.utils.schema import (
    Choice,
    Flag,
    Integer,
    Number,
    Rule,
    Seed,
    Text,
    check_fields,
    check_value,
    document,
    read_typed,
    setting,
)


def deployment_methods() -> list[str]:
    """The run config's ``method`` choices, read from the method registry when a config is checked:
    the algorithms of DP-FTS-DE's experiment kind, each by its first alias (its run-config spelling,
    e.g. ``dp-fts-de``) or else its name (``ts``)."""
    classes = (get_method(name) for name in method_names("dp_fts_de"))
    return [cls.aliases[0] if cls.aliases else cls.name for cls in classes]


#: Run config keys that name a settings field differently (Flower's word for ``T``).
RENAMED = {"num-rounds": "num_iterations"}
#: Settings fields a run config does not set: ``algorithm`` comes from ``method``.
NOT_KEYS = ("algorithm",)
#: :class:`PrivacySettings` fields a deployment takes (``max_epsilon`` is the method's, ``max-epsilon``).
PRIVACY_KEYS = ("accountant", "delta")
#: Keys whose ``0`` means ``None`` (TOML has no null).
ZERO_IS_NONE = ("clip_norm", "max_epsilon", "delta", "lattice_scale")
#: ``objective`` type of a federation whose nodes each evaluate their own objective.
NODE_LOCAL = "node"
#: The node config key that names a node's own objective (``objective.KEY``: its keyword arguments).
NODE_OBJECTIVE_KEY = "objective"


class ObjectiveMismatch(ValueError):
    """A node's objective does not fit the federation (missing, unexpected, or on another domain)."""


class FederationDomain(Objective):
    r"""The domain of a federation of node-local objectives, as an objective that cannot be evaluated.

    What the server and the run config know of such a federation: ``N`` agents
    on ``bounds`` (``2 x d``), with ``search_space`` when the run config names
    the parameters. Each agent's function lives on its node only.
    """

    def __init__(self, bounds: Tensor, num_agents: int, search_space: SearchSpace | None = None) -> None:
        self._bounds, self.num_agents, self.search_space = bounds, int(num_agents), search_space

    @property
    def bounds(self) -> Tensor:  # type: ignore[override]  # read-only: fixed at construction
        return self._bounds

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        raise RuntimeError(
            "this federation's objectives are node-local: each SuperNode evaluates its own "
            "(node config `objective`), nobody evaluates the federation's."
        )


def _node_local_domain(spec: Mapping[str, Any], num_agents: int) -> FederationDomain:
    r"""The :class:`FederationDomain` of a run config ``objective = '{"type": "node", ...}'`` (checked)."""
    where = 'run config `objective` ({"type": "node", ...})'
    extra = sorted(set(spec) - {"type", "bounds", "parameters"})
    if extra or ("bounds" in spec) == ("parameters" in spec):
        raise ValueError(
            f"{where} takes exactly one of `bounds` (2 x d: [[lower...], [upper...]]) or `parameters` "
            f"(a search space {{name: {{low, high, log, type}}}}), got keys {sorted(spec)}."
        )
    if "parameters" in spec:
        try:
            space = SearchSpace.from_dict(spec["parameters"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: `parameters`: {err}") from None
        return FederationDomain(space.bounds, num_agents, space)
    try:
        bounds = torch.tensor(spec["bounds"], dtype=torch.float64)
        ok = bounds.ndim == 2 and bounds.shape[0] == 2 and bounds.shape[1] >= 1
        ok = ok and bool(torch.isfinite(bounds).all() and (bounds[1] > bounds[0]).all())
    except (TypeError, ValueError, RuntimeError):
        ok = False
    if not ok:
        raise ValueError(
            f"{where}: `bounds` must be 2 x d finite numbers [[lower...], [upper...]] with every upper "
            f"bound above its lower bound, got {spec['bounds']!r}."
        )
    return FederationDomain(bounds, num_agents)


def node_objective_spec(node_config: Mapping[str, Any]) -> dict[str, Any] | None:
    r"""The objective a node config names (``{"type": ..., **kwargs}``), or ``None`` when it names none.

    ``objective`` is ``"package.module:ClassName"`` or a JSON object; ``objective.KEY``
    entries (Flower flattens a node config file's ``[objective]`` table into them) add keyword
    arguments, ``objective.type`` the class.
    """
    prefix = NODE_OBJECTIVE_KEY + "."
    kwargs = {k[len(prefix) :]: v for k, v in node_config.items() if str(k).startswith(prefix)}
    if NODE_OBJECTIVE_KEY not in node_config and not kwargs:
        return None
    value = node_config.get(NODE_OBJECTIVE_KEY, "")
    spec: dict[str, Any] = {}
    if isinstance(value, str) and value.strip().startswith("{"):
        spec = _json(f"node config `{NODE_OBJECTIVE_KEY}`", value)
    elif value not in ("", None):
        if not isinstance(value, str):
            raise ValueError(
                f"node config `{NODE_OBJECTIVE_KEY}` must be 'package.module:ClassName' or a JSON "
                f"object, got {value!r}."
            )
        spec = {"type": value.strip()}
    spec.update(kwargs)
    if "type" not in spec:
        raise ValueError(
            f"node config `{NODE_OBJECTIVE_KEY}` names no class: give "
            f'{NODE_OBJECTIVE_KEY}="package.module:ClassName" (or `{prefix}type`).'
        )
    return spec


class NodeObjective(Objective):
    r"""A node's own black box as agent ``agent_id`` of an ``N``-agent federation.

    The federation's round code asks an objective for agent ``n``'s values
    (``agents = [n]``); the node's objective is one agent's function (its agent
    ``0``), so this view answers for agent ``agent_id`` only and passes every
    other call through.

    Args:
        inner: The node's objective (``num_agents = 1``).
        agent_id: The agent the node plays.
        num_agents: ``N``.
    """

    def __init__(self, inner: Objective, agent_id: int, num_agents: int) -> None:
        self.inner, self.agent_id, self.num_agents = inner, int(agent_id), int(num_agents)
        self.candidates = inner.candidates
        self.value_name = inner.value_name

    @property
    def bounds(self) -> Tensor:  # type: ignore[override]  # read-only: the inner objective's
        return self.inner.bounds

    def _own(self, agents: Tensor | None, like: Tensor) -> Tensor:
        agents = torch.full((like.shape[0],), self.agent_id) if agents is None else torch.as_tensor(agents)
        if bool((agents.reshape(-1) != self.agent_id).any()):
            raise ValueError(f"this node evaluates agent {self.agent_id} only, not agents {agents.tolist()}.")
        return torch.zeros(agents.numel(), dtype=torch.long, device=like.device)

    def observe(
        self, X: Tensor, keys: Tensor, agents: Tensor | None = None, validate: bool = True
    ) -> tuple[Tensor, Tensor]:
        return self.inner.observe(X, keys, self._own(agents, X), validate)

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        return self.inner._evaluate(X, self._own(agents, X), noise)

    def loss(self, best_values: Tensor, agents: Tensor | None = None) -> Tensor:
        return self.inner.loss(best_values)

    @property
    def loss_name(self) -> str:
        return self.inner.loss_name


def _describe(bounds: Tensor) -> str:
    return f"{bounds.shape[-1]}-dimensional, bounds {[[round(v, 6) for v in row] for row in bounds.tolist()]}"


#: The node config key and the environment variable that list the ``module:Class`` objectives a node may import.
ALLOW_OBJECTIVES_KEY = "allow-objectives"
ALLOW_OBJECTIVES_ENV = "FBO_ALLOW_OBJECTIVES"


def allowed_objectives(node_config: Mapping[str, Any] | None = None) -> frozenset[str]:
    r"""The ``module:Class`` objectives this process may import for a run config: those in
    ``$FBO_ALLOW_OBJECTIVES`` and in ``node_config["allow-objectives"]`` (comma-separated)."""
    texts = [os.environ.get(ALLOW_OBJECTIVES_ENV, "")]
    if node_config is not None:
        texts.append(str(node_config.get(ALLOW_OBJECTIVES_KEY, "")))
    return frozenset(part.strip() for text in texts for part in text.split(",") if part.strip())


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


def read_value(
    key: str, field_name: str, value: Any, hint: Any, where: str = "run config", zero_is_none: bool = True
) -> Any:
    r"""A Flower config value (a run config's, or a node config's: TOML, or text from the command line) for a
    field annotated ``hint``: scalars converted strictly, ``dict`` from JSON, ``None`` from ``"none"`` (or from
    ``0`` for :data:`ZERO_IS_NONE`, unless ``zero_is_none`` is off) where the field is optional.

    Args:
        key: The key, as the config spells it (for messages).
        field_name: The field it sets.
        value: The value the config holds.
        hint: The field's annotation.
        where: ``"run config"`` or ``"node config"`` (for messages).
        zero_is_none: Whether ``0`` means ``None`` for the fields of :data:`ZERO_IS_NONE`.

    Returns:
        The value, typed.
    """
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    optional = type(None) in args
    kinds = [a for a in args if a is not type(None)]
    if optional and (isinstance(value, str) and value.strip().lower() in ("none", "null", "")):
        return None
    zero = zero_is_none and field_name in ZERO_IS_NONE
    if optional and zero and not isinstance(value, bool) and value in (0, "0"):
        return None
    if any(typing.get_origin(k) is dict or k is dict for k in kinds):
        return _json(key, value)
    try:
        return read_typed(key, value, hint, text=True)  # Any (p-t): as TOML gave it
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def _check_objective_spec(key: str, value: Any) -> None:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ValueError(f'`{key}` must be a JSON object with a "type", got {value!r}.')


def _check_domain(key: str, value: Any) -> None:
    try:
        check_options(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"`{key}`: {err}") from None


def default_threshold(num_shares: int, num_agents: int, min_survivors: int) -> int:
    r"""The Shamir threshold ``t``: with every pair (``k ≥ N``), ``t = k_min``, so any ``k_min`` survivors
    can unmask and ``t − 1`` nodes colluding with the server learn no node's secret; with a ring of
    ``k < N`` (SecAgg+), a majority of the ring, ``⌊k/2⌋ + 1`` (a neighbourhood that loses more
    cannot unmask, and the round fails)."""
    k = int(num_shares)
    if k >= int(num_agents):
        return max(2, int(min_survivors))
    return max(2, k // 2 + 1)


@document
@dataclass(frozen=True)
class FlowerRunConfig:
    r"""A deployment's run config, typed: its keys are these fields and those of the settings (kebab-case).

    Attributes:
        settings: The federation's method settings (``algorithm`` from ``method``).
        privacy: Its accountant and δ.
    """

    method: str = setting(
        "dp-fts-de",
        "``dp-fts-de`` (the FTS family: FTS with ``P = 1``, ``z = 0``) or ``ts`` (no communication).",
        Choice(deployment_methods),
    )
    num_agents: int = setting(4, "``N``, agents of the federation (one per SuperNode).", Integer(minimum=1))
    objective: dict[str, Any] = setting(
        None,
        'JSON ``{"type": ..., **kwargs}`` for :func:`~fbo_torch.objectives.build_objective` (a simulated '
        "federation: every node builds it and evaluates the function of its ``partition-id``; "
        '``agents_per_group`` defaults to ``N``), or ``{"type": "node", "bounds": [[...], [...]]}`` / '
        '``{"type": "node", "parameters": {...}}``: each node evaluates its own black box, named in its node '
        "config (see the module docstring); the run config gives only the federation's domain.",
        Rule(_check_objective_spec, {"no_type": 1}),
        factory=lambda: {"type": "gp_grid"},
    )
    seed: int = setting(
        0,
        "The agents' keyed streams and the shared broadcast search (public: every node reads it); never the "
        "server's coins or noise, which come from the server's own secret (:mod:`fbo_torch.flower.server_state`).",
        Seed(),
    )
    settings: DPFTSDESettings = field(default_factory=DPFTSDESettings)
    privacy: PrivacySettings = field(default_factory=PrivacySettings)
    domain: dict[str, Any] = setting(
        None,
        "JSON of :class:`~fbo_torch.optim.domain.Domain`'s options.",
        Rule(_check_domain, {"no_such_option": 1}),
        factory=dict,
    )
    allow_large_delta: bool = setting(
        False, "Accept a δ ≥ ``1/N`` (a guarantee that allows leaking one agent's data in full).", Flag()
    )
    secure_mode: bool = setting(
        True,
        "Draw the server's noise with the mitigation of floating-point attacks (Opacus' secure mode).",
        Flag(),
    )
    round_timeout: float = setting(
        120.0, "Seconds the server waits for replies in a round.", Number(what="a finite number of seconds > 0")
    )
    min_nodes_timeout: float = setting(
        120.0,
        "Seconds the server waits for ``N`` nodes to connect.",
        Number(strict=False, what="a finite number of seconds >= 0"),
    )
    report_best: bool = setting(False, "Agents report their best value in clear (for the demo's print-out).", Flag())
    summary_path: str = setting("", 'The server writes its round log there as JSON ("": no file).', Text())
    secagg_num_shares: int = setting(
        0,
        'With ``aggregation = "secure"``: neighbours of each node in SecAgg+ (itself included); 0: every pair '
        "(SecAgg).",
        Integer(minimum=0),
    )
    secagg_threshold: int = setting(
        0,
        "Shamir threshold of SecAgg+, more than half of a neighbourhood (a lower one is refused); 0: "
        "``min_survivors`` with every pair, a majority of the ring otherwise.",
        Integer(minimum=0),
    )

    def __post_init__(self) -> None:
        try:
            check_fields(self, spell=_kebab)
        except (TypeError, ValueError) as err:
            raise type(err)(f"run config: {err}") from None
        algorithm = get_method(self.method, "dp_fts_de").name
        if self.settings.algorithm != algorithm:
            object.__setattr__(self, "settings", dataclasses.replace(self.settings, algorithm=algorithm))
        delta = self.privacy.delta
        if delta is not None and delta * self.num_agents >= 1.0 and not self.allow_large_delta:
            raise ValueError(
                f"run config `delta` = {delta:g} is >= 1/N = {1 / self.num_agents:g}: such a guarantee allows "
                "releasing one agent's data in full. Use a smaller delta (0: the deployment default "
                "min(1e-5, 0.01/N)), or set `allow-large-delta = true` to accept it."
            )
        if self.node_local:
            _node_local_domain(self.objective, self.num_agents)
        if self.settings.method.federated():
            release = get_release(self.settings.aggregation)
            try:
                release.check(self.settings, int(self.num_agents))
            except ValueError as err:  # name the run config key, not the field
                text = str(err)
                for f in fields(DPFTSDESettings):
                    text = text.replace(f"`{f.name}`", f"`{_kebab(f.name)}`")
                raise ValueError(f"run config: {text}") from None
            if not release.sees_messages:  # a secure sum over SecAgg+
                self._check_majorities(fewest_survivors(int(self.num_agents), self.settings.dropout_tolerance))

    def _check_majorities(self, min_survivors: int) -> None:
        r"""Secure rounds safe against a server that lies about who dropped out: more than half of the
        agents survive (so a majority can confirm one survivor set) and the threshold is more than half
        of each neighbourhood (so no two sets of ``t`` honest neighbours can reveal both secrets of a node)."""
        N = int(self.num_agents)
        if 2 * min_survivors <= N:
            raise ValueError(
                f"run config `dropout-tolerance` = {self.settings.dropout_tolerance:g} lets a secure round release "
                f"with {min_survivors} of {N} agents; it must keep more than half of them (dropout-tolerance < 0.5): "
                "with fewer, a server that tells nodes different dropout sets can unmask one agent's vector."
            )
        k, t = self.secagg_neighbours, self.secure_threshold()
        if not k < 2 * t <= 2 * k:
            raise ValueError(
                f"run config `secagg-threshold` = {t} with neighbourhoods of {k} nodes (`secagg-num-shares`): the "
                "threshold must be more than half of a neighbourhood and at most all of it; a lower one lets a "
                "server that tells nodes different dropout sets reconstruct both secrets of one node."
            )

    @property
    def secagg_neighbours(self) -> int:
        r"""``k``, the nodes of a SecAgg+ neighbourhood, each itself included: every agent (``secagg-num-shares``
        0 or ``≥ N``), else a ring of ``secagg-num-shares`` rounded up to an odd number."""
        N = int(self.num_agents)
        k = min(self.secagg_num_shares or N, N)
        return k + 1 if k < N and k % 2 == 0 else k

    def secure_threshold(self) -> int:
        r"""``t``, the Shamir threshold of the secure rounds: ``secagg-threshold``, or :func:`default_threshold`."""
        k_min = fewest_survivors(int(self.num_agents), self.settings.dropout_tolerance)
        return self.secagg_threshold or default_threshold(self.secagg_neighbours, int(self.num_agents), k_min)

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
        hints = {
            "run": typing.get_type_hints(cls),
            "settings": typing.get_type_hints(DPFTSDESettings),
            "privacy": typing.get_type_hints(PrivacySettings),
        }
        parts: dict[str, dict[str, Any]] = {"run": {}, "settings": {}, "privacy": {}}
        for key, value in run_config.items():
            where, name = keys[key]
            parts[where][name] = read_value(key, name, value, hints[where][name])
        run = parts["run"]
        method = run.get("method", cls.method)
        try:
            check_value(cls, "method", method)  # first: the settings' algorithm is the method's
            algorithm = get_method(method, "dp_fts_de", key="method").name
            settings = DPFTSDESettings(algorithm=algorithm, **parts["settings"])
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

    @property
    def node_local(self) -> bool:
        """Whether each node evaluates its own objective (``objective = '{"type": "node", ...}'``)."""
        return self.objective.get("type") == NODE_LOCAL

    def check_objective(self, allowed: Collection[str] = frozenset()) -> None:
        r"""Refuse an objective this process did not choose to run, before anything is imported.

        Built-in objectives, names registered in this process and ``fbo_torch``'s own
        modules pass; a ``"module:Class"`` path passes only if it is in ``allowed``
        (:func:`allowed_objectives`: this node's or server's own configuration, never
        the run config).

        Raises:
            ValueError: The run config names code this process does not allow.
        """
        kind = self.objective.get("type")
        if not isinstance(kind, str) or kind in REGISTRY or kind == NODE_LOCAL:
            return
        if kind.partition(":")[0].split(".")[0] == "fbo_torch":
            return
        if kind not in allowed:
            raise ValueError(
                f"run config `objective` names {kind!r}: importing it would run that module's code here, and this "
                f"process allows only built-in objectives and the ones its own configuration lists; add it to the "
                f"node config `{ALLOW_OBJECTIVES_KEY}` (flower-supernode --node-config "
                f"\"{ALLOW_OBJECTIVES_KEY}='{kind}'\") or to ${ALLOW_OBJECTIVES_ENV} on every node and the server."
            )

    def build_objective(self) -> Any:
        r"""The federation's objective: the simulated one every node builds (node ``n`` evaluates agent
        ``n`` only), or, for node-local objectives, a :class:`FederationDomain` (bounds only)."""
        if self.node_local:
            return _node_local_domain(self.objective, self.num_agents)
        spec = dict(self.objective)
        spec.setdefault("agents_per_group", int(self.num_agents))
        obj = build_objective(spec)
        if obj.num_agents != self.num_agents:
            raise ValueError(f"the objective has {obj.num_agents} agents but `num-agents` is {self.num_agents}.")
        return obj

    def node_objective(self, node_config: Mapping[str, Any], agent_id: int) -> Objective:
        r"""What node ``agent_id`` evaluates, given its node config: agent ``n`` of the run's objective, or,
        in a federation of node-local objectives, the node's own (a :class:`NodeObjective`).

        Raises:
            ObjectiveMismatch: The node names no objective in a node-local federation, names one in a
                federation whose run config defines the objective, or its objective is not one agent's
                function on the federation's domain (its bounds, or the run config's ``parameters``).
            ValueError: Its objective cannot be built (the message says why, in one line).
        """
        spec = node_objective_spec(node_config)
        n = int(agent_id)
        if not self.node_local:
            if spec is not None:
                raise ObjectiveMismatch(
                    f"agent {n} names its own objective {spec['type']!r} in its node config, but this federation's "
                    "objective is the run config's; run the federation with objective = "
                    '\'{"type": "node", "bounds": ...}\' for node-local objectives, or drop the node\'s `objective`.'
                )
            return self.build_objective()
        domain = _node_local_domain(self.objective, self.num_agents)
        if spec is None:
            raise ObjectiveMismatch(
                f"agent {n} has no objective: this federation's objectives are node-local; start the SuperNode "
                f"with --node-config \"partition-id={n} objective='package.module:ClassName'\" (its own black box)."
            )
        try:
            own = build_objective(spec)
        except (TypeError, ValueError, OSError, ImportError, RuntimeError) as err:
            text = " ".join(str(err).split())
            raise ValueError(f"agent {n}: node config `objective` ({spec['type']}): {text}") from None
        name = f"agent {n}'s objective {spec['type']!r}"
        if own.num_agents != 1:
            raise ObjectiveMismatch(
                f"{name} has {own.num_agents} agents; a node's objective is one agent's function (num_agents = 1)."
            )
        bounds = own.bounds.detach().to("cpu", torch.float64)
        theirs = domain.bounds
        if bounds.shape != theirs.shape or not torch.allclose(bounds, theirs, rtol=1e-9, atol=1e-12):
            raise ObjectiveMismatch(f"{name} is {_describe(bounds)}; the federation's domain is {_describe(theirs)}.")
        if domain.search_space is not None and getattr(own, "search_space", None) != domain.search_space:
            mine = getattr(own, "search_space", None)
            raise ObjectiveMismatch(
                f"{name} searches {mine.to_config() if mine is not None else 'no named search space'}; the "
                f"federation's parameters are {domain.search_space.to_config()}."
            )
        return NodeObjective(own, n, self.num_agents)

    def build_domain(self, objective: Any) -> Domain:
        return Domain(objective.bounds, objective.candidates, **self.domain).to("cpu")

    @property
    def ledger_delta(self) -> float:
        """The ledger's δ: ``delta``, or the deployment default for ``N`` agents when unset."""
        delta = self.privacy.delta
        return float(delta) if delta is not None else deployment_delta(int(self.num_agents))

    #: Keys that do not change what the federation computes or releases (left out of its fingerprint; SecAgg+'s
    #: neighbourhoods and threshold change how the sum is computed, not the sum).
    TRANSPORT_KEYS = (
        "round_timeout",
        "min_nodes_timeout",
        "report_best",
        "summary_path",
        "secagg_num_shares",
        "secagg_threshold",
    )

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
