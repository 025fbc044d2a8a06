r"""How much memory this process can still use, and refusing work that needs more.

A setting that scales an allocation (iterations, agents, features, candidates)
is checked against the memory the machine can give *before* anything is
allocated, so a mistyped ``num_iterations: 1000000000`` is one line naming the
setting instead of a process the kernel kills after minutes of swapping. The
limit follows from the machine, not from a fixed guess: :func:`available_memory`
reads Linux's ``MemAvailable`` (``/proc/meminfo``), lowered to what a cgroup
(container) still allows (``memory.max - memory.current``), else the free
physical pages (``os.sysconf``), else ``psutil`` if it is installed; where
none of these answers, nothing is refused. ``FBO_MEMORY_LIMIT`` (bytes, or
with a ``K``/``M``/``G``/``T`` suffix) replaces the machine's figure. CUDA
devices report their free memory (``torch.cuda.mem_get_info``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: The environment variable that sets the memory a run may use (bytes; ``K``, ``M``, ``G``, ``T`` suffixes).
LIMIT_ENV = "FBO_MEMORY_LIMIT"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class MemoryLimitError(ValueError):
    """A setting would need more memory than the machine has; the message names the setting."""


def parse_bytes(name: str, value: object) -> int:
    r"""A memory size: an int (bytes) or a string with an optional ``K``/``M``/``G``/``T`` suffix,
    binary units (``"512M"``, ``"4GiB"``, ``"1.5 G"``); ``ValueError`` naming ``name`` otherwise.

    Example:
        >>> parse_bytes("max_memory", "4GiB")
        4294967296
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name} must be a number of bytes or a size like '4GiB', got {value!r}.")
    if isinstance(value, str):
        text = value.strip().upper().removesuffix("B").removesuffix("I").strip()
        unit = text[-1] if text and text[-1] in _UNITS else ""
        try:
            number = float(text[: len(text) - len(unit)])
        except ValueError:
            raise ValueError(
                f"{name} must be a number of bytes or a size like '4GiB' (K, M, G, T suffixes), got {value!r}."
            ) from None
    else:
        number, unit = float(value), ""
    if not (number > 0 and number * _UNITS[unit] < 2**63):
        raise ValueError(f"{name} must be a positive size below 8 EiB, got {value!r}.")
    return int(number * _UNITS[unit])


def memory_budget(value: object, key: str = "max_memory") -> int:
    r"""A working-memory budget in bytes: the one reading of ``max_memory`` (the experiment key, ``--max-memory``,
    :func:`~fbo_torch.federation.chunks.round_budget`); :func:`parse_bytes`'s spellings, the message naming ``key``.

    Example:
        >>> memory_budget("512M")
        536870912
    """
    return parse_bytes(f"`{key}`", value)


def _env_limit() -> int | None:
    text = os.environ.get(LIMIT_ENV, "").strip()
    if not text:
        return None
    try:
        return parse_bytes(f"${LIMIT_ENV}", text)
    except ValueError as err:
        raise MemoryLimitError(str(err)) from None


def _meminfo() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup() -> int | None:
    """What the process's cgroup (v2) still allows, if it sets a limit."""
    try:
        rel = next(
            line.split(":", 2)[2].strip()
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if line.startswith("0::")
        )
        folder = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((folder / "memory.current").read_text().strip()))
    except (OSError, ValueError, StopIteration):
        return None


def _sysconf() -> int | None:
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def _psutil() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def available_memory(device: torch.device | str | None = None) -> int | None:
    r"""Bytes this process can still allocate on ``device`` (the host by default), or ``None`` when
    the system does not say (then nothing is refused)."""
    limit = _env_limit()
    if limit is not None:
        return limit
    import torch  # here: parsing a size (a config's max_memory) needs no torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(dev)[0])
        except (RuntimeError, AssertionError):
            return None
    host = _meminfo()
    if host is None:
        host = _sysconf()
    if host is None:
        host = _psutil()
    group = _cgroup()
    if group is not None:
        host = group if host is None else min(host, group)
    return host


def show_bytes(n: float) -> str:
    """``n`` bytes for people (``1.5 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def check_memory(name: str, need: float, what: str, device: torch.device | str | None = None) -> None:
    r"""Refuse, naming ``name``, work that needs ``need`` bytes when the machine has less.

    Args:
        name: The setting to blame (an argument, a YAML key or a flag), e.g. ``"`num_features`"``.
        need: Estimated bytes.
        what: What needs them, for the message (e.g. ``"1e9 features of dimension 2"``).
        device: Where they would be allocated.

    Raises:
        MemoryLimitError: ``need`` exceeds :func:`available_memory`.
    """
    have = available_memory(device)
    if have is not None and need > have:
        where = "" if device is None or str(device).split(":")[0] == "cpu" else f" on {device}"
        raise MemoryLimitError(
            f"{name}: {what} needs about {show_bytes(need)}, more than the {show_bytes(have)} this machine has "
            f"free{where}; lower it (or set ${LIMIT_ENV} if the estimate is wrong for this machine)."
        )


__all__ = [
    "LIMIT_ENV",
    "MemoryLimitError",
    "available_memory",
    "check_memory",
    "memory_budget",
    "parse_bytes",
    "show_bytes",
]
