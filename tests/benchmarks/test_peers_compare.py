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
