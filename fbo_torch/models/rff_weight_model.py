r"""The BoTorch side of a Gaussian posterior over RFF weights: ``posterior``, transforms, conditioning.

``f(x) = φ(T(x))ᵀω`` with ``ω ~ N(ν, C)``: :class:`_RFFWeightModel` holds what
every such model does for BoTorch (``posterior`` as a ``GPyTorchPosterior``,
input and outcome transforms, ``fantasize`` / ``condition_on_observations``),
whatever stores ``ν`` and ``C``;
:class:`~fbo_torch.models.rff_blr.RFFBayesianLinear` (the agents' posteriors from
their data, with in-place updates) and :class:`ConditionedRFFBayesianLinear`
(one conditioned on further, possibly batched, observations: what BoTorch's
look-ahead acquisitions build) are the two.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, cast

import torch
from botorch.models.model import FantasizeMixin, Model
from botorch.models.transforms.outcome import OutcomeTransform
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.posteriors.posterior import Posterior
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator
from torch import Tensor
from torch.nn import Module

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.utils.validation import (
    check_last_dim,
    check_single_output,
    check_tensor,
)


class _RFFWeightModel(Model, FantasizeMixin):
    r"""BoTorch plumbing shared by Gaussian posteriors over RFF weights.

    ``f(x) = φ(T(x))ᵀω`` with ``ω ~ N(ν, C)``, ``T`` the model's input transform
    (identity by default) and outcomes on the scale of its outcome transform.
    Subclasses provide ``_mean_cov(φ)`` (posterior mean and covariance of
    ``φω``), ``_cov_apply(φ)`` (``φC``, for conditioning), ``_mean_vector``
    (``ν``, ``batch_shape x M``), ``_noise`` (per-batch noise variance) and
    ``_root`` (the :class:`~fbo_torch.models.rff_blr.RFFBayesianLinear` holding features and transforms).
    """

    # the root's: the transforms given to its constructor, by name
    _given_transforms: dict[str, Module | None]

    @property
    @abstractmethod
    def _root(self) -> _RFFWeightModel:
        r"""The :class:`~fbo_torch.models.rff_blr.RFFBayesianLinear` at the bottom of the chain."""

    @property
    @abstractmethod
    def _mean_vector(self) -> Tensor:
        r"""``ν``, ``batch_shape x M``."""

    @property
    @abstractmethod
    def _noise(self) -> Tensor:
        r"""The noise variance ``σ²`` of each batch entry."""

    @abstractmethod
    def _mean_cov(self, phi: Tensor) -> tuple[Tensor, Tensor]:
        r"""Posterior mean and covariance of ``φω`` for features ``... x q x M``."""

    @abstractmethod
    def _cov_apply(self, phi: Tensor) -> Tensor:
        r"""``φC`` for features ``... x k x M``."""

    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def features(self) -> RandomFourierFeatures:
        # registered by RFFBayesianLinear.__init__, which checks it is a RandomFourierFeatures
        return cast(RandomFourierFeatures, self._root._modules["features"])

    # ------------------------------------------------------------ transforms
    def transform_inputs(self, X: Tensor, input_transform: Module | None = None) -> Tensor:
        r"""Apply the input transform (fitted at construction, always in eval mode)."""
        tf = input_transform if input_transform is not None else self._root._modules.get("input_transform")
        if tf is None:
            return X
        was_training = tf.training
        tf.eval()
        try:
            return tf(X)
        finally:
            tf.train(was_training)

    def _transform_outcomes(self, Y: Tensor, Yvar: Tensor | None, X: Tensor) -> tuple[Tensor, Tensor | None]:
        tf = self._root._modules.get("outcome_transform")
        if tf is None:
            return Y, Yvar
        was_training = tf.training
        tf.eval()
        try:
            return tf(Y, Yvar, X=X)
        finally:
            tf.train(was_training)

    def _set_transformed_inputs(self) -> None:
        r"""No-op: training inputs are stored transformed at construction."""

    def _revert_to_original_inputs(self) -> None:
        r"""No-op: training inputs are stored transformed at construction."""

    def _check_transforms(self) -> None:
        root = self._root
        for name in ("input_transform", "outcome_transform"):
            current = root._modules.get(name, root.__dict__.get(name))
            if current is not root._given_transforms[name]:
                raise RuntimeError(
                    f"`{name}` was changed after this RFFBayesianLinear was built; its training data were "
                    f"transformed with the transform given at construction. Pass `{name}=...` to the "
                    "constructor instead of attaching it later."
                )

    # ------------------------------------------------------------- posterior
    # Model's signature; FantasizeMixin declares an incompatible one (`X, *args, observation_noise: bool`)
    def posterior(  # type: ignore[override]
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: Any | None = None,
        **kwargs: Any,
    ) -> Posterior:
        r"""Posterior of ``f(X) = φ(T(X))ᵀω``.

        Args:
            X: ``batch_shape x q x d`` inputs; ``batch_shape`` must broadcast with
                the model's (e.g. ``q x d``, ``N x q x d`` or ``b x N x q x d``).
            output_indices: Must be ``None`` or ``[0]`` (the model has one output).
            observation_noise: If True, add the noise variance ``σ²`` to the
                diagonal; a tensor (``... x q x 1``, on the outcome-transformed
                scale) is added as given.
            posterior_transform: Optional BoTorch ``PosteriorTransform`` applied to the posterior.

        Returns:
            A ``GPyTorchPosterior`` (lazy covariance, un-transformed by the
            outcome transform), batch shape ``broadcast(batch_shape, model batch)``.
        """
        check_single_output(output_indices)
        check_tensor("X", X)
        check_last_dim("X", X, self.features.dim)
        if X.ndim < 2:
            raise ValueError(f"`X` must be at least 2-dimensional (q x d), got shape {tuple(X.shape)}.")
        self._check_transforms()
        like = self._mean_vector
        phi = self.features(self.transform_inputs(X.to(like)))  # ... x q x M
        mean, cov = self._mean_cov(phi)
        batch = torch.broadcast_shapes(mean.shape[:-1], cov.shape[:-2])  # fantasies share covariances
        mean, cov = mean.expand(*batch, mean.shape[-1]), cov.expand(*batch, *cov.shape[-2:])
        if observation_noise is True:
            noise = self._noise.unsqueeze(-1).unsqueeze(-1)
            cov = cov + noise * torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
        elif isinstance(observation_noise, Tensor):
            cov = cov + torch.diag_embed(observation_noise.to(cov).squeeze(-1).expand(cov.shape[:-1]))
        # a lazy covariance: no Cholesky (which may need jitter when q > M) until one is needed
        posterior: Posterior = GPyTorchPosterior(MultivariateNormal(mean, DenseLinearOperator(cov)))
        # the constructor's OutcomeTransform (_check_transforms above) or None
        outcome_transform = cast("OutcomeTransform | None", self._root._modules.get("outcome_transform"))
        if outcome_transform is not None:
            posterior = outcome_transform.untransform_posterior(posterior, X=X)
        if posterior_transform is not None:
            return posterior_transform(posterior)
        return posterior

    def subset_output(self, idcs: list[int]) -> _RFFWeightModel:
        r"""The model itself for ``idcs = [0]`` (it has one output); anything else is an error."""
        if list(idcs) != [0]:
            raise ValueError(f"{type(self).__name__} has a single output; `idcs` must be [0], got {list(idcs)}.")
        return self

    # --------------------------------------------------------- conditioning
    def fantasize(
        self, X: Tensor, sampler: Any, observation_noise: Tensor | None = None, **kwargs: Any
    ) -> ConditionedRFFBayesianLinear:
        r"""BoTorch's ``fantasize`` with the model's noise variance as the default observation noise.

        Returns a :class:`ConditionedRFFBayesianLinear` with batch shape
        ``sampler.sample_shape x broadcast(X batch, model batch)``.
        """
        if observation_noise is None:
            observation_noise = self._noise.to(self._mean_vector).unsqueeze(-1).unsqueeze(-1)
        return super().fantasize(X, sampler, observation_noise=observation_noise, **kwargs)

    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any
    ) -> _RFFWeightModel:
        r"""The posterior conditioned on ``(X, Y)`` in any BoTorch batch layout (e.g. fantasies).

        With ``φ_f = φ(T(X))``, ``S = φ_f C φ_fᵀ + diag(noise)`` and its Cholesky
        factor ``R``, the conditioned weights are ``N(ν + Wᵀz, C − WᵀW)`` with
        ``W = R⁻¹φ_f C`` and ``z = R⁻¹(y − φ_f ν)``: ``O(k M)`` numbers per batch
        entry, no copy of the stored data.

        Args:
            X: ``batch_shape x k x d`` inputs (broadcasting with the model's batch).
            Y: ``batch_shape' x k x 1`` observations (e.g. ``num_fantasies x batch_shape x k x 1``).
            noise: Optional ``batch_shape' x k x 1`` noise variances on the
                outcome-transformed scale; the model's ``σ²`` if ``None``.

        Returns:
            A :class:`ConditionedRFFBayesianLinear`.
        """
        check_tensor("X", X)
        check_tensor("Y", Y)
        check_last_dim("X", X, self.features.dim)
        if Y.ndim < 2 or Y.shape[-1] != 1 or Y.shape[-2] != X.shape[-2]:
            raise ValueError(
                f"`Y` must be batch_shape x k x 1 with k = {X.shape[-2]} to match `X`, got {tuple(Y.shape)}."
            )
        self._check_transforms()
        like = self._mean_vector
        Xt = self.transform_inputs(X.to(like))
        Y, _ = self._transform_outcomes(Y.to(like), None, Xt)  # `noise` is on the transformed scale already
        noise = None if noise is None else noise.to(like)
        phi = self.features(Xt)  # ... x k x M
        if noise is None:
            noise_diag = self._noise.unsqueeze(-1).expand(*self._noise.shape, phi.shape[-2])
        else:
            noise_diag = noise.squeeze(-1)
        A = self._cov_apply(phi)  # φ_f C: ... x k x M
        S = A @ phi.mT + torch.diag_embed(noise_diag)
        R = torch.linalg.cholesky(S)
        W = torch.linalg.solve_triangular(R, A, upper=False)
        resid = Y.squeeze(-1) - (phi @ like.unsqueeze(-1)).squeeze(-1)
        z = torch.linalg.solve_triangular(R, resid.unsqueeze(-1), upper=False)
        mean = like + (z.mT @ W).squeeze(-2)
        rows = getattr(self, "rows", None)
        if rows is not None:
            batch = torch.broadcast_shapes(rows.shape[:-2], W.shape[:-2])
            W = torch.cat([rows.expand(*batch, *rows.shape[-2:]), W.expand(*batch, *W.shape[-2:])], dim=-2)
        return ConditionedRFFBayesianLinear(self._root, W, mean)


class ConditionedRFFBayesianLinear(_RFFWeightModel):
    r"""An :class:`~fbo_torch.models.rff_blr.RFFBayesianLinear` conditioned on further, possibly batched, observations.

    What :meth:`RFFBayesianLinear.fantasize <fbo_torch.models.rff_blr.RFFBayesianLinear.fantasize>` and
    :meth:`~fbo_torch.models.rff_blr.RFFBayesianLinear.condition_on_observations` return for BoTorch's
    batch layouts (knowledge gradient, integrated posterior variance): the
    weight posterior ``N(ν', C − WᵀW)`` with ``C`` the base model's covariance
    and ``W`` (``batch x k x M``) the whitened rows of the new observations.
    The base model is shared, not copied. It supports ``posterior``,
    ``fantasize``/``condition_on_observations`` (stacking more rows) and
    ``subset_output``; it has no ``update``, ``sample_weights`` or pathwise
    sampler (draw from the base model instead).

    Args:
        base: The unconditioned model (features, transforms, noise).
        rows: ``W``, ``batch_W x k x M``.
        weight_mean: ``ν'``, ``batch_shape x M``.
    """

    base: _RFFWeightModel
    rows: Tensor
    weight_mean: Tensor

    def __init__(self, base: _RFFWeightModel, rows: Tensor, weight_mean: Tensor) -> None:
        super().__init__()
        self.base = base
        self.register_buffer("rows", rows)
        self.register_buffer("weight_mean", weight_mean)

    @property
    def _root(self) -> _RFFWeightModel:
        return self.base

    @property
    def _mean_vector(self) -> Tensor:
        return self.weight_mean

    @property
    def _noise(self) -> Tensor:
        return self.base._noise

    @property
    def batch_shape(self) -> torch.Size:
        return self.weight_mean.shape[:-1]

    def _mean_cov(self, phi: Tensor) -> tuple[Tensor, Tensor]:
        _, cov = self.base._mean_cov(phi)
        u = self.rows @ phi.mT  # ... x k x q
        mean = (phi @ self.weight_mean.unsqueeze(-1)).squeeze(-1)
        return mean, cov - u.mT @ u

    def _cov_apply(self, phi: Tensor) -> Tensor:
        return self.base._cov_apply(phi) - (phi @ self.rows.mT) @ self.rows


__all__ = ["ConditionedRFFBayesianLinear"]
