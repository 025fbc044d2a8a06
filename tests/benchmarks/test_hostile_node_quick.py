"""Keeps ``benchmarks/hostile_node.py`` working (two rounds), and its outcome: the release bounds hold."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_hostile_node_quick(tmp_path):
    spec = importlib.util.spec_from_file_location("hostile_node", ROOT / "benchmarks" / "hostile_node.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--rounds", "2", "--json", str(tmp_path / "h.json")]) == 0
    out = json.loads((tmp_path / "h.json").read_text())
    c = out["constants"]
    for row in out["attacks"].values():
        assert row["new_max_shift"] <= 2 * c["B"] and row["new_norm_shift"] <= 2 * c["R"] * (1 + 1e-9)
        assert row["old_max_shift"] > c["old_bound_NA"] > 2 * c["B"]
