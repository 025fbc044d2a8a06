"""Keeps ``benchmarks/baselines_scaling.py`` working: its ``--quick`` mode end to end, in a subprocess."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "baselines_scaling.py"
PHASES = {"target_gp", "peers", "rgpe_weights", "rgpe_maximize", "taf_construct", "taf_maximize"}
TOTALS = {
    "rgpe_s": ("peers", "rgpe_weights", "rgpe_maximize"),
    "taf_s": ("peers", "taf_construct", "taf_maximize"),
    "rgpe_acq_s": ("rgpe_weights", "rgpe_maximize"),
    "taf_acq_s": ("taf_construct", "taf_maximize"),
}


def _run_quick(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ, MPLBACKEND="Agg")
    # one thread: quick and steady on a shared machine
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--threads", "1", "--out", str(tmp_path), *extra],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [p.name for p in tmp_path.glob("*.json")] == ["baselines_scaling_cpu_quick.json"]
    assert (tmp_path / "baselines_scaling_cpu_quick.png").stat().st_size > 0
    return proc, json.loads((tmp_path / "baselines_scaling_cpu_quick.json").read_text())


def test_baselines_scaling_quick(tmp_path):
    proc, res = _run_quick(tmp_path)
    assert "log-log slope" in proc.stdout and "growth in N" in proc.stdout

    m, s = res["machine"], res["settings"]
    assert res["benchmark"] == "baselines_scaling"
    assert m["cpu_count"] >= 1 and m["torch"] and m["device"] == "cpu" and m["date"]
    assert "baselines_scaling.py" in m["command"] and "--quick" in m["command"]
    assert m["torch_threads"] == 1
    assert s["quick"] is True and s["N"] == [4, 8] and s["M"] == 20 and s["D"] == 2
    M = s["M"]
    assert res["parameters_per_agent"] == {"rgpe": M + M * M, "taf": M + M * M + 1}

    cells = res["cells"]
    assert [(c["N"], c["M"], c["d"]) for c in cells] == [(4, 20, 2), (8, 20, 2)]
    for c in cells:
        assert c["device"] == "cpu" and c["n_target"] == s["n_target"] and c["n_agent"] == s["n_agent"]
        assert set(c["phases_s"]) == PHASES
        assert all(math.isfinite(v) and v > 0 for v in c["phases_s"].values())
        for key, phases in TOTALS.items():
            assert math.isfinite(c[key]) and c[key] > 0
            assert math.isclose(c[key], sum(c["phases_s"][p] for p in phases), rel_tol=1e-9)
        assert c["parameters_per_agent"] == res["parameters_per_agent"]
        assert c["parameters_received"] == {a: c["N"] * p for a, p in res["parameters_per_agent"].items()}
        assert c["cell_wall_s"] > 0

    sc = res["scaling"]
    assert sc["N_fitted"] == [4, 8]
    for key in ("rgpe_s", "taf_s", "rgpe_acq_s", "taf_acq_s"):
        slope = sc[key]["slope"]
        assert isinstance(slope, float) and math.isfinite(slope)
        assert sc[key]["sublinear"] == (slope < 1.0)
        # two cells: the fitted slope is the slope through them
        expected = math.log(cells[1][key] / cells[0][key]) / math.log(8 / 4)
        assert math.isclose(slope, expected, rel_tol=1e-9, abs_tol=1e-12)


def test_baselines_scaling_cell_budget(tmp_path):
    proc, res = _run_quick(tmp_path, "--cell-budget", "0")
    cells = res["cells"]
    assert [c["N"] for c in cells] == [4, 8]
    assert "phases_s" in cells[0] and "skipped" in cells[1] and "phases_s" not in cells[1]
    assert "skipped" in proc.stdout and "slope n/a" in proc.stdout
    assert res["scaling"]["N_fitted"] == [4]
    assert res["scaling"]["rgpe_s"] == {"slope": None, "sublinear": None}
