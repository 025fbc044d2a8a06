r"""Typed messages agents send, with their communication cost.

Small frozen records in the spirit of Flower's ``ArrayRecord``/``ConfigRecord``:
each carries the fingerprint of the random-feature map its vectors refer to, so
a receiver can refuse vectors built on a different map, and reports
``num_parameters`` so every method's communication cost is comparable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from fbo_torch.utils.validation import check_finite, check_floating, check_input_bounds, check_tensor


def _check_fingerprint(name: str, fingerprint: str) -> None:
    if not isinstance(fingerprint, str) or not fingerprint:
        raise TypeError(f"`{name}` must be a non-empty string (RandomFourierFeatures.fingerprint).")


@dataclass(frozen=True)
class AgentMessage:
    r"""What an FTS agent sends: one posterior draw ``ω_n`` of its RFF weights.

    The weights were fitted on ``φ(T(x))`` for the sender's input transform
    ``T``; ``input_bounds`` says which (:mod:`fbo_torch.protocol.input_space`),
    so a receiver evaluates ``φ(T(x))ᵀω`` on the inputs the sender's features saw.
    :meth:`RFFBayesianLinear.messages <fbo_torch.models.RFFBayesianLinear.messages>`
    fills it in.

    Attributes:
        omega: ``M`` weight vector drawn from ``N(ν_n, σ²Σ_n⁻¹)``.
        agent_id: The sender's index.
        num_observations: ``t_n``, observations the draw was conditioned on.
        fingerprint: ``RandomFourierFeatures.fingerprint`` of the map used.
        input_bounds: ``2 x d`` bounds ``[lower, upper]`` of the sender's input
            transform, ``T(x) = (x − lower) / (upper − lower)`` (``[0, 1]^d``: raw
            inputs); ``None``: not declared (the receiver's acquisition decides,
            see :func:`~fbo_torch.protocol.input_space.resolve_message_space`).
            Like the feature map, a setting of the federation, so not counted in
            :attr:`num_parameters`.
    """

    omega: Tensor
    agent_id: int
    num_observations: int
    fingerprint: str
    input_bounds: Tensor | None = None

    def __post_init__(self) -> None:
        check_tensor("omega", self.omega)
        check_floating("omega", self.omega)
        if self.omega.ndim != 1:
            raise ValueError(f"`omega` must be a vector of M weights, got shape {tuple(self.omega.shape)}.")
        check_finite("omega", self.omega)
        if int(self.num_observations) < 0:
            raise ValueError(f"`num_observations` must be >= 0, got {self.num_observations}.")
        _check_fingerprint("fingerprint", self.fingerprint)
        if self.input_bounds is not None:
            check_input_bounds("input_bounds", self.input_bounds)
            if self.input_bounds.ndim != 2:
                raise ValueError(f"`input_bounds` must be 2 x d, got shape {tuple(self.input_bounds.shape)}.")

    @property
    def num_parameters(self) -> int:
        """Numbers sent: ``M``."""
        return self.omega.numel()

    def to(self, *args: Any, **kwargs: Any) -> AgentMessage:
        bounds = None if self.input_bounds is None else self.input_bounds.to(*args, **kwargs)
        return replace(self, omega=self.omega.to(*args, **kwargs), input_bounds=bounds)


@dataclass(frozen=True)
class PosteriorMessage:
    r"""What an RGPE/TAF agent sends: its whole RFF weight posterior.

    The FTS paper (Sec. 3.2) adapts RGPE and TAF by having each agent send
    ``ν_n`` and ``Σ_n⁻¹`` (``M + M²`` numbers); the receiver then evaluates the
    agent's approximate GP: mean ``φ(x)ᵀν_n`` and variance ``φ(x)ᵀ C_n φ(x)``
    with ``C_n = σ² Σ_n⁻¹``. TAF also needs the agent's incumbent (best observed
    value), one more number.

    Attributes:
        weight_mean: ``M`` posterior mean ``ν_n``.
        weight_covariance: ``M x M`` posterior covariance ``σ² Σ_n⁻¹``.
        agent_id: The sender's index.
        num_observations: ``t_n``.
        fingerprint: ``RandomFourierFeatures.fingerprint`` of the map used.
        incumbent: Optional best observed value (sent for TAF).
    """

    weight_mean: Tensor
    weight_covariance: Tensor
    agent_id: int
    num_observations: int
    fingerprint: str
    incumbent: float | None = None

    def __post_init__(self) -> None:
        check_tensor("weight_mean", self.weight_mean)
        check_tensor("weight_covariance", self.weight_covariance)
        M = self.weight_mean.numel()
        if self.weight_mean.ndim != 1 or self.weight_covariance.shape != (M, M):
            raise ValueError(
                "`weight_mean` must be an M-vector and `weight_covariance` M x M, got "
                f"{tuple(self.weight_mean.shape)} and {tuple(self.weight_covariance.shape)}."
            )
        check_finite("weight_mean", self.weight_mean)
        check_finite("weight_covariance", self.weight_covariance)
        _check_fingerprint("fingerprint", self.fingerprint)

    @property
    def num_parameters(self) -> int:
        """Numbers sent: ``M + M²`` (+1 with an incumbent), as counted in the FTS paper."""
        M = self.weight_mean.numel()
        return M + M * M + (0 if self.incumbent is None else 1)


def stack_omegas(messages: Sequence[AgentMessage], fingerprint: str | None = None, dim: int | None = None) -> Tensor:
    r"""Stack the ``ω`` of several messages into ``N x M``, checking they agree.

    (Their input spaces are checked where they are evaluated:
    :func:`~fbo_torch.protocol.input_space.resolve_message_space`.)

    Args:
        messages: Non-empty sequence of :class:`AgentMessage`.
        fingerprint: If given, every message must carry this fingerprint.
        dim: The receiver's input dimension ``d``: a message whose ``input_bounds`` has another
            dimension is reported as such (before its fingerprint, which differs then too).

    Returns:
        ``N x M`` weight vectors.

    Raises:
        ValueError: Empty input, messages of another input dimension, or messages built on
            different feature maps.
    """
    if len(messages) == 0:
        raise ValueError("`messages` is empty: at least one agent message is needed.")
    for i, m in enumerate(messages):
        if not isinstance(m, AgentMessage):
            raise TypeError(f"`messages[{i}]` must be an AgentMessage, got {type(m).__name__}.")
    if dim is not None:
        wrong = {
            m.agent_id: m.input_bounds.shape[-1]
            for m in messages
            if m.input_bounds is not None and m.input_bounds.shape[-1] != dim
        }
        if wrong:
            dims = sorted(set(wrong.values()))
            raise ValueError(
                f"Messages from agents {sorted(wrong)} are {'/'.join(map(str, dims))}-dimensional (their input "
                f"bounds), but the receiver's feature map is {dim}-dimensional: every agent of a federation "
                "searches the same parameters, with a map built from the same arguments (dim included)."
            )
    expected = fingerprint if fingerprint is not None else messages[0].fingerprint
    bad = [m.agent_id for m in messages if m.fingerprint != expected]
    if bad:
        raise ValueError(
            f"Messages from agents {bad} were built on a different random-feature map "
            f"(fingerprint != {expected}); all agents must share the same features."
        )
    sizes = {m.omega.numel() for m in messages}
    if len(sizes) != 1:
        raise ValueError(f"Messages carry vectors of different lengths {sorted(sizes)}.")
    dtypes = {str(m.omega.dtype) for m in messages}
    if len(dtypes) != 1:
        raise TypeError(
            f"`messages` carry vectors of different dtypes {sorted(dtypes)}; convert them to one "
            "(float64 for GP algebra) instead of mixing precisions."
        )
    return torch.stack([m.omega for m in messages])
