r"""The deployed server's durable state: its secret, its ledger and its rounds, in a folder only it reads.

A deployed server must survive a crash without under-reporting ε or reusing
noise, and must keep the one thing that makes its noise unpredictable — its
secret — away from everyone else. :class:`ServerState` is a folder on the
server's machine, chosen by server-side configuration only (the
``FBO_SERVER_STATE`` environment variable of the SuperLink that starts the
ServerApp, else one folder per federation under Flower's home,
:meth:`ServerState.for_federation`; never the run config, which every
ClientApp reads). It holds one file, ``server.json`` (mode 0600): the
federation's fingerprint, the server's secret (32 bytes from the OS's
cryptographic generator, drawn when the federation starts), the privacy
ledger, every round's record and the exchange last sent, its broadcast
included. The file is written atomically (temporary file, fsync, rename)
**before** the exchange it describes is sent.

The secret lives in the same file as the ledger on purpose: the noise of a
round is a function of (secret, round), so a secret that outlived its ledger
would let a new federation repeat an old one's noise. A server holds an
exclusive lock on the folder (``.lock``) while it runs: two servers on one
folder would release different data with the same noise, and the difference
of their broadcasts would show it; the second is refused.

Every state written with rounds in it is also recorded in the **release
journal** (:class:`ReleaseJournal`), an append-only file of hash-chained
entries (exchange, releases, ε, the state's SHA-256) kept *outside* the folder
(``<folder>.journal`` beside it, or ``$FBO_SERVER_JOURNAL``) and fsync'd
before the exchange is sent. A restart accepts only the state the journal's
last entry names (or the one written just before a crash stopped its entry):
a ``server.json`` copied back from earlier, a restored backup of the folder, a
truncated or emptied state are refused, and a state without rounds never gets
its federation's old secret back (a fresh one is drawn, and only while the
journal shows nothing was sent). Someone who can rewrite both the folder and
the journal consistently (the server's own user, root) is not stopped by it:
keep the journal on storage that user cannot rewrite if that matters.

A server restarted on the folder of its federation resumes: its ledger,
verified (ε recomputed from the recorded releases), carries on from what was
released — never from 0 — and it re-sends the last exchange it wrote,
unchanged, so a round's broadcast is never drawn twice. A folder of another
federation, a finished federation, a state that does not verify, and a folder
or file that others could write or replace (wrong owner, group- or
world-writable, a symbolic link) are refused with one line that says what to
do. Nothing here imports ``flwr``.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from fbo_torch.utils.files import sync_folder, write_atomic
from fbo_torch.utils.secure_random import SECRET_BYTES, check_secret, new_secret

#: The environment variable that points a ServerApp at its state folder.
STATE_ENV = "FBO_SERVER_STATE"
#: The environment variable that names the release journal (default: ``<state folder>.journal``).
JOURNAL_ENV = "FBO_SERVER_JOURNAL"
FORMAT = 3
STATE_FILE = "server.json"
LOCK_FILE = ".lock"
#: The ``prev`` of a journal's first entry.
GENESIS = "0" * 64


class ServerStateError(RuntimeError):
    """The server's state folder cannot be used for this federation; the message says why and what to do."""


def _check_private(path: Path, st: os.stat_result, what: str, mode_mask: int) -> None:
    """``path`` must be owned by this user and have none of ``mode_mask``'s permission bits."""
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise ServerStateError(
            f"{what} {path} belongs to another user (uid {st.st_uid}); the server's secret and "
            "ledger must be in a folder only the server's user controls."
        )
    if st.st_mode & mode_mask:
        raise ServerStateError(
            f"{what} {path} has mode {stat.S_IMODE(st.st_mode):o}: others could read or replace "
            f"the server's secret or ledger; chmod it {'700' if mode_mask == 0o022 else '600'}."
        )


