"""benchmarks/peers/lhs_designs.py: seeded Latin-hypercube designs in the results schema, which run_ours reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
import lhs_designs
import run_ours

from fbo_torch.objectives.tetci2019 import Tetci2019


def test_each_coordinate_has_one_point_per_stratum_and_the_seed_fixes_the_design():
    U = lhs_designs.lhs(7, 3, seed=4, task=2)
    assert U.shape == (7, 3) and ((U >= 0) & (U < 1)).all()
    for j in range(3):  # a Latin hypercube: every one of the n strata [k/n, (k+1)/n) holds one point
        assert sorted(np.floor(U[:, j] * 7).astype(int).tolist()) == list(range(7))
    assert np.array_equal(U, lhs_designs.lhs(7, 3, seed=4, task=2))
    assert not np.array_equal(U, lhs_designs.lhs(7, 3, seed=4, task=3))
    assert not np.array_equal(U, lhs_designs.lhs(7, 3, seed=5, task=2))


def test_the_file_holds_each_tasks_design_in_its_box_with_its_values_and_run_ours_starts_from_it(tmp_path):
    path = tmp_path / "designs.json"
    args = ["tetci2019", "--dim", "2", "--seeds", "0-1", "--fe-init", "4", "--fe-max", "6", "--out", str(path)]
    assert lhs_designs.main(args) == 0
    data = json.loads(path.read_text())
    obj = Tetci2019(dim=2)
    assert data["designs_only"] and (data["fe_init"], data["fe_max"]) == (4, 6)
    assert [t["y_global"] for t in data["tasks"]] == (-obj.optimum).tolist()
    for run in data["runs"]["design"]:
        X = torch.tensor([t["X"] for t in run["tasks"]], dtype=torch.float64)  # A x 4 x 2
        y = torch.tensor([t["y"] for t in run["tasks"]], dtype=torch.float64)
        assert ((X >= obj.lb[:, None]) & (X <= obj.ub[:, None])).all()
        assert torch.equal(obj.evaluate_original(X), y)
    out = tmp_path / "ours.json"
    assert run_ours.main([str(path), "--seeds", "1", "--configs", "local", "--out", str(out)]) == 0
    ours = json.loads(out.read_text())
    tasks = ours["runs"]["local"][0]["tasks"]
    first = torch.tensor([t["X"][:4] for t in tasks], dtype=torch.float64)
    design = torch.tensor([t["X"] for t in data["runs"]["design"][1]["tasks"]], dtype=torch.float64)
    # to the unit cube and back (x = lb + (ub - lb) u): a few ulps of the box's width
    width = (obj.ub - obj.lb)[:, None, :]
    assert ((first - design).abs() <= 8 * torch.finfo(torch.float64).eps * width).all()
    assert all(len(t["y"]) == 6 for t in tasks)


def test_bad_input_is_refused_naming_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit):
        lhs_designs.main(["tetci2019", "--dim", "2", "--fe-init", "5", "--fe-max", "4", "--out", str(tmp_path / "x")])
    assert "--fe-init and --fe-max" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lhs_designs.main(["tevc2024", "--dim", "2", "--fe-init", "2", "--fe-max", "4", "--out", str(tmp_path / "x")])
    assert "--fmto" in capsys.readouterr().err
