"""The settings schema, walked: every field is declared once with a doc, a check and a default that passes
it, and a value its check refuses is refused with the same message from Python, YAML and a Flower run config
(which only prefix where the value came from and spell the key their way)."""

import dataclasses

import pytest

import fbo_torch.federation.settings as settings_module
from fbo_torch.experiments.config import ConfigError, RunOptions, RunsConfig, parse_config
from fbo_torch.federation.settings import (
    KIND_DEFAULTS,
    SETTINGS_CLASSES,
    DPFTSDESettings,
    FTSSettings,
    HistorySettings,
    MethodSettings,
    PrivacySettings,
)
from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.flower.floor import PREFIX, PrivacyFloor, PrivacyFloorError
from fbo_torch.utils.schema import CHECK, DOC, Check, Text, declared

FIELDS = [(cls, f) for cls in SETTINGS_CLASSES for f in dataclasses.fields(cls)]


def _id(case):
    cls, f = case
    return f"{cls.__name__}.{f.name}"


def _default(f):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _python_message(cls, name, value):
    with pytest.raises((ValueError, TypeError)) as info:
        cls(**{name: value})
    return str(info.value)


@pytest.mark.parametrize("case", FIELDS, ids=_id)
def test_every_field_has_a_doc_a_check_and_a_default_it_passes(case):
    cls, f = case
    assert set(f.metadata) == {DOC, CHECK}, "declare it with fbo_torch.utils.schema.setting"
    assert isinstance(f.metadata[DOC], str) and f.metadata[DOC].strip().endswith(".")
    assert isinstance(f.metadata[CHECK], Check)
    f.metadata[CHECK](f.name, _default(f))
    assert f"        {f.name}: " in cls.__doc__  # the generated Attributes section


@pytest.mark.parametrize("case", FIELDS, ids=_id)
def test_every_check_refuses_a_bad_value_naming_the_key(case):
    cls, f = case
    bad = f.metadata[CHECK].refused()
    with pytest.raises((ValueError, TypeError), match=f"`{f.name}"):
        f.metadata[CHECK](f.name, bad)
    if cls is not MethodSettings:  # an abstract base: its subclasses are built from YAML and TOML
        assert f"`{f.name}" in _python_message(cls, f.name, bad)


def _yaml_message(cls, name, value):
    experiment = "fts" if cls in (FTSSettings, HistorySettings) else "dp_fts_de"
    raw = {
        "experiment": experiment,
        "objective": {"type": "gp_grid", "num_groups": 1, "agents_per_group": 3},
        "methods": [{"name": "m"}],
    }
    where = "exp.yaml: methods[0]"
    if cls is HistorySettings:
        raw["history"], where = {name: value}, "exp.yaml: history"
    elif cls is PrivacySettings:
        raw["privacy"], where = {name: value}, "exp.yaml: privacy"
    else:
        raw["methods"] = [{"name": "m", name: value}]
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "exp.yaml")
    return where, str(info.value)


@pytest.mark.parametrize("case", [c for c in FIELDS if c[0] is not MethodSettings], ids=_id)
def test_yaml_refuses_with_the_python_message(case):
    cls, f = case
    bad = f.metadata[CHECK].refused()
    where, message = _yaml_message(cls, f.name, bad)
    assert message == f"{where}: {_python_message(cls, f.name, bad)}"


FLOWER_KEYS = {(where, name): key for key, (where, name) in FlowerRunConfig.keys().items()}


@pytest.mark.parametrize(
    "case",
    [c for c in FIELDS if (c[0], c[1].name) in [(DPFTSDESettings, n) for w, n in FLOWER_KEYS if w == "settings"]]
    + [c for c in FIELDS if (c[0], c[1].name) in [(PrivacySettings, n) for w, n in FLOWER_KEYS if w == "privacy"]],
    ids=_id,
)
def test_a_flower_run_config_refuses_with_the_python_message(case):
    cls, f = case
    key = FLOWER_KEYS["settings" if cls is DPFTSDESettings else "privacy", f.name]
    bad = f.metadata[CHECK].refused()
    with pytest.raises(ValueError) as info:
        FlowerRunConfig.from_run_config({key: bad})
    expected = _python_message(cls, f.name, bad).replace(f"`{f.name}`", f"`{key}`")
    assert str(info.value) == f"run config: {expected}"