def _digest(data: Any) -> str:
    """SHA-256 of the canonical JSON of ``data``."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


class ReleaseJournal:
    r"""An append-only, hash-chained record of every exchange the server wrote before sending it.

    One JSON line per entry: ``seq`` (0, 1, ...), ``federation``, ``exchange``
    (the round of the exchange), ``releases`` and ``epsilon`` (the ledger's),
    ``finished``, ``state`` (SHA-256 of the state written), ``prev`` (the
    previous entry's ``hash``) and ``hash`` (SHA-256 of the entry without it).
    An entry is appended with ``O_APPEND`` and fsync'd; the file is opened
    without following symbolic links and must be a 0600 file of this user.

    Args:
        path: The journal file (created, mode 0600, when first appended to).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser()

    def _open(self, flags: int) -> int:
        try:
            return os.open(self.path, flags | os.O_NOFOLLOW, 0o600)
        except OSError as err:
            raise ServerStateError(
                f"release journal {self.path}: cannot open it ({err.strerror or err}); it must be "
                f"a regular file of the server's user, not a symbolic link ({JOURNAL_ENV})."
            ) from None

    def entries(self) -> list[dict[str, Any]]:
        r"""Every entry, the chain verified (``[]`` when there is no journal).

        Raises:
            ServerStateError: The file cannot be read safely, or an entry is malformed
                or does not chain to the one before it.
        """
        if not os.path.lexists(self.path):
            return []
        fd = self._open(os.O_RDONLY)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ServerStateError(f"release journal {self.path} is not a regular file.")
            _check_private(self.path, st, "release journal", 0o077)
            lines = fh.read().decode("utf-8", errors="replace").splitlines()
        out: list[dict[str, Any]] = []
        prev = GENESIS
        for i, line in enumerate(lines):
            try:
                entry = json.loads(line)
                ok = (
                    isinstance(entry, dict)
                    and entry.get("seq") == i
                    and entry.get("prev") == prev
                    and entry.get("hash") == _digest({k: v for k, v in entry.items() if k != "hash"})
                )
            except ValueError:
                ok = False
            if not ok:
                raise ServerStateError(
                    f"release journal {self.path}: entry {i + 1} is malformed or does not follow from the one "
                    "before it (edited or truncated): the server cannot tell what it released. Restore the "
                    "journal, or start a new federation in a new state folder."
                )
            out.append(entry)
            prev = entry["hash"]
        return out

    @staticmethod
    def next_entry(
        last: dict[str, Any] | None, federation: str, state: dict[str, Any], finished: bool, epsilon: Any
    ) -> dict[str, Any]:
        """The entry that records ``state`` after ``last`` (not yet appended)."""
        server = state.get("server") or {}
        ledger = server.get("ledger") or {}
        entry = {
            "seq": 0 if last is None else last["seq"] + 1,
            "federation": federation,
            "exchange": state.get("round"),
            "releases": len(ledger.get("epsilons", [])),
            "epsilon": epsilon,
            "finished": bool(finished),
            "state": _digest(state),
            "prev": GENESIS if last is None else last["hash"],
        }
        entry["hash"] = _digest(entry)
        return entry

    def append(self, entry: dict[str, Any]) -> None:
        """Append ``entry`` and flush it (and, for a new file, its folder) to disk."""
        new = not os.path.lexists(self.path)
        fd = self._open(os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ServerStateError(f"release journal {self.path} is not a regular file.")
            _check_private(self.path, st, "release journal", 0o077)
            os.write(fd, (json.dumps(entry, sort_keys=True, separators=(",", ":"), allow_nan=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            sync_folder(self.path.parent)


class ServerState:
    r"""A server's state folder (created with mode 0700 if missing).

    Args:
        folder: The folder. It holds one federation's state; use one per federation.
        journal: The release journal's file (default: ``$FBO_SERVER_JOURNAL``, else
            ``<folder>.journal`` beside the folder, so that restoring the folder
            from a backup does not roll the journal back with it).

    Raises:
        ServerStateError: The folder cannot be created, is a symbolic link, belongs
            to another user, or is writable by others.
    """

    def __init__(self, folder: str | os.PathLike[str], journal: str | os.PathLike[str] | None = None) -> None:
        self._lock_fd: int | None = None
        self.folder = Path(folder).expanduser()
        if journal is None:
            journal = os.environ.get(JOURNAL_ENV, "").strip() or None
        self.journal = ReleaseJournal(
            journal if journal is not None else self.folder.parent / f"{self.folder.name}.journal"
        )
        self._last: dict[str, Any] | None = None  # the journal's last entry, once read
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.lstat(self.folder)
        except OSError as err:
            raise ServerStateError(
                f"server state folder {self.folder}: cannot create it ({err.strerror or err})."
            ) from None
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise ServerStateError(
                f"server state folder {self.folder} is a symbolic link or not a folder; give the real folder."
            )
        _check_private(self.folder, st, "server state folder", 0o022)
        if not os.access(self.folder, os.W_OK | os.X_OK):
            raise ServerStateError(f"server state folder {self.folder}: not writable.")

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
        return cls(cls.default_root() / fingerprint[:16])

    @staticmethod
    def default_root() -> Path:
        """``$FLWR_HOME/fbo_torch/server``: where federations' folders go by default."""
        home = Path(os.environ.get("FLWR_HOME", "").strip() or Path.home() / ".flwr").expanduser()
        return home / "fbo_torch" / "server"

    # ------------------------------------------------------------------ the lock
    def lock(self) -> None:
        """Hold the folder for this process (released by :meth:`release` or when the process ends)."""
        if self._lock_fd is not None:
            return
        fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ServerStateError(
                    f"server state folder {self.folder} is in use by another server process: two servers on one "
                    "folder would release different data with the same noise. Stop the other one, or give this "
                    f"one its own folder ({STATE_ENV})."
                ) from None
            raise ServerStateError(f"server state folder {self.folder}: cannot lock it ({err.strerror}).") from None
        self._lock_fd = fd

    def release(self) -> None:
        """Let go of the folder."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __del__(self) -> None:
        self.release()

    # ------------------------------------------------------------------ the file
    @property
    def path(self) -> Path:
        return self.folder / STATE_FILE

    def _read(self) -> dict[str, Any] | None:
        path = self.path
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise ServerStateError(
                f"{path}: cannot open it ({err.strerror}); it must be a regular file, not a symbolic link."
            ) from None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ServerStateError(f"{path} is not a regular file.")
            _check_private(path, st, "server state file", 0o077)
            text = fh.read()
        try:
            state = json.loads(text)
            state["format"], state["federation"], state["finished"], state["secret"]
        except (ValueError, KeyError, TypeError) as err:
            raise ServerStateError(
                f"{path} is unreadable ({type(err).__name__}: {err}); the server cannot account for what it "
                "released: restore the file, or start a new federation in a new state folder."
            ) from None
        return state

    def open(self, federation: str, secret: bytes | None = None) -> tuple[bytes, dict[str, Any] | None]:
        r"""Lock the folder and return ``(secret, saved state or None)`` for federation ``federation``.

        A new federation — no state file, or one without rounds (nothing sent:
        the journal holds no entry of this federation) — gets ``secret`` (default:
        a fresh one from the OS's generator), never a secret found in the folder,
        written at once with an empty record, so it exists only together with
        its ledger. A saved state is returned only if it is the one the release
        journal's last entry names.

        Raises:
            ServerStateError: Another process holds the folder; it holds another
                federation, a finished one, another secret than ``secret``, an
                unreadable state, or a state older than what the journal says was
                sent (rolled back, restored from a backup, emptied).
        """
        if secret is not None:
            secret = check_secret(secret)
        self.lock()
        try:
            return self._open(federation, secret)
        except BaseException:
            self.release()
            raise

    def _open(self, federation: str, secret: bytes | None) -> tuple[bytes, dict[str, Any] | None]:
        entries = self.journal.entries()
        self._last = entries[-1] if entries else None
        state = self._read()
        path = self.path
        if state is not None:
            if state["format"] != FORMAT:
                raise ServerStateError(f"{path} has format {state['format']!r}, this fbo_torch writes {FORMAT}.")
            if state["federation"] != federation:
                raise ServerStateError(
                    f"{path} belongs to another federation (fingerprint {str(state['federation'])[:16]}, this run's "
                    f"{federation[:16]}): its releases were about other agents or settings. Use one state folder "
                    f"per federation (set {STATE_ENV} to a new folder)."
                )
            if state["finished"]:
                raise ServerStateError(
                    f"{path}: this federation already finished its rounds (epsilon = {state.get('epsilon')}); "
                    "running it again would release more about the same agents. Start a new federation in a new "
                    f"state folder ({STATE_ENV}) and account for both runs yourself."
                )
        if state is None or not state.get("state"):
            sent = [e for e in entries if e["federation"] == federation]
            if sent:
                last = sent[-1]
                raise ServerStateError(
                    f"{path} is {'missing' if state is None else 'empty'}, but the release journal "
                    f"{self.journal.path} records exchange {last['exchange']} of this federation as sent "
                    f"({last['releases']} release(s), epsilon = {last['epsilon']}): its ledger and secret are gone "
                    "or rolled back, and starting over would under-count epsilon. Restore the state folder, or "
                    f"start a new federation in a new state folder ({STATE_ENV}) and account for both runs yourself."
                )
            # nothing of this federation was sent: a fresh secret, never the one in the file
            secret = secret if secret is not None else new_secret()
            self.save(federation, secret, None)
            return secret, None
        try:
            saved = check_secret(bytes.fromhex(state["secret"]), f"{path}: secret")
        except (TypeError, ValueError) as err:
            raise ServerStateError(f"{path}: its secret is not {SECRET_BYTES} bytes in hex ({err}).") from None
        if secret is not None and secret != saved:
            raise ServerStateError(f"{path} holds another secret than the one given; refusing to mix them.")
        self._check_journal(state)
        return saved, state["state"]

    def _check_journal(self, state: dict[str, Any]) -> None:
        r"""``state`` must be what the journal's last entry names, or the state written just before a
        crash stopped its entry (then that entry is appended now: nothing it describes was sent)."""
        path, last, entry = self.path, self._last, state.get("journal")
        recorded = (
            "holds no entry"
            if last is None
            else f"records exchange {last['exchange']}, {last['releases']} release(s), epsilon = {last['epsilon']}"
        )
        rolled_back = ServerStateError(
            f"{path} is not the last state this server wrote (the release journal {self.journal.path} {recorded}): "
            "it was rolled back, restored from a backup or replaced, or the journal was. Restore both, or start "
            f"a new federation in a new state folder ({STATE_ENV})."
        )
        if (
            not isinstance(entry, dict)
            or entry.get("state") != _digest(state["state"])
            or entry.get("hash") != _digest({k: v for k, v in entry.items() if k != "hash"})
        ):
            raise rolled_back
        if last is not None and entry == last:
            return
        if entry.get("seq") == (0 if last is None else last["seq"] + 1) and entry.get("prev") == (
            GENESIS if last is None else last["hash"]
        ):
            self.journal.append(entry)
            self._last = entry
            return
        raise rolled_back

    def save(
        self, federation: str, secret: bytes, state: dict[str, Any] | None, finished: bool = False, epsilon: Any = None
    ) -> None:
        """Write the state atomically (0600), then its journal entry, before anything it describes is sent."""
        entry = None
        if state is not None:
            entry = ReleaseJournal.next_entry(self._last, federation, state, finished, epsilon)
        data = {
            "format": FORMAT,
            "federation": federation,
            "finished": bool(finished),
            "epsilon": epsilon,
            "secret": secret.hex(),
            "state": state,
            "journal": entry,
        }
        write_atomic(self.path, json.dumps(data, indent=1, allow_nan=True).encode(), mode=0o600)
        if entry is not None:
            self.journal.append(entry)
            self._last = entry


__all__ = ["JOURNAL_ENV", "STATE_ENV", "ReleaseJournal", "ServerState", "ServerStateError"]
