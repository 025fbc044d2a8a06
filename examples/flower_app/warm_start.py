r"""Start Flower's per-message app processes from a warm, pre-imported parent.

Flower's deployment engine runs every ClientApp message (and the ServerApp) in
a new process: ``flwr-clientapp`` / ``flwr-serverapp``, started by the
SuperNode's (SuperLink's) SuperExec from ``PATH``. Each such process imports
``flwr``, ``torch`` and ``fbo_torch`` before it does any work, for every
agent and every round; Flower's own processes (``flower-superlink``,
``flower-supernode``, the ``flower-superexec`` each of them starts, the ``flwr``
CLI) pay the same import cost once each (docs/design.md has the seconds).

This script is a fork server for all of those processes, for the demo
(``run_demo.sh``) and small machines; a deployment does not need it.
:func:`serve` imports everything once, then listens on a Unix socket; the
shims that :func:`write_shims` puts first on ``PATH`` (one per entry of
:data:`ENTRY_POINTS`) send their arguments, environment, working directory and
standard streams over it, and the server forks a child that runs Flower's own
entry point (:func:`flwr.supernode.cli.flwr_clientapp.flwr_clientapp` or the
ServerApp's) with them. The child is a fresh process for one task (or one
long-running service), as Flower expects; only the imports are shared. The
shim exits with the child's exit code and stops the child if it is stopped itself.

Nothing about Flower's protocol changes: without the shims on ``PATH`` the
same app runs the plain way (``WARM=0 make flower-demo``).

Run: ``python examples/flower_app/warm_start.py SOCKET SHIM_DIR BIN_DIR``.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
from pathlib import Path

#: The console scripts of ``flwr`` that the shims stand for (as in flwr's entry_points.txt).
ENTRY_POINTS = {
    "flwr-clientapp": ("flwr.supernode.cli", "flwr_clientapp"),
    "flwr-serverapp": ("flwr.superlink.cli", "flwr_serverapp"),
    "flower-superexec": ("flwr.supercore.cli", "flower_superexec"),
    "flower-superlink": ("flwr.superlink.cli", "flower_superlink"),
    "flower-supernode": ("flwr.supernode.cli", "flower_supernode"),
    "flwr": ("flwr.cli.app", "app"),
}

SHIM = r"""#!{python}
# Flower's `{name}` started by the fork server at {socket} (examples/flower_app/warm_start.py).
import json, os, signal, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect({socket!r})
except OSError:
    os.execv({real!r}, [{real!r}] + sys.argv[1:])  # no server: the plain way
req = json.dumps({{"name": {name!r}, "argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}}).encode()
socket.send_fds(s, [struct.pack("!I", len(req)) + req], [0, 1, 2])
signal.signal(signal.SIGTERM, lambda *_: (s.close(), sys.exit(143)))
data = b""
while len(data) < 4:
    chunk = s.recv(4 - len(data))
    if not chunk:
        sys.exit(1)
    data += chunk
sys.exit(struct.unpack("!i", data)[0])
"""


def write_shims(shim_dir: str | Path, sock: str, bin_dir: str | Path) -> None:
    """Write a shim per entry point into ``shim_dir`` (put it first on ``PATH``)."""
    shim_dir = Path(shim_dir)
    shim_dir.mkdir(parents=True, exist_ok=True)
    for name in ENTRY_POINTS:
        path = shim_dir / name
        path.write_text(SHIM.format(python=sys.executable, name=name, socket=sock, real=str(Path(bin_dir) / name)))
        path.chmod(0o755)


def _preload() -> dict:
    """Import what every app process needs (the cost this server saves)."""
    import importlib

    import torch  # noqa: F401

    import fbo_torch.federation.agents
    import fbo_torch.flower.client_app
    import fbo_torch.flower.server_app  # noqa: F401

    return {name: getattr(importlib.import_module(mod), fn) for name, (mod, fn) in ENTRY_POINTS.items()}


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    size = struct.unpack("!I", msg[:4])[0]
    while len(msg) < 4 + size:
        chunk = conn.recv(4 + size - len(msg))
        if not chunk:
            raise ConnectionError("shim closed the connection mid-request")
        msg += chunk
    return json.loads(msg[4 : 4 + size]), fds


def _run_child(entry, request: dict, fds: list[int]) -> None:
    """In the forked child: become the app process the shim stands for."""
    code = 0
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        # the caller's PYTHONPATH, as a fresh interpreter would put it first (e.g. a node's own objective)
        for folder in reversed([e for e in request["env"].get("PYTHONPATH", "").split(os.pathsep) if e]):
            if folder not in sys.path:
                sys.path.insert(0, folder)
        threads = request["env"].get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:  # torch read it when the server imported it; the caller's wins
            sys.modules["torch"].set_num_threads(int(threads))
        sys.argv = [request["name"], *request["argv"]]
        entry()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(sock_path: str) -> None:
    """Import once, then fork one child per shim connection until SIGTERM/SIGINT."""
    entries = _preload()
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(64)
    server.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}  # pid -> the shim's connection
    started: dict[int, tuple[str, float]] = {}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    print(f"warm start: ready on {sock_path}", flush=True)
    try:
        while not stop:
            for key, _ in sel.select(timeout=0.05):
                if key.fileobj is server:
                    try:
                        conn, _ = server.accept()
                    except BlockingIOError:
                        continue
                    conn.setblocking(True)
                    try:
                        request, fds = _recv_request(conn)
                    except (OSError, ValueError, ConnectionError):
                        conn.close()
                        continue
                    pid = os.fork()
                    if pid == 0:
                        server.close()
                        conn.close()
                        _run_child(entries[request["name"]], request, fds)
                    for fd in fds:
                        os.close(fd)
                    children[pid] = conn
                    started[pid] = (request["name"], time.monotonic())
                    sel.register(conn, selectors.EVENT_READ, pid)
                else:  # the shim went away (stopped): stop its child
                    pid = key.data
                    sel.unregister(key.fileobj)
                    if pid in children:
                        try:
                            os.kill(pid, signal.SIGTERM)
                        except ProcessLookupError:
                            pass
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                conn = children.pop(pid, None)
                name, t0 = started.pop(pid, ("?", time.monotonic()))
                print(
                    f"warm start: {name} pid {pid} exit {os.waitstatus_to_exitcode(status)} "
                    f"after {time.monotonic() - t0:.2f} s",
                    flush=True,
                )
                if conn is not None:
                    try:
                        sel.unregister(conn)
                    except (KeyError, ValueError):
                        pass
                    try:
                        conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
                    except OSError:
                        pass
                    conn.close()
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for pid in list(children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        server.close()
        if os.path.exists(sock_path):
            os.unlink(sock_path)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python warm_start.py SOCKET SHIM_DIR BIN_DIR")
    write_shims(sys.argv[2], sys.argv[1], sys.argv[3])
    serve(sys.argv[1])
