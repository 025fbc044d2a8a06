r"""Files written whole or not at all, with the permissions asked for.

:func:`write_atomic` writes to a temporary file next to the target, flushes it
to disk, renames it over the target and flushes the folder, so a process
killed at any moment leaves either the old file or the new one, never a torn
one. Its permissions are what ``open()`` would give (``0o666`` less the
umask) unless a mode is given (``0o600`` for a secret), applied before any
byte is written. A failure raises :class:`WriteError`: one line naming the
file (not its temporary file) and the system's reason.
"""

from __future__ import annotations

import errno
import os
import tempfile
import threading
from pathlib import Path


class WriteError(OSError):
    """A file could not be written (disk full, no permission, read-only file system, ...).

    ``filename`` is the file that was being written (not its temporary file);
    ``str()`` is one line naming it and the system's reason.
    """

    def __str__(self) -> str:
        code = errno.errorcode.get(self.errno) if isinstance(self.errno, int) else None
        return f"cannot write {self.filename}: {self.strerror}" + (f" ({code})" if code else "")


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    r"""The process's umask, read without changing it where the system allows.

    Linux reports it in ``/proc/self/status``; elsewhere it is read by setting
    and restoring it (``os.umask`` can only be read by setting it), under a lock
    so that two threads of this module never interleave that.
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        old = os.umask(0o077)
        os.umask(old)
    return old


def _write_replace(path: Path, data: bytes, mode: int | None) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), (0o666 & ~current_umask()) if mode is None else mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        sync_folder(path.parent)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def sync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename survives a crash); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data: bytes, mode: int | None = None) -> None:
    r"""Write ``data`` to ``path`` atomically (see the module docstring).

    Args:
        mode: Permission bits: ``None`` gives ``0o666`` less the umask; an explicit
            mode is applied exactly, whatever the umask.

    Raises:
        WriteError: The write failed; ``path`` keeps its old contents and no
            temporary file is left behind.
    """
    path = Path(path)
    try:
        _write_replace(path, data, mode)
    except WriteError:
        raise
    except OSError as err:
        raise WriteError(err.errno, err.strerror or str(err), str(path)) from err


__all__ = ["WriteError", "current_umask", "sync_folder", "write_atomic"]
