"""pyfmto's recorded runs (benchmarks/results/peers/pyfmto): well formed, paired, and the same functions as our port.

The runs themselves need pyfmto's environment (``benchmarks/peers/run_pyfmto.py``); what is checked here
needs only the files and numpy: the schema the comparison code reads, the pairing (run ``seed`` of every
configuration starts from the same initial design), and that every recorded value is what
:class:`~fbo_torch.objectives.tetci2019.Tetci2019` computes at the recorded point. The ``merge`` and
``summary`` commands run end to end on tiny files.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fbo_torch.objectives.tetci2019 import Tetci2019

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "peers" / "run_pyfmto.py"
RESULTS = sorted((ROOT / "benchmarks" / "results" / "peers" / "pyfmto").glob("*.json"))
sys.path.insert(0, str(SCRIPT.parent))
from run_pyfmto import check_results


def _load(path):
    return json.loads(path.read_text())


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_recorded_runs_are_well_formed_and_paired(path):
    data = _load(path)
    check_results(data)
    n0 = data["fe_init"]
    lb = torch.tensor([t["lb"] for t in data["tasks"]], dtype=torch.float64).unsqueeze(1)
    ub = torch.tensor([t["ub"] for t in data["tasks"]], dtype=torch.float64).unsqueeze(1)
    designs: dict[int, torch.Tensor] = {}
    for runs in data["runs"].values():
        for run in runs:
            X0 = torch.tensor([t["X"][:n0] for t in run["tasks"]], dtype=torch.float64)
            assert ((X0 >= lb) & (X0 <= ub)).all()
            # every configuration's run `seed` starts from the same initial design
            assert torch.equal(designs.setdefault(run["seed"], X0), X0)


@pytest.mark.parametrize("path", [p for p in RESULTS if p.name.startswith("tetci2019_")], ids=lambda p: p.name)
def test_recorded_values_are_our_ports_values(path):
    data = _load(path)
    obj = Tetci2019(dim=data["dim"])
    assert [t["y_global"] for t in data["tasks"]] == obj.y_global.tolist()
    assert torch.equal(torch.tensor([t["lb"] for t in data["tasks"]], dtype=torch.float64), obj.lb)
    for runs in data["runs"].values():
        X = torch.tensor([[t["X"] for t in run["tasks"]] for run in runs], dtype=torch.float64)  # R x N x n x d
        y = torch.tensor([[t["y"] for t in run["tasks"]] for run in runs], dtype=torch.float64)
        ours = obj.evaluate_original(X.transpose(0, 1).flatten(1, 2)).unflatten(1, (X.shape[0], X.shape[2]))
        ours = ours.transpose(0, 1)  # R x N x n, one batched call for all runs
        assert torch.allclose(ours, y, rtol=1e-12, atol=1e-12)


def _tiny(seed: int, label: str, command: str) -> dict:
    task = {"X": [[0.5, -1.0], [0.25, 2.0], [0.0, 0.0]], "y": [3.0, 1.0, 2.0]}
    return {
        "problem": "toy",
        "dim": 2,
        "fe_init": 2,
        "fe_max": 3,
        "pyfmto_version": "0.3.4",
        "fmto_commit": "abc",
        "machine": "m",
        "command": command,
        "tasks": [{"name": "Sphere", "lb": [-1.0, -2.0], "ub": [1.0, 2.0], "y_global": 0.0}],
        "runs": {label: [{"seed": seed, "wall_time": 1.5, "tasks": [task]}]},
    }


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_merge_and_summary(tmp_path):
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "all.json"
    a.write_text(json.dumps(_tiny(0, "BO", "run a")))
    b.write_text(
        json.dumps(_tiny(1, "BO", "run b") | {"runs": {**_tiny(1, "BO", "")["runs"], **_tiny(0, "FMTBO", "")["runs"]}})
    )
    proc = _run("merge", "--out", str(out), str(a), str(b))
    assert proc.returncode == 0, proc.stderr
    merged = _load(out)
    check_results(merged)
    assert list(merged["runs"]) == ["FMTBO", "BO"]  # the configurations' order
    assert [r["seed"] for r in merged["runs"]["BO"]] == [0, 1] and merged["command"] == "run a; run b"

    proc = _run("summary", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "| T1 Sphere | 0 | 1 ± nan | 1 ± 0 |" in proc.stdout  # final best f: min(y) of each run
    assert "| BO | 0: 2, 1: 2 | 1.500 |" in proc.stdout  # 1 task x 1 iteration per run

    other = _tiny(2, "BO", "c") | {"fe_max": 4}
    (tmp_path / "c.json").write_text(json.dumps(other))
    proc = _run("merge", "--out", str(tmp_path / "bad.json"), str(a), str(tmp_path / "c.json"))
    assert proc.returncode != 0 and "differ in 'fe_max'" in proc.stderr


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["runs"]["BO"][0]["tasks"][0]["X"].pop(), r"X \(3 x 2\)"),
        (lambda d: d["runs"]["BO"][0]["tasks"][0]["y"].__setitem__(0, 1), r"\.y: expected 3 floats"),
        (lambda d: d["tasks"][0].__setitem__("lb", [0.0]), r"tasks\[0\]\.lb"),
        (lambda d: d.pop("machine"), "results keys"),
    ],
)
def test_check_results_names_what_is_wrong(edit, message):
    data = copy.deepcopy(_tiny(0, "BO", "c"))
    check_results(data)
    edit(data)
    with pytest.raises(ValueError, match=message):
        check_results(data)


OURS = sorted((ROOT / "benchmarks" / "results" / "peers" / "ours").glob("*.json"))


def _pyfmto_of(ours: dict) -> dict:
    """The file whose designs ``ours`` started from: pyfmto's runs, or ``lhs_designs.py``'s designs where pyfmto
    did not run the problem here."""
    name = f"{ours['problem']}_d{ours['dim']}.json"
    peers = ROOT / "benchmarks" / "results" / "peers"
    return _load(peers / "pyfmto" / name if (peers / "pyfmto" / name).is_file() else peers / "designs" / name)


def _check_ours(data: dict) -> None:
    """pyfmto's schema, where ours has ``configs`` (the settings of each label) instead of pyfmto's versions."""
    assert set(data["configs"]) == set(data["runs"])
    check_results({**{k: v for k, v in data.items() if k != "configs"}, "pyfmto_version": "", "fmto_commit": ""})


def _designs(data: dict) -> dict[int, torch.Tensor]:
    n0 = data["fe_init"]
    return {
        run["seed"]: torch.tensor([t["X"][:n0] for t in run["tasks"]], dtype=torch.float64)
        for runs in data["runs"].values()
        for run in runs
    }


@pytest.mark.parametrize("path", OURS, ids=[p.name for p in OURS])
def test_our_runs_start_from_pyfmtos_designs(path):
    # run `seed` of ours starts where pyfmto's run `seed` started: the comparisons are paired. The design
    # goes to the unit cube and back (x = lb + (ub - lb) u): a few ulps of the box's width. A newcomer's
    # runs (and the FTS paper's synthetic suite) have no pyfmto counterpart: their configurations are paired
    # with each other by seed, which the schema check covers.
    data = _load(path)
    _check_ours(data)
    if data.get("setting", "together") == "together" and data["problem"] != "synthetic":
        theirs = _designs(_pyfmto_of(data))
        width = torch.tensor([[t["ub"][0] - t["lb"][0]] for t in data["tasks"]], dtype=torch.float64).unsqueeze(-1)
        for seed, X0 in _designs(data).items():
            close = (X0 - theirs[seed]).abs() <= 8e-16 * width
            assert torch.allclose(X0, theirs[seed], rtol=0, atol=0) or close.all()
    else:  # every configuration starts each seed from the same points
        for label, runs in data["runs"].items():
            first = {
                r["seed"]: [t["X"][: data["fe_init"]] for t in r["tasks"]] for r in next(iter(data["runs"].values()))
            }
            for run in runs:
                assert [t["X"][: data["fe_init"]] for t in run["tasks"]] == first[run["seed"]], (label, run["seed"])
    if data["problem"] == "tetci2019":  # and every value is the port's at the recorded point
        obj = Tetci2019(dim=data["dim"])
        for runs in data["runs"].values():
            for run in runs:
                X = torch.tensor([t["X"] for t in run["tasks"]], dtype=torch.float64)  # N x n x d
                y = torch.tensor([t["y"] for t in run["tasks"]], dtype=torch.float64)
                assert torch.allclose(obj.evaluate_original(X), y, rtol=1e-12, atol=1e-12)


def test_run_ours_writes_a_paired_results_file(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
    import run_ours

    src = ROOT / "benchmarks" / "results" / "peers" / "pyfmto" / "tetci2019_d3.json"
    out = tmp_path / "ours.json"
    assert run_ours.main([str(src), "--seeds", "0", "--configs", "local", "--out", str(out)]) == 0
    data = _load(out)
    _check_ours(data)
    assert list(data["runs"]) == ["local"] and [r["seed"] for r in data["runs"]["local"]] == [0]
    run = data["runs"]["local"][0]
    assert all(len(t["y"]) == data["fe_max"] for t in run["tasks"])
    mine, theirs = _designs(data)[0], _designs(_load(src))[0]
    assert ((mine - theirs).abs() <= 1e-12 * theirs.abs().clamp_min(1.0)).all()
