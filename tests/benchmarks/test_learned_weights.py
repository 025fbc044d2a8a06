"""Keeps ``benchmarks/learned_weights.py analyze`` honest: its paired statistics on a hand-made results file."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import learned_weights


def _results(tmp_path: Path) -> Path:
    # two scenarios, three runs, curves of 3 iterations; FTS learned is better by 0.1, 0.2, 0.3 at the end
    base = [[1.0, 0.5, 0.4], [1.0, 0.6, 0.5], [1.0, 0.7, 0.6]]
    learned = [[1.0, 0.4, 0.3], [1.0, 0.5, 0.3], [1.0, 0.6, 0.3]]
    methods = [
        {"name": "FTS", "runs": base, "sources": [[0, -1], [1, 1], [-1, -1]], "targets": [0, 0, 1], "inits": [0, 1, 0]},
        {
            "name": "FTS learned",
            "runs": learned,
            "sources": [[1, 1], [1, -1], [-1, -1]],
            "targets": [0, 0, 1],
            "inits": [0, 1, 0],
        },
    ]
    scen = [{"name": n, "methods": methods} for n in ("a", "b")]
    result = {
        "experiment": "fts",
        "config": {"scenarios": [{"name": "a", "objective": {"type": "landmine"}}]},
        "scenarios": scen,
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(result))
    return path


def test_paired_differences_and_t_test(tmp_path):
    report = learned_weights.analyze(_results(tmp_path), ["FTS"], -1, by_target=True)
    row = next(r for r in report["scenarios"][0]["rows"] if r["method"] == "FTS learned")
    v = row["vs"]["FTS"]
    diffs = [-0.1, -0.2, -0.3]
    se = math.sqrt(sum((d + 0.2) ** 2 for d in diffs) / 2 / 3)
    assert v["diff"] == pytest.approx(-0.2) and v["se"] == pytest.approx(se)
    assert v["better"] == 3 and v["distinguishable"] == (0.2 > 4.302652729911275 * se)
    assert row["followed"] == {"peer": 1.0}  # three peer queries over three runs
    pooled = next(r for r in report["pooled"] if r["method"] == "FTS learned")["vs"]["FTS"]
    assert pooled["runs"] == 6 and pooled["diff"] == pytest.approx(-0.2)
    # the mean over iterations 1..T, and per target
    mean = learned_weights.analyze(_results(tmp_path), ["FTS"], "mean")["scenarios"][0]["rows"][1]["vs"]["FTS"]
    assert mean["diff"] == pytest.approx(sum([-0.1, -0.15, -0.2]) / 3)
    by_target = report["scenarios"][0]["by_target"]
    assert {r["target"] for r in by_target} == {0, 1}
    assert report["scenarios"][0]["mean_rank"] == {"FTS": 2.0, "FTS learned": 1.0}
    assert "| a | FTS learned |" in learned_weights.markdown(report)


def test_a_dp_fts_de_study_is_paired_by_repetition_of_agent_averaged_curves(tmp_path):
    """Rows r·N + n of a DP-FTS-DE record are agent n of repetition r: the agents of a repetition share
    every broadcast, so the pairs are the repetitions' agent-averaged curves, not the agents."""
    ts = {"name": "TS", "runs": [[1.0, 0.6], [1.0, 0.4], [1.0, 0.7], [1.0, 0.5]], "repetitions": [0, 0, 1, 1]}
    fts = {"name": "FTS", "runs": [[1.0, 0.5], [1.0, 0.3], [1.0, 0.4], [1.0, 0.4]], "repetitions": [0, 0, 1, 1]}
    result = {
        "experiment": "dp_fts_de",
        "config": {"scenarios": [{"name": "s", "objective": {"type": "digits_cnn"}}]},
        "scenarios": [{"name": "s", "methods": [ts, fts]}],
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(result))
    report = learned_weights.analyze(path, ["TS"], -1)
    row = next(r for r in report["scenarios"][0]["rows"] if r["method"] == "FTS")
    assert row["vs"]["TS"]["runs"] == 2  # two repetitions, not four agents
    assert row["vs"]["TS"]["diff"] == pytest.approx(((0.4 - 0.5) + (0.4 - 0.6)) / 2)
    with pytest.raises(SystemExit, match="no --by-target"):
        learned_weights.analyze(path, ["TS"], -1, by_target=True)
