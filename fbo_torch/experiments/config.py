r"""YAML experiment configurations: schema, validation and resolution.

An experiment file looks like::

    experiment: fts              # fts | dp_fts_de
    name: fts_synthetic_fig1
    seed: 0
    objective: {type: gp_grid, num_groups: 5, agents_per_group: 51}
    runs: {num_inits: 5}
    history: {mode: random, t_n: 40}
    domain: {raw_samples: 1024, num_restarts: 8}   # the maximizer's options (Domain)
    defaults: {num_iterations: 50, p_t: 1-1/sqrt(t)}   # shared method settings
    scenarios:                   # optional: panels with overrides
      - name: "d_n = 0.02, t_n = 40"
        objective: {perturbation: 0.02}
        history: {t_n: 40}
        methods:
          - {name: TS, algorithm: ts}
          - {name: "FTS (M=50)", algorithm: fts, num_features: 50}

Without ``scenarios``, a top-level ``methods`` list forms one scenario.
``objective.type`` is a built-in name (:data:`fbo_torch.objectives.REGISTRY`), a name
added with :func:`fbo_torch.objectives.register`, or ``"package.module:ClassName"``
for a class of your own (the objective protocol: :mod:`fbo_torch.objectives.base`);
the section's other keys are its constructor's keyword arguments, checked against its signature.
Unknown keys and bad values raise :class:`ConfigError` naming the offending
entry (and the closest valid key).
"""  # noqa: D405, D411, D214  (``methods:`` above is a YAML key in an example, not a docstring section)

from __future__ import annotations

import copy
import dataclasses
import difflib
import inspect
import os
import re
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml

from fbo_torch.experiments import schema
from fbo_torch.simulate.presets import DEFAULT_SETUP, check_setup, objective_setup, setup_choices
from fbo_torch.utils.paths import shipped_example
from fbo_torch.utils.resources import memory_budget
from fbo_torch.utils.schema import (
    Choice,
    Integer,
    Optional,
    Rule,
    Seed,
    check_fields,
    document,
    read_typed,
    setting,
)

if TYPE_CHECKING:  # torch and the settings classes are imported where a config is resolved, not to check one
    from fbo_torch.federation.settings import HistorySettings, PrivacySettings
    from fbo_torch.optim.domain import Domain

TOP_KEYS = (
    "experiment",
    "name",
    "description",
    "seed",
    "device",
    "max_memory",
    "setup",
    "checkpoint_every",
    "max_failed_fraction",
    "objective",
    "runs",
    "history",
    "domain",
    "defaults",
    "scenarios",
    "methods",
    "privacy",
)
SCENARIO_KEYS = ("name", "setup", "objective", "history", "defaults", "methods", "runs")
#: The experiment kinds ``experiment:`` names (their method settings: :func:`settings_class`).
EXPERIMENT_KINDS = tuple(schema.SETTINGS_SOURCE)


def settings_class(experiment: str) -> type:
    """The settings class of an experiment kind's methods (``FTSSettings``, ``DPFTSDESettings``)."""
    from fbo_torch.federation import settings

    return cast(type, getattr(settings, schema.SETTINGS_SOURCE[experiment][1]))


class ConfigError(ValueError):
    """An experiment configuration is invalid; the message names the entry."""


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-6`` as a string; this loader reads it as a float."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """Parse YAML with floats such as ``1e-6`` read as numbers."""
    return yaml.load(text, Loader=_Loader)


def _suggest(key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_keys(where: str, section: dict[str, Any], allowed: list[str] | tuple[str, ...]) -> None:
    """``section`` must be a mapping of ``allowed`` keys (else a :class:`ConfigError` at ``where``)."""
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(section).__name__}.")
    allowed = list(allowed)
    for key in section:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {key!r}{_suggest(str(key), allowed)}; allowed: {sorted(allowed)}.")


def _hints(fn: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(
            cast(Any, fn).__init__ if isinstance(fn, type) and not dataclasses.is_dataclass(fn) else fn
        )
    except Exception:  # unresolvable forward references: leave those arguments unchecked
        return {}


def check_types(where: str, fn: Any, values: dict[str, Any]) -> None:
    r"""Values whose type does not fit ``fn``'s annotations (a dataclass or a callable) raise :class:`ConfigError`."""
    _check_hints(where, _hints(fn), values)


