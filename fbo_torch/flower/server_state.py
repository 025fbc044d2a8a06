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
entries (exchange, releases, ε, a commitment to the secret, the state's
SHA-256) kept *outside* the folder (``<folder>.journal`` beside it, or
``$FBO_SERVER_JOURNAL``) and fsync'd before the exchange is sent. The journal
**proves forward progress**: along the chain the federation and the secret's
commitment never change, and the exchange and release counters only move
forward, by at most one each per entry (:meth:`ReleaseJournal.follows`);
an entry that breaks this — appended by anyone who can only append — makes
the whole journal refused. A restart accepts only the state the journal's
last entry names, with the secret it commits to, or the one written just
before a crash stopped its entry — which must follow the last entry the same
way and whose counters must be what the state holds: a ``server.json`` copied
back from earlier (with or without a forged "crash" entry), one whose secret
was replaced, a restored backup of the folder, a truncated or emptied state
are refused, and a state without rounds never gets its federation's old
secret back (a fresh one is drawn, and only while the journal shows nothing
was sent). A journal holds **one federation** and is locked (``flock``) by the
server that holds the folder: a second federation pointed at it (a shared
``$FBO_SERVER_JOURNAL``) is refused instead of breaking the chain. Someone who
can rewrite both the folder and the journal consistently (the server's own
user, root) is not stopped by it: keep the journal on storage that user
cannot rewrite if that matters.

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
import math
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
FORMAT = 4
STATE_FILE = "server.json"
LOCK_FILE = ".lock"
#: The ``prev`` of a journal's first entry.
GENESIS = "0" * 64
#: An entry's ``epsilon`` of a federation without privacy accounting (TS: ``"nan"``; no ε given: ``None``).
_UNACCOUNTED = ("nan", None)


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


def secret_commitment(secret: bytes) -> str:
    """SHA-256 commitment to a server secret (256 random bits: it hides the secret), in the journal's chain."""
    return hashlib.sha256(b"fbo-torch/server-secret/v1" + check_secret(secret)).hexdigest()


def _counter(value: Any) -> float:
    """An entry's exchange, release count or ε as a number (``"inf"`` is infinite); NaN when it is not one."""
    if isinstance(value, bool):
        return math.nan
    if isinstance(value, (int, float)):
        return float(value)
    return math.inf if value == "inf" else math.nan


