"""Keeps ``benchmarks/posterior_sampling.py`` working: its ``--quick`` mode end to end, in a subprocess."""

from __future__ import annotations

import inspect
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

from fbo_torch.models.rff_blr import RFFBayesianLinear

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "posterior_sampling.py"


def _expected_representations() -> list[str]:
    has = "representation" in inspect.signature(RFFBayesianLinear.__init__).parameters
    return ["weight", "dual"] if has else ["default"]


def test_posterior_sampling_quick(tmp_path):
    env = dict(os.environ, MPLBACKEND="Agg")
    # one thread each side: quick and steady on a shared machine
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--threads", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
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
            # ours: the median of the repeats; the reference: the mean per agent times N
            assert o[f"{p}_wall_s"] == statistics.median(o["repeats_wall_s"][p])
            assert len(o["repeats_wall_s"][p]) == o["repeats"]
            assert math.isclose(ref[f"{p}_wall_s"], ref[f"{p}_per_agent_mean_s"] * c["N"], rel_tol=1e-9)
            assert math.isclose(ratio[p], ref[f"{p}_wall_s"] / o[f"{p}_wall_s"], rel_tol=1e-9)
        for pair in ("fit_sample", "update_sample"):  # the ratio of the sums, not the sum of the ratios
            a, b = pair.split("_")
            assert math.isclose(
                ratio[pair],
                (ref[f"{a}_wall_s"] + ref[f"{b}_wall_s"]) / (o[f"{a}_wall_s"] + o[f"{b}_wall_s"]),
                rel_tol=1e-9,
            )
        # the timed agents' phases add up to the reference's timed wall time
        assert math.isclose(
            ref["timed_wall_s"],
            ref["agents_timed"] * sum(ref[f"{p}_per_agent_mean_s"] for p in ("fit", "update", "sample")),
            rel_tol=1e-9,
        )
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


def _run_quick(script: str, tmp_path: Path) -> dict:
    env = dict(os.environ, MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and list(tmp_path.glob("*.png"))
    return json.loads(files[0].read_text())


def test_round_time_quick(tmp_path):
    res = _run_quick("round_time.py", tmp_path)
    assert res["machine"]["cpu_count"] >= 1 and res["machine"]["command"]
    cells = res["cells"]
    assert [(c["N"], c["M"], c["d"]) for c in cells] == [(8, 16, 1), (8, 16, 2)]
    for c in cells:
        assert set(c["phases_s"]) == {
            "posterior_update",
            "sampling",
            "server",
            "acq_server",
            "gp_update",
            "acq_own",
            "gp_refit",
        }
        expected = (
            sum(v for k, v in c["phases_s"].items() if k != "gp_refit") + c["phases_s"]["gp_refit"] / c["refit_every"]
        )
        assert math.isclose(c["round_s"], expected, rel_tol=1e-9)
        assert math.isclose(
            c["round_without_refit_s"], c["round_s"] - c["phases_s"]["gp_refit"] / c["refit_every"], rel_tol=1e-9
        )
        assert math.isclose(c["per_agent_ms"], 1000 * c["round_s"] / c["N"], rel_tol=1e-9)
        # the cell ran a warm-up round and the timed one: its wall time holds every timed phase
        assert c["cell_wall_s"] > sum(c["phases_s"].values())
        assert c["repeats"] == 1 and c["P"] == (4 if c["d"] >= 2 else 2)


def test_reference_loop_quick(tmp_path):
    res = _run_quick("reference_loop.py", tmp_path)
    assert set(res["ours"]) == {"1", "2"} and res["reference"]["agents_timed"] == 3
    ref = res["reference"]
    assert math.isclose(ref["per_agent_ms"], 1000 * ref["round_s_for_timed_agents"] / ref["agents_timed"], rel_tol=1e-9)
    for t, ours in res["ours"].items():
        assert ours["torch_threads"] == int(t) and ours["N"] == 12
        assert math.isclose(ours["per_agent_ms"], 1000 * ours["round_s"] / ours["N"], rel_tol=1e-9)
    for t, s in res["speedup_per_agent_round"].items():
        assert math.isclose(s, res["reference"]["per_agent_ms"] / res["ours"][t]["per_agent_ms"], rel_tol=1e-9)
    assert [q["lengthscale"] for q in res["quality"]] == [0.1, 0.01]
    for q in res["quality"]:
        assert 0 <= q["fraction_ours_at_least_as_good"] <= 1 and q["functions"] == 3
    # one pair in --quick: the runs are the reported ones
    assert res["runs_per_agent_ms"] == {
        "1": [res["ours"]["1"]["per_agent_ms"]],
        "2": [res["ours"]["2"]["per_agent_ms"]],
        "reference": [ref["per_agent_ms"]],
    }


def test_batched_acqf_quick(tmp_path):
    res = _run_quick("batched_acqf.py", tmp_path)
    rows = res["rows"]
    assert [(r["B"], r["acquisition"]) for r in rows] == [
        (3, "UpperConfidenceBound"),
        (3, "LogExpectedImprovement"),
        (3, "PosteriorMean"),
    ]
    for r in rows:
        assert r["values_consistent"] and len(r["diffs"]) == 3
        assert math.isclose(r["speedup"], r["seconds_optimize_acqf"] / r["seconds_batched"], rel_tol=1e-9)
        assert math.isclose(r["cpu_speedup"], r["cpu_seconds_optimize_acqf"] / r["cpu_seconds_batched"], rel_tol=1e-9)
        assert r["batched_worse"] + r["batched_better"] <= 3 and r["diff_min"] <= r["diff_mean"] <= r["diff_max"]
