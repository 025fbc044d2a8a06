"""Every setting has one default: YAML, a Flower run config and Python build the same settings."""

import dataclasses

import pytest
import torch

import fbo_torch.federation.settings as settings_module
from fbo_torch.experiments.config import parse_config
from fbo_torch.federation.settings import DPFTSDESettings, FTSSettings, MethodSettings, PrivacySettings
from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.optim.domain import Domain


def _yaml(experiment: str, **top):
    raw = {
        "experiment": experiment,
        "objective": {"type": "gp_grid", "num_groups": 1, "agents_per_group": 3},
        "methods": [{"name": "m"}],
        **top,
    }
    return parse_config(raw, "exp.yaml")


@pytest.mark.parametrize("experiment, cls", [("fts", FTSSettings), ("dp_fts_de", DPFTSDESettings)])
def test_yaml_method_without_keys_is_the_python_default(experiment, cls):
    cfg = _yaml(experiment)
    ((_, settings),) = cfg.scenarios[0].methods
    assert settings == cls()
    assert cfg.privacy == PrivacySettings()


def test_yaml_domain_and_flower_domain_are_domain_defaults():
    cfg = _yaml("dp_fts_de")
    bounds = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    python = Domain(bounds)
    assert cfg.build_domain(type("O", (), {"bounds": bounds, "candidates": None})()).options() == python.options()
    assert cfg.domain == python.options()
    flower = FlowerRunConfig.from_run_config({})
    assert Domain(bounds, **flower.domain).options() == python.options()
    assert python.screen_dtype is torch.float32 and python.options()["screen_dtype"] == "float32"


def test_flower_run_config_without_keys_is_the_python_default():
    cfg = FlowerRunConfig.from_run_config({})
    assert cfg.settings == DPFTSDESettings()
    assert cfg.privacy == PrivacySettings()
    assert cfg == FlowerRunConfig()
    assert cfg.num_rounds == DPFTSDESettings().num_iterations


def test_every_settings_field_is_a_flower_key_and_round_trips():
    keys = FlowerRunConfig.keys()
    fields = {f.name for f in dataclasses.fields(DPFTSDESettings)} - {"algorithm"}
    assert {name for where, name in keys.values() if where == "settings"} == fields
    assert keys["num-rounds"] == ("settings", "num_iterations") and "num-iterations" not in keys
    cfg = FlowerRunConfig.from_run_config(
        {
            "num-rounds": 7,
            "noise-multiplier": 0.5,
            "clip-norm": 2.0,
            "faults": '{"dropout_rate": 0.2}',
            "p-t": 0.25,
            "gp-kernel": "rbf",
            "delta": 1e-6,
            "domain": '{"raw_samples": 64}',
            "max-epsilon": 3.0,
        }
    )
    assert cfg.settings.num_iterations == 7 and cfg.settings.faults == {"dropout_rate": 0.2}
    assert cfg.settings.max_epsilon == 3.0 and cfg.privacy.delta == 1e-6 and cfg.domain == {"raw_samples": 64}
    assert FlowerRunConfig.from_run_config(cfg.to_run_config()) == cfg
    assert FlowerRunConfig.from_run_config(FlowerRunConfig().to_run_config()) == FlowerRunConfig()


def test_zero_means_none_only_where_documented():
    cfg = FlowerRunConfig.from_run_config({"clip-norm": 0, "max-epsilon": 0, "delta": 0})
    assert cfg.settings.clip_norm is None and cfg.settings.max_epsilon is None and cfg.privacy.delta is None
    assert cfg.ledger_delta == min(1e-5, 0.01 / cfg.num_agents)
    with pytest.raises(ValueError, match="`num-init` must be >= 1"):
        FlowerRunConfig.from_run_config({"num-init": 0})


def test_subclass_defaults_differ_only_where_the_module_table_says():
    base = {f.name: f.default for f in dataclasses.fields(MethodSettings)}
    documented = {"num_iterations", "num_init", "num_features", "p1_equals_p2", "gp_refit_every"}
    for cls in (FTSSettings, DPFTSDESettings):
        changed = {f.name for f in dataclasses.fields(cls) if f.name in base and f.default != base[f.name]}
        assert changed <= documented, cls
    for name in documented:
        assert f"``{name}``" in settings_module.__doc__
