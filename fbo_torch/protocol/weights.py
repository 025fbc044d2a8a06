r"""Distributed-exploration weights ``φ_n^(i)`` (DP-FTS-DE Sec. 3.2, thesis App. C.2).

For sub-region ``i``, agents assigned to explore it get weight ``∝ exp(a)`` and
the others ``∝ exp(b)`` (``a ≥ b > 0``); each region's weights sum to 1 over
agents. The adaptive schedule keeps ``a`` fixed for ``const_rounds`` rounds and
then decays it linearly to ``b`` over ``decay_rounds`` rounds, after which the
weights are uniform (thesis: ``a = 16``, ``b = 1``; synthetic 5/5 — i.e.
``a = 16`` for ``t = 1..5`` and ``16, 12.25, 8.5, 4.75, 1`` for ``t = 6..10`` —
real-world 10/30).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fbo_torch.utils.validation import check_int, check_positive, check_tensor


def exploration_weights(membership: Tensor, a: float, b: float = 1.0) -> Tensor:
    r"""Softmax weights per region.

    Args:
        membership: ``P x N`` booleans, agent ``n`` assigned to region ``i``.
        a: Log-weight of assigned agents.
        b: Log-weight of the others.

    Returns:
        ``P x N`` float64 weights, each row summing to 1.
    """
    check_tensor("membership", membership)
    if membership.ndim != 2 or membership.dtype != torch.bool:
        raise ValueError(f"`membership` must be a P x N bool tensor, got {membership.dtype} {tuple(membership.shape)}.")
    # Python scalars, not device tensors: no host-to-device copy in a round
    logits = torch.where(membership, float(a), float(b)).to(torch.float64)
    return torch.softmax(logits, dim=-1)


class ExplorationWeights:
    r"""The weight schedule ``round -> P x N`` handed to the server.

    Args:
        membership: ``P x N`` assignment booleans (e.g. from
            :meth:`~fbo_torch.protocol.partition.SubRegionPartition.membership`).
        a: Initial log-weight of assigned agents (16 in the papers).
        b: Log-weight of the others (1).
        const_rounds: Rounds with ``a`` held (5 synthetic, 10 real-world).
        decay_rounds: Rounds over which ``a`` decays linearly to ``b`` (5 / 30).
        mode: ``"adaptive"`` (the schedule above), ``"fixed"`` (``a`` forever,
            the non-adaptive ablation of App. C.2.2.4) or ``"uniform"``
            (equal weights; no distributed-exploration weighting).

    Round ``t`` uses ``a_t = a`` for ``t <= const_rounds``; for the next
    ``decay_rounds`` rounds ``a_t`` goes linearly from ``a`` (first) to ``b``
    (last); afterwards ``a_t = b``. Round 0 (initialization) uses ``a``.
    """

    MODES = ("adaptive", "fixed", "uniform")

    def __init__(
        self,
        membership: Tensor,
        a: float = 16.0,
        b: float = 1.0,
        const_rounds: int = 5,
        decay_rounds: int = 5,
        mode: str = "adaptive",
    ) -> None:
        if mode not in self.MODES:
            raise ValueError(f"`mode` must be one of {self.MODES}, got {mode!r}.")
        check_positive("b", b)
        if not float(a) >= float(b):
            raise ValueError(f"`a` must be >= `b` (more weight on assigned agents), got a={a}, b={b}.")
        self.const_rounds = check_int("const_rounds", const_rounds, minimum=0)
        self.decay_rounds = check_int("decay_rounds", decay_rounds, minimum=0)
        exploration_weights(membership, a, b)  # validates membership
        self.membership, self.a, self.b, self.mode = membership, float(a), float(b), mode

    def a_at(self, round: int) -> float:
        """``a_t`` of round ``round``."""
        t = check_int("round", round, minimum=0)
        if self.mode == "fixed":
            return self.a
        if self.mode == "uniform":
            return self.b
        if t <= self.const_rounds:
            return self.a
        k = t - self.const_rounds  # 1 .. decay_rounds
        if k > self.decay_rounds:
            return self.b
        if self.decay_rounds == 1:
            return self.b
        return self.a - (self.a - self.b) * (k - 1) / (self.decay_rounds - 1)

    def __call__(self, round: int) -> Tensor:
        """``P x N`` weights for round ``round`` (rows sum to 1)."""
        return exploration_weights(self.membership, self.a_at(round), self.b)

    def __repr__(self) -> str:
        return (
            f"ExplorationWeights(mode={self.mode!r}, a={self.a}, b={self.b}, "
            f"const_rounds={self.const_rounds}, decay_rounds={self.decay_rounds})"
        )