def _check_hints(where: str, hints: dict[str, Any], values: dict[str, Any]) -> None:
    for key, value in values.items():
        hint = hints.get(key)
        if hint is not None:
            try:
                read_typed(key, value, hint)
            except ValueError as err:
                raise ConfigError(f"{where}: {err}") from None


def build_dataclass(cls: type, values: dict[str, Any], where: str) -> Any:
    r"""Instantiate ``cls`` from ``values``, turning unknown keys, wrong types and bad values into
    :class:`ConfigError`."""
    names = [f.name for f in dataclasses.fields(cls)]
    check_keys(where, values, names)
    check_types(where, cls, values)
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from None


def check_callable_kwargs(where: str, fn: Any, kwargs: dict[str, Any], skip: tuple[str, ...] = ()) -> None:
    """Unknown keyword arguments of ``fn`` (a class or function), and values of the wrong type, raise
    :class:`ConfigError`."""
    params = inspect.signature(fn).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        allowed = [n for n in params if n not in ("self",) + skip]
        check_keys(where, kwargs, allowed)
    check_types(where, fn, kwargs)


def check_device(cfg: ExperimentConfig, override: str | None = None) -> None:
    r"""A ``cuda`` device (the config's ``device``, the ``--device`` override or ``objective.device``)
    without an available CUDA device raises :class:`ConfigError` naming the YAML key or flag."""
    import torch

    if torch.cuda.is_available():
        return
    src = cfg.source
    if override is not None:
        if str(override).startswith("cuda"):
            raise ConfigError(
                "--device cuda: no CUDA device is available here (torch.cuda.is_available() is "
                "False); use --device cpu."
            )
    elif str(cfg.device).startswith("cuda"):
        raise ConfigError(
            f"{src}: `device: {cfg.device}` but no CUDA device is available here "
            "(torch.cuda.is_available() is False); set `device: cpu` or pass --device cpu."
        )
    for i, sc in enumerate(cfg.scenarios):
        dev = sc.objective.get("device")
        if dev is not None and str(dev).startswith("cuda"):
            raise ConfigError(
                f"{src}: objective.device (scenario {i}, {sc.name!r}) is {dev!r} but no CUDA device "
                "is available here; set `device: cpu` in the objective."
            )


def _memory(key: str, value: Any) -> None:
    memory_budget(value, key)


def _failed_fraction(key: str, value: Any) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 < value <= 1):
        raise ValueError(
            f"`{key}` must be a number in (0, 1] (the fraction of a method's evaluations that may fail before the "
            f"run stops; 1: only when every one fails), got {value!r}."
        )


