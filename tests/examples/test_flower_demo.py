"""`make flower-demo` end to end: a secured SuperLink and 4 SuperNodes on 127.0.0.1, 3 rounds, an intruder
refused, nothing left behind; and two SuperNodes that each evaluate their own objective, named only in their
node configs (`OWN_OBJECTIVES=1`)."""

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr")

ROOT = Path(__file__).resolve().parents[2]


def _free_ports(count: int) -> int:
    """A base port with ``count`` free ports after it."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count >= 65535:
            continue
        socks = []
        try:
            for p in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.skip("no free block of ports on 127.0.0.1")


def _processes_of(work_marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if work_marker in line]


@pytest.mark.slow  # a SuperLink, 5 SuperNodes and a 3-round run (`make test` runs it; -m "not slow" skips it)
@pytest.mark.skipif(shutil.which("ps") is None or not sys.platform.startswith("linux"), reason="needs Linux ps")
def test_flower_demo_runs_three_secured_rounds_refuses_an_intruder_and_stops_every_process(tmp_path):
    port = _free_ports(7)
    env = dict(
        os.environ, VENV=str(Path(sys.executable).parent.parent), PORT=str(port), TMPDIR=str(tmp_path), ROGUE="1"
    )
    env.pop("INSECURE", None)
    proc = subprocess.run(
        [str(ROOT / "examples/flower_app/run_demo.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rounds = re.findall(r"^round (\d): epsilon = ([0-9.]+) .*reported (\d)/4 .*$", proc.stdout, re.M)
    assert [r[0] for r in rounds] == ["1", "2", "3"]
    eps = [float(r[1]) for r in rounds]
    assert 0 < eps[0] < eps[1] < eps[2]
    assert all(
        len(re.findall(r"agent \d: [-0-9.]+", line)) == 4
        for line in proc.stdout.splitlines()
        if line.startswith("round ")
    )
    assert "TLS + SuperNode authentication, agents bound to node keys" in proc.stdout
    # a SuperNode whose key is not registered, claiming agent 0, is refused by the SuperLink (loopback, real TLS)
    assert re.search(
        r"^rogue SuperNode .*refused by the SuperLink: \[code: 2004\] Failed to activate SuperNode", proc.stdout, re.M
    ), proc.stdout
    assert _processes_of(str(tmp_path)) == []  # no SuperLink, SuperNode, SuperExec or app process left
    assert _processes_of(f"127.0.0.1:{port}") == []


@pytest.mark.slow  # a SuperLink, 2 SuperNodes training their own CNNs, a 2-round run
@pytest.mark.skipif(shutil.which("ps") is None or not sys.platform.startswith("linux"), reason="needs Linux ps")
def test_two_nodes_each_evaluate_the_objective_named_only_in_their_own_node_config(tmp_path):
    """Each SuperNode's node config names `digits_on_device:DigitsOnDevice` and its own data file; the run
    config holds only the federation's parameters. Both agents report validation accuracies of their own
    CNNs, and neither the run config nor the server's log names the class."""
    port = _free_ports(4)
    env = dict(
        os.environ,
        VENV=str(Path(sys.executable).parent.parent),
        PORT=str(port),
        TMPDIR=str(tmp_path),
        OWN_OBJECTIVES="1",
        NUM_NODES="2",
        ROUNDS="2",
        KEEP="1",
    )
    for key in ("INSECURE", "ROGUE"):
        env.pop(key, None)
    proc = subprocess.run(
        [str(ROOT / "examples/flower_app/run_demo.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rounds = re.findall(r"^round (\d): epsilon = ([0-9.]+) .*reported (\d)/2 .*$", proc.stdout, re.M)
    assert [(r[0], r[2]) for r in rounds] == [("1", "2"), ("2", "2")]
    assert 0 < float(rounds[0][1]) < float(rounds[1][1])
    for line in (ln for ln in proc.stdout.splitlines() if ln.startswith("round ")):
        best = [float(v) for v in re.findall(r"agent \d: ([-0-9.]+) \(\d+ obs\)", line)]
        assert len(best) == 2 and all(0.0 < v <= 1.0 for v in best), line  # validation accuracies
    assert "each node's own objective (node config)" in proc.stdout
    work = next(tmp_path.glob("fbo-flower-demo.*"))
    server_log = (work / "run.log").read_text()
    assert "digits_on_device" not in server_log and "DigitsOnDevice" not in server_log
    assert _processes_of(str(tmp_path)) == [] and _processes_of(f"127.0.0.1:{port}") == []
