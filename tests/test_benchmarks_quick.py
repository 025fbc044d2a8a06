"""Keeps ``benchmarks/posterior_sampling.py`` working: its ``--quick`` mode end to end, in a subprocess."""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from fbo_torch.models.rff_blr import RFFBayesianLinear

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "posterior_sampling.py"


def _expected_representations() -> list[str]:
    has = "representation" in inspect.signature(RFFBayesianLinear.__init__).parameters
    return ["weight", "dual"] if has else ["default"]


def test_posterior_sampling_quick(tmp_path):
    env = dict(os.environ, MPLBACKEND="Agg")
    # one thread each side: quick and steady on a shared machine
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--threads", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "x upd+smp" in proc.stdout  # the table was printed

    data = json.loads((tmp_path / "posterior_sampling.json").read_text())
    assert (tmp_path / "posterior_sampling.png").stat().st_size > 0
    s = data["settings"]
    assert s["quick"] is True
    reps = _expected_representations()
    assert s["representations"] == reps
    cells = data["cells"]
    expected = {(N, M, r) for N in s["N"] for M in s["M"] for r in reps}
    assert {(c["N"], c["M"], c["representation"]) for c in cells} == expected
    assert len(cells) == len(expected)

    for c in cells:
        o, ref, ratio = c["ours"], c["reference"], c["ratio"]
        assert c["device"] == "cpu" and c["n"] == s["n"] and c["d"] == 2
        assert o["feasible"], o["infeasible_reason"]
        assert o["omega_finite"]
        for p in ("fit", "update", "sample"):
            assert o[f"{p}_wall_s"] > 0
            assert ref[f"{p}_wall_s"] > 0 and ref[f"{p}_per_agent_mean_s"] > 0
            assert math.isclose(ref[f"{p}_wall_s"], ref[f"{p}_per_agent_mean_s"] * c["N"], rel_tol=1e-9)
            assert ratio[p] > 0
        assert ratio["fit_sample"] > 0 and ratio["update_sample"] > 0
        assert 1 <= ref["agents_timed"] <= c["N"]
        assert ref["measured"] == (ref["agents_timed"] == c["N"]) != ref["extrapolated"]
        assert o["n_chunks"] == math.ceil(c["N"] / o["chunk_size"])
        assert o["peak_memory_bytes"] > 0
        if reps != ["default"]:
            assert o["representation_resolved"] == c["representation"]

    # quick mode exercises both paths: a reference extrapolated from a subset, and a chunked cell
    assert any(c["reference_extrapolated"] for c in cells)
    assert any(c["reference_measured"] for c in cells)
    assert any(c["ours"]["chunked"] for c in cells)

    m, t = data["machine"], data["threads"]
    assert m["cpu_model"] and m["logical_cores"] >= 1 and m["torch"] and m["numpy"]
    assert t["torch_num_threads"] == 1
    assert "posterior_sampling.py" in data["command"] and "--quick" in data["command"]
    assert data["goal"]["target_ratio"] == 50 and data["goal"]["at_N"] == 1000