class ReleaseJournal:
    r"""An append-only, hash-chained record of every exchange the server wrote before sending it.

    One JSON line per entry: ``seq`` (0, 1, ...), ``federation``, ``exchange``
    (the round of the exchange), ``releases`` and ``epsilon`` (the ledger's),
    ``finished``, ``secret`` (:func:`secret_commitment`), ``state`` (SHA-256 of
    the state written), ``prev`` (the previous entry's ``hash``) and ``hash``
    (SHA-256 of the entry without it). Every entry :meth:`follows` the one
    before it. An entry is appended with ``O_APPEND`` and fsync'd; the file is
    opened without following symbolic links and must be a 0600 file of this
    user.

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
        for i, line in enumerate(lines):
            try:
                entry = json.loads(line)
                ok = isinstance(entry, dict) and self.follows(out[-1] if out else None, entry)
            except ValueError:
                ok = False
            if not ok:
                raise ServerStateError(
                    f"release journal {self.path}: entry {i + 1} is malformed or does not follow from the one "
                    "before it (edited, truncated, or an appended entry that moves a counter back or changes the "
                    "federation or secret): the server cannot tell what it released. Restore the journal, or start "
                    "a new federation in a new state folder."
                )
            out.append(entry)
        return out

    @staticmethod
    def follows(last: dict[str, Any] | None, entry: dict[str, Any]) -> bool:
        r"""Whether ``entry`` may come right after ``last`` (``None``: first): it chains to it (``seq``, ``prev``,
        its own ``hash``), names the same federation and secret commitment, and moves forward — exchange and
        release counters by 0 or 1 each, ε never down, a finished federation never unfinished."""
        if entry.get("hash") != _digest({k: v for k, v in entry.items() if k != "hash"}):
            return False
        if not (isinstance(entry.get("secret"), str) and isinstance(entry.get("finished"), bool)):
            return False
        exchange, releases, eps = (_counter(entry.get(k)) for k in ("exchange", "releases", "epsilon"))
        accounted = entry.get("epsilon") not in _UNACCOUNTED
        if not (exchange >= 0 and releases >= 0 and (eps >= 0 or not accounted)):
            return False
        if last is None:
            return entry.get("seq") == 0 and entry.get("prev") == GENESIS
        steps = (exchange - _counter(last["exchange"]), releases - _counter(last["releases"]))
        return (
            entry.get("seq") == last["seq"] + 1
            and entry.get("prev") == last["hash"]
            and entry.get("federation") == last["federation"]
            and entry["secret"] == last["secret"]
            and all(step in (0.0, 1.0) for step in steps)
            and (eps >= _counter(last["epsilon"]) if accounted else last["epsilon"] in _UNACCOUNTED)
            and entry["finished"] >= last["finished"]
        )

    @staticmethod
    def describe(federation: str, state: dict[str, Any], finished: bool, epsilon: Any, secret: bytes) -> dict[str, Any]:
        """What an entry says of ``state``: federation, counters, ε, finished, secret commitment, digest."""
        server = state.get("server") or {}
        ledger = server.get("ledger") or {}
        return {
            "federation": federation,
            "exchange": state.get("round"),
            "releases": len(ledger.get("epsilons", [])),
            "epsilon": epsilon,
            "finished": bool(finished),
            "secret": secret_commitment(secret),
            "state": _digest(state),
        }

    @staticmethod
    def next_entry(
        last: dict[str, Any] | None,
        federation: str,
        state: dict[str, Any],
        finished: bool,
        epsilon: Any,
        secret: bytes,
    ) -> dict[str, Any]:
        """The entry that records ``state`` after ``last`` (not yet appended)."""
        entry = {
            "seq": 0 if last is None else last["seq"] + 1,
            **ReleaseJournal.describe(federation, state, finished, epsilon, secret),
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
        self._journal_fd: int | None = None
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
        """Hold the folder and its journal for this process (released by :meth:`release` or when the
        process ends)."""
        if self._lock_fd is not None:
            return
        fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        _flock(
            fd,
            f"server state folder {self.folder} is in use by another server process: two servers on one folder "
            f"would release different data with the same noise. Stop the other one, or give this one its own "
            f"folder ({STATE_ENV}).",
        )
        self._lock_fd = fd
        try:
            new = not os.path.lexists(self.journal.path)
            jfd = self.journal._open(os.O_RDWR | os.O_CREAT)
            if new:
                sync_folder(self.journal.path.parent)
            _flock(
                jfd,
                f"release journal {self.journal.path} is in use by another server (another federation's, or "
                f"this one's): a journal records one federation. Give each federation its own ({JOURNAL_ENV}).",
            )
        except BaseException:
            self.release()
            raise
        self._journal_fd = jfd

    def release(self) -> None:
        """Let go of the folder and its journal."""
        for name in ("_journal_fd", "_lock_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

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
        if entries and entries[0]["federation"] != federation:
            raise ServerStateError(
                f"release journal {self.journal.path} records federation {str(entries[0]['federation'])[:16]}, not "
                f"this run's {federation[:16]}: a journal records one federation. Give each federation its own "
                f"journal ({JOURNAL_ENV}) and state folder ({STATE_ENV})."
            )
        if state is None or not state.get("state"):
            if entries:
                last = entries[-1]
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
        self._check_journal(state, federation, saved)
        return saved, state["state"]

    def _check_journal(self, state: dict[str, Any], federation: str, secret: bytes) -> None:
        r"""``state`` must be what the journal's last entry names, with the secret it commits to, or the state
        written just before a crash stopped its entry — an entry that :meth:`ReleaseJournal.follows` the last
        and says what the state holds (then it is appended now: nothing it describes was sent)."""
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
        described = ReleaseJournal.describe(federation, state["state"], state["finished"], state.get("epsilon"), secret)
        if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in described.items()):
            raise rolled_back
        if last is not None and entry == last:
            return
        if ReleaseJournal.follows(last, entry):
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
            entry = ReleaseJournal.next_entry(self._last, federation, state, finished, epsilon, secret)
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


def _flock(fd: int, busy: str) -> None:
    """An exclusive, non-blocking ``flock`` on ``fd`` (closed, and :class:`ServerStateError` raised, if it fails)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise ServerStateError(busy) from None
        raise ServerStateError(f"{busy.split(' is ')[0]}: cannot lock it ({err.strerror}).") from None


def other_federations(state: ServerState) -> list[str]:
    """Warnings about the other federations this server's default folder holds (their ε add up if they
    involved the same agents: each federation is accounted on its own)."""
    root = ServerState.default_root()
    out = []
    for folder in sorted(p for p in root.glob("*") if p.is_dir() and p != state.folder):
        try:
            saved = json.loads((folder / "server.json").read_text())
        except (OSError, ValueError):
            continue
        out.append(
            f"this server also ran federation {folder.name} (epsilon {saved.get('epsilon')}, "
            f"{'finished' if saved.get('finished') else 'unfinished'}): each federation has its own ledger; "
            "if both involve the same agents, their privacy losses add up"
        )
    return out


__all__ = [
    "JOURNAL_ENV",
    "STATE_ENV",
    "ReleaseJournal",
    "ServerState",
    "ServerStateError",
    "other_federations",
    "secret_commitment",
]
