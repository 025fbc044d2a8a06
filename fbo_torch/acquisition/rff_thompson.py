r"""Acquisition functions on received RFF weight vectors: ``x ↦ φ(x)ᵀω``.

A message ``ω_n`` from agent ``n`` *is* a Thompson sample of that agent's
RFF-approximated GP posterior, so maximizing ``φ(x)ᵀω_n`` is FTS Algorithm 1,
line 6. :class:`PiecewiseRFFThompsonSample` is the DP-FTS-DE agent's function
``x ↦ φ(x)ᵀω^(i[x])`` built from one broadcast vector per sub-region.

A sender that transforms its inputs (``Normalize``) fitted ``ω`` on ``φ(T(x))``;
the acquisitions evaluate ``φ(T(x))ᵀω`` with ``T`` from the message's
``input_bounds`` or the ``input_transform`` argument
(:mod:`fbo_torch.protocol.input_space`): candidates ``X`` are always raw inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botorch.acquisition.acquisition import AcquisitionFunction
from botorch.models.deterministic import GenericDeterministicModel
from botorch.utils.transforms import t_batch_mode_transform
from torch import Tensor
from torch.nn import Module

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.protocol.input_space import resolve_message_space
from fbo_torch.protocol.messages import AgentMessage, stack_omegas
from fbo_torch.utils.validation import check_finite, check_floating, check_tensor

if TYPE_CHECKING:  # pragma: no cover
    from fbo_torch.protocol.partition import SubRegionPartition


def _check_features(features: object) -> RandomFourierFeatures:
    if not isinstance(features, RandomFourierFeatures):
        raise TypeError(f"`features` must be a RandomFourierFeatures, got {type(features).__name__}.")
    return features


def check_fingerprint(features: RandomFourierFeatures, fingerprint: str | None, name: str = "omega") -> None:
    r"""Weight vectors given as tensors carry no fingerprint: the caller may say which map they were drawn on
    (``fingerprint``, a :attr:`RandomFourierFeatures.fingerprint`), and it must be ``features``'s."""
    if fingerprint is None:
        return
    if not isinstance(fingerprint, str):
        raise TypeError(f"`fingerprint` must be a RandomFourierFeatures.fingerprint (a str), got {fingerprint!r}.")
    if fingerprint != features.fingerprint:
        raise ValueError(
            f"`{name}` were drawn on another feature map (fingerprint {fingerprint[:12]}...) than `features` "
            f"({features.fingerprint[:12]}...): every agent must build the shared map from the same arguments "
            "(RandomFourierFeatures.config()), or the weights mean nothing on it."
        )


def _omega_from(
    features: RandomFourierFeatures, omega: Tensor | AgentMessage, name: str = "omega", fingerprint: str | None = None
) -> Tensor:
    if isinstance(omega, AgentMessage):  # its dimension, then its feature map, checked
        omega = stack_omegas([omega], fingerprint=features.fingerprint, dim=features.dim)[0]
    else:
        check_fingerprint(features, fingerprint, name)
    check_tensor(name, omega)
    check_floating(name, omega)
    if omega.dtype != features.spectral.dtype:
        raise TypeError(
            f"`{name}` has dtype {omega.dtype}, the feature map {features.spectral.dtype}: convert one "
            "to the other (float64 for GP algebra) instead of mixing precisions."
        )
    if omega.shape[-1] != features.num_features:
        raise ValueError(
            f"`{name}` must have M = {features.num_features} entries in its last dimension, "
            f"got shape {tuple(omega.shape)}."
        )
    check_finite(name, omega)
    return omega


_ONE_OMEGA_MANY_Q = (
    "RFFThompsonSample with one weight vector cannot produce {q}: x -> phi(x)^T omega is one fixed "
    "function, so every candidate would be the same maximizer. Pass `omega` as q x M (one vector per "
    "candidate) and optimize with sequential=False, or use q = 1."
)


