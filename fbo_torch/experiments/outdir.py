r"""Output folders of experiment runs: an exclusive lock, config fingerprints, atomic writes.

A run owns its output folder ``OUT`` while it runs: it holds an exclusive
``fcntl.flock`` on ``OUT/.lock``, so a second run into the same folder is
refused instead of interleaving its files with the first. ``OUT/run.json``
records the *fingerprint* of the run: the SHA-256 of the canonical JSON of
the resolved configuration (objective, methods, seeds, repetitions, privacy
settings, device) and the ``fbo_torch`` version. Every checkpoint and
``results.json`` carry the same fingerprint; ``--resume`` continues only a run
with the same fingerprint and otherwise names the keys that differ.

Things that do not change results (output paths, plot formats, ``--threads``, progress
bars, ``checkpoint_every``, ``max_memory``, ``max_failed_fraction``) are not part of the fingerprint.

``run.json`` also lists every file and folder the run writes (``files``),
each name recorded before its file is first written, with the size and SHA-256
of what was written (``written``), so ``--overwrite`` deletes only files that
still hold exactly what an fbo-torch run wrote there (its latest write of the
file, or the one before, which a run killed mid-write leaves) and keeps
everything else (a file a forged ``run.json`` lists is kept unless it holds
those very bytes). It never writes over a file it kept: a run is refused before
anything is deleted when a file it would keep has a name the run writes
(:meth:`OutputFolder.refuse_overwriting`), and a write to a kept file is refused.

Nothing a run writes or deletes leaves ``OUT``: every write and deletion inside
it walks from ``OUT`` one folder at a time without following symbolic links
(``openat`` with ``O_NOFOLLOW``), so a folder inside ``OUT`` replaced by a
link to elsewhere stops the run with one line instead of being written
through. A refused ``OUT`` is left as it was (no ``.lock`` appears in a folder
that is refused), and ``~`` in ``OUT`` is the user's home. Files are written
with the permissions ``open()`` would give them (``0o666`` less the umask)
unless a caller asks for a mode.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import errno
import fcntl
import hashlib
import json
import math
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, cast

import fbo_torch
from fbo_torch.utils.files import WriteError, current_umask, write_atomic, write_atomic_at

MANIFEST = "run.json"
LOCK = ".lock"
#: Keys of the resolved configuration that do not change results (``max_memory`` only chunks agents,
#: ``max_failed_fraction`` only decides when a failing objective stops the run).
NOT_FINGERPRINTED = ("checkpoint_every", "max_memory", "max_failed_fraction")


class OutputError(RuntimeError):
    """The output folder cannot be used as asked; the message is one line and says what to do."""


class ResumeError(OutputError):
    """``--resume`` would mix this run with a different one, or its files are unreadable."""


# ----------------------------------------------------------------- fingerprints


def _canonical(value: Any, ints: bool = True) -> Any:
    """JSON-ready copy; with ``ints``, an integral float becomes the int (``1.0`` and ``1`` give one fingerprint)."""
    if isinstance(value, dict):
        return {str(k): _canonical(v, ints) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v, ints) for v in value]
    if isinstance(value, float):
        if ints and math.isfinite(value) and value.is_integer():
            return int(value)
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def fingerprinted_config(resolved: dict[str, Any], ints: bool = True) -> dict[str, Any]:
    """The part of a resolved configuration that determines the results (JSON-ready)."""
    cfg = copy.deepcopy(resolved)
    for key in NOT_FINGERPRINTED:
        cfg.pop(key, None)
    return _canonical(cfg, ints)


def fingerprint(resolved: dict[str, Any], version: str | None = None) -> str:
    """SHA-256 of the canonical JSON of ``resolved`` (see :func:`fingerprinted_config`) and the package version."""
    if version is None:
        version = fbo_torch.__version__
    payload = {"config": fingerprinted_config(resolved), "fbo_torch": version}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _flatten(value: Any, path: str, label: str, out: dict[str, tuple[Any, str]]) -> None:
    if isinstance(value, dict) and value:
        if "name" in value and path.endswith("]"):
            label = f"{label}, {value['name']!r}" if label else repr(value["name"])
        for k, v in value.items():
            _flatten(v, f"{path}.{k}" if path else str(k), label, out)
    elif isinstance(value, list) and value and any(isinstance(v, (dict, list)) for v in value):
        for i, v in enumerate(value):
            _flatten(v, f"{path}[{i}]", label, out)
    else:
        out[path] = (value, label)


_ABSENT = "<absent>"


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Lines ``key.path (labels): old -> new`` for every leaf that differs between two configurations."""
    a: dict[str, tuple[Any, str]] = {}
    b: dict[str, tuple[Any, str]] = {}
    _flatten(_canonical(old, False), "", "", a)
    _flatten(_canonical(new, False), "", "", b)
    lines = []
    for key in list(a) + [k for k in b if k not in a]:
        va, la = a.get(key, (_ABSENT, ""))
        vb, lb = b.get(key, (_ABSENT, ""))
        ca, cb = _canonical(va), _canonical(vb)
        if ca != cb or type(ca) is not type(cb):
            label = lb or la
            where = f"{key} ({label})" if label else key
            lines.append(f"{where}: {_show(va)} -> {_show(vb)}")
    return lines


