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


def constant_tensor(values: Sequence[float | int | bool], dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> Tensor:
    r"""A 1-d tensor holding ``values`` on ``device``, written without a host-device copy.

    On CPU (or for more than 64 values) this is ``torch.tensor(values)``; on other
    devices one ``fill_`` per value. ``dtype`` defaults to torch's default dtype.
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    vals = list(values)
    if dev.type == "cpu" or len(vals) > 64:
        return torch.tensor(vals, dtype=dtype, device=dev)
    out = torch.empty(len(vals), dtype=dtype if dtype is not None else torch.get_default_dtype(), device=dev)
    for j, v in enumerate(vals):
        out[j].fill_(v)
    return out
