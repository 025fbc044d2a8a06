"""Keeps ``benchmarks/reproduce.py`` honest: a tiny run re-runs bit for bit, a changed record does not."""

from __future__ import annotations

import copy
import json
import math
import shutil
import sys
from pathlib import Path

import pytest

from fbo_torch.cli import main as fbo_main

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import compare_runs
import reproduce
from collect_results import compact

FTS = """
experiment: fts
name: tiny-fts
seed: 5
objective: {type: gp_grid, num_groups: 1, agents_per_group: 4, grid_size: 50}
runs: {num_inits: 3, num_targets: 2}
history: {t_n: 4}
defaults: {num_iterations: 3, num_features: 10, gp_refit_every: 0}
scenarios:
  - name: first
    methods:
      - {name: TS, algorithm: ts}
      - {name: FTS, algorithm: fts}
  - name: second
    objective: {perturbation: 0.5}
    methods:
      - {name: FTS, algorithm: fts}
"""

DP = """
experiment: dp_fts_de
name: tiny-dp
seed: 3
objective: {type: gp_grid, num_groups: 1, agents_per_group: 4, grid_size: 50, perturb_first: true}
runs: {num_inits: 2}
defaults: {num_iterations: 3, num_init: 2, num_features: 10, gp_refit_every: 0}
methods:
  - {name: TS, algorithm: ts}
  - {name: DP-FTS-DE, algorithm: fts_de, num_regions: 2, sample_rate: 0.5, noise_multiplier: 1.0, clip_norm: 5.0}
"""


def _finished(tmp: Path, text: str) -> Path:
    cfg, out = tmp / "cfg.yaml", tmp / "out"
    cfg.write_text(text)
    assert fbo_main(["run", str(cfg), "--out", str(out), "--quiet", "--threads", "1"]) == 0
    return out


@pytest.fixture(scope="module")
def fts_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _finished(tmp_path_factory.mktemp("fts"), FTS)


@pytest.fixture(scope="module")
def fts_rerun(fts_folder: Path) -> dict:
    """The subset (second scenario, first target, two initializations) re-run for real, once."""
    outcome = reproduce.check(fts_folder, scenarios=range(1, 2), inits=2, targets=1)
    assert outcome["reproduces"], outcome
    (row,) = outcome["rows"]
    assert (row["scenario"], row["method"], row["runs"], row["same_sources"]) == ("second", "FTS", 2, 2)
    assert row["max_abs_difference"] == 0.0
    return outcome


def _recheck(monkeypatch: pytest.MonkeyPatch, folder: Path, rerun: dict, **subset: object) -> dict:
    """``reproduce.check`` against a given re-run (no second run)."""
    monkeypatch.setattr(reproduce, "run_subset", lambda cfg, work, threads: copy.deepcopy(rerun))
    return reproduce.check(folder, **subset)  # type: ignore[arg-type]


def test_the_subset_keeps_the_scenario_seed_and_the_recorded_settings(fts_folder: Path) -> None:
    resolved = reproduce.load_yaml((fts_folder / "config.resolved.yaml").read_text())
    recorded = json.loads((fts_folder / "results.json").read_text())
    cfg, subset = reproduce.subset_config(resolved, recorded, range(1, 2), 2, 1, 2)
    assert cfg["seed"] == 5 + 1000 and "privacy" not in cfg
    (sc,) = cfg["scenarios"]
    assert sc["runs"]["num_inits"] == 2 and sc["runs"]["targets"] == [0]
    assert [m["num_iterations"] for m in sc["methods"]] == [2]
    assert subset["iterations"] == [2] and subset["recorded_iterations"] == [3]