def _show(value: Any) -> str:
    return value if value is _ABSENT else json.dumps(value)


# ----------------------------------------------------------------- atomic writes


def atomic_write_bytes(path: str | Path, data: bytes, mode: int | None = None) -> None:
    r"""Write ``data`` to a temporary file next to ``path``, flush it to disk, then ``os.replace`` it.

    Args:
        path: The file to (over)write.
        data: Its new contents.
        mode: Permission bits of the file: ``None`` gives what ``open()`` would
            (``0o666`` less the umask); an explicit mode (e.g. ``0o600`` for a
            secret) is applied exactly, whatever the umask. The file never has
            wider permissions than these while it is written.

    Raises:
        WriteError: The write failed (``OSError`` with ``filename=path`` and the
            system's ``errno``); ``path`` keeps its old contents and no temporary
            file is left behind.

    Inside the folder of an open :class:`OutputFolder`, the file's name, size and
    hash are added to that folder's list of files the run wrote before the file is
    written, and the file is written by that folder (:meth:`OutputFolder.write`:
    nothing outside it, whatever links it holds).
    """
    path = Path(path)
    folder = _holder(path)
    if folder is not None:
        folder.write(path, data, mode)
    else:
        write_atomic(path, data, mode)


def atomic_write_text(path: str | Path, text: str, mode: int | None = None) -> None:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode(), mode=mode)


# ----------------------------------------------------------------- the folder

#: Output folders open in this process; :func:`atomic_write_bytes` records writes into them.
_OPEN: list[OutputFolder] = []
_OPEN_LOCK = threading.Lock()


def _holder(path: Path) -> OutputFolder | None:
    """The open output folder ``path`` lies in, if any."""
    with _OPEN_LOCK:
        folders = list(_OPEN)
    return next((f for f in folders if f._relative(path) is not None), None)