RUN_FIELDS = [f for f in dataclasses.fields(FlowerRunConfig) if f.name not in ("settings", "privacy")]


@pytest.mark.parametrize("f", RUN_FIELDS, ids=lambda f: f.name)
def test_the_flower_run_config_s_own_keys_are_declared_and_refused_the_same_way_from_toml(f):
    assert set(f.metadata) == {DOC, CHECK} and f.metadata[DOC].strip().endswith(".")
    assert f"        {f.name}: " in FlowerRunConfig.__doc__
    f.metadata[CHECK](f.name, _default(f))
    key = FLOWER_KEYS["run", f.name]
    bad = f.metadata[CHECK].refused()
    with pytest.raises((ValueError, TypeError)) as python:
        FlowerRunConfig(**{f.name: bad})
    assert str(python.value).startswith(f"run config: `{key}`")
    if isinstance(f.metadata[CHECK], Text):
        return  # TOML spells any scalar as the string it holds
    with pytest.raises(ValueError) as toml:
        FlowerRunConfig.from_run_config({key: bad})
    assert str(toml.value) == str(python.value)


@pytest.mark.parametrize(
    "case", [(cls, f) for cls in (RunOptions, RunsConfig) for f in dataclasses.fields(cls)], ids=_id
)
def test_the_experiment_file_s_top_level_keys_and_runs_are_declared_and_refused_the_same_way(case):
    cls, f = case
    assert set(f.metadata) == {DOC, CHECK} and f.metadata[DOC].strip().endswith(".")
    assert f"        {f.name}: " in cls.__doc__
    f.metadata[CHECK](f.name, _default(f))
    bad = f.metadata[CHECK].refused()
    raw = {"experiment": "fts", "objective": {"type": "gp_grid"}, "methods": [{"name": "m"}]}
    where = "exp.yaml"
    if cls is RunsConfig:
        raw["runs"], where = {f.name: bad}, "exp.yaml: runs"
    else:
        raw[f.name] = bad
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "exp.yaml")
    assert str(info.value) == f"{where}: {_python_message(cls, f.name, bad)}"


@pytest.mark.parametrize("f", dataclasses.fields(PrivacyFloor), ids=lambda f: f.name)
def test_a_node_s_privacy_floor_is_declared_and_refused_the_same_way_from_its_node_config(f):
    assert set(f.metadata) == {DOC, CHECK} and f.metadata[DOC].strip().endswith(".")
    assert f"        {f.name}: " in PrivacyFloor.__doc__
    f.metadata[CHECK](f.name, _default(f))
    key = PREFIX + f.name.replace("_", "-")
    bad = f.metadata[CHECK].refused()
    with pytest.raises(PrivacyFloorError) as python:
        PrivacyFloor(**{f.name: bad})
    assert str(python.value).startswith(f"node config: `{key}`")
    with pytest.raises(PrivacyFloorError) as node:
        PrivacyFloor.from_node_config({key: bad})
    assert str(node.value) == str(python.value)


def test_kind_defaults_are_one_table_and_the_module_docstring_shows_it():
    base = {f.name: _default(f) for f in dataclasses.fields(MethodSettings)}
    for cls in (FTSSettings, DPFTSDESettings):
        changed = {f.name: f.default for f in dataclasses.fields(cls) if f.name in base and f.default != base[f.name]}
        assert changed == KIND_DEFAULTS[cls.KIND]
        # a kind's default keeps the field's doc and check
        for name in changed:
            assert {f.name: f for f in dataclasses.fields(cls)}[name].metadata == {
                f.name: f for f in dataclasses.fields(MethodSettings)
            }[name].metadata
    for name, value in KIND_DEFAULTS["dp_fts_de"].items():
        shown = str(value).lower()
        row = next(line for line in settings_module.__doc__.splitlines() if line.startswith(f"``{name}``"))
        assert row.split()[1:] == [str(base[name]).lower(), shown], row


def test_every_settings_class_is_walked():
    classes = {
        obj
        for obj in vars(settings_module).values()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == settings_module.__name__
    }
    assert classes == set(SETTINGS_CLASSES)
    assert all(declared(cls) == list(dataclasses.fields(cls)) for cls in SETTINGS_CLASSES)
