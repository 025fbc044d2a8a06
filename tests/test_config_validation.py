"""Everything is validated at config load, before anything runs (issue 11, item 4)."""

import dataclasses

import pytest
import torch

from fbo_torch.cli import build_parser, main
from fbo_torch.experiments.config import ConfigError, load_config, parse_config
from fbo_torch.runners.dp_fts_de import DPFTSDESettings
from fbo_torch.runners.fts import FTSSettings

BASE = {
    "experiment": "dp_fts_de",
    "objective": {"type": "gp_grid", "num_groups": 1, "agents_per_group": 4, "grid_size": 50},
    "methods": [{"name": "TS", "algorithm": "ts"}],
}


def parse(**changes):
    raw = {**BASE, **changes}
    if "scenarios" in changes:
        del raw["methods"]
    return parse_config(raw, source="exp.yaml")


@pytest.mark.parametrize(
    "changes, match",
    [
        # unknown keys: the path and the valid keys
        ({"methods": [{"name": "a", "noise_multipler": 1.0}]},
         r"exp.yaml: methods\[0\]: unknown key 'noise_multipler' \(did you mean 'noise_multiplier'\?\); allowed: \[.*'gp_warm_start'"),
        ({"scenarios": [{"name": "s", "methods": [{"name": "a"}], "histroy": {}}]},
         r"exp.yaml: scenarios\[0\]: unknown key 'histroy'.*allowed: \[.*'history'"),
        ({"privacy": {"acountant": "rdp"}}, r"exp.yaml: privacy: unknown key 'acountant'.*allowed"),
        # method setting types, every field type-checked
        ({"methods": [{"name": "a", "gp_warm_start": "yes"}]}, r"methods\[0\]: `gp_warm_start` must be true or false, got 'yes'"),
        ({"methods": [{"name": "a", "num_iterations": "5"}]}, r"`num_iterations` must be an integer, got '5'"),
        ({"methods": [{"name": "a", "rff_lengthscale": "0.1"}]}, r"`rff_lengthscale` must be a number, got '0.1'"),
        ({"methods": [{"name": "a", "rff_normalize": 1}]}, r"`rff_normalize` must be true or false, got 1"),
        ({"methods": [{"name": "a", "clip_norm": "big"}]}, r"`clip_norm` must be a number or null, got 'big'"),
        ({"methods": [{"name": "a", "const_rounds": 2.5}]}, r"`const_rounds` must be an integer, got 2.5"),
        ({"methods": [{"name": "a", "faults": [0.1]}]}, r"`faults` must be a mapping or null"),
        # objective arguments and their types
        ({"objective": {"type": "gp_grid", "num_groups": "2"}}, r"objective \(gp_grid\): `num_groups` must be an integer, got '2'"),
        ({"objective": {"type": "gp_grid", "perturb_first": "no"}}, r"`perturb_first` must be true or false"),
        ({"objective": {"type": "gp_grid", "lenghtscale": 0.1}}, r"unknown key 'lenghtscale' \(did you mean 'lengthscale'\?\)"),
        # privacy
        ({"privacy": {"accountant": "moments"}}, r"privacy.accountant must be one of \[.*'rdp-classic'.*got 'moments'"),
        ({"privacy": {"extra_accountants": ["rdp", "prvv"]}}, r"privacy.extra_accountants\[1\] must be one of"),
        ({"privacy": {"delta": 1.5}}, r"privacy.delta must be a number in \(0, 1\)"),
        ({"privacy": {"max_epsilon": -1}}, r"privacy.max_epsilon must be a number > 0"),
        ({"experiment": "fts", "privacy": {"delta": 0.1}}, r"`privacy` applies to `experiment: dp_fts_de` only"),
        # setups and other sections
        ({"setup": "paper"}, r"exp.yaml: `setup` must be one of \['authors', 'modern'\], got 'paper'"),
        ({"scenarios": [{"name": "s", "setup": "x", "methods": [{"name": "a"}]}]}, r"scenarios\[0\]: `setup` must be one of"),
        ({"history": {"gp_kernel": "matern"}}, r"history: `gp_kernel` must be one of"),
        ({"runs": {"num_inits": "3"}}, r"runs: `num_inits` must be an integer"),
        ({"optimizer": {"lr": "fast"}}, r"optimizer: `lr` must be a number"),
        ({"seed": True}, r"`seed` must be a non-negative integer"),
        ({"runs": [1]}, r"`runs` must be a mapping"),
    ],
)
def test_config_errors_name_the_key(changes, match):
    with pytest.raises(ConfigError, match=match):
        parse(**changes)


def test_every_settings_field_is_accepted_from_yaml():
    for cls, experiment in ((DPFTSDESettings, "dp_fts_de"), (FTSSettings, "fts")):
        values = dataclasses.asdict(cls())
        values.update(gp_warm_start=True, gp_sample_features=None, faults={"dropout_rate": 0.1})
        if cls is DPFTSDESettings:
            values.update(noise_multiplier=1.0, clip_norm=2.0, max_epsilon=5.0)
        cfg = parse(experiment=experiment, methods=[{"name": "all", **values}])
        assert cfg.scenarios[0].methods[0][1] == cls(**values)


