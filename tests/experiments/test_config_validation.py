"""Everything is validated at config load, before anything runs."""

import dataclasses
import math

import pytest
import torch

from fbo_torch.cli import build_parser, main
from fbo_torch.experiments.config import ConfigError, parse_config
from fbo_torch.federation.settings import DPFTSDESettings, FTSSettings
from fbo_torch.simulate.presets import PAPER

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
        (
            {"methods": [{"name": "a", "noise_multipler": 1.0}]},
            r"exp.yaml: methods\[0\]: unknown key 'noise_multipler' \(did you mean 'noise_multiplier'\?\); allowed: \[.*'gp_warm_start'",  # noqa: E501
        ),
        (
            {"scenarios": [{"name": "s", "methods": [{"name": "a"}], "histroy": {}}]},
            r"exp.yaml: scenarios\[0\]: unknown key 'histroy'.*allowed: \[.*'history'",
        ),
        ({"privacy": {"acountant": "rdp"}}, r"exp.yaml: privacy: unknown key 'acountant'.*allowed"),
        # a typo in `defaults` is named where it is, not under the first method that inherits it
        ({"defaults": {"num_initt": 2}}, r"^exp.yaml: defaults: unknown key 'num_initt' \(did you mean 'num_init'\?\)"),
        (
            {"scenarios": [{"name": "s", "methods": [{"name": "a"}], "defaults": {"p_tt": 1}}]},
            r"^exp.yaml: scenarios\[0\]: defaults: unknown key 'p_tt' \(did you mean 'p_t'\?\)",
        ),
        # method setting types, every field type-checked
        (
            {"methods": [{"name": "a", "gp_warm_start": "yes"}]},
            r"methods\[0\]: `gp_warm_start` must be true or false, got 'yes'",
        ),
        ({"methods": [{"name": "a", "num_iterations": "5"}]}, r"`num_iterations` must be an integer, got '5'"),
        ({"methods": [{"name": "a", "rff_lengthscale": "0.1"}]}, r"`rff_lengthscale` must be a number, got '0.1'"),
        ({"methods": [{"name": "a", "rff_normalize": 1}]}, r"`rff_normalize` must be true or false, got 1"),
        ({"methods": [{"name": "a", "clip_norm": "big"}]}, r"`clip_norm` must be a number or null, got 'big'"),
        ({"methods": [{"name": "a", "const_rounds": 2.5}]}, r"`const_rounds` must be an integer, got 2.5"),
        ({"methods": [{"name": "a", "faults": [0.1]}]}, r"`faults` must be a mapping or null"),
        # objective arguments and their types
        (
            {"objective": {"type": "gp_grid", "num_groups": "2"}},
            r"objective \(gp_grid\): `num_groups` must be an integer, got '2'",
        ),
        ({"objective": {"type": "gp_grid", "perturb_first": "no"}}, r"`perturb_first` must be true or false"),
        (
            {"objective": {"type": "gp_grid", "lenghtscale": 0.1}},
            r"unknown key 'lenghtscale' \(did you mean 'lengthscale'\?\)",
        ),
        # privacy
        (
            {"privacy": {"accountant": "moments"}},
            r"privacy: `accountant` must be one of \[.*'rdp-classic'.*got 'moments'",
        ),
        ({"privacy": {"extra_accountants": ["rdp", "prvv"]}}, r"privacy: `extra_accountants\[1\]` must be one of"),
        ({"privacy": {"delta": 1.5}}, r"privacy: `delta` must lie in \(0, 1\)"),
        ({"privacy": {"max_epsilon": -1}}, r"privacy: `max_epsilon` must be a finite number > 0"),
        ({"experiment": "fts", "privacy": {"delta": 0.1}}, r"`privacy` applies to `experiment: dp_fts_de` only"),
        # setups and other sections
        (
            {"setup": "papers"},
            r"exp.yaml: `setup` must be one of \['authors', 'engine', 'modern', 'paper'\], got 'papers'",
        ),
        (
            {"scenarios": [{"name": "s", "setup": "x", "methods": [{"name": "a"}]}]},
            r"scenarios\[0\]: `setup` must be one of",
        ),
        ({"history": {"gp_kernel": "matern"}}, r"history: `gp_kernel` must be one of"),
        ({"runs": {"num_inits": "3"}}, r"runs: `num_inits` must be an integer"),
        ({"domain": {"lr": "fast"}}, r"domain: `lr` must be a number"),
        ({"optimizer": {"lr": 0.1}}, r"`optimizer` is now called `domain`"),
        ({"seed": True}, r"`seed` must be an integer in \[0, 2\^63\)"),
        ({"seed": 2**64}, r"`seed` must be an integer in \[0, 2\^63\), got 18446744073709551616"),  # was accepted
        ({"runs": [1]}, r"`runs` must be a mapping"),
        ({"objective": [1]}, r"exp.yaml: `objective` must be a mapping with a `type`, got list"),
        (
            {"objective": {"num_groups": 1}},
            r"exp.yaml: `objective` must be a mapping with a `type`, at the top level or in every scenario",
        ),
        (
            {
                "objective": None,
                "scenarios": [
                    {"name": "a", "objective": dict(BASE["objective"]), "methods": [{"name": "TS"}]},
                    {"name": "b", "methods": [{"name": "TS"}]},
                ],
            },
            r"scenarios\[1\]: `objective` must be a mapping with a `type`, at the top level or in every scenario",
        ),
    ],
)
def test_config_errors_name_the_key(changes, match):
    with pytest.raises(ConfigError, match=match):
        parse(**changes)


