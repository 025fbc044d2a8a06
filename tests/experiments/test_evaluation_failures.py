"""An objective's failed evaluations are counted per agent and round, shown once per kind, recorded in
results.json and results.csv, and bound a run: one whose evaluations all fail (or more than
``max_failed_fraction``) stops with one line naming the objective and the exception. The objectives live in
``user_objectives.py`` next to this file."""

import csv
import json
from pathlib import Path

import pytest
import torch

from fbo_torch.cli import main
from fbo_torch.federation.evaluation_failures import (
    EvaluationError,
    EvaluationFailures,
    EvaluationFailureWarning,
    recording,
)
from fbo_torch.federation.faults import evaluate_agents
from fbo_torch.utils import keyed_random as kr

HERE = Path(__file__).resolve().parent

FTS = """
experiment: fts
name: failing
seed: 3
objective: {{type: "user_objectives:{objective}", num_agents: 3{extra}}}
runs: {{num_inits: 2, num_targets: 2}}
history: {{t_n: 4}}
defaults: {{num_iterations: 4, num_init: 2, num_features: 10, gp_refit_every: 0}}
{top}
methods:
  - {{name: TS, algorithm: ts}}
  - {{name: FTS, algorithm: fts}}
"""


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def _run(tmp_path, objective, extra="", top="", out="out"):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(FTS.format(objective=objective, extra=extra, top=top))
    return main(["run", str(cfg), "--out", str(tmp_path / out), "--no-progress"])


def test_an_objective_that_always_raises_stops_the_run_with_one_line_naming_it(tmp_path, capsys):
    assert _run(tmp_path, "Crashes") == 1
    captured = capsys.readouterr()
    error = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and len(captured.err.strip().splitlines()) == 1, captured.err
    assert "objective user_objectives:Crashes" in error[0]
    assert "every evaluation so far failed" in error[0] and "RuntimeError: my simulator crashed" in error[0]
    assert "user_objectives.py" in error[0]  # where it was raised
    # the first failure was shown once, as it happened (here: by the other agents' histories)
    shown = [line for line in captured.out.splitlines() if "raised RuntimeError: my simulator crashed" in line]
    assert len(shown) == 1 and "round" in shown[0]
    assert not (tmp_path / "out" / "results.json").exists()


def test_failures_are_counted_per_agent_and_round_and_recorded(tmp_path, capsys):
    # x > 0.5 gives NaN: some evaluations of every agent fail, most do not
    assert _run(tmp_path, "NaNAbove", extra=", threshold: 0.5") == 0
    printed = capsys.readouterr().out
    assert sum("returned a NaN value" in line for line in printed.splitlines()) == 1  # once per run and kind
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    sc = res["scenarios"][0]
    for m in sc["methods"]:
        rec = m["evaluation_failures"]
        # 4 runs (2 targets x 2 inits): 2 initial points and 4 rounds each; FTS's other agents send one-shot
        assert rec["evaluations"] == 4 * (2 + 4)
        assert 0 < rec["failed"] < rec["evaluations"]
        assert set(rec["kinds"]) == {"NaN"} and rec["kinds"]["NaN"]["count"] == rec["failed"]
        assert sum(n for _, _, n in rec["by_agent_round"]) == rec["failed"]
        assert {a for a, _, _ in rec["by_agent_round"]} <= {0, 1}  # the targets
        assert all(0 <= r <= 4 for _, r, _ in rec["by_agent_round"])
        # the rounds' failures, per run, are the runs' `failed` flags
        per_round = sum(n for _, r, n in rec["by_agent_round"] if r >= 1)
        assert per_round == sum(map(sum, m["failed"]))
    assert sc["history_evaluation_failures"]["evaluations"] == 3 * 4
    with open(tmp_path / "out" / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    failed_rows = [r for r in rows if r["failed"] == "1"]
    assert failed_rows and {r["failed"] for r in rows if r["iteration"] != "0"} <= {"0", "1"}
    assert all(r["failed"] == "" for r in rows if r["iteration"] == "0")
    ts = sc["methods"][0]
    assert len([r for r in failed_rows if r["method"] == "TS"]) == sum(map(sum, ts["failed"]))
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert f"TS: {ts['evaluation_failures']['failed']} of 24 evaluations failed (NaN" in summary


def test_max_failed_fraction_bounds_a_partly_failing_run(tmp_path, capsys):
    # agent 1's simulator crashes: a third of the evaluations (the histories') or a half (the targets 0 and 1)
    assert _run(tmp_path, "Crashes", extra=", agents_failing: [1]", out="ok") == 0
    res = json.loads((tmp_path / "ok" / "results.json").read_text())
    ts = res["scenarios"][0]["methods"][0]["evaluation_failures"]
    assert ts["failed"] == ts["evaluations"] // 2 and list(ts["kinds"]) == ["RuntimeError"]
    assert ts["kinds"]["RuntimeError"]["first"]["agent"] == 1
    assert any("user_objectives.py" in frame for frame in ts["kinds"]["RuntimeError"]["first"]["traceback"])
    capsys.readouterr()
    assert _run(tmp_path, "Crashes", extra=", agents_failing: [1]", top="max_failed_fraction: 0.25", out="no") == 1
    err = capsys.readouterr().err
    assert "more than max_failed_fraction = 0.25" in err and "RuntimeError: my simulator crashed" in err


def test_an_objective_of_the_wrong_shape_is_named(tmp_path, capsys):
    assert _run(tmp_path, "WrongShape") == 1
    err = capsys.readouterr().err
    assert "objective user_objectives:WrongShape returned observations of shape (1, 3, 4)" in err
    assert "expected (3, 4)" in err


def test_the_log_reads_values_only_when_flushed_and_warns_without_one():
    from user_objectives import Crashes, NaNAbove

    obj = NaNAbove(num_agents=2, threshold=0.5)
    X = torch.tensor([[[0.2], [0.7]], [[0.9], [0.1]]], dtype=torch.float64)
    keys = kr.fold(kr.root_key(0, "test"), torch.arange(2))
    log = EvaluationFailures("objective nan", report=None)
    log.round = 3
    with recording(log):
        evaluate_agents(obj, X, torch.tensor([0, 1]), keys)
    assert log.evaluations == 0  # noted, not yet read
    log.flush()
    assert (log.evaluations, log.failed, log.counts) == (4, 2, {(0, 3): 1, (1, 3): 1})
    with pytest.warns(EvaluationFailureWarning, match="user_objectives:Crashes raised RuntimeError"):
        y, _, raised = evaluate_agents(Crashes(2), X, torch.tensor([0, 1]), keys)
    assert raised.all() and torch.isnan(y).all()
    strict = EvaluationFailures("objective x", max_failed_fraction=0.4)  # 1 of 2 fails below
    with recording(strict):
        evaluate_agents(obj, X[:1], torch.tensor([0]), keys[:1])
    with pytest.raises(EvaluationError, match="more than max_failed_fraction = 0.4 .*1 of 2"):
        strict.flush()
    with pytest.raises(ValueError, match="max_failed_fraction"):
        EvaluationFailures("x", max_failed_fraction=0)