def test_a_changed_curve_or_source_is_reported(
    fts_folder: Path, fts_rerun: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    new = json.loads((fts_folder / "results.json").read_text())
    rerun = copy.deepcopy(new)  # a re-run of everything, as the recorded one
    folder = tmp_path / "changed"
    shutil.copytree(fts_folder, folder)
    assert _recheck(monkeypatch, folder, rerun, scenarios=range(2), inits=None)["reproduces"]

    method = new["scenarios"][0]["methods"][1]
    method["runs"][1][2] = math.nextafter(method["runs"][1][2], math.inf)  # one ulp, one point of one run
    (folder / "results.json").write_text(json.dumps(new))
    outcome = _recheck(monkeypatch, folder, rerun, scenarios=range(2), inits=None)
    assert not outcome["reproduces"]
    bad = [(r["scenario"], r["method"]) for r in outcome["rows"] if not r["identical"]]
    assert bad == [("first", "FTS")]
    assert 0 < outcome["rows"][1]["max_abs_difference"] < 1e-12
    assert outcome["rows"][1]["first_difference"] == 2 and outcome["rows"][0]["first_difference"] is None
    assert outcome["rows"][1]["rounding_only"]  # reported as such, and still not identical

    new = json.loads((fts_folder / "results.json").read_text())
    sources = new["scenarios"][1]["methods"][0]["sources"]
    sources[0][0] = 1 if sources[0][0] != 1 else -1
    (folder / "results.json").write_text(json.dumps(new))
    outcome = _recheck(monkeypatch, folder, rerun, scenarios=range(2), inits=None)
    assert not outcome["reproduces"]
    row = outcome["rows"][-1]
    assert row["max_abs_difference"] == 0.0 and row["same_sources"] == row["runs"] - 1
    assert not row["identical"] and not row["rounding_only"]

    assert reproduce.main([str(folder), "--scenarios", "1", "--inits", "2"]) == 1  # the exit status


def test_a_shorter_run_pairs_with_the_prefix_and_not_without(fts_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rerun = json.loads((fts_folder / "results.json").read_text())
    for sc in rerun["scenarios"]:
        for m in sc["methods"]:
            m["runs"] = [r[:3] for r in m["runs"]]  # two iterations
            m["sources"] = [s[:2] for s in m["sources"]]
    outcome = _recheck(monkeypatch, fts_folder, rerun, scenarios=range(2), inits=None, iterations=2)
    assert outcome["reproduces"] and outcome["rows"][0]["runs"] == 6
    with pytest.raises(ValueError, match="prefix"):
        compare_runs.compare(json.loads((fts_folder / "results.json").read_text()), rerun)


def test_a_compacted_dp_record_reruns_every_repetition_and_compares_their_average(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = _finished(tmp_path, DP)
    folder = tmp_path / "compacted"
    folder.mkdir()
    shutil.copy(full / "config.resolved.yaml", folder)
    recorded = compact(json.loads((full / "results.json").read_text()))
    (folder / "results.json").write_text(json.dumps(recorded))
    outcome = reproduce.check(folder, inits=1, iterations=2)  # inits ignored: every repetition
    assert outcome["subset"]["inits"] == [2] and outcome["subset"]["pairing"] == "aggregate over every repetition"
    assert outcome["reproduces"], outcome
    assert [(r["pairing"], r["runs"], r["same_source_fractions"]) for r in outcome["rows"]] == [
        ("aggregate", 2, True)
    ] * 2

    # the uncompacted record pairs run by run, by (repetition, agent)
    rows = compare_runs.compare(
        json.loads((full / "results.json").read_text()), json.loads((full / "results.json").read_text())
    )
    assert [(r["pairing"], r["runs"], r["max_abs_difference"]) for r in rows] == [("runs", 8, 0.0)] * 2

    recorded["scenarios"][0]["methods"][1]["loss_mean"][1] += 1e-9
    (folder / "results.json").write_text(json.dumps(recorded))
    with pytest.raises(reproduce.SubsetError, match="every one"):
        reproduce.subset_config(
            reproduce.load_yaml((folder / "config.resolved.yaml").read_text()), recorded, range(1), 1, None, 2
        )
    rerun = json.loads((full / "results.json").read_text())
    for m in rerun["scenarios"][0]["methods"]:
        m.pop("runs")
    outcome = _recheck(monkeypatch, folder, compact(rerun), inits=None)
    assert [r["identical"] for r in outcome["rows"]] == [True, False]


def test_a_shorter_dp_run_is_averaged_as_the_recorded_run_averaged_its_own() -> None:
    import torch

    g = torch.Generator().manual_seed(0)
    full = torch.rand(290, 61, generator=g, dtype=torch.float64)  # 29 agents x 10 repetitions, 60 iterations
    for k in (1, 3, 31):
        assert compare_runs.mean_as_recorded(full[:, :k].tolist(), 61) == full.mean(0)[:k].tolist()