@document
@dataclasses.dataclass
class RunOptions:
    r"""The top-level keys of an experiment file that are no section: its seed and how it runs.

    Only ``seed`` changes results (:data:`~fbo_torch.experiments.outdir.NOT_FINGERPRINTED` lists the others
    that do not); ``max_memory`` is read into bytes.
    """

    seed: int = setting(0, "Every random stream of the run derives from it.", Seed())
    device: str = setting(
        "cpu", "``cpu`` or ``cuda``: where everything runs (``--device`` overrides it).", Choice(("cpu", "cuda"))
    )
    max_memory: int | None = setting(
        None,
        "Working-memory budget of a round: bytes or a size like ``4GiB`` (``--max-memory`` overrides it; null: "
        "half the free memory); agents beyond it run in chunks, with the same results.",
        Optional(Rule(_memory, "lots")),
    )
    checkpoint_every: int = setting(
        5, "Iterations between checkpoints (0: none), from which ``--resume`` continues.", Integer(minimum=0)
    )
    max_failed_fraction: float = setting(
        1.0,
        "A method stops when more than this fraction of its evaluations failed (1: only when every one did).",
        Rule(_failed_fraction, 1.5),
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.max_memory is not None:
            self.max_memory = memory_budget(self.max_memory)
        self.max_failed_fraction = float(self.max_failed_fraction)


def _targets(key: str, value: Any) -> None:
    if value != "auto" and not (
        isinstance(value, list) and value and all(isinstance(t, int) and t >= 0 for t in value)
    ):
        raise ValueError(f"`{key}` must be 'auto' or a non-empty list of agent indices, got {value!r}.")


@document
@dataclasses.dataclass
class RunsConfig:
    r"""Which repetitions to run (an experiment's ``runs:``)."""

    targets: Any = setting(
        "auto",
        "``auto`` (the objective's own targets, or the first ``num_targets`` agents), or an explicit list of "
        "agent indices (FTS).",
        Rule(_targets, []),
    )
    num_targets: int | None = setting(
        None, "With ``auto`` on objectives without built-in targets.", Optional(Integer(minimum=1))
    )
    num_inits: int = setting(
        5,
        "Random initializations per target (FTS), or repetitions of the whole federation (DP-FTS-DE); "
        "``--inits K`` overrides it. Each gets its own random streams derived from the file's ``seed``.",
        Integer(minimum=1),
    )

    def __post_init__(self) -> None:
        check_fields(self)


def check_domain(where: str, options: Any) -> dict[str, Any]:
    r"""The YAML ``domain:`` section: options of :class:`~fbo_torch.optim.domain.Domain`, validated by it
    (:class:`ConfigError` naming the key otherwise); returned with every default filled in, as YAML writes them."""
    from fbo_torch.optim.domain import DTYPE_OPTIONS, Domain, check_options, dtype_name

    check_keys(where, options, list(Domain.option_defaults()))
    check_types(where, Domain, options)
    try:
        checked = check_options(options)
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    out = {**Domain.option_defaults(), **checked}
    for name in DTYPE_OPTIONS:
        out[name] = dtype_name(out[name])
    return out


@dataclasses.dataclass
class Scenario:
    """One resolved panel of an experiment."""

    name: str
    objective: dict[str, Any]
    history: HistorySettings
    runs: RunsConfig
    methods: list[tuple[str, Any]]  # (label, settings dataclass)
    setup: str = DEFAULT_SETUP
    #: Where the scenario stands in the file, for messages (``"exp.yaml: scenarios[1]"``).
    where: str = "config"


@dataclasses.dataclass
class ExperimentConfig:
    """A resolved, validated experiment."""

    experiment: str
    name: str
    seed: int
    device: str
    checkpoint_every: int
    #: Options of the :class:`~fbo_torch.optim.domain.Domain` (every one, as YAML writes them).
    domain: dict[str, Any]
    privacy: PrivacySettings
    scenarios: list[Scenario]
    raw: dict[str, Any]
    source: str = "config"
    #: :attr:`RunOptions.max_memory`, in bytes.
    max_memory: int | None = RunOptions.max_memory
    #: :attr:`RunOptions.max_failed_fraction`.
    max_failed_fraction: float = RunOptions.max_failed_fraction

    def build_domain(self, objective: Any) -> Domain:
        """The :class:`~fbo_torch.optim.domain.Domain` of ``objective`` with this file's options (on the CPU)."""
        from fbo_torch.optim.domain import Domain

        return Domain(objective.bounds, objective.candidates, **self.domain)

    def resolved(self) -> dict[str, Any]:
        """The fully expanded configuration (what the CLI echoes and stores)."""
        return {
            "experiment": self.experiment,
            "name": self.name,
            "seed": self.seed,
            "device": self.device,
            "max_memory": self.max_memory,
            "checkpoint_every": self.checkpoint_every,
            "max_failed_fraction": self.max_failed_fraction,
            "domain": dict(self.domain),
            # an FTS experiment takes no `privacy` section: the resolution names it only where it applies
            **({"privacy": dataclasses.asdict(self.privacy)} if self.experiment == "dp_fts_de" else {}),
            "scenarios": [
                {
                    "name": s.name,
                    "setup": s.setup,
                    "objective": s.objective,
                    "history": dataclasses.asdict(s.history),
                    "runs": dataclasses.asdict(s.runs),
                    "methods": [{"name": n, **dataclasses.asdict(m)} for n, m in s.methods],
                }
                for s in self.scenarios
            ],
        }


def _merge(base: dict[str, Any] | None, over: dict[str, Any] | None) -> dict[str, Any]:
    out = copy.deepcopy(base or {})
    out.update(copy.deepcopy(over or {}))
    return out


def _setup(where: str, section: dict[str, Any], default: str) -> str:
    try:
        return check_setup(section.get("setup", default))
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None


def _fitting_preset(preset: dict[str, Any], algorithm: Any, settings_cls: type) -> dict[str, Any]:
    r"""A setup's choices without an ``own_acquisition`` the method's algorithm cannot take (``paper``'s
    Thompson sample for ``peer_prior``, which weights an analytic acquisition): the algorithm's own
    default stays. An unknown algorithm is left for the settings to refuse."""
    from fbo_torch.methods.base import get_method

    if "own_acquisition" not in preset:
        return preset
    name = algorithm if algorithm is not None else settings_cls.algorithm  # type: ignore[attr-defined]
    try:
        method = get_method(name, getattr(settings_cls, "KIND", None))
    except ValueError:
        return preset
    if preset["own_acquisition"] in method.own_acquisitions:
        return preset
    return {k: v for k, v in preset.items() if k != "own_acquisition"}


@dataclasses.dataclass
class CheckedConfig:
    """What :func:`check_config` read from a configuration mapping (before anything is resolved)."""

    experiment: str
    name: str
    seed: int
    device: str
    max_memory: int | None
    checkpoint_every: int
    max_failed_fraction: float
    setup: str
    #: ``(where, section, setup)`` of each scenario (a top-level ``methods`` list is one).
    scenarios: list[tuple[str, dict[str, Any], str]]


def check_method_keys(where: str, section: dict[str, Any], experiment: str) -> None:
    r"""Unknown method keys (in ``methods[j]`` or ``defaults``) raise :class:`ConfigError`; a key of the other
    experiment kind's methods is named as such (``agent_weights`` belongs to ``experiment: fts``)."""
    own = schema.settings_fields(experiment)
    for key in section if isinstance(section, dict) else ():
        others = [kind for kind in EXPERIMENT_KINDS if kind != experiment and key in schema.settings_fields(kind)]
        if key not in own and others:
            raise ConfigError(
                f"{where}: `{key}` is a method key of `experiment: {others[0]}`, not of `experiment: {experiment}`"
                f"{_suggest(str(key), list(own))}; allowed: {sorted(own)}."
            )
    check_keys(where, section, list(own))


def check_annotated(where: str, annotations: dict[str, str], values: dict[str, Any]) -> None:
    r"""Values whose type does not fit their field's annotation (source text, :mod:`~fbo_torch.experiments.schema`)
    raise :class:`ConfigError`, as :func:`check_types` does; annotations beyond builtin types are not checked."""
    hints = {k: schema.annotation_type(a) for k, a in annotations.items()}
    _check_hints(where, {k: h for k, h in hints.items() if h is not None}, values)


def check_config(raw: Any, source: str = "config") -> CheckedConfig:
    r"""Check what a configuration mapping can be checked for without importing torch: the keys of every
    section (from the settings classes' source, :mod:`~fbo_torch.experiments.schema`), the top-level values,
    the structure of ``scenarios`` and ``methods``, and the types of values whose fields have builtin types.
    :func:`parse_config` calls it first, so these mistakes are reported within a second.
    """
    if isinstance(raw, dict) and "optimizer" in raw:
        raise ConfigError(
            f"{source}: `optimizer` is now called `domain` (the options of fbo_torch.optim.Domain, "
            "the same keys); rename the section."
        )
    check_keys(source, raw, TOP_KEYS)
    experiment = raw.get("experiment")
    if experiment not in EXPERIMENT_KINDS:
        raise ConfigError(f"{source}: `experiment` must be one of {list(EXPERIMENT_KINDS)}, got {experiment!r}.")
    name = str(raw.get("name") or Path(source).stem)
    options = {f.name: raw[f.name] for f in dataclasses.fields(RunOptions) if f.name in raw}
    try:
        run = RunOptions(**options)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: {err}") from None
    top_setup = _setup(source, raw, DEFAULT_SETUP)
    for key, fields in (("domain", schema.domain_options()), ("privacy", schema.privacy_fields())):
        section = raw.get(key) or {}
        check_keys(f"{source}: {key}", section, list(fields))
        check_annotated(f"{source}: {key}", fields, section)
    if experiment == "fts" and raw.get("privacy"):
        raise ConfigError(f"{source}: `privacy` applies to `experiment: dp_fts_de` only.")
    for key in ("runs", "history", "defaults"):
        if raw.get(key) is not None and not isinstance(raw[key], dict):
            raise ConfigError(f"{source}: `{key}` must be a mapping, got {type(raw[key]).__name__}.")
    if raw.get("objective") is not None and not isinstance(raw["objective"], dict):
        raise ConfigError(
            f"{source}: `objective` must be a mapping with a `type`, got {type(raw['objective']).__name__}."
        )
    scenarios_raw = raw.get("scenarios")
    in_scenarios = scenarios_raw is not None
    if scenarios_raw is None:
        if not raw.get("methods"):
            raise ConfigError(f"{source}: give `methods` (a list) or `scenarios`.")
        scenarios_raw = [{"name": name, "methods": raw["methods"]}]
    elif raw.get("methods"):
        raise ConfigError(f"{source}: give either top-level `methods` or `scenarios`, not both.")
    if not isinstance(scenarios_raw, list) or not scenarios_raw:
        raise ConfigError(f"{source}: `scenarios` must be a non-empty list.")
    fields = schema.settings_fields(experiment)
    check_method_keys(f"{source}: defaults", raw.get("defaults") or {}, experiment)  # a typo is named where it is
    check_annotated(f"{source}: defaults", fields, raw.get("defaults") or {})
    scenarios = []
    for i, sc in enumerate(scenarios_raw):
        where = f"{source}: scenarios[{i}]" if in_scenarios else source
        check_keys(where, sc, SCENARIO_KEYS)
        for key in ("objective", "runs", "history", "defaults"):
            if sc.get(key) is not None and not isinstance(sc[key], dict):
                raise ConfigError(f"{where}: `{key}` must be a mapping, got {type(sc[key]).__name__}.")
        if "type" not in _merge(raw.get("objective"), sc.get("objective")):
            raise ConfigError(
                f"{where}: `objective` must be a mapping with a `type`, at the top level or in every scenario."
            )
        history = schema.history_fields()
        for part in (raw.get("history") or {}, sc.get("history") or {}):
            check_keys(f"{where}: history", part, list(history))
            check_annotated(f"{where}: history", history, part)
        build_dataclass(RunsConfig, _merge(raw.get("runs") or {}, sc.get("runs")), f"{where}: runs")
        check_method_keys(f"{where}: defaults", sc.get("defaults") or {}, experiment)
        check_annotated(f"{where}: defaults", fields, sc.get("defaults") or {})
        methods_raw = sc.get("methods")
        if not isinstance(methods_raw, list) or not methods_raw:
            raise ConfigError(f"{where}: `methods` must be a non-empty list.")
        labels = set()
        for j, m in enumerate(methods_raw):
            mw = f"{where}: methods[{j}]"
            if not isinstance(m, dict) or "name" not in m:
                raise ConfigError(f"{mw}: each method needs a `name`.")
            label = str(m["name"])
            if label in labels:
                raise ConfigError(f"{mw}: duplicate method name {label!r}.")
            labels.add(label)
            own = {k: v for k, v in m.items() if k != "name"}
            check_method_keys(mw, own, experiment)
            check_annotated(mw, fields, own)
        scenarios.append((where, sc, _setup(where, sc, top_setup)))
    return CheckedConfig(
        experiment,
        name,
        run.seed,
        run.device,
        run.max_memory,
        run.checkpoint_every,
        run.max_failed_fraction,
        top_setup,
        scenarios,
    )


def _blame(err: ConfigError, method: dict[str, Any], mw: str, defaults: list[tuple[str, dict[str, Any]]]) -> str:
    r"""The message of a method's settings error, naming the ``defaults`` section (and the method) when the key
    it names came from there rather than from the method itself."""
    text = str(err).removeprefix(f"{mw}: ")
    found = re.search(r"`([A-Za-z_][A-Za-z0-9_]*)", text)
    key = found.group(1) if found else None
    if key is None or key in method:
        return str(err)
    for where, section in reversed(defaults):  # the scenario's defaults override the file's
        if key in section:
            return f"{where}: {text.rstrip('.')} (in methods[{mw.rsplit('[', 1)[-1]} {method.get('name')!r})."
    return str(err)


def parse_config(raw: dict[str, Any], source: str = "config") -> ExperimentConfig:
    r"""Validate a configuration mapping and resolve scenarios and methods.

    Everything is checked here, before anything runs: first what needs no torch (:func:`check_config`:
    keys, top-level values, structure, builtin types), then what the settings classes and the objective's
    constructor check: value types (from their annotations), ranges, accountant names and setups. An error
    names the section the offending value is in (a method's own key, or the ``defaults`` it inherited).
    """
    checked = check_config(raw, source)  # first, and without torch: the mistakes it finds are named at once
    from fbo_torch.federation.settings import HistorySettings, PrivacySettings
    from fbo_torch.objectives import objective_class

    experiment = checked.experiment
    domain = check_domain(f"{source}: domain", raw.get("domain") or {})
    privacy = build_dataclass(PrivacySettings, raw.get("privacy") or {}, f"{source}: privacy")
    settings_cls = settings_class(experiment)
    scenarios = []
    for i, (where, sc, setup) in enumerate(checked.scenarios):
        objective = _merge(raw.get("objective"), sc.get("objective"))
        try:
            cls = objective_class(objective["type"])
        except ValueError as err:
            raise ConfigError(f"{where}: objective.type: {err}") from None
        objective = {
            "type": objective["type"],
            **objective_setup(objective["type"], setup),
            **{k: v for k, v in objective.items() if k != "type"},
        }
        kwargs = {k: v for k, v in objective.items() if k != "type"}
        check_callable_kwargs(f"{where}: objective ({objective['type']})", cls, kwargs)
        history = build_dataclass(
            HistorySettings, _merge(raw.get("history") or {}, sc.get("history")), f"{where}: history"
        )
        runs = build_dataclass(RunsConfig, _merge(raw.get("runs") or {}, sc.get("runs")), f"{where}: runs")
        defaults = _merge(raw.get("defaults") or {}, sc.get("defaults"))
        sources = [(f"{source}: defaults", raw.get("defaults") or {}), (f"{where}: defaults", sc.get("defaults") or {})]
        # the setup's choices first; `defaults` and the method's own keys override them
        preset = setup_choices(setup, settings_cls)
        methods = []
        for j, m in enumerate(sc["methods"]):
            mw = f"{where}: methods[{j}]"
            own = {k: v for k, v in m.items() if k != "name"}
            fitting = _fitting_preset(preset, own.get("algorithm", defaults.get("algorithm")), settings_cls)
            values = _merge(_merge(fitting, defaults), own)
            try:
                settings = build_dataclass(settings_cls, values, mw)
                if privacy.max_epsilon is not None and "max_epsilon" not in values and settings.is_private:
                    # privacy.max_epsilon: the budget of every method whose algorithm says it is private
                    settings = build_dataclass(settings_cls, {**values, "max_epsilon": privacy.max_epsilon}, mw)
            except ConfigError as err:
                raise ConfigError(_blame(err, m, mw, sources)) from None
            methods.append((str(m["name"]), settings))
        scenarios.append(
            Scenario(str(sc.get("name", f"scenario {i}")), objective, history, runs, methods, setup, where)
        )
    return ExperimentConfig(
        experiment,
        checked.name,
        checked.seed,
        checked.device,
        checked.checkpoint_every,
        domain,
        privacy,
        scenarios,
        raw,
        source,
        checked.max_memory,
        checked.max_failed_fraction,
    )


def _expand_env(value: Any, where: str) -> Any:
    """Expand ``${VAR}`` in string values; an unset variable is a clear error."""
    if isinstance(value, dict):
        return {k: _expand_env(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str) and "$" in value:
        for name in re.findall(r"\$\{(\w+)\}", value):
            if name not in os.environ:
                raise ConfigError(f"{where}: environment variable {name} is not set (used as ${{{name}}}).")
        return os.path.expandvars(value)
    return value


#: Limits on what a config file may expand to through YAML aliases (``*name``); real configs are far smaller.
MAX_DEPTH, MAX_VALUES = 100, 1_000_000


def check_structure(value: Any, source: str) -> None:
    r"""Refuse a parsed YAML tree that contains itself (``a: &a [*a]``: an anchor used inside its own
    value), nests deeper than :data:`MAX_DEPTH` or expands through aliases to more than
    :data:`MAX_VALUES` values, with a one-line :class:`ConfigError` naming the key."""
    stack: list[tuple[Any, str, frozenset[int]]] = [(value, "", frozenset())]
    count = 0
    while stack:
        node, key, above = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError(
                f"{source}: expands to more than {MAX_VALUES:,} values through YAML aliases "
                "(*name); write the values out instead."
            )
        if not isinstance(node, (dict, list)):
            continue
        shown = key or "the top level"
        if id(node) in above:
            raise ConfigError(
                f"{source}: `{shown}` is a YAML alias (*name) of a value that contains it, so it "
                "never ends; write the value out instead."
            )
        if len(above) >= MAX_DEPTH:
            raise ConfigError(f"{source}: `{shown}` is nested more than {MAX_DEPTH} levels deep.")
        inner = above | {id(node)}
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            sub = f"{key}[{k}]" if isinstance(node, list) else (f"{key}.{k}" if key else str(k))
            stack.append((v, sub, inner))


def _yaml_problem(err: yaml.YAMLError, text: str) -> str:
    """One line: what PyYAML found wrong, and where (with that line of ``text``)."""
    problem, mark = getattr(err, "problem", None), getattr(err, "problem_mark", None)
    if problem and mark is not None:
        lines = text.splitlines()
        line = lines[mark.line].strip() if mark.line < len(lines) else ""
        line = line if len(line) <= 100 else line[:97] + "..."
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1}" + (f": {line}" if line else "") + ")"
    lines = str(err).strip().splitlines()
    reason = lines[0] if lines else type(err).__name__
    position = getattr(err, "position", None)
    return f"{reason} (character {position})" if position is not None else reason


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate a YAML experiment file (``${VAR}`` values come from the environment)."""
    path = Path(path)
    if not path.is_file():
        shipped = shipped_example(path)
        hint = (
            f"; fbo_torch ships it as {shipped}: `fbo-torch examples DIR` copies the example configs into DIR "
            f"(then: fbo-torch run DIR/{shipped} --out ...)"
            if shipped is not None
            else ""
        )
        raise ConfigError(f"config file {str(path)!r} does not exist{hint}.")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: not a YAML text file (byte {err.start} is not UTF-8: {err.reason}); "
            "give an experiment .yaml file (see configs/)."
        ) from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the file ({err.strerror or err}).") from None
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(err, text)}.") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply.") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level.")
    check_structure(raw, str(path))
    return parse_config(_expand_env(raw, str(path)), source=str(path))
