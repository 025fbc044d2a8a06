r"""Every agent's approximate GP posterior, rebuilt from what the agent sent.

For the RGPE and TAF baselines of the FTS paper (Dai et al. 2020, Sec. 3.2) each
agent ``n`` sends the mean ``ν_n`` and covariance ``C_n = σ²Σ_n⁻¹`` of its RFF
weight posterior (``M + M²`` numbers). The target agent then holds, for every
``n``, the Bayesian linear model

    f_n(x) = φ(x)ᵀω_n,   ω_n ~ N(ν_n, C_n),

i.e. the GP with mean ``φ(x)ᵀν_n`` and covariance ``φ(x)ᵀ C_n φ(x')``, where ``φ``
is the shared :class:`~fbo_torch.features.RandomFourierFeatures` map.

:class:`AgentRFFPosteriors` stores all ``N`` agents in one batch. Each ``C_n`` is
kept only through a factor ``R_n`` with ``R_n R_nᵀ = C_n``, computed once, so a
variance is a squared norm ``‖φ(x)ᵀR_n‖²``. The ``N`` factors are also laid side by
side as one ``M x NM`` matrix, so projecting ``P`` candidates onto every agent is a
*single* ``P x M x NM`` matrix product rather than ``N`` small ones.

Because every agent uses the same ``φ``, a weighted sum ``Σ_n w_n f_n`` of
independent agents is again a Bayesian linear model on ``φ``, with weight mean
``Σ w_n ν_n`` and covariance ``Σ w_n² C_n`` (:meth:`AgentRFFPosteriors.linear_combination`).
RGPE uses this to make the cost of an acquisition evaluation independent of ``N``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from botorch.exceptions.errors import UnsupportedError
from botorch.models.model import Model
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator
from torch import Tensor

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.models.weight_posterior import RFFWeightPosterior
from fbo_torch.protocol.messages import PosteriorMessage
from fbo_torch.sampling.draws import standard_normal
from fbo_torch.utils.validation import (
    check_finite,
    check_floating,
    check_last_dim,
    check_ndim,
    check_single_output,
    check_tensor,
)

#: Upper bound on the number of elements of the ``P x N x M`` projection held at
#: once by :meth:`AgentRFFPosteriors.predict` (about 64 MB in float64).
_MAX_CHUNK_ELEMENTS = 2**23


class AgentRFFPosteriors(Model):
    r"""The approximate GP posteriors of ``N`` agents on a shared RFF map.

    A BoTorch ``Model`` with ``batch_shape = [N]`` and one output: agent ``n``'s
    posterior at ``X`` has mean ``φ(X)ν_n`` and covariance ``φ(X) C_n φ(X)ᵀ``
    (the full ``q x q`` matrix for ``q > 1``). All agents are evaluated in one
    batched computation.

    Args:
        features: The shared :class:`~fbo_torch.features.RandomFourierFeatures`.
        weight_means: ``N x M`` posterior weight means ``ν_n``.
        weight_covariances: ``N x M x M`` posterior weight covariances
            ``C_n = σ²Σ_n⁻¹`` (symmetric PSD). Only their factors are kept.
        incumbents: Optional ``N`` best observed values of the agents (sent for
            TAF, see :class:`~fbo_torch.protocol.messages.PosteriorMessage`).
        agent_ids: Optional ``N`` agent identifiers, kept for bookkeeping.
        noise_variances: Optional ``N`` observation-noise variances ``σ_n²``;
            only needed for ``posterior(..., observation_noise=True)``.

    Example:
        >>> post = AgentRFFPosteriors.from_messages(messages, rff)
        >>> mean, var = post.predict(torch.rand(1000, 2, dtype=torch.float64))  # 1000 x N
    """

    features: RandomFourierFeatures
    weight_mean: Tensor
    covariance_factor: Tensor
    _factor_wide: Tensor
    incumbents: Tensor | None
    noise_variances: Tensor | None

    def __init__(
        self,
        features: RandomFourierFeatures,
        weight_means: Tensor,
        weight_covariances: Tensor,
        incumbents: Tensor | Sequence[float] | None = None,
        agent_ids: Sequence[int] | None = None,
        noise_variances: Tensor | None = None,
    ) -> None:
        super().__init__()
        nu = self._check_means(features, weight_means)
        _check_matrices("weight_covariances", weight_covariances, nu)
        post = RFFWeightPosterior.from_covariance(nu, weight_covariances)
        self._setup(features, post.mean, post.root, incumbents, agent_ids, noise_variances)

    # ---------------------------------------------------------- constructors
    @classmethod
    def from_factors(
        cls,
        features: RandomFourierFeatures,
        weight_means: Tensor,
        covariance_factors: Tensor,
        incumbents: Tensor | Sequence[float] | None = None,
        agent_ids: Sequence[int] | None = None,
        noise_variances: Tensor | None = None,
    ) -> AgentRFFPosteriors:
        r"""Build from factors ``R_n`` (``N x M x M``) with ``C_n = R_n R_nᵀ``."""
        nu = cls._check_means(features, weight_means)
        _check_matrices("covariance_factors", covariance_factors, nu)
        obj = cls.__new__(cls)
        Model.__init__(obj)
        obj._setup(features, nu, covariance_factors.to(nu), incumbents, agent_ids, noise_variances)
        return obj

    @classmethod
    def from_messages(cls, messages: Sequence[PosteriorMessage], features: RandomFourierFeatures) -> AgentRFFPosteriors:
        r"""Build from the agents' :class:`~fbo_torch.protocol.messages.PosteriorMessage`.

        Every message must carry ``features.fingerprint``: a vector built on a
        different random-feature map means a different function, so a mismatch
        raises instead of silently mixing maps. Incumbents are kept if every
        message carries one (``None`` otherwise).

        Raises:
            ValueError: No messages, fingerprint mismatch, or wrong ``M``.
        """
        if not isinstance(features, RandomFourierFeatures):
            raise TypeError(f"`features` must be a RandomFourierFeatures, got {type(features).__name__}.")
        if len(messages) == 0:
            raise ValueError("`messages` is empty: at least one agent's PosteriorMessage is needed.")
        for i, m in enumerate(messages):
            if not isinstance(m, PosteriorMessage):
                raise TypeError(f"`messages[{i}]` must be a PosteriorMessage, got {type(m).__name__}.")
        expected = features.fingerprint
        bad = [m.agent_id for m in messages if m.fingerprint != expected]
        if bad:
            raise ValueError(
                f"`messages` from agents {bad} were built on a different random-feature map than "
                f"`features` (fingerprint {expected}); every agent must use the same features."
            )
        M = features.num_features
        wrong = [m.agent_id for m in messages if m.weight_mean.numel() != M]
        if wrong:
            raise ValueError(f"`messages` from agents {wrong} do not carry M = {M} weights.")
        nu = torch.stack([m.weight_mean for m in messages])
        cov = torch.stack([m.weight_covariance.to(nu) for m in messages])
        incumbents = None
        sent = [m.incumbent for m in messages if m.incumbent is not None]
        if len(sent) == len(messages):
            incumbents = torch.tensor([float(v) for v in sent], dtype=nu.dtype, device=nu.device)
        return cls(features, nu, cov, incumbents=incumbents, agent_ids=[int(m.agent_id) for m in messages])

    @classmethod
    def from_model(cls, model: Any) -> AgentRFFPosteriors:
        r"""Build from a :class:`~fbo_torch.models.rff_blr.RFFBayesianLinear` (same agents).

        The factors are the model's
        :meth:`~fbo_torch.models.rff_blr.RFFBayesianLinear.weight_posterior`
        (``R_n = σ_n L_n⁻ᵀ``, one batched triangular solve: the covariance is
        never formed and re-factorized). Incumbents are each agent's
        best observed value when every agent has at least one observation.
        """
        from fbo_torch.models.rff_blr import RFFBayesianLinear

        if not isinstance(model, RFFBayesianLinear):
            raise TypeError(f"`model` must be an RFFBayesianLinear, got {type(model).__name__}.")
        post = model.weight_posterior()  # R_n = σ_n L_n⁻ᵀ
        M = post.mean.shape[-1]
        nu, factor = post.mean.reshape(-1, M), post.root.reshape(-1, M, M)  # N = 1 for an unbatched model
        valid = model.mask
        incumbents = None
        if bool(valid.any(-1).all()):
            y = torch.where(valid, model.train_Y.squeeze(-1), -math.inf)
            incumbents = y.amax(-1)
        return cls.from_factors(model.features, nu, factor, incumbents=incumbents, noise_variances=model.noise_variance)

    # ---------------------------------------------------------------- setup
    @staticmethod
    def _check_means(features: RandomFourierFeatures, weight_means: Tensor) -> Tensor:
        if not isinstance(features, RandomFourierFeatures):
            raise TypeError(f"`features` must be a RandomFourierFeatures, got {type(features).__name__}.")
        check_ndim("weight_means", weight_means, 2, "N x M")
        check_floating("weight_means", weight_means)
        N, M = weight_means.shape
        if N < 1:
            raise ValueError("`weight_means` must hold at least one agent (N >= 1).")
        if M != features.num_features:
            raise ValueError(f"`weight_means` has M = {M} columns but `features` has {features.num_features} features.")
        check_finite("weight_means", weight_means)
        return weight_means

    def _setup(
        self,
        features: RandomFourierFeatures,
        nu: Tensor,
        factor: Tensor,
        incumbents: Tensor | Sequence[float] | None,
        agent_ids: Sequence[int] | None,
        noise_variances: Tensor | None,
    ) -> None:
        N, M = nu.shape
        self.features = features
        self.register_buffer("weight_mean", nu.detach().clone())
        self.register_buffer("covariance_factor", factor.detach().clone())
        # R_wide[:, n*M:(n+1)*M] = R_n, so that φ R_wide projects onto all agents at once.
        self.register_buffer("_factor_wide", factor.detach().permute(1, 0, 2).reshape(M, N * M).clone())
        if incumbents is not None:
            inc = torch.as_tensor(incumbents, dtype=nu.dtype, device=nu.device).reshape(-1)
            if inc.shape != (N,):
                raise ValueError(f"`incumbents` must hold N = {N} values, got {tuple(inc.shape)}.")
            check_finite("incumbents", inc)
            inc = inc.clone()
        else:
            inc = None
        self.register_buffer("incumbents", inc)
        if noise_variances is not None:
            noise = torch.as_tensor(noise_variances, dtype=nu.dtype, device=nu.device).reshape(-1)
            if noise.shape != (N,):
                raise ValueError(f"`noise_variances` must hold N = {N} values, got {tuple(noise.shape)}.")
            noise = noise.clone()
        else:
            noise = None
        self.register_buffer("noise_variances", noise)
        if agent_ids is not None and len(agent_ids) != N:
            raise ValueError(f"`agent_ids` must hold N = {N} ids, got {len(agent_ids)}.")
        self.agent_ids = list(agent_ids) if agent_ids is not None else list(range(N))

    # ------------------------------------------------------------ properties
    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        return torch.Size([self.num_agents])

    @property
    def num_agents(self) -> int:
        return self.weight_mean.shape[0]

    @property
    def num_features(self) -> int:
        return self.weight_mean.shape[1]

    def subset(self, indices: Tensor | Sequence[int]) -> AgentRFFPosteriors:
        r"""The posteriors of the agents at ``indices`` (e.g. a target's peers)."""
        idx = torch.as_tensor(indices, dtype=torch.long, device=self.weight_mean.device).reshape(-1)
        if idx.numel() == 0:
            raise ValueError("`indices` is empty: a subset needs at least one agent.")
        pick = idx.tolist()
        return type(self).from_factors(
            self.features,
            self.weight_mean[idx],
            self.covariance_factor[idx],
            incumbents=None if self.incumbents is None else self.incumbents[idx],
            agent_ids=[self.agent_ids[i] for i in pick],
            noise_variances=None if self.noise_variances is None else self.noise_variances[idx],
        )

    def weight_covariance(self) -> Tensor:
        r"""The covariances ``C_n = R_n R_nᵀ``, ``N x M x M`` (diagnostics only)."""
        return self.covariance_factor @ self.covariance_factor.mT

    def _features(self, X: Tensor) -> Tensor:
        check_tensor("X", X)
        check_floating("X", X)
        check_last_dim("X", X, self.features.dim)
        return self.features(X.to(self.weight_mean))

    # ---------------------------------------------------------- fast paths
    def predict_mean(self, X: Tensor) -> Tensor:
        r"""Posterior means ``φ(x)ᵀν_n`` of every agent: ``... x d -> ... x N``."""
        return self._features(X) @ self.weight_mean.mT

    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Marginal posterior means and variances of every agent at every point.

        Args:
            X: ``... x d`` points, shared by all agents.

        Returns:
            ``(mean, variance)``, each ``... x N``. The work is one ``P x M x NM``
            matrix product for the ``P`` points (split into chunks of bounded
            memory), followed by a squared norm.
        """
        phi = self._features(X)
        lead = phi.shape[:-1]
        phi = phi.reshape(-1, self.num_features)
        mean = (phi @ self.weight_mean.mT).reshape(*lead, self.num_agents)
        var = self._variances(phi).reshape(*lead, self.num_agents)
        return mean, var

    def _variances(self, phi: Tensor) -> Tensor:
        """``P x M`` features -> ``P x N`` variances ``‖φᵀR_n‖²``."""
        P, M = phi.shape
        N = self.num_agents
        rows = max(1, _MAX_CHUNK_ELEMENTS // max(1, N * M))
        out = []
        for start in range(0, P, rows):
            V = (phi[start : start + rows] @ self._factor_wide).view(-1, N, M)
            out.append(V.square().sum(-1))
        return torch.cat(out, dim=0) if out else phi.new_zeros(0, N)

    @property
    def weight_posterior(self) -> RFFWeightPosterior:
        r"""The agents' weight posteriors (``N x M`` means, ``N x M x M`` roots)."""
        return RFFWeightPosterior(self.weight_mean, self.covariance_factor)

    def linear_combination(self, weights: Tensor) -> RFFWeightPosterior:
        r"""The weight posterior of ``Σ_n w_n f_n`` (agents independent):
        :meth:`~fbo_torch.models.weight_posterior.RFFWeightPosterior.combine`.

        Args:
            weights: ``N`` weights.

        Returns:
            ``(mean, root)``: the ``M`` mean and an ``M x M`` root ``R̄`` with
            ``R̄R̄ᵀ = Σ_n w_n² C_n``.
        """
        check_tensor("weights", weights)
        if weights.numel() != self.num_agents:
            raise ValueError(f"`weights` must hold N = {self.num_agents} values, got {tuple(weights.shape)}.")
        return self.weight_posterior.combine(weights)

    def sample_joint(
        self,
        X: Tensor,
        sample_shape: torch.Size = torch.Size(),
        generator: torch.Generator | None = None,
    ) -> Tensor:
        r"""Joint posterior draws of every agent's function at the points ``X``.

        Draws in weight space, ``f_n(X) = φ(X)(ν_n + R_n z_n)`` with
        ``z_n ~ N(0, I_M)``, which is exact and needs no jitter.

        Args:
            X: ``n x d`` points shared by all agents.
            sample_shape: Leading shape of independent draws.
            generator: Optional ``torch.Generator`` (drawn on its own device).

        Returns:
            ``*sample_shape x N x n`` draws.
        """
        check_ndim("X", X, 2, "n x d")
        phi = self._features(X)  # n x M
        n, M = phi.shape
        N = self.num_agents
        sample_shape = torch.Size(sample_shape)
        S = math.prod(sample_shape)
        G = (phi @ self._factor_wide).view(n, N, M).transpose(0, 1)  # N x n x M
        z = standard_normal((N, M, S), self.weight_mean, generator)
        f = (G @ z).permute(2, 0, 1) + (phi @ self.weight_mean.mT).mT  # S x N x n
        return f.reshape(*sample_shape, N, n)

    # -------------------------------------------------------------- posterior
    def posterior(
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: Any | None = None,
        **kwargs: Any,
    ) -> GPyTorchPosterior:
        r"""Posterior of every agent's ``f_n(X) = φ(X)ᵀω_n``.

        Args:
            X: ``batch_shape x q x d`` inputs; ``batch_shape`` must broadcast with
                ``[N]``: ``q x d`` and ``b x 1 x q x d`` share the points across
                agents, ``N x q x d`` or ``b x N x q x d`` give each agent its own.
            output_indices: Must be ``None`` or ``[0]`` (each agent has one output).
            observation_noise: If True, add each agent's ``σ_n²`` (needs
                ``noise_variances``); a tensor is added to the diagonal as is.
            posterior_transform: Optional BoTorch ``PosteriorTransform`` applied to the posterior.

        Returns:
            A ``GPyTorchPosterior`` with batch shape ``broadcast(batch_shape, [N])``,
            mean ``φν_n`` and the full ``q x q`` covariance ``φ C_n φᵀ``.
        """
        check_single_output(output_indices)
        check_tensor("X", X)
        if X.ndim < 2:
            raise ValueError(f"`X` must be at least 2-dimensional (q x d), got shape {tuple(X.shape)}.")
        phi = self._features(X)  # lead x q x M
        lead, q = phi.shape[:-2], phi.shape[-2]
        N, M = self.num_agents, self.num_features
        if len(lead) == 0 or lead[-1] == 1:  # the same points for every agent
            outer = lead[:-1]
            flat = phi.reshape(-1, M)
            mean = (flat @ self.weight_mean.mT).reshape(*outer, q, N).movedim(-1, -2)
            if q == 1:
                var = self._variances(flat).reshape(*outer, q, N).movedim(-1, -2)
                cov = var.unsqueeze(-1)
            else:
                V = (flat @ self._factor_wide).reshape(*outer, q, N, M).movedim(-2, -3)
                cov = V @ V.mT
        elif lead[-1] == N:  # one set of points per agent
            mean, cov = self.weight_posterior.predict(phi)
        else:
            raise ValueError(
                f"The batch shape of `X` {tuple(lead)} does not broadcast with the {N} agents "
                "(its last batch dimension must be 1 or N)."
            )
        if observation_noise is True:
            if self.noise_variances is None:
                raise UnsupportedError(
                    "`observation_noise=True` needs the agents' noise variances; build with "
                    "`noise_variances=` or `from_model`, or pass the noise as a tensor."
                )
            eye = torch.eye(q, dtype=cov.dtype, device=cov.device)
            cov = cov + self.noise_variances.view(-1, 1, 1) * eye
        elif isinstance(observation_noise, Tensor):
            cov = cov + torch.diag_embed(observation_noise.to(cov).squeeze(-1).expand(cov.shape[:-1]))
        posterior = GPyTorchPosterior(MultivariateNormal(mean, DenseLinearOperator(cov)))
        if posterior_transform is not None:
            return posterior_transform(posterior)
        return posterior

    def transform_inputs(self, X: Tensor, input_transform: Any | None = None) -> Tensor:
        return X

    def extra_repr(self) -> str:
        return (
            f"num_agents={self.num_agents}, num_features={self.num_features}, "
            f"incumbents={'yes' if self.incumbents is not None else 'no'}"
        )


def _check_matrices(name: str, value: Tensor, nu: Tensor) -> None:
    """``value`` must be a finite floating ``N x M x M`` tensor for the ``N x M`` means ``nu``."""
    check_tensor(name, value)
    check_floating(name, value)
    N, M = nu.shape
    if value.shape != (N, M, M):
        raise ValueError(f"`{name}` must have shape {(N, M, M)} (N x M x M), got {tuple(value.shape)}.")
    check_finite(name, value)
