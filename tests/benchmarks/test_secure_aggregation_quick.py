"""Keeps ``benchmarks/secure_aggregation.py`` working: its quick utility study and a 4-node overhead cell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "secure_aggregation.py"


def _run(*args, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_secure_aggregation_quick(tmp_path):
    proc = _run("utility", "--quick", tmp_path=tmp_path)
    assert "| quick | secure, matched ε |" in proc.stdout
    entry = json.loads((tmp_path / "utility_quick.json").read_text())["objectives"]["quick"]
    arms = entry["arms"]
    assert set(arms) == {"central", "secure, same z", "secure, matched ε"}
    assert arms["central"]["epsilon_server"] is None and arms["central"]["accountant"] == "rdp"
    # the matched arm's ε against others is the central ε; the server's ε is reported beside it
    assert abs(arms["secure, matched ε"]["epsilon"] - entry["central_epsilon"]) < 1e-3 * entry["central_epsilon"]
    assert arms["secure, matched ε"]["epsilon_server"] > 0
    assert arms["secure, matched ε"]["noise_multiplier"] > arms["secure, same z"]["noise_multiplier"]

    _run("overhead", "--nodes", "4", "--loopback", tmp_path=tmp_path)
    cell = json.loads((tmp_path / "overhead.json").read_text())["in_process"]
    assert [c["N"] for c in cell] == [4] and cell[0]["bytes_sent"] > 0 and cell[0]["threshold"] == 4


def test_the_scaling_plot_reads_every_kind_of_row(tmp_path):
    """``plot``: SecAgg+ seconds and bytes per node from each finished secure round, a central run's time per
    round, a run that did not finish as a marked point, and the in-process cells split by share count."""
    runs = {
        "in_process": [
            {"N": 8, "num_shares": 8, "server_s": 0.5, "nodes_s_total": 1.5, "bytes_sent": 80, "bytes_received": 40},
            {"N": 8, "num_shares": 7, "server_s": 0.25, "nodes_s_total": 0.75, "bytes_sent": 40, "bytes_received": 24},
        ],
        "loopback": [
            {
                "N": 4,
                "secagg": True,
                "rounds": 2,
                "returncode": 0,
                "wall_s": 50.0,
                "rounds_log": [
                    {"secagg": {"seconds": 10.0, "bytes_sent": 400, "bytes_received": 200}},
                    {"secagg": {"seconds": 12.0, "bytes_sent": 400, "bytes_received": 240}},
                ],
            },
            {
                "N": 4,
                "secagg": False,
                "rounds": 2,
                "returncode": 0,
                "wall_s": 30.0,
                "phases": {"superlink-up": 6.0, "run-done": 26.0},
            },
            {"N": 64, "secagg": True, "rounds": 2, "returncode": 1, "wall_s": 288.0},
        ],
    }
    path = tmp_path / "overhead.json"
    path.write_text(json.dumps(runs))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "plot", str(tmp_path / "scaling.png"), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    points = json.loads(proc.stdout)
    assert points["secagg_loopback"] == [[4, 10.0, 150.0], [4, 12.0, 160.0]]
    assert len(points["central_loopback"]) == 1 and points["central_loopback"][0][:2] == [4, 10.0]  # (26 - 6) / 2
    assert points["failed_loopback"][0][:2] == [64, 288.0]
    assert points["in_process_all"] == [[8, 2.0, 15.0]] and points["in_process_ring"] == [[8, 1.0, 8.0]]
    assert (tmp_path / "scaling.png").stat().st_size > 0
