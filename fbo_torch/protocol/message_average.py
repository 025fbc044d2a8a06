r"""A receiver's running average of the messages each peer sends, round after round.

An FTS message is one draw ``ω ~ N(ν_n, σ²Σ_n⁻¹)`` from the sender's RFF
posterior: in the directions its observations do not pin down, the draw
fluctuates with the prior's full variance, so the maximizer of ``φ(x)ᵀω`` is
mostly wherever those fluctuations peak — far from the sender's data. That is
what Thompson sampling wants, but not what a receiver wants when it asks
*where the sender's function is best*. Averaging ``k`` draws divides the
fluctuations' variance by ``k`` and leaves the mean ``ν_n``; a sender's
posterior moves by one observation per round, so a window of a few rounds
averages draws of nearly the same posterior.

:class:`MessageAverage` keeps, for every (receiver, sender) slot, the running
mean of the messages received so far and, after ``memory`` rounds, an
exponential average with weight ``1/memory`` (the window's length). It is the
receiver's post-processing of what it was sent: nothing more is shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from fbo_torch.utils.validation import check_int


class MessageAverage:
    r"""Running averages of ``... x M`` message vectors, updated once per round.

    Args:
        memory: ``k ≥ 1``: a plain mean of the first ``k`` rounds' messages, then an
            exponential average with weight ``1/k`` on each new one (``k = 1``: the latest).

    Example:
        >>> avg = MessageAverage(memory=10)
        >>> omega_bar = avg.update(omegas)   # R x A x M, every round
    """

    def __init__(self, memory: int = 10) -> None:
        self.memory = check_int("memory", memory, minimum=1)
        self.count = 0
        self.mean: Tensor | None = None

    def update(self, messages: Tensor) -> Tensor:
        """Add this round's ``... x M`` messages; returns the averages (same shape)."""
        if self.mean is not None and messages.shape != self.mean.shape:
            raise ValueError(
                f"messages of shape {tuple(messages.shape)} after rounds of shape "
                f"{tuple(self.mean.shape)}: one message per slot and round."
            )
        self.count += 1
        if self.mean is None:
            self.mean = messages.clone()
        else:
            a = 1.0 / min(self.count, self.memory)
            self.mean = torch.lerp(self.mean, messages, a)
        return self.mean

    def state_dict(self) -> dict[str, Any]:
        return {"memory": self.memory, "count": self.count, "mean": self.mean}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.memory, self.count, self.mean = int(state["memory"]), int(state["count"]), state["mean"]


__all__ = ["MessageAverage"]