def test_every_settings_field_is_accepted_from_yaml():
    for cls, experiment in ((DPFTSDESettings, "dp_fts_de"), (FTSSettings, "fts")):
        values = dataclasses.asdict(cls())
        values.update(gp_warm_start=True, gp_sample_features=None, faults={"eval_failure_rate": 0.1})
        if cls is DPFTSDESettings:
            values.update(
                noise_multiplier=1.0,
                clip_norm=2.0,
                max_epsilon=5.0,
                faults={"eval_failure_rate": 0.1, "dropout_rate": 0.1, "byzantine_rate": 0.1, "byzantine_kind": "inf"},
            )
        cfg = parse(experiment=experiment, methods=[{"name": "all", **values}])
        assert cfg.scenarios[0].methods[0][1] == cls(**values)


def test_setup_in_yaml_applies_the_preset_and_explicit_keys_win():
    cfg = parse(
        setup="authors",
        defaults={"gp_restarts": 2},
        scenarios=[
            {"name": "a", "methods": [{"name": "TS", "algorithm": "ts"}]},
            {"name": "m", "setup": "modern", "methods": [{"name": "TS", "algorithm": "ts"}]},
        ],
    )
    authors, modern = (sc.methods[0][1] for sc in cfg.scenarios)
    assert (authors.gp_kernel, authors.gp_warm_start, authors.broadcast_maximization) == ("authors", True, "per_agent")
    assert authors.gp_restarts == 2  # `defaults` overrides the setup
    assert modern == DPFTSDESettings(algorithm="ts", gp_restarts=2, **PAPER)  # "modern": the papers' agents
    assert [s["setup"] for s in cfg.resolved()["scenarios"]] == ["authors", "modern"]
    land = parse(setup="authors", objective={"type": "landmine"})
    assert land.scenarios[0].objective["scoring"] == "platt"