def test_setup_in_yaml_applies_the_preset_and_explicit_keys_win():
    cfg = parse(setup="authors", defaults={"gp_restarts": 2},
                scenarios=[{"name": "a", "methods": [{"name": "TS", "algorithm": "ts"}]},
                           {"name": "m", "setup": "modern", "methods": [{"name": "TS", "algorithm": "ts"}]}])
    authors, modern = (sc.methods[0][1] for sc in cfg.scenarios)
    assert (authors.gp_kernel, authors.gp_warm_start, authors.broadcast_maximization) == ("authors", True, "per_agent")
    assert authors.gp_restarts == 2  # `defaults` overrides the setup
    assert modern == DPFTSDESettings(algorithm="ts", gp_restarts=2)
    assert [s["setup"] for s in cfg.resolved()["scenarios"]] == ["authors", "modern"]
    land = parse(setup="authors", objective={"type": "landmine"})
    assert land.scenarios[0].objective["scoring"] == "platt"


def test_privacy_max_epsilon_is_the_private_methods_default():
    cfg = parse(privacy={"max_epsilon": 4.0}, methods=[
        {"name": "TS", "algorithm": "ts"},
        {"name": "DP", "noise_multiplier": 1.0, "clip_norm": 1.0},
        {"name": "DP own", "noise_multiplier": 1.0, "clip_norm": 1.0, "max_epsilon": 9.0}])
    assert [m.max_epsilon for _, m in cfg.scenarios[0].methods] == [None, 4.0, 9.0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_cuda_without_a_gpu_names_the_yaml_key_before_any_work(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("experiment: dp_fts_de\ndevice: cuda\nobjective: {type: gp_grid}\nmethods: [{name: TS, algorithm: ts}]\n")
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "`device: cuda`" in err and str(cfg) in err and "--device cpu" in err
    assert not out.exists()
    assert main(["run", str(cfg), "--out", str(out), "--device", "cuda"]) == 2
    assert "--device cuda" in capsys.readouterr().err
    cfg.write_text("experiment: dp_fts_de\nobjective: {type: digits_cnn, device: cuda}\nmethods: [{name: TS}]\n")
    assert main(["run", str(cfg), "--out", str(out)]) == 2
    assert "objective.device" in capsys.readouterr().err


def test_bad_config_fails_at_load_not_after_minutes(tmp_path, capsys, monkeypatch):
    import fbo_torch.experiments.run as run_mod

    monkeypatch.setattr(run_mod, "build_objective", lambda spec: pytest.fail("work started"))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("experiment: dp_fts_de\nobjective: {type: gp_grid}\nmethods:\n  - {name: TS, algorithm: ts}\n"
                   "  - {name: DP, sample_rate: 0.5, noise_multiplier: 1.0, clip_norm: 1.0, gp_warm_start: 'no'}\n")
    assert main(["run", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "methods[1]: `gp_warm_start` must be true or false" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, flag, says",
    [
        (["-q", "0", "-z", "1", "-T", "10", "-N", "5"], "--sample-rate/-q", "0 < q <= 1"),
        (["-q", "1.5", "-z", "1", "-T", "10", "-N", "5"], "--sample-rate/-q", "0 < q <= 1"),
        (["-q", "abc", "-z", "1", "-T", "10", "-N", "5"], "--sample-rate/-q", "expected a number"),
        (["-q", "0.5", "-z", "0", "-T", "10", "-N", "5"], "--noise-multiplier/-z", "z > 0"),
        (["-q", "0.5", "-z", "-1", "-T", "10", "-N", "5"], "--noise-multiplier/-z", "z > 0"),
        (["-q", "0.5", "-z", "1", "-T", "0", "-N", "5"], "--steps/-T", "integer >= 1"),
        (["-q", "0.5", "-z", "1", "-T", "2.5", "-N", "5"], "--steps/-T", "integer >= 1"),
        (["-q", "0.5", "-z", "1", "-T", "10", "--delta", "1"], "--delta", "0 < delta < 1"),
        (["-q", "0.5", "-z", "1", "-T", "10", "--delta", "0"], "--delta", "0 < delta < 1"),
        (["-q", "0.5", "-z", "1", "-T", "10", "-N", "0"], "--num-agents/-N", "integer >= 1"),
        (["-q", "0.5", "-z", "1", "-T", "10"], "--delta or --num-agents", "give"),
    ],
)
def test_privacy_rejects_bad_flags_naming_them(capsys, args, flag, says):
    with pytest.raises(SystemExit) as e:
        main(["privacy", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "fbo-torch privacy: error:" in err and flag in err and says in err, err


def test_every_option_has_help():
    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions)
    for name, p in sub.choices.items():
        for action in p._actions:
            assert action.help, f"fbo-torch {name} {action.option_strings or action.dest} has no help text"


def test_bare_command_prints_help_and_fails(capsys):
    assert main([]) == 2  # the console script exits with main()'s return value
    err = capsys.readouterr().err
    assert "usage: fbo-torch" in err and "quickstart" in err and "give a COMMAND" in err
