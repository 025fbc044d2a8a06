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