class RFFThompsonSample(AcquisitionFunction):
    r"""``x ↦ φ(x)ᵀω``: maximize a received RFF weight vector.

    Follows BoTorch's acquisition conventions: ``forward`` takes
    ``b x q x d`` and returns ``b``, written in torch ops so ``optimize_acqf``
    gets gradients. With ``q > 1`` pass ``omega`` as ``q x M`` (one vector per
    candidate, as in parallel Thompson sampling) and optimize jointly
    (``sequential=False``); the value is the sum over the q candidates, so each
    is maximized independently. One ``ω`` with ``q > 1`` (jointly, or
    sequentially through pending points) is refused: it is one fixed function,
    and its q maximizers would be q copies of the same point.

    The function is wrapped as a ``GenericDeterministicModel`` in ``self.model``.

    Args:
        features: The shared feature map ``φ``.
        omega: ``M`` weights, ``q x M`` weights, or an :class:`AgentMessage`
            (whose fingerprint must match ``features``). A tensor carries no
            fingerprint: it is checked against ``features`` only when
            ``fingerprint`` is given, otherwise taken on trust.
        input_transform: The sender's input transform ``T`` (e.g. the
            ``Normalize(d, bounds=...)`` its model used), for a raw ``omega``
            tensor fitted on transformed inputs: the value is then ``φ(T(x))ᵀω``.
            By default a tensor is taken as fitted on raw inputs, and a message
            uses its own ``input_bounds``; a transform that disagrees with them
            is an error.
        fingerprint: The :attr:`RandomFourierFeatures.fingerprint` of the map a
            tensor ``omega`` was drawn on (e.g. sent beside it); a ``ValueError``
            when it is not ``features``'s.

    Attributes:
        message_space: The :class:`~fbo_torch.protocol.input_space.MessageSpace`
            ``T`` applied before ``φ``.

    Example:
        >>> acqf = RFFThompsonSample(rff, omega)
        >>> x, val = optimize_acqf(acqf, bounds, q=1, num_restarts=10, raw_samples=512)
        >>> # omega fitted by a model with Normalize(2, bounds=branin_bounds), X on Branin's box
        >>> acqf = RFFThompsonSample(rff, omega, input_transform=Normalize(2, bounds=branin_bounds))
    """

    omega: Tensor

    def __init__(
        self,
        features: RandomFourierFeatures,
        omega: Tensor | AgentMessage,
        input_transform: Module | None = None,
        fingerprint: str | None = None,
    ) -> None:
        features = _check_features(features)
        weights = _omega_from(features, omega, fingerprint=fingerprint)
        space = resolve_message_space(omega, input_transform, features.dim)
        omega = weights
        if omega.ndim not in (1, 2):
            raise ValueError(f"`omega` must be M or q x M, got shape {tuple(omega.shape)}.")
        model = GenericDeterministicModel(f=self._function_values, num_outputs=1)
        super().__init__(model=model)
        self.features = features
        self.message_space = space
        self.register_buffer("omega", omega)
        super().set_X_pending(None)

    def _function_values(self, X: Tensor) -> Tensor:
        phi = self.features(self.message_space(X))
        omega = self.omega.to(phi)
        if omega.ndim == 1:
            return (phi @ omega).unsqueeze(-1)
        return (phi * omega).sum(-1, keepdim=True)

    @t_batch_mode_transform()  # type: ignore[arg-type]  # BoTorch's annotation rejects subclasses' methods
    def forward(self, X: Tensor) -> Tensor:
        r"""Evaluate ``Σ_j φ(x_j)ᵀω_j`` on ``b x q x d`` candidates, returning ``b``."""
        if self.omega.ndim == 2 and X.shape[-2] != self.omega.shape[0]:
            raise ValueError(f"`omega` holds {self.omega.shape[0]} vectors but X has q = {X.shape[-2]}.")
        if self.omega.ndim == 1 and X.shape[-2] != 1:
            raise ValueError(_ONE_OMEGA_MANY_Q.format(q=f"q = {X.shape[-2]} candidates"))
        return self._function_values(X).squeeze(-1).sum(-1)

    def set_X_pending(self, X_pending: Tensor | None = None) -> None:
        r"""Refuse pending points: this function does not change with them (see the class docstring)."""
        if X_pending is not None:
            raise ValueError(_ONE_OMEGA_MANY_Q.format(q="pending points (sequential q > 1)"))
        super().set_X_pending(None)


class PiecewiseRFFThompsonSample(AcquisitionFunction):
    r"""``x ↦ φ(x)ᵀω^(i[x])``: the DP-FTS-DE agent's function (Algorithm 2, line 8).

    The server broadcasts one vector per sub-region; a point uses the vector of
    the sub-region it lies in. The function is smooth inside each sub-region
    and jumps across borders, so maximize it one sub-region at a time (see
    :meth:`region_bounds`) and keep the best.

    Args:
        features: The shared feature map.
        omegas: ``P x M`` broadcast vectors.
        partition: The :class:`~fbo_torch.protocol.SubRegionPartition` with
            ``P`` sub-regions (of the raw input space).
        input_transform: The input transform every agent's weights were fitted
            under (see :class:`RFFThompsonSample`); raw inputs by default.

    Example:
        >>> acqf = PiecewiseRFFThompsonSample(rff, broadcast, partition)
        >>> best = max((optimize_acqf(acqf.region_acquisition(i), b, q=1, num_restarts=4, raw_samples=256)
        ...             for i, b in enumerate(acqf.region_bounds())), key=lambda r: r[1])
    """

    omegas: Tensor

    def __init__(
        self,
        features: RandomFourierFeatures,
        omegas: Tensor,
        partition: SubRegionPartition,
        input_transform: Module | None = None,
    ) -> None:
        features = _check_features(features)
        omegas = _omega_from(features, omegas, name="omegas")
        space = resolve_message_space(omegas, input_transform, features.dim)
        if omegas.ndim != 2 or omegas.shape[0] != partition.num_regions:
            raise ValueError(
                f"`omegas` must be P x M with P = {partition.num_regions} sub-regions, got {tuple(omegas.shape)}."
            )
        model = GenericDeterministicModel(f=lambda X: self._function_values(X).unsqueeze(-1), num_outputs=1)
        super().__init__(model=model)
        self.features = features
        self.partition = partition
        self.message_space = space
        self.register_buffer("omegas", omegas)

    def _function_values(self, X: Tensor) -> Tensor:
        phi = self.features(self.message_space(X))  # ... x M
        region = self.partition.region_of(X)  # ...
        omega = self.omegas.to(phi)[region]  # ... x M
        return (phi * omega).sum(-1)

    @t_batch_mode_transform()  # type: ignore[arg-type]  # BoTorch's annotation rejects subclasses' methods
    def forward(self, X: Tensor) -> Tensor:
        return self._function_values(X).sum(-1)

    def region_bounds(self) -> Tensor:
        """``P x 2 x d`` bounds of the sub-regions (one optimization each)."""
        return self.partition.region_bounds()

    def region_acquisition(self, region: int) -> RFFThompsonSample:
        r"""``x ↦ φ(x)ᵀω^(region)``: the smooth piece to maximize over
        ``region_bounds()[region]``; the best of the ``P`` maxima is the maximum
        of the piecewise function (up to points on shared borders)."""
        return RFFThompsonSample(self.features, self.omegas[region], input_transform=self.message_space)
