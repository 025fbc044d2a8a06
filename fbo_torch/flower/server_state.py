r"""The deployed server's durable state: its secret, its ledger and its rounds, in a folder only it reads.

A deployed server must survive a crash without under-reporting ε or reusing
noise, and must keep the one thing that makes its noise unpredictable — its
secret — away from everyone else. :class:`ServerState` is a folder on the
server's machine, chosen by server-side configuration only (the
``FBO_SERVER_STATE`` environment variable of the SuperLink that starts the
ServerApp, else one folder per federation under Flower's home,
:meth:`ServerState.for_federation`; never the run config, which every
ClientApp reads):

* ``secret.key`` — 32 bytes from the OS's cryptographic generator, written once
  (mode 0600) when the folder is first used; the server's coins and noise are
  drawn from it (:class:`~fbo_torch.federation.randomness.SecretServerRandomness`).
* ``server.json`` — the federation's fingerprint, the privacy ledger, every
  round's record and the exchange last sent (its broadcast included), written
  atomically (temporary file, fsync, rename; mode 0600) **before** that
  exchange is sent.

A server restarted on the same folder for the same federation resumes: its
ledger, verified (ε recomputed from the recorded releases), carries on from
what was released — never from 0 — and it re-sends the last exchange it
wrote, unchanged, so a broadcast is never drawn twice for one round with two
different noises. A folder of another federation, a finished federation and a
state that does not verify are refused with one line that says what to do.
Nothing here imports ``flwr``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fbo_torch.utils.files import write_atomic
from fbo_torch.utils.secure_random import SECRET_BYTES, check_secret, new_secret

#: The environment variable that points a ServerApp at its state folder.
STATE_ENV = "FBO_SERVER_STATE"
FORMAT = 1
SECRET_FILE = "secret.key"
STATE_FILE = "server.json"


class ServerStateError(RuntimeError):
    """The server's state folder cannot be used for this federation; the message says why and what to do."""


class ServerState:
    r"""A server's state folder (created with mode 0700 if missing).

    Args:
        folder: The folder. It holds one federation's state; use one per federation.
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            raise ServerStateError(f"server state folder {self.folder}: cannot create it ({err.strerror or err}).") from None
        if not self.folder.is_dir() or not os.access(self.folder, os.W_OK | os.X_OK):
            raise ServerStateError(f"server state folder {self.folder}: not a writable folder.")

    @classmethod
    def from_env(cls) -> ServerState | None:
        """The folder named by ``$FBO_SERVER_STATE``, or ``None`` when it is unset or empty."""
        path = os.environ.get(STATE_ENV, "").strip()
        return cls(path) if path else None

    @classmethod
    def for_federation(cls, fingerprint: str) -> ServerState:
        r"""``$FBO_SERVER_STATE``, else this federation's folder under Flower's home:
        ``$FLWR_HOME/fbo_torch/server/<first 16 hex digits of the federation's fingerprint>``
        (``FLWR_HOME`` defaults to ``~/.flwr``, as for Flower)."""
        state = cls.from_env()
        if state is not None:
            return state
        home = Path(os.environ.get("FLWR_HOME", "").strip() or Path.home() / ".flwr").expanduser()
        return cls(home / "fbo_torch" / "server" / fingerprint[:16])

    # ------------------------------------------------------------------ secret
    @property
    def secret_path(self) -> Path:
        return self.folder / SECRET_FILE

    def secret(self) -> bytes:
        """The server's secret: read from ``secret.key``, or drawn fresh and written once (0600)."""
        path = self.secret_path
        if not path.exists():
            tmp = self.folder / f".{SECRET_FILE}.{os.getpid()}.tmp"
            write_atomic(tmp, new_secret(), mode=0o600)
            try:
                os.link(tmp, path)  # whole or not at all, and never over a secret another process wrote first
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        try:
            data = path.read_bytes()
            return check_secret(data, str(path))
        except (OSError, TypeError, ValueError) as err:
            raise ServerStateError(f"{path}: not a {SECRET_BYTES}-byte server secret ({err}); restore it, or use a "
                                   f"new state folder (a new federation, ε from 0).") from None

    def set_secret(self, secret: bytes) -> None:
        """Install a given secret (e.g. to rerun a federation exactly); refused if another is there."""
        secret = check_secret(secret)
        path = self.secret_path
        if path.exists():
            if path.read_bytes() != secret:
                raise ServerStateError(f"{path} holds another secret; refusing to replace it.")
            return
        write_atomic(path, secret, mode=0o600)

    # ------------------------------------------------------------------ state
    def load(self, federation: str) -> dict[str, Any] | None:
        r"""The saved state of federation ``federation`` (a fingerprint), or ``None`` if there is none.

        Raises:
            ServerStateError: The folder holds another federation, a finished one,
                or an unreadable state.
        """
        path = self.folder / STATE_FILE
        if not path.exists():
            return None
        try:
            state = json.loads(path.read_text())
            fmt, saved, finished = state["format"], state["federation"], state["finished"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ServerStateError(
                f"{path} is unreadable ({type(err).__name__}: {err}); the server cannot account for what it "
                "released: restore the file, or start a new federation in a new state folder.") from None
        if fmt != FORMAT:
            raise ServerStateError(f"{path} has format {fmt!r}, this fbo_torch writes {FORMAT}.")
        if saved != federation:
            raise ServerStateError(
                f"{path} belongs to another federation (fingerprint {str(saved)[:16]}, this run's "
                f"{federation[:16]}): its releases were about other agents or settings. Use one state folder per "
                f"federation (set {STATE_ENV} to a new folder).")
        if finished:
            eps = state.get("epsilon")
            raise ServerStateError(
                f"{path}: this federation already finished its rounds (epsilon = {eps}); running it again "
                f"would release more about the same agents. Start a new federation in a new state folder "
                f"({STATE_ENV}) and account for both runs yourself.")
        return state

    def save(self, federation: str, state: dict[str, Any], finished: bool = False) -> None:
        """Write the state atomically (0600) before anything it describes is sent."""
        data = dict(state, format=FORMAT, federation=federation, finished=bool(finished))
        write_atomic(self.folder / STATE_FILE, json.dumps(data, indent=1, allow_nan=True).encode(), mode=0o600)


__all__ = ["STATE_ENV", "ServerState", "ServerStateError"]
