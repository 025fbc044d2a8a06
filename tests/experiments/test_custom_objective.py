"""Objectives of your own in experiment files: ``objective: {type: "package.module:ClassName", ...}`` and
:func:`fbo_torch.objectives.register`; the classes live in ``user_objectives.py`` next to this file."""

import csv
import json
import os
import sys
from pathlib import Path

import pytest

import fbo_torch.objectives as objectives
from fbo_torch.cli import main
from fbo_torch.experiments.config import ConfigError, parse_config

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    """``user_objectives`` importable, as a user's module on PYTHONPATH would be."""
    monkeypatch.syspath_prepend(str(HERE))


FTS = """
experiment: fts
name: bowl
seed: 2
objective: {type: "user_objectives:Bowl", num_agents: 3, spread: 0.1}
runs: {num_inits: 2, num_targets: 2}
history: {t_n: 4}
defaults: {num_iterations: 3, num_features: 10, gp_refit_every: 0}
methods:
  - {name: TS, algorithm: ts}
  - {name: FTS, algorithm: fts}
"""

DP = """
experiment: dp_fts_de
name: duck
objective: {type: "user_objectives:DuckBowl", num_agents: 4}
runs: {num_inits: 1}
defaults: {num_iterations: 3, num_init: 2, num_features: 10, gp_refit_every: 0}
methods:
  - {name: DP-FTS-DE, algorithm: fts_de, num_regions: 2, sample_rate: 0.5, noise_multiplier: 1.0, clip_norm: 5.0}
"""


def _write(tmp_path, text):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def _rows(out):
    with open(out / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_an_objective_subclass_runs_end_to_end_from_yaml(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(_write(tmp_path, FTS)), "--out", str(out), "--quiet"]) == 0
    assert capsys.readouterr().out == ""  # --quiet
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["scenarios"][0]["objective"] == {
        "type": "user_objectives:Bowl",
        "num_agents": 3,
        "spread": 0.1,
    }
    for m in res["scenarios"][0]["methods"]:
        assert m["loss_name"] == "simple regret" and m["targets"] == [0, 0, 1, 1]
        assert all(x >= 0 for run in m["runs"] for x in run)  # optimum 0: regret is -best
    rows = _rows(out)
    assert len(rows) == 2 * 4 * 4  # methods x (targets x inits) x (iterations + 1)
    assert all(float(r["loss"]) == pytest.approx(-float(r["best_value"])) for r in rows)
    assert (out / "simple_regret.png").is_file()


def test_a_duck_typed_class_is_wrapped_and_keeps_its_own_loss(tmp_path):
    out = tmp_path / "out"
    assert main(["run", str(_write(tmp_path, DP)), "--out", str(out), "--no-progress"]) == 0
    m = json.loads((out / "results.json").read_text())["scenarios"][0]["methods"][0]
    assert m["loss_name"] == "one minus best" and m["epsilon_final"] > 0
    rows = _rows(out)
    assert len(rows) == 4 * 4  # agents x (rounds + 1)
    assert all(float(r["loss"]) == pytest.approx(1 - float(r["best_value"])) for r in rows)
    assert (out / "one_minus_best.png").is_file()  # the plot is named after the objective's loss


