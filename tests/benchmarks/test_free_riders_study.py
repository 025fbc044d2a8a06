"""benchmarks/free_riders.py end to end on a tiny federation: colluding reports reach the study."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import free_riders


def test_the_study_runs_with_colluding_free_riders_and_records_it(tmp_path):
    out = tmp_path / "study.json"
    args = ["--out", str(out), "--agents", "4", "--riders", "2", "--federations", "2", "--rounds", "4"]
    args += ["--num-init", "3", "--kinds", "noise", "--reciprocity", "ranks", "--report", "collude"]
    assert free_riders.main(args) == 0
    data = json.loads(out.read_text())
    assert data["setting"]["free_riders_report"] == "collude" and data["setting"]["free_riders"] == [0, 1]
    block = data["kinds"]["noise"]
    assert set(block) >= {"FTS", "FTS + reciprocity (ranks)"}
    excluded = block["FTS + reciprocity (ranks)"]["first_excluded_round"]
    assert len(excluded) == 4 and all(len(row) == 2 for row in excluded)  # per agent and federation
    assert "--report collude" in data["command"]


def test_the_study_bars_replaying_riders_with_the_replays_configuration(tmp_path):
    out = tmp_path / "study.json"
    args = ["--out", str(out), "--agents", "4", "--riders", "1", "--federations", "2", "--rounds", "4"]
    args += ["--num-init", "3", "--kinds", "stale", "--reciprocity", "ranks+replays"]
    assert free_riders.main(args) == 0
    entry = json.loads(out.read_text())["kinds"]["stale"]["FTS + reciprocity (ranks, replays)"]
    # the stale rider replays from its second message on: barred in rounds 2..4 of each federation
    assert entry["share_of_rounds_excluded"]["free_riders"] == 0.75
    assert entry["first_excluded_round"][0] == [2, 2]
