r"""Small tensors of Python numbers on any device without a host synchronization.

``torch.tensor([...], device="cuda")`` copies from pageable host memory, which
synchronizes the host with the device (``torch.cuda.set_sync_debug_mode("error")``
raises on it). Inside a round engine that must never wait for the GPU, a tensor
of a few constants is instead written with one ``fill_`` per value: each is a
kernel launch with the value as an argument, no copy, no wait.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def constant_tensor(
    values: Sequence[float | int | bool], dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> Tensor:
    r"""A 1-d tensor holding ``values`` on ``device``, written without a host-device copy.

    On CPU this is ``torch.tensor(values)``; on other devices one ``fill_`` per run of
    equal consecutive values (e.g. ``d`` equal lower bounds are one fill, whatever ``d``),
    or ``torch.tensor(values)`` (a copy) beyond 64 runs. ``dtype`` defaults to torch's
    default dtype.
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    vals = list(values)
    runs = _runs(vals)
    if dev.type == "cpu" or len(runs) > 64:
        return torch.tensor(vals, dtype=dtype, device=dev)
    out = torch.empty(len(vals), dtype=dtype if dtype is not None else torch.get_default_dtype(), device=dev)
    for start, stop, v in runs:
        out[start:stop].fill_(v)
    return out


def _runs(values: Sequence[float | int | bool]) -> list[tuple[int, int, float | int | bool]]:
    """``(start, stop, value)`` for each run of equal consecutive values (of the same type)."""
    runs: list[tuple[int, int, float | int | bool]] = []
    for j, v in enumerate(values):
        if runs and runs[-1][2] == v and type(runs[-1][2]) is type(v):
            runs[-1] = (runs[-1][0], j + 1, v)
        else:
            runs.append((j, j + 1, v))
    return runs
