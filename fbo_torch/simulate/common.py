r"""Helpers of the simulators: :func:`~fbo_torch.simulate.common.cpu_state` (checkpoints' tensors on the host)."""

from __future__ import annotations

from typing import Any

from torch import Tensor


def cpu_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with every tensor value moved to the host (other values unchanged), for a checkpoint."""
    return {k: (v.cpu() if isinstance(v, Tensor) else v) for k, v in state.items()}