def _digest(data: bytes) -> dict[str, Any]:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _holds(fd: int, record: Any) -> bool:
    r"""Whether the file open as ``fd`` is a regular file holding what ``record`` (``run.json``'s entry of it)
    says a run wrote: its latest write, or the one before (a run killed between recording a write and
    finishing it leaves the earlier contents)."""
    if not isinstance(record, dict):
        return False
    wanted = [record] + ([record["previous"]] if isinstance(record.get("previous"), dict) else [])
    with os.fdopen(os.dup(fd), "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size not in [w.get("size") for w in wanted]:
            return False
        digest = hashlib.sha256()
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest() in [w.get("sha256") for w in wanted]


class _Linked(OSError):
    """A folder on the way to a file inside ``OUT`` is a symbolic link or not a folder."""


def _entries(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.name != LOCK)


def _shown(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


class OutputFolder:
    r"""An output folder held for one run (use as a context manager, or :meth:`open` / :meth:`close`).

    Opening checks the folder is usable (one-line :class:`OutputError` otherwise),
    takes the exclusive lock on ``OUT/.lock`` (refused while another run holds
    it) and then, when the folder already holds files: with ``overwrite`` deletes
    the files and folders that ``OUT/run.json`` lists as written by fbo-torch
    runs and keeps every other one (``deleted``, ``kept``); a folder
    without that list (no ``run.json``, or one written before fbo-torch kept
    it) is refused, so nothing is deleted that a run cannot be shown to have
    written. With ``resume`` the files stay for :meth:`check_resume`; otherwise
    a non-empty folder is refused.

    ``open(create=False)`` does all of that except creating and deleting: an
    existing folder is locked and checked, a missing one only checked. A later
    :meth:`open` creates the folder (and takes the lock) if needed and deletes
    what ``overwrite`` deletes, so a run can check everything else in between.

    While the folder is open, every :func:`atomic_write_bytes` into it adds the
    file's name to ``run.json``'s ``files`` (from :meth:`write_manifest` on), and
    :meth:`make_dir` does the same for folders.
    """

    def __init__(self, path: str | Path, resume: bool = False, overwrite: bool = False) -> None:
        if resume and overwrite:
            raise OutputError(
                "--resume and --overwrite exclude each other: resume continues the old run, overwrite deletes it."
            )
        self.path = Path(path).expanduser()
        self.resume = resume
        self.overwrite = overwrite
        self._fd: int | None = None
        self._dir_fd: int | None = None  # OUT itself, opened when locked: every write walks from it
        self.had_files = False
        self._to_delete: list[str] | None = None
        self._to_check: dict[str, Any] | None = None  # size and hash of each file run.json says a run wrote
        #: What ``overwrite`` deleted (names relative to the folder) and what it kept (top-level names).
        self.deleted: list[str] = []
        self.kept: list[str] = []
        self._manifest: dict[str, Any] | None = None  # run.json once read or written; {} if it lists no files
        self._kept_files: set[str] = set()  # files --overwrite kept: never written over
        self._record_lock = threading.Lock()

    # -- lifecycle
    def check(self) -> None:
        r"""Refuse a path that cannot serve as the output folder (a file, an uncreatable or unwritable
        folder), creating nothing."""
        out = self.path
        if out.exists() and not out.is_dir():
            raise OutputError(f"--out {out} is a file, not a folder; choose a folder path.")
        if out.is_dir():
            if not os.access(out, os.W_OK | os.X_OK):
                raise OutputError(f"--out {out}: no permission to write in this folder.")
            return
        parent = Path(os.path.abspath(out)).parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        reason = None
        if not parent.is_dir():
            reason = os.strerror(errno.ENOTDIR)
        elif not os.access(parent, os.W_OK | os.X_OK):
            reason = os.strerror(errno.EACCES)
        if reason is not None:
            raise OutputError(f"--out {out}: cannot create the folder ({reason}: {parent}).")

    def open(self, create: bool = True) -> OutputFolder:
        """Check, lock and prepare the folder (see the class docstring); returns ``self``."""
        if self._fd is None:
            self.check()
            if not self.path.is_dir():
                if not create:
                    return self
                try:
                    self.path.mkdir(parents=True, exist_ok=True)
                except OSError as err:
                    raise OutputError(f"--out {self.path}: cannot create the folder ({err.strerror or err}).") from None
            if not os.path.lexists(self.path / LOCK):
                self._inspect()  # a folder that will be refused is refused before a lock file is made in it
            self._lock()
            try:
                self._inspect()
            except BaseException:
                self.close()
                raise
        if create and self._to_delete is not None:
            try:
                self._clear(self._to_delete)
            except BaseException:
                self.close()
                raise
            self._to_delete = None
        return self

    def _lock(self) -> None:
        out = self.path
        if not os.access(out, os.W_OK | os.X_OK):
            raise OutputError(f"--out {out}: no permission to write in this folder.")
        lock = out / LOCK
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            raise OutputError(
                f"--out {out}: cannot create the lock file {lock} ({err.strerror or err}; it must "
                "not be a symbolic link)."
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = ""
            try:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            except OSError:
                pass
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                who = f"pid {holder}" if holder.isdigit() else "another process"
                raise OutputError(
                    f"--out {out} is in use by another fbo-torch run ({who} holds {lock}); "
                    "wait for it to finish or choose another --out."
                ) from None
            raise OutputError(f"--out {out}: cannot lock {lock} ({err.strerror or err}).") from None
        try:
            self._dir_fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as err:
            os.close(fd)
            raise OutputError(f"--out {out}: cannot open the folder ({err.strerror or err}).") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        with _OPEN_LOCK:
            _OPEN.append(self)

    def _inspect(self) -> None:
        out = self.path
        entries = _entries(out)
        self.had_files = bool(entries)
        if not entries:
            return
        if self.overwrite:
            self._to_delete, self._to_check = self._written_files()
            return
        if self.resume:
            if not (out / MANIFEST).is_file():
                self.check_resume({})  # refused now: there is no run to resume (nothing is read from `{}`)
            return
        if not os.path.lexists(out / MANIFEST):
            raise OutputError(
                f"--out {out} holds files that no fbo-torch run wrote ({_shown([p.name for p in entries])}); "
                "choose an empty or new folder."
            )
        raise OutputError(
            f"--out {out} is not empty ({_shown([p.name for p in entries])}); pass --resume to continue the run "
            "in it, --overwrite to delete the files an earlier run wrote there (other files are kept), "
            "or choose another --out."
        )

    def _read_manifest(self, error: type[OutputError], missing: str, unreadable: str) -> dict[str, Any]:
        r"""``OUT/run.json`` as a dict, or ``error(missing)`` when there is none and ``error(unreadable)``
        (``{reason}`` filled in) when it is not a JSON object."""
        path = self.path / MANIFEST
        if not path.is_file():
            raise error(missing)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise error(unreadable.format(reason=f"{type(err).__name__}: {err}")) from None
        if not isinstance(data, dict):
            raise error(unreadable.format(reason="not a JSON object"))
        return data

    def _written_files(self) -> tuple[list[str], dict[str, Any]]:
        r"""The names ``run.json`` lists as written by fbo-torch runs (checked to lie inside the folder),
        and the size and hash it recorded for each file."""
        out = self.path
        path = out / MANIFEST
        manifest = self._read_manifest(
            OutputError,
            f"--out {out} holds files but no fbo-torch run ({MANIFEST} is missing); --overwrite only clears "
            "folders an fbo-torch run wrote: nothing was deleted; choose an empty or new folder.",
            f"--overwrite: {path} is unreadable ({{reason}}), so the files the old run wrote cannot be told from "
            "others; nothing was deleted: delete the old run's files yourself or choose another --out.",
        )
        files, written = manifest.get("files"), manifest.get("written")
        # an older run.json: no names, or names without what the files held (`written`)
        if files is None or not isinstance(written, dict):
            raise OutputError(
                f"--overwrite: {path} does not list the files its run wrote (it was written by an older "
                "fbo_torch), so --overwrite cannot tell them from yours and deletes nothing: delete the old run's "
                "files yourself (e.g. results.json, run.json, checkpoints/, *.png, summary.txt) or choose "
                "another --out."
            )
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise OutputError(
                f"--overwrite: `files` in {path} is not a list of names; nothing was deleted: "
                "delete the old run's files yourself or choose another --out."
            )
        for name in files:
            pure = PurePosixPath(name)
            if pure.is_absolute() or not pure.parts or ".." in pure.parts or name in (LOCK, "."):
                raise OutputError(
                    f"--overwrite: {path} lists {name!r}, which is not a file inside {out}; "
                    "nothing was deleted: delete the old run's files yourself or choose another --out."
                )
        return cast(list[str], files), written  # checked above: a list of names

    def _clear(self, files: list[str]) -> None:
        r"""Delete the listed files that still hold exactly what ``run.json`` recorded (size and SHA-256),
        then the listed folders that are empty after that, then ``run.json`` (so the list outlives an
        interrupted deletion); keep everything else. Nothing is followed through a symbolic link."""
        out = self.path
        written = self._to_check or {}
        deleted = []

        def remove(name: str, check: bool = True) -> None:
            with self._opened(name) as opened:
                if opened is None:  # missing, a link, or a folder on the way missing or linked elsewhere
                    return
                parent, fd = opened
                if _holds(fd, written.get(name)) or (not check and stat.S_ISREG(os.fstat(fd).st_mode)):
                    os.unlink(PurePosixPath(name).name, dir_fd=parent)
                    deleted.append(name)

        def remove_folder(name: str) -> None:
            rel = PurePosixPath(name)
            try:
                parent = self._walk(rel.parts[:-1])
            except OSError:
                return
            try:
                os.rmdir(rel.name, dir_fd=parent)  # only an empty folder, never a link
                deleted.append(name)
            except OSError:
                pass
            finally:
                os.close(parent)

        names = [f for f in files if not f.endswith("/")]
        folders = sorted((f for f in files if f.endswith("/")), key=lambda f: -f.count("/"))  # deepest first
        try:
            for name in sorted(f for f in names if f != MANIFEST):
                remove(name)
            for name in folders:
                remove_folder(name.rstrip("/"))
            if MANIFEST in names:
                remove(MANIFEST, check=False)  # the list itself, read and checked above
        except OSError as err:
            raise OutputError(
                f"--overwrite: cannot delete {err.filename or out} ({err.strerror or err}); "
                "fix its permissions or choose another --out."
            ) from None
        self.deleted = [d + "/" if d + "/" in folders else d for d in deleted]
        self.kept = [p.name + ("/" if p.is_dir() else "") for p in _entries(out)]
        self.had_files = bool(self.kept)
        self._kept_files = set(self._files())

    def _files(self, parts: tuple[str, ...] = ()) -> list[str]:
        r"""The files below ``OUT/parts`` (relative names; symbolic links are not followed, ``.lock`` is left out)."""
        try:
            fd = self._walk(parts)
        except OSError:
            return []
        try:
            names = sorted(os.listdir(fd))
            out = []
            for name in names:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    out += self._files((*parts, name))
                elif (parts or name != LOCK) and not stat.S_ISLNK(st.st_mode):
                    out.append(PurePosixPath(*parts, name).as_posix())
            return out
        finally:
            os.close(fd)

    def refuse_overwriting(self, names: set[str]) -> None:
        r"""With ``overwrite``, before anything is deleted: refuse (one-line :class:`OutputError`) when a file
        that would be kept (one no run wrote, or one changed since a run wrote it) has a name in ``names``,
        the files this run may write (relative names), since the run would write over it."""
        if self._to_delete is None or self._dir_fd is None:
            return
        listed = set(self._to_delete)
        written = self._to_check or {}
        clash = []
        for name in sorted(names & set(self._files())):
            if name == MANIFEST:
                continue  # the list itself, read and checked when the folder was opened
            with self._opened(name) as opened:
                if opened is None or not (name in listed and _holds(opened[1], written.get(name))):
                    clash.append(name)
        if clash:
            raise OutputError(
                f"--overwrite: {_shown(clash)} in {self.path} do not hold what an fbo-torch run wrote there "
                "(changed since, or yours), and this run writes files of those names: nothing was deleted; "
                "move them out of --out, or choose another --out."
            )

    @contextlib.contextmanager
    def _opened(self, name: str) -> Iterator[tuple[int, int] | None]:
        r"""``(folder, file)`` descriptors of the file ``OUT/name``, reached without following symbolic links
        (``None`` when it, or a folder on the way, is missing, a link or not a folder); closed afterwards."""
        rel = PurePosixPath(name)
        try:
            parent = self._walk(rel.parts[:-1])
        except OSError:
            yield None
            return
        try:
            fd = os.open(rel.name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=parent)
        except OSError:
            os.close(parent)
            yield None
            return
        try:
            yield parent, fd
        finally:
            os.close(fd)
            os.close(parent)

    def _walk(self, parts: tuple[str, ...], create: bool = False) -> int:
        r"""A new descriptor of the folder ``OUT/parts``, reached one folder at a time without following
        symbolic links (``create``: missing folders are made). Raises :class:`OSError` otherwise."""
        if self._dir_fd is None:
            raise OSError(errno.EBADF, "the output folder is not open", str(self.path))
        fd = os.dup(self._dir_fd)
        try:
            for part in parts:
                try:
                    nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, dir_fd=fd)
                    nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except OSError as err:
                    if err.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise _Linked(err.errno, "a symbolic link or not a folder", part) from None
                    raise
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _folder(self, parts: tuple[str, ...], path: Path, create: bool = False) -> int:
        """:meth:`_walk` for writing ``path``: a linked folder is an :class:`OutputError`, a failure a
        :class:`WriteError`."""
        try:
            return self._walk(parts, create)
        except _Linked as err:
            raise OutputError(
                f"--out {self.path}: {PurePosixPath(*parts)} inside it is a symbolic link or not a "
                f"folder ({err.filename}); a run writes nothing outside --out: remove it, or choose "
                "another --out."
            ) from None
        except OSError as err:
            raise WriteError(err.errno, err.strerror or str(err), str(path)) from err

    def write(self, path: str | Path, data: bytes, mode: int | None = None) -> None:
        r"""Write ``data`` atomically to ``path`` inside this folder (see :func:`atomic_write_bytes`),
        recording its name, size and hash in ``run.json`` first.

        Raises:
            OutputError: A folder on the way is a symbolic link or not a folder (nothing is written
                outside ``OUT``).
            WriteError: The write failed.
        """
        path = Path(path)
        rel = self._relative(path)
        if rel is None:
            raise ValueError(f"{path} is not inside the output folder {self.path}.")
        if rel in self._kept_files:
            raise OutputError(
                f"--out {self.path}: {rel} was kept by --overwrite (no run wrote it, or it changed since), so "
                "this run does not write over it; move it out of --out, or choose another --out."
            )
        parts = PurePosixPath(rel).parts
        self.record(path, data=data)
        folder = self._folder(parts[:-1], path)
        try:
            write_atomic_at(folder, parts[-1], data, mode, path)
        finally:
            os.close(folder)

    def close(self) -> None:
        if self._fd is not None:
            with _OPEN_LOCK:
                if self in _OPEN:
                    _OPEN.remove(self)
            os.close(self._fd)  # releases the lock; the file stays (unlinking it would race a waiting run)
            self._fd = None
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    def __enter__(self) -> OutputFolder:
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the list of written files
    def _relative(self, path: Path) -> str | None:
        try:
            rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(self.path))
        except ValueError:
            return None
        return rel.as_posix() if rel.parts else None

    def record(self, path: str | Path, folder: bool = False, data: bytes | None = None) -> None:
        r"""Add ``path`` (a file, or with ``folder`` a folder, inside this folder) to ``run.json``'s ``files``;
        with ``data``, record the size and SHA-256 of what the file is about to hold (``written``).

        Does nothing outside the folder, and in a folder whose ``run.json`` keeps no
        list (a folder of an older run, redrawn by ``fbo-torch report``: what its run
        wrote cannot be listed after the fact).
        """
        rel = self._relative(Path(path))
        if rel is None or self._fd is None or rel == LOCK:
            return
        name = rel + "/" if folder else rel
        with self._record_lock:
            if self._manifest is None:
                try:
                    found = json.loads((self.path / MANIFEST).read_text())
                except (OSError, ValueError):
                    found = None
                self._manifest = found if isinstance(found, dict) and isinstance(found.get("files"), list) else {}
            files = self._manifest.get("files")
            if files is None:
                return
            written = self._manifest.setdefault("written", {})
            if not isinstance(written, dict):
                written = self._manifest["written"] = {}
            entry = None if data is None or name == MANIFEST else _digest(data)
            before = written.get(name)
            if isinstance(before, dict):
                before = {k: v for k, v in before.items() if k != "previous"}
            if name in files and (entry is None or before == entry):
                return
            if name not in files:
                files.append(name)
                files.sort()
            if entry is not None:
                written[name] = {**entry, "previous": before} if isinstance(before, dict) else entry
            self._write_manifest()

    def _write_manifest(self) -> None:
        data = json.dumps(self._manifest, indent=1).encode()
        if self._dir_fd is None:
            write_atomic(self.path / MANIFEST, data)
        else:
            write_atomic_at(self._dir_fd, MANIFEST, data, None, self.path / MANIFEST)

    def make_dir(self, name: str) -> Path:
        """Create the folder ``OUT/name`` (listed in ``run.json`` first); returns its path."""
        path = self.path / name
        self.record(path, folder=True)
        os.close(self._folder(PurePosixPath(name).parts, path, create=True))
        return path

    # -- the manifest
    def check_resume(self, resolved: dict[str, Any]) -> None:
        r"""With ``resume`` and files present: refuse unless ``OUT/run.json`` has this run's fingerprint."""
        if not (self.resume and self.had_files):
            return
        out = self.path
        path = out / MANIFEST
        unreadable = (
            f"--resume: {path} is unreadable or incomplete ({{reason}}); rerun with --overwrite to start "
            "over, or choose another --out."
        )
        old = self._read_manifest(
            ResumeError,
            f"--resume: {out} holds files but no {MANIFEST} (not an fbo-torch run, or one written before "
            "fingerprints existed), so it cannot be checked against this config; "
            "rerun with --overwrite to start over, or choose another --out.",
            unreadable,
        )
        try:
            old_fp, old_cfg, old_version = old["fingerprint"], old["config"], old["fbo_torch_version"]
        except KeyError as err:
            raise ResumeError(unreadable.format(reason=f"KeyError: {err}")) from None
        if old_fp == fingerprint(resolved):
            return
        diffs = config_diff(old_cfg, fingerprinted_config(resolved, ints=False))
        if old_version != fbo_torch.__version__:
            diffs.append(f"fbo_torch version: {old_version} -> {fbo_torch.__version__}")
        if not diffs:
            diffs = ["(the stored fingerprint does not match its config: the manifest was edited)"]
        shown = diffs[:12] + ([f"... and {len(diffs) - 12} more"] if len(diffs) > 12 else [])
        raise ResumeError(
            f"--resume refused: the run in {out} used a different configuration "
            f"({len(diffs)} difference{'s' if len(diffs) != 1 else ''}, old -> new):\n  "
            + "\n  ".join(shown)
            + "\nResuming would mix results of both configs. Restore the old config to resume, or rerun with "
            "--overwrite (deletes the old results) or with another --out."
        )

    def write_manifest(self, resolved: dict[str, Any]) -> str:
        r"""Write ``OUT/run.json`` (fingerprint, version, fingerprinted config, the files the run wrote);
        returns the fingerprint. A resumed run keeps the old ``created`` time and file list."""
        fp = fingerprint(resolved)
        manifest = {
            "fingerprint": fp,
            "fbo_torch_version": fbo_torch.__version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "config": fingerprinted_config(resolved, ints=False),
            "files": [MANIFEST],
            "written": {},
        }
        path = self.path / MANIFEST
        if self.resume and path.is_file():
            try:
                old = json.loads(path.read_text())
            except ValueError:
                old = None
            old = old if isinstance(old, dict) else {}
            manifest["created"] = old.get("created", manifest["created"])
            if isinstance(old.get("files"), list):
                manifest["files"] = sorted(set(old["files"]) | {MANIFEST})
            if isinstance(old.get("written"), dict):
                manifest["written"] = old["written"]
        with self._record_lock:
            self._manifest = manifest
            self._write_manifest()
        return fp


__all__ = [
    "MANIFEST",
    "OutputError",
    "OutputFolder",
    "ResumeError",
    "WriteError",
    "atomic_write_bytes",
    "atomic_write_text",
    "config_diff",
    "current_umask",
    "fingerprint",
    "fingerprinted_config",
]
