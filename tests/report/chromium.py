"""A headless Chromium driven over the DevTools protocol, for the report pages' real-browser tests.

:func:`chromium` finds the distribution's Chromium, installs it with ``apt-get`` where it is missing and
this is root on a Debian-like system (once, under a file lock: xdist workers may ask together), and
otherwise skips the test with a message that says why and how to get it. :class:`Browser` opens a page
and collects what a person would see in the console: uncaught exceptions, ``console.error`` calls,
the browser's error log entries, and any request that leaves the page's own file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

#: Chromium's flags: headless, and nothing that reaches the network on its own (on a closed network its
#: background connections are refused and logged).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-port=0",
)
NAMES = ("chromium", "chromium-browser", "google-chrome")
#: Set to 1 to never install Chromium from the tests (then they skip where it is missing).
NO_INSTALL_ENV = "FBO_TORCH_NO_BROWSER_INSTALL"


def _which() -> str | None:
    return next((p for p in map(shutil.which, NAMES) if p), None)


def chromium() -> str:
    """The Chromium executable; installed from the distribution where possible, else the test is skipped."""
    found = _which()
    if found:
        return found
    why = None
    if os.environ.get(NO_INSTALL_ENV, "") not in ("", "0"):
        why = f"{NO_INSTALL_ENV} is set"
    elif not hasattr(os, "geteuid") or os.geteuid() != 0:
        why = "not root, so it cannot be installed here"
    elif not shutil.which("apt-get"):
        why = "no apt-get to install it with"
    if why is None:
        with open(Path(tempfile.gettempdir()) / "fbo-torch-chromium.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one installer at a time; the others find it installed
            if not _which():
                env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
                for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
                    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
                    if proc.returncode != 0:
                        why = f"`{' '.join(cmd)}` failed: {proc.stderr.strip()[-300:]}"
                        break
        found = _which()
        if found:
            return found
    pytest.skip(
        f"no Chromium for the real-browser test of report.html ({why or 'the install did not provide it'}); "
        "install the distribution's package (Debian: apt-get install chromium) to run it"
    )


class Browser:
    """One headless Chromium with one tab, spoken to over the DevTools protocol (websockets)."""

    def __init__(self, executable: str, timeout: float = 60.0) -> None:
        from websockets.sync.client import connect

        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="fbo-torch-chromium-")
        self.proc = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its helper processes are ended with it (close)
        )
        port_file = Path(self.profile) / "DevToolsActivePort"
        end = time.monotonic() + timeout
        while not (port_file.exists() and len(port_file.read_text().split()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.close()
                pytest.fail(f"Chromium did not start (exit status {self.proc.poll()})")
            time.sleep(0.1)
        port, path = port_file.read_text().split()[:2]
        self.stack = contextlib.ExitStack()
        self.ws = self.stack.enter_context(connect(f"ws://127.0.0.1:{port}{path}", max_size=None, open_timeout=timeout))
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)

    def call(self, method: str, params: dict[str, Any] | None = None, session: bool = False) -> dict[str, Any]:
        """Send one command and wait for its answer (events that arrive meanwhile are kept)."""
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv(timeout=self.timeout))
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _wait_event(self, method: str) -> None:
        end = time.monotonic() + self.timeout
        while not any(e.get("method") == method for e in self.events):
            self.events.append(json.loads(self.ws.recv(timeout=max(0.1, end - time.monotonic()))))

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able)."""
        out = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def open(self, path: Path) -> None:
        """Load a file and wait until its load event has fired."""
        self.events.clear()
        self.call("Page.navigate", {"url": path.resolve().as_uri()}, session=True)
        self._wait_event("Page.loadEventFired")

    def console_errors(self) -> list[str]:
        """Uncaught exceptions, ``console.error``/``assert`` calls and error log entries since :meth:`open`."""
        self.evaluate("1")  # let pending events arrive
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(json.dumps(p.get("exceptionDetails", {}))[:500])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(json.dumps(p.get("args", []))[:500])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(json.dumps(p["entry"])[:500])
        return out

    def requests(self) -> list[str]:
        """URLs the page requested since :meth:`open`."""
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            if getattr(self, "stack", None) is not None:
                self.stack.close()
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)  # the group this test started, by its id
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
            shutil.rmtree(self.profile, ignore_errors=True)