def test_privacy_max_epsilon_is_the_private_methods_default():
    cfg = parse(
        privacy={"max_epsilon": 4.0},
        methods=[
            {"name": "TS", "algorithm": "ts"},
            {"name": "DP", "noise_multiplier": 1.0, "clip_norm": 1.0},
            {"name": "DP own", "noise_multiplier": 1.0, "clip_norm": 1.0, "max_epsilon": 9.0},
        ],
    )
    assert [m.max_epsilon for _, m in cfg.scenarios[0].methods] == [None, 4.0, 9.0]
    # the algorithm says what is private, not `noise_multiplier > 0`: TS releases nothing, whatever its z
    cfg = parse(
        privacy={"max_epsilon": 4.0},
        methods=[{"name": "TS", "algorithm": "ts", "noise_multiplier": 1.0, "clip_norm": 1.0}],
    )
    assert [m.max_epsilon for _, m in cfg.scenarios[0].methods] == [None]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_cuda_without_a_gpu_names_the_yaml_key_before_any_work(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "experiment: dp_fts_de\ndevice: cuda\nobjective: {type: gp_grid}\nmethods: [{name: TS, algorithm: ts}]\n"
    )
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
    import fbo_torch.experiments.loop as loop

    monkeypatch.setattr(loop, "build_objective", lambda spec, **kwargs: pytest.fail("work started"))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "experiment: dp_fts_de\nobjective: {type: gp_grid}\nmethods:\n  - {name: TS, algorithm: ts}\n"
        "  - {name: DP, sample_rate: 0.5, noise_multiplier: 1.0, clip_norm: 1.0, gp_warm_start: 'no'}\n"
    )
    assert main(["run", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "methods[1]: `gp_warm_start` must be true or false" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, flag, says",
    [
        (["-q", "0", "-z", "1", "-T", "10", "-N", "5"], "--sample-rate/-q", "must lie in (0, 1], got 0.0"),
        (["-q", "1.5", "-z", "1", "-T", "10", "-N", "5"], "--sample-rate/-q", "must lie in (0, 1], got 1.5"),
        (["-q", "abc", "-z", "1", "-T", "10", "-N", "5"], "--sample-rate/-q", "must be a number, got 'abc'"),
        (["-q", "0.5", "-z", "inf", "-T", "10", "-N", "5"], "--noise-multiplier/-z", "finite and >= 0, got inf"),
        (["-q", "0.5", "-z", "-1", "-T", "10", "-N", "5"], "--noise-multiplier/-z", "finite and >= 0, got -1.0"),
        (["-q", "0.5", "-z", "1", "-T", "0", "-N", "5"], "--steps/-T", "must be >= 1, got 0"),
        (["-q", "0.5", "-z", "1", "-T", "2.5", "-N", "5"], "--steps/-T", "must be an integer, got '2.5'"),
        (["-q", "0.5", "-z", "1", "-T", "10", "--delta", "1"], "--delta", "must lie in (0, 1), got 1.0"),
        (["-q", "0.5", "-z", "1", "-T", "10", "--delta", "0"], "--delta", "must lie in (0, 1), got 0.0"),
        (["-q", "0.5", "-z", "1", "-T", "10", "-N", "1"], "--num-agents/-N", "must be >= 2, got 1"),
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


# ------------------------------------------------- checked before --out is created

TINY = """\
experiment: dp_fts_de
objective: {type: gp_grid, num_groups: 1, agents_per_group: 4, grid_size: 50}
defaults: {num_iterations: 2, num_init: 2, num_features: 10, gp_refit_every: 0}
methods:
  - {name: DP, algorithm: fts_de, num_regions: 2, sample_rate: 0.5, noise_multiplier: 1.0, clip_norm: 1.0}
"""
TINY_FTS = """\
experiment: fts
objective: {type: gp_grid, num_groups: 1, agents_per_group: 3, grid_size: 50}
history: {t_n: 3}
defaults: {num_iterations: 2, num_features: 10, gp_refit_every: 0}
methods:
  - {name: TS, algorithm: ts}
  - {name: FTS, algorithm: fts}
"""


@pytest.mark.parametrize(
    "text, says",
    [
        (
            TINY.replace("clip_norm: 1.0", "clip_norm: .inf"),
            "methods[0]: `clip_norm` must be finite when `noise_multiplier` > 0",
        ),
        (
            TINY.replace("agents_per_group: 4", "agents_per_group: 1"),
            "methods[0] ('DP'): a private method (`noise_multiplier` 1.0) with `privacy.delta` null takes δ = 1/N^1.1, "
            "which needs N >= 2 agents, but the objective has 1",
        ),
        (
            TINY.replace("num_regions: 2", "num_regions: 100"),
            "methods[0] ('DP'): `num_regions: 100` is too many for the objective's 50 candidate points",
        ),
        (
            TINY.replace(
                "{type: gp_grid, num_groups: 1, agents_per_group: 4, grid_size: 50}",
                "{type: landmine, path: /no/such/LandmineData.mat}",
            ),
            "objective (landmine): LandmineData.mat not found (given as `path`). Looked in: /no/such/LandmineData.mat;",
        ),
        (
            TINY.replace(
                "{type: gp_grid, num_groups: 1, agents_per_group: 4, grid_size: 50}", "{type: har, path: /no/such/har}"
            ),
            "objective (har): UCI HAR data set not found under /no/such/har",
        ),
        (TINY.replace("num_groups: 1", "num_groups: 0"), "objective (gp_grid): `num_groups` must be >= 1, got 0."),
        (
            TINY_FTS.replace("agents_per_group: 3", "agents_per_group: 1"),
            "methods[1] ('FTS', algorithm fts): target agent(s) [0] have no other agent of its group",
        ),
        (TINY_FTS.replace("history:", "runs: {targets: [5]}\nhistory:"), "runs.targets [5] exceed the objective's 3"),
        # before: the process grew to 22.7 GB until the kernel killed it
        (
            TINY.replace("num_iterations: 2", "num_iterations: 1000000000"),
            "methods[0] ('DP'): `num_iterations: 1000000000`: 20 agent(s) at once (5 init(s)), 1000000000 iterations",
        ),
        (
            TINY_FTS.replace("num_features: 10", "num_features: 10000000"),
            "methods[1] ('FTS'): `num_features: 10000000`: ",
        ),
        (
            TINY.replace("clip_norm: 1.0}", "clip_norm: 1.0, aggregation: secure, dropout_tolerance: 0.9}"),
            "methods[0] ('DP'): `dropout_tolerance` leaves min_survivors = 1; secure aggregation needs 2 <= ",
        ),
        (
            TINY_FTS.replace("{name: FTS, algorithm: fts}", "{name: FTS, algorithm: fts, reciprocity: true}"),
            "methods[1] ('FTS'): `reciprocity` ties what an agent receives to what it sends, so every agent must "
            "both send and follow: it needs `history.mode: together`, got 'random'.",
        ),
        (
            TINY_FTS.replace("{name: FTS, algorithm: fts}", "{name: FTS, algorithm: fts, fairness: 1.0}"),
            "methods[1] ('FTS'): `fairness` ranks the incumbents of a federation's agents, so they must optimize "
            "together: it needs `history.mode: together`, got 'random'.",
        ),
        (
            TINY_FTS.replace(
                "{name: FTS, algorithm: fts}", "{name: FTS, algorithm: fts, free_riders: {agents: [1, 3], kind: noise}}"
            ),
            "methods[1] ('FTS'): `free_riders.agents` names agent(s) [3], but the objective has 3 agents.",
        ),
    ],
    ids=[
        "infinite-S",
        "one-agent-private",
        "too-many-regions",
        "landmine-file",
        "har-files",
        "objective-argument",
        "fts-without-peers",
        "targets",
        "memory-iterations",
        "memory-features",
        "secure-survivors",
        "reciprocity-not-together",
        "fairness-not-together",
        "free-rider-out-of-range",
    ],
)
def test_what_needs_the_objective_is_refused_before_out_exists(tmp_path, capsys, text, says):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {cfg}") and says in captured.err, captured.err
    assert len(captured.err.strip().splitlines()) == 1 and "# resolved config" not in captured.out
    assert not out.exists()


def test_a_refused_config_deletes_nothing_with_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("{}")
    (out / "run.json").write_text('{"files": ["results.json", "run.json"], "written": {}}')
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY.replace("num_regions: 2", "num_regions: 100"))
    assert main(["run", str(cfg), "--out", str(out), "--overwrite", "--no-progress"]) == 2
    assert "is too many" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [".lock", "results.json", "run.json"]


@pytest.mark.parametrize(
    "method, says",
    [
        ({"noise_multiplier": math.inf, "clip_norm": 1.0}, "`noise_multiplier` must be finite and >= 0, got inf"),
        ({"noise_multiplier": 1.0, "clip_norm": 1.0, "max_epsilon": math.inf}, "`max_epsilon` must be a finite number"),
        ({"num_regions": 2, "weight_a": 0.5}, "`weight_a` must be a finite number >= `weight_b` (1.0), got 0.5"),
        ({"num_regions": 2, "weight_b": 0.0}, "`weight_b` must be a finite number > 0, got 0.0"),
        ({"num_regions": 2, "decay_rounds": -1}, "`decay_rounds` must be >= 0, got -1"),
        ({"experiment": "fts", "faults": {"byzantine_rate": 0.2}}, "`faults.byzantine_rate` applies to DP-FTS-DE"),
        ({"faults": {"byzantine_rate": 0.2, "byzantine_kind": "loud"}}, "`faults.byzantine_kind` must be one of"),
        ({"rff_lengthscale": 0.0}, "`rff_lengthscale` must be a finite number > 0"),
        ({"rff_outputscale": math.nan}, "`rff_outputscale` must be a finite number > 0"),
        ({"rff_noise_variance": -1.0}, "`rff_noise_variance` must be a finite number > 0"),
        ({"rff_seed": 2**64}, "`rff_seed` must be a signed 64-bit integer"),
        ({"experiment": "fts", "algorithm": "taf", "taf_bandwidth": math.inf}, "`taf_bandwidth` must be a finite"),
    ],
)
def test_values_the_runners_refuse_are_named_at_load(method, says):
    method = dict(method)
    experiment = method.pop("experiment", "dp_fts_de")
    with pytest.raises(ConfigError) as err:
        parse(experiment=experiment, methods=[{"name": "m", **method}])
    assert str(err.value).startswith("exp.yaml: methods[0]: ") and says in str(err.value), str(err.value)


BOMB = "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10) if i else ', '.join(['x'] * 10)}]\n" for i in range(7))


@pytest.mark.parametrize(
    "content, says",
    [
        (bytes(range(256)) * 4, "not a YAML text file (byte 128 is not UTF-8: invalid start byte)"),
        (b"experiment: fts\nname: \xff\xfe\n", "not a YAML text file (byte 22 is not UTF-8"),
        (b"experiment: fts\x00\n", "not valid YAML: unacceptable character #x0000"),
        (b"a: &a [*a]\n", "`a[0]` is a YAML alias (*name) of a value that contains it"),
        (
            b"experiment: fts\nobjective: &o {type: gp_grid, num_groups: [1, *o]}\nmethods: [{name: TS}]\n",
            "`objective.num_groups[1]` is a YAML alias (*name) of a value that contains it",
        ),
        (BOMB.encode(), "expands to more than 1,000,000 values through YAML aliases"),
        (b"experiment: fts\nobjective: " + b"[" * 150 + b"]" * 150 + b"\n", "is nested more than 100 levels deep"),
        (
            b"experiment: fts\nobjective: {type: gp_grid\nmethods: []\n",
            "not valid YAML: expected ',' or '}', but got ':' (line 3, column 8: methods: [])",
        ),
    ],
    ids=["binary", "invalid-utf8", "nul", "self-alias", "alias-cycle-in-objective", "alias-bomb", "deep", "syntax"],
)
def test_unreadable_yaml_is_a_one_line_error_naming_the_file(tmp_path, capsys, content, says):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(content)
    assert main(["run", str(cfg), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {cfg}: ") and says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_each_scenario_may_name_its_own_objective_without_a_top_level_one():
    cfg = parse(
        objective=None,
        scenarios=[
            {"name": "a", "objective": dict(BASE["objective"]), "methods": [{"name": "TS"}]},
            {"name": "b", "objective": {**BASE["objective"], "agents_per_group": 3}, "methods": [{"name": "TS"}]},
        ],
    )
    assert [s.objective["agents_per_group"] for s in cfg.scenarios] == [4, 3]


def test_every_shipped_config_resolves_to_a_config_that_loads_as_itself(tmp_path, monkeypatch):
    """``config.resolved.yaml`` is what a run records; it must run again as it is (no section its
    experiment refuses, every scenario's objective complete), and say the same thing."""
    import glob
    import pathlib

    import yaml

    from fbo_torch.experiments.config import load_config

    monkeypatch.setenv("FBO_HAR_PATH", str(tmp_path / "har"))  # read when the objective is built, not here
    root = pathlib.Path(__file__).resolve().parents[2]
    paths = sorted(glob.glob(str(root / "configs" / "**" / "*.yaml"), recursive=True))
    assert len(paths) >= 15
    for i, path in enumerate(paths):
        resolved = load_config(path).resolved()
        again = tmp_path / f"resolved{i}.yaml"
        again.write_text(yaml.safe_dump(resolved, sort_keys=False))
        assert load_config(str(again)).resolved() == resolved, path
        assert ("privacy" in resolved) == (resolved["experiment"] == "dp_fts_de"), path