def _objective_error(objective):
    raw = {"experiment": "fts", "objective": objective, "methods": [{"name": "TS", "algorithm": "ts"}]}
    with pytest.raises(ConfigError) as err:
        parse_config(raw, source="exp.yaml")
    text = str(err.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize(
    "objective, says",
    [
        (
            {"type": "no_such_module_here:Thing"},
            "exp.yaml: objective.type: cannot import module 'no_such_module_here' for 'no_such_module_here:Thing' "
            "(no module named 'no_such_module_here')",
        ),
        (
            {"type": "user_objectives:Bowll"},
            "exp.yaml: objective.type: module 'user_objectives' has no attribute 'Bowll' (did you mean 'Bowl'?).",
        ),
        (
            {"type": "user_objectives:Unrelated"},
            "exp.yaml: objective.type: 'user_objectives:Unrelated' is not an objective: it neither subclasses "
            "fbo_torch.objectives.base.Objective nor defines `_evaluate(X, agents, noise)` or `__call__(X, agents)`",
        ),
        (
            {"type": "user_objectives:Abstract"},
            "exp.yaml: objective.type: 'user_objectives:Abstract' subclasses Objective but does not implement "
            "_evaluate.",
        ),
        ({"type": "user_objectives:factory"}, "'user_objectives:factory' is a function, not a class"),
        ({"type": "user_objectives:"}, "'user_objectives:' is not of the form 'package.module:ClassName'"),
        ({"type": "my_cnn"}, "exp.yaml: objective.type: unknown objective type 'my_cnn'"),
        (
            {"type": "user_objectives:Bowl", "num_agent": 3},
            "exp.yaml: objective (user_objectives:Bowl): unknown key 'num_agent' (did you mean 'num_agents'?); "
            "allowed: ['center', 'num_agents', 'spread'].",
        ),
        (
            {"type": "user_objectives:Bowl", "spread": "wide"},
            "exp.yaml: objective (user_objectives:Bowl): `spread` must be a number, got 'wide' (str).",
        ),
    ],
)
def test_what_is_wrong_with_a_custom_type_is_one_line_naming_the_key(objective, says):
    assert says in _objective_error(objective)


def test_unknown_names_say_how_to_name_a_class_of_your_own():
    text = _objective_error({"type": "gp_gird"})
    assert "(did you mean 'gp_grid'?)" in text and "'package.module:ClassName' for your own class" in text


@pytest.mark.parametrize(
    "objective, says",
    [
        ("{type: 'user_objectives:NoBounds'}", "has no `bounds` (required: `bounds`, a 2 x d tensor, and `num_agents`"),
        ("{type: 'user_objectives:DuckBowl', width: -1.0}", "every upper bound must exceed its lower bound"),
    ],
)
def test_an_instance_without_the_required_members_is_refused_before_out_exists(tmp_path, capsys, objective, says):
    text = DP.replace('{type: "user_objectives:DuckBowl", num_agents: 4}', objective)
    out = tmp_path / "out"
    assert main(["run", str(_write(tmp_path, text)), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "objective (user_objectives:" in err and says in err, err
    assert not out.exists()


def test_register_gives_a_class_a_yaml_name(monkeypatch):
    monkeypatch.setattr(objectives, "REGISTRY", dict(objectives.REGISTRY))
    from user_objectives import Bowl, Unrelated

    objectives.register("bowl", Bowl)
    cfg = parse_config(
        {
            "experiment": "fts",
            "objective": {"type": "bowl", "num_agents": 2},
            "methods": [{"name": "TS", "algorithm": "ts"}],
        }
    )
    assert objectives.build_objective(cfg.scenarios[0].objective).num_agents == 2
    with pytest.raises(ValueError, match="already registered"):
        objectives.register("bowl", Bowl)
    objectives.register("bowl", "user_objectives:DuckBowl", replace=True)  # a path, imported when used
    assert objectives.objective_class("bowl").__name__ == "DuckBowl"
    with pytest.raises(ValueError, match="is not an objective"):
        objectives.register("unrelated", Unrelated)
    with pytest.raises(ValueError, match="without ':'"):
        objectives.register("a:b", Bowl)


def test_the_cli_finds_a_module_in_the_current_folder(tmp_path, monkeypatch, capsys):
    # `fbo-torch` (a console script) does not search the current folder by itself
    (tmp_path / "my_objective_mod.py").write_text("from user_objectives import Bowl as MyBowl\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p or ".") != str(tmp_path)])
    cfg = _write(tmp_path, FTS.replace("user_objectives:Bowl", "my_objective_mod:MyBowl"))
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "--quiet"]) == 0, capsys.readouterr().err
    assert sys.path[-1] == str(tmp_path)  # appended: never shadows an installed package


def test_a_box_other_than_the_unit_cube_is_said_once_in_yaml_words_and_quiet_is_silent(tmp_path, capsys):
    """On [0, 4] the shared map's lengthscale is in the objective's units. The run says so in one line naming
    the YAML key (not BoTorch's InputDataWarning, whose advice, Normalize and fit_shared_features, is for Python);
    with --quiet it prints nothing at all."""
    import warnings

    from botorch.exceptions.warnings import InputDataWarning

    cfg = _write(tmp_path, DP.replace("num_agents: 4}", "num_agents: 4, width: 4.0}"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["run", str(cfg), "--out", str(tmp_path / "a"), "--no-progress"]) == 0
    assert not [w for w in caught if issubclass(w.category, InputDataWarning)]
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "not the unit cube" in line]
    assert len(notes) == 1 and "span [0, 4]" in notes[0] and "`rff_lengthscale` (0.03)" in notes[0]
    assert "Normalize" not in out and "fit_shared_features" not in out
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # what the quiet run silences, even where warnings would show
        assert main(["run", str(cfg), "--out", str(tmp_path / "b"), "--no-progress", "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")
