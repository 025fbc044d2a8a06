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
import secrets
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


def _temporary(folder_fd: int, name: str, mode: int) -> tuple[int, str]:
    """A new file ``.name.<random>.tmp`` in the folder, created exclusively and without following links."""
    for _ in range(100):
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=folder_fd), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", name)


def write_atomic_at(
    folder_fd: int, name: str, data: bytes, mode: int | None = None, shown: str | os.PathLike[str] | None = None
) -> None:
    r"""Write ``data`` atomically to the file ``name`` of the folder open as ``folder_fd``.

    The temporary file is created in that folder exclusively and without following
    symbolic links, and renamed over ``name`` (a symbolic link there is replaced, not
    followed), so nothing outside the folder is written, whatever the folder holds.

    Args:
        folder_fd: A file descriptor of the folder, open for reading.
        name: The file's name in the folder (no path).
        data: The bytes to write.
        mode: Permission bits (``None``: ``0o666`` less the umask).
        shown: The file's path for error messages (default ``name``).

    Raises:
        WriteError: The write failed; ``name`` keeps its old contents and no
            temporary file is left behind.
    """
    bits = (0o666 & ~current_umask()) if mode is None else mode
    tmp = None
    try:
        fd, tmp = _temporary(folder_fd, name, 0o600)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), bits)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        tmp = None
        try:
            os.fsync(folder_fd)  # the rename survives a crash
        except OSError:
            pass
    except OSError as err:
        raise WriteError(err.errno, err.strerror or str(err), str(shown or name)) from err
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp, dir_fd=folder_fd)
            except OSError:
                pass


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


def write_atomic(path: str | os.PathLike[str], data: bytes, mode: int | None = None) -> None:
    r"""Write ``data`` to ``path`` atomically (see the module docstring and :func:`write_atomic_at`).

    Args:
        path: The file to write.
        data: The bytes to write.
        mode: Permission bits: ``None`` gives ``0o666`` less the umask; an explicit
            mode is applied exactly, whatever the umask.

    Raises:
        WriteError: The write failed; ``path`` keeps its old contents and no
            temporary file is left behind.
    """
    path = Path(path)
    try:
        folder_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        raise WriteError(err.errno, err.strerror or str(err), str(path)) from err
    try:
        write_atomic_at(folder_fd, path.name, data, mode, path)
    finally:
        os.close(folder_fd)


__all__ = ["WriteError", "current_umask", "sync_folder", "write_atomic", "write_atomic_at"]
