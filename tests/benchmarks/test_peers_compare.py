"""benchmarks/peers/compare.py: re-scored problems get the best known optimum as ``y_global``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
import compare


def _file(path: Path, X: list, y_global: list) -> Path:
    data = {
        "problem": "toy",
        "dim": 1,
        "fe_max": 2,
        "tasks": [{"name": f"t{i}", "y_global": None} for i in range(len(y_global))],
        "runs": {"a": [{"seed": 0, "tasks": [{"X": x, "y": [0.0] * len(x)} for x in X]}]},
    }
    path.write_text(json.dumps(data))
    return path


def test_a_searched_optimum_is_lowered_to_a_better_recorded_value(tmp_path, monkeypatch):
    """``y_global`` from a search is an upper bound on the minimum: where a run recorded less (here task 1,
    0.5 against the search's 0.7; in another file), every file's regret is taken against the recorded value."""

    def scorer(data):
        return (lambda X: X.sum(-1)), [0.1, 0.7]

    monkeypatch.setitem(compare.RESCORED, "toy", scorer)
    one = _file(tmp_path / "one.json", [[[0.3], [0.2]], [[0.9], [0.8]]], [0.1, 0.7])
    two = _file(tmp_path / "two.json", [[[0.4], [0.6]], [[0.5], [1.0]]], [0.1, 0.7])
    for path in compare.reevaluate([one, two]):
        data = json.loads(Path(path).read_text())
        assert [t["y_global"] for t in data["tasks"]] == [0.1, 0.5]
        assert data["reevaluated"]
    meta, finals, _ = compare.load(compare.reevaluate([one]))
    # task 0: min(0.3, 0.2) - 0.1; task 1 of file one alone: min(0.9, 0.8) - 0.7
    assert abs(finals["a"][0][0] - 0.1) < 1e-12 and abs(finals["a"][0][1] - 0.1) < 1e-12


def test_the_anytime_area_credits_reaching_a_regret_early():
    """Two runs end at the same regret; the one that got there first has the smaller area, by exactly the
    mean of ``log`` over the evaluations after the initial design; a regret of 0 counts as the floor."""
    import numpy as np

    early = np.array([[8.0, 4.0, 1.0, 1.0, 1.0]])  # 1 task x fe_max = 5, fe_init = 2
    late = np.array([[8.0, 4.0, 4.0, 4.0, 1.0]])
    zero = np.array([[8.0, 4.0, 0.0, 0.0, 0.0]])
    floor = np.array([1e-3])
    area = compare.log_regret_area({"early": {0: early}, "late": {0: late}, "zero": {0: zero}}, 2, floor)
    assert np.allclose(area["early"][0], [np.log([4.0, 1.0, 1.0, 1.0]).mean()], rtol=1e-15)
    assert np.allclose(area["late"][0], [np.log([4.0, 4.0, 4.0, 1.0]).mean()], rtol=1e-15)
    assert np.allclose(area["zero"][0], [(np.log(4.0) + 3 * np.log(1e-3)) / 4], rtol=1e-15)
    finals = {"early": {0: early[:, -1]}, "late": {0: late[:, -1]}}
    assert compare.summarize(finals, [])["mean_rank"] == {"early": 1.5, "late": 1.5}  # the final regret ties
    anytime = compare.summarize({k: area[k] for k in finals}, [], "raw")
    assert anytime["mean_rank"] == {"early": 1.0, "late": 2.0}


def test_compare_reports_final_and_anytime_ranks_with_paired_tests(tmp_path, capsys):
    """End to end on two configurations over 3 seeds: ``b`` reaches each run's final regret at the first
    evaluation after the design, ``a`` only at the last, so ranks tie on final regret and ``b`` wins the
    anytime ranking, distinguishably (its area is lower by ``(log 4 − log final) / 3`` in every seed)."""

    def run(seed: int, late: bool) -> dict:
        final = 1.0 + 0.1 * seed
        y = [5.0, 4.0, 4.0, final] if late else [5.0, 4.0, final, final]
        return {"seed": seed, "tasks": [{"X": [[0.0]] * 4, "y": y}]}

    data = {
        "problem": "toy",
        "dim": 1,
        "fe_init": 2,
        "fe_max": 4,
        "tasks": [{"name": "t", "y_global": 0.0}],
        "runs": {"a": [run(s, True) for s in range(3)], "b": [run(s, False) for s in range(3)]},
    }
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "summary.json"
    assert compare.main([str(path), "--reference", "a", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["mean_rank"] == {"a": 1.5, "b": 1.5}
    assert summary["anytime"]["mean_rank"] == {"a": 2.0, "b": 1.0}
    cell = summary["anytime"]["paired"]["a"]["b"]
    assert cell["better"] == 1 and cell["worse"] == 0
    assert "**Anytime**" in capsys.readouterr().out
