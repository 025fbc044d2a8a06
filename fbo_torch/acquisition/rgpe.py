r"""Ranking-weighted Gaussian process ensemble (RGPE), adapted to federated BO.

RGPE (Feurer, Letham & Bakshy 2018, "Scalable meta-learning for Bayesian
optimization using ranking-weighted Gaussian process ensembles"; the BoTorch
tutorial "Meta-learning with RGPE") models the target function as a weighted
sum of independent GPs, one per previous task and one for the target task,

    f̄(x) = Σ_i w_i f_i(x) ~ N(Σ_i w_i μ_i(x), Σ_i w_i² σ_i²(x)),

which is again a GP and can be plugged into any BoTorch acquisition function.
In the FTS paper's adaptation (Dai et al. 2020, Sec. 3.2) the "previous tasks"
are the other agents, each represented by the approximate GP of its RFF
posterior (:class:`~fbo_torch.models.agent_posteriors.AgentRFFPosteriors`).

**Weights** (Feurer et al.; BoTorch tutorial). For ``S`` joint
posterior draws of every model at the target's observed inputs
``x_1..x_n`` the ranking loss counts misranked ordered pairs,

    L(f_i) = Σ_j Σ_k 1[(f_i(x_j) < f_i(x_k)) ⊕ (y_j < y_k)],

and for the target model, whose in-sample predictions would be over-confident,
the draws come from its leave-one-out posteriors ``f_{-j}`` (conditioned on all
observations but ``j``, drawn jointly at all ``n`` inputs as in the tutorial):

    L(f_t) = Σ_j Σ_k 1[(f_{-j}(x_j) < f_{-j}(x_k)) ⊕ (y_j < y_k)].

``w_i`` is the fraction of draws in which model ``i`` has the smallest loss.
Choices made here (all vectorized over agents and draws, no loop over agents):

* Pairs with tied observations ``y_j = y_k`` carry no ranking information and
  are skipped; a tie of the predictions counts as half a misranking.
* Ties for the smallest loss split that draw's unit weight evenly among the tied
  models (as in the authors' final reference implementation; the first arXiv
  version gave ties to the target, the BoTorch tutorial to the lowest index).
* With fewer than two distinct observed values (``n < 2``, or all ``y`` equal)
  no pair can be ranked: every model's loss is 0 and the tie rule gives uniform
  weights ``1/(N+1)``, the same limit as TST-R's weights.
* The target's leave-one-out posteriors come from one closed-form computation
  (Rasmussen & Williams 2006, Sec. 5.4.2), not ``n`` refits: removing
  observation ``j`` adds the rank-one term ``u_j u_jᵀ`` with
  ``u_j = K A e_j / √A_jj`` (``A = (K + σ²I)⁻¹``) to the full posterior
  covariance and shifts its mean by ``-u_j α_j/√A_jj`` (``α = A(y - m)``).
* Weight dilution (many poor models each winning a few draws by chance) is not
  corrected by default, matching the BoTorch tutorial. ``weight_dilution``
  offers Feurer et al.'s two remedies: ``"percentile"`` (first arXiv version,
  arXiv:1802.02219v1): discard agent ``i`` if the median of its loss is at least
  the ``dilution_percentile``-th (default 95th) percentile of the target's loss;
  ``"probabilistic"`` (final version): keep agent ``i`` with probability
  ``P(L_i < L_t)`` (estimated from the draws), multiplied by ``1 - n/horizon``
  when a ``horizon`` (total evaluation budget) is given. Discarded agents get
  weight 0.

Agents' posteriors and the target model must predict on the same outcome scale
(the ensemble mean mixes them); the ranking loss itself is scale-free.

**Cost.** Because every agent shares the feature map ``φ``, the agent part of
the ensemble collapses to one Bayesian linear model on ``φ`` with weight mean
``Σ w_n ν_n`` and covariance ``Σ w_n² C_n``, formed once when the model is
built. An acquisition evaluation then costs the target GP's posterior plus one
``q x M`` by ``M x M`` product, whatever the number of agents ``N`` (the FTS
paper's Fig. 3d has RGPE's cost growing linearly in ``N``).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from botorch.exceptions.errors import UnsupportedError
from botorch.models.model import Model
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from fbo_torch.models.agent_posteriors import AgentRFFPosteriors
from fbo_torch.models.weight_posterior import RFFWeightPosterior, psd_factor
from fbo_torch.sampling.draws import standard_normal, uniform
from fbo_torch.utils.validation import (
    check_finite,
    check_floating,
    check_int,
    check_ndim,
    check_single_output,
    check_tensor,
)

#: Upper bound on the number of pairwise differences formed at once by :func:`ranking_loss`.
_MAX_PAIRWISE_ELEMENTS = 2**23

WeightDilution = Literal["percentile", "probabilistic"] | None


# ---------------------------------------------------------------- ranking loss
def normalized_weights(weights: Tensor, num_agents: int) -> Tensor:
    r"""Ensemble weights given by a user, checked and normalized to sum to one.

    Args:
        weights: ``N + 1`` non-negative values, the agents' then the target's.
        num_agents: ``N``.

    Returns:
        The ``N + 1`` weights divided by their sum (detached).
    """
    check_tensor("weights", weights)
    check_floating("weights", weights)
    w = weights.detach().reshape(-1)
    if w.shape != (num_agents + 1,):
        raise ValueError(
            f"`weights` must hold N + 1 = {num_agents + 1} values (agents, then target), got {tuple(weights.shape)}."
        )
    check_finite("weights", w)
    if bool((w < 0).any()) or not bool(w.sum() > 0):
        raise ValueError("`weights` must be non-negative with a positive sum.")
    return w / w.sum()


def _pair_signs(y: Tensor) -> Tensor:
    """``n x n`` matrix ``s[j, k] = sign(y_k - y_j)``."""
    return torch.sign(y.unsqueeze(-2) - y.unsqueeze(-1))


def ranking_loss(f: Tensor, y: Tensor) -> Tensor:
    r"""Misranked ordered pairs of predictions ``f`` against observations ``y``.

    ``L = Σ_{j,k: y_j≠y_k} 1[(f_j < f_k) ⊕ (y_j < y_k)]``, with a tie
    ``f_j = f_k`` counting ½. Each unordered pair appears twice with the same
    outcome, so over the ``p ≤ n(n-1)/2`` pairs ``(j, k)`` with ``y_j < y_k``,
    ``L = p - Σ sign(f_k - f_j)``. The differences are one matrix product with a
    ``n x p`` matrix of ``±1`` (exact: every other term is an exact zero).

    Args:
        f: ``... x n`` predictions (e.g. posterior draws of many models).
        y: ``n`` observations.

    Returns:
        ``...`` losses in ``[0, n(n-1)]``.
    """
    n = f.shape[-1]
    lo, hi = (_pair_signs(y) > 0).nonzero(as_tuple=True)  # pairs with y_lo < y_hi
    p = lo.numel()
    D = torch.zeros(n, p, dtype=f.dtype, device=f.device)
    cols = torch.arange(p, device=f.device)
    D[hi.to(f.device), cols] = 1.0
    D[lo.to(f.device), cols] = -1.0
    flat = f.reshape(-1, n)
    rows = max(1, _MAX_PAIRWISE_ELEMENTS // max(1, p))
    parts = [torch.sign(flat[i : i + rows] @ D).sum(-1) for i in range(0, flat.shape[0], rows)]
    agree = torch.cat(parts) if parts else flat.new_zeros(0)
    return (p - agree).reshape(f.shape[:-1])


def _loo_ranking_loss(f_loo: Tensor, y: Tensor) -> Tensor:
    r"""Target-model loss from leave-one-out draws ``f_loo``: ``S x n (fold j) x n (point k)``.

    Compares ``f_{-j}(x_j)`` with ``f_{-j}(x_k)`` against ``y_j`` vs ``y_k``, with
    the same conventions as :func:`ranking_loss` (tied ``y`` skipped, tied ``f`` ½).
    """
    sy = _pair_signs(y)
    diag = f_loo.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)  # S x n x 1: f_{-j}(x_j)
    sf = torch.sign(f_loo - diag)  # s[j, k] = sign(f_{-j}(x_k) - f_{-j}(x_j))
    return (sy.abs().sum() - (sf * sy).sum((-1, -2))) / 2


# ------------------------------------------------------------- target LOO
def _gp_prior_at_train(target_model: Any) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""Prior mean ``m``, covariance ``K``, noise ``σ²`` and targets ``y`` of the
    target model at its own training inputs, in the model's internal (transformed)
    space. Supports exact single-output GPs (e.g. ``SingleTaskGP``, batch shape
    ``[]`` or ``[1]``) and an unbatched / one-agent ``RFFBayesianLinear``."""
    from fbo_torch.models.rff_blr import RFFBayesianLinear

    if isinstance(target_model, RFFBayesianLinear):
        if target_model.num_agents != 1:
            raise ValueError(
                f"`target_model` must model one agent, got an RFFBayesianLinear with {target_model.num_agents}."
            )
        valid = target_model.mask[0]
        X = target_model.train_X[0][valid]
        y = target_model.train_Y[0, :, 0][valid]
        phi = target_model.features(X)
        K = phi @ phi.mT
        noise = target_model.noise_variance[0].expand(X.shape[0])
        return torch.zeros_like(y), K, noise, y
    needed = ("train_inputs", "train_targets", "covar_module", "mean_module", "likelihood")
    if not all(hasattr(target_model, a) for a in needed):
        raise TypeError(
            "`target_model` must be an exact single-output GP (e.g. SingleTaskGP) or an "
            f"RFFBayesianLinear, got {type(target_model).__name__}."
        )
    if getattr(target_model, "num_outputs", 1) != 1:
        raise UnsupportedError(f"`target_model` must have one output, got {target_model.num_outputs}.")
    target_model.eval()  # BoTorch models store transformed training inputs in eval mode
    X = target_model.train_inputs[0]
    y = target_model.train_targets
    while X.ndim > 2:
        if X.shape[0] != 1:
            raise ValueError(
                f"`target_model` must not be batched (batch shape [] or [1]), got training inputs {tuple(X.shape)}."
            )
        X, y = X[0], y[0]
    with torch.no_grad():
        m = target_model.mean_module(X)
        K = target_model.covar_module(X).to_dense()
        noise = target_model.likelihood.noise
    m, K = m.reshape(-1), K.reshape(K.shape[-2:])
    if noise.numel() not in (1, X.shape[0]):
        raise ValueError("`target_model`'s likelihood noise must be homoskedastic or one value per observation.")
    return m, K, noise.reshape(-1).expand(X.shape[0]), y.reshape(-1)


def loo_posteriors(prior_mean: Tensor, K: Tensor, noise: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""All ``n`` leave-one-out posteriors of a GP at its training inputs, in closed form.

    Fold ``j`` conditions ``f ~ N(m, K)`` on every observation except ``y_j``.
    With ``A = (K + diag σ²)⁻¹`` and ``α = A(y - m)``, its posterior at all ``n``
    inputs has mean ``m + Kα - u_j α_j/√A_jj`` and covariance ``Σ + u_j u_jᵀ``,
    where ``Σ = K - KAK`` is the full-data posterior covariance and
    ``u_j = KAe_j/√A_jj`` (the rank-one correction of Rasmussen & Williams,
    Sec. 5.4.2, extended to the joint posterior).

    Returns:
        ``(means, Sigma, U)``: ``n x n`` fold means (row ``j`` = fold ``j``),
        ``n x n`` full posterior covariance, and ``n x n`` with column ``j`` = ``u_j``.
    """
    n = y.shape[-1]
    Ky = K + torch.diag_embed(noise)
    L = psd_safe_cholesky(Ky)
    eye = torch.eye(n, dtype=K.dtype, device=K.device)
    Linv = torch.linalg.solve_triangular(L, eye, upper=False)  # needed for diag(A) (R&W eq. 5.12)
    A_diag = Linv.square().sum(-2)
    W = Linv @ K  # L⁻¹K
    KA = W.mT @ Linv  # K A
    alpha = torch.cholesky_solve((y - prior_mean).unsqueeze(-1), L).squeeze(-1)
    post_mean = prior_mean + K @ alpha
    Sigma = K - W.mT @ W
    U = KA / A_diag.sqrt().unsqueeze(-2)
    means = post_mean.unsqueeze(-2) - (U * (alpha / A_diag.sqrt()).unsqueeze(-2)).mT
    return means, Sigma, U


def _target_loo_samples(target_model: Any, num_samples: int, generator: torch.Generator | None) -> Tensor:
    """``S x n x n`` joint draws of the target's LOO posteriors (fold j, point k)."""
    m, K, noise, y = _gp_prior_at_train(target_model)
    means, Sigma, U = loo_posteriors(m, K, noise, y)
    n = y.shape[-1]
    R = psd_factor(Sigma)
    z = standard_normal((num_samples, n, n), means, generator)  # independent per fold
    xi = standard_normal((num_samples, n), means, generator)
    # fold j: means[j] + R z_j + u_j ξ_j
    return means + z @ R.mT + xi.unsqueeze(-1) * U.mT


# ---------------------------------------------------------------- weights
def compute_rgpe_weights(
    target_model: Any,
    agent_posteriors: AgentRFFPosteriors | None,
    train_X: Tensor,
    train_Y: Tensor,
    num_samples: int = 256,
    generator: torch.Generator | None = None,
    weight_dilution: WeightDilution = None,
    dilution_percentile: float = 95.0,
    horizon: int | None = None,
) -> Tensor:
    r"""RGPE ensemble weights: the probability that each model ranks the target's
    observations best (Feurer et al. 2018; see the module docstring for details).

    Args:
        target_model: The target agent's GP fitted on ``(train_X, train_Y)``
            (``SingleTaskGP``-like exact GP with monotone outcome transform, or
            an ``RFFBayesianLinear`` of one agent). Its leave-one-out posteriors
            give the target's loss.
        agent_posteriors: The other agents' posteriors (``None`` for no agents).
        train_X: ``n x d`` target observations' inputs (the target model's data).
        train_Y: ``n x 1`` (or ``n``) target observations.
        num_samples: Number ``S`` of joint posterior draws (BoTorch tutorial: 256).
        generator: Optional ``torch.Generator`` for reproducible draws.
        weight_dilution: ``None`` (default), ``"percentile"`` or ``"probabilistic"``.
        dilution_percentile: Percentile of the target's loss for ``"percentile"``.
        horizon: Optional total evaluation budget for ``"probabilistic"``; keep
            probabilities are scaled by ``1 - n/horizon``.

    Returns:
        ``N + 1`` non-negative weights summing to 1 (dtype/device of ``train_X``):
        agents ``0..N-1``, then the target model last.
    """
    check_ndim("train_X", train_X, 2, "n x d")
    check_tensor("train_Y", train_Y)
    check_floating("train_X", train_X)
    check_floating("train_Y", train_Y)
    y = train_Y.reshape(-1) if train_Y.ndim == 1 or (train_Y.ndim == 2 and train_Y.shape[-1] == 1) else None
    if y is None or y.shape[0] != train_X.shape[0]:
        raise ValueError(
            f"`train_Y` must be n x 1 with n = {train_X.shape[0]} to match `train_X`, got {tuple(train_Y.shape)}."
        )
    check_finite("train_X", train_X)
    check_finite("train_Y", train_Y)
    num_samples = check_int("num_samples", num_samples, minimum=1)
    if weight_dilution not in (None, "percentile", "probabilistic"):
        raise ValueError(f"`weight_dilution` must be None, 'percentile' or 'probabilistic', got {weight_dilution!r}.")
    if not 0.0 <= float(dilution_percentile) <= 100.0:
        raise ValueError(f"`dilution_percentile` must lie in [0, 100], got {dilution_percentile}.")
    if horizon is not None:
        horizon = check_int("horizon", horizon, minimum=1)
    if agent_posteriors is not None and not isinstance(agent_posteriors, AgentRFFPosteriors):
        raise TypeError(
            f"`agent_posteriors` must be an AgentRFFPosteriors or None, got {type(agent_posteriors).__name__}."
        )
    if agent_posteriors is None or agent_posteriors.num_agents == 0:
        return torch.ones(1, dtype=train_X.dtype, device=train_X.device)
    N = agent_posteriors.num_agents
    n = y.shape[0]
    if not bool((_pair_signs(y) != 0).any()):  # n < 2 or all y equal: nothing to rank
        return torch.full((N + 1,), 1.0 / (N + 1), dtype=train_X.dtype, device=train_X.device)

    like = agent_posteriors.weight_mean  # computations run in the agents' dtype/device
    y = y.to(like)
    with torch.no_grad():
        f_loo = _target_loo_samples(target_model, num_samples, generator).to(like)
        if f_loo.shape[-1] != n:
            raise ValueError(
                f"`target_model` holds {f_loo.shape[-1]} training points but `train_X` has {n}; pass the "
                "target model's own training data."
            )
        loss_target = _loo_ranking_loss(f_loo, y)  # S
        f_agents = agent_posteriors.sample_joint(train_X.to(like), torch.Size([num_samples]), generator)
        loss_agents = ranking_loss(f_agents, y)  # S x N
        losses = torch.cat([loss_agents, loss_target.unsqueeze(-1)], dim=-1)  # S x (N + 1)

        if weight_dilution == "percentile":
            q = torch.tensor(float(dilution_percentile) / 100.0, dtype=like.dtype, device=like.device)
            median = torch.quantile(loss_agents, 0.5, dim=0)
            drop = median >= torch.quantile(loss_target, q)
            losses[:, :N] = torch.where(drop, torch.inf, losses[:, :N])
        elif weight_dilution == "probabilistic":
            p_keep = (loss_agents < loss_target.unsqueeze(-1)).to(like.dtype).mean(0)
            if horizon is not None:
                p_keep = p_keep * max(0.0, 1.0 - n / horizon)
            u = uniform((N,), like, generator)
            drop = u >= p_keep
            losses[:, :N] = torch.where(drop, torch.inf, losses[:, :N])

        is_best = losses == losses.amin(dim=-1, keepdim=True)
        share = is_best.to(like.dtype) / is_best.sum(-1, keepdim=True).to(like.dtype)
        return share.mean(0).to(dtype=train_X.dtype, device=train_X.device)


# ------------------------------------------------------------------ model
class RGPE(Model):
    r"""Ranking-weighted GP ensemble of the target model and every agent.

    A single-output BoTorch ``Model``: at ``X`` (``batch_shape x q x d``) its
    posterior is Gaussian with

        mean  w_t μ_t(X) + Σ_n w_n φ(X)ν_n,
        cov   w_t² Σ_t(X) + Σ_n w_n² φ(X) C_n φ(X)ᵀ,

    the agents' part evaluated through the precomputed combination
    ``ν̄ = Σ w_n ν_n``, ``C̄ = Σ w_n² C_n = R̄R̄ᵀ`` (one ``M x M`` factor), so its
    cost does not depend on the number of agents. Usable with any BoTorch
    acquisition function (e.g. ``LogExpectedImprovement``, ``qLogNoisyExpectedImprovement``).

    The agents and the target must predict on the same outcome scale. The
    ensemble's ``batch_shape`` is the target model's: a one-agent batch (e.g.
    :meth:`~fbo_torch.models.batched_gp.BatchedExactGP.to_botorch` of a one-agent
    GP) gives ``[1]``, which BoTorch's baseline pruning
    (``qLogNoisyExpectedImprovement``) rejects; use an unbatched target model
    there (``to_botorch(index=i)``).

    Args:
        target_model: The target agent's model (single output, e.g. ``SingleTaskGP``).
        agent_posteriors: The other agents' posteriors, or ``None``.
        weights: ``N + 1`` non-negative weights, agents first and target last
            (e.g. from :func:`compute_rgpe_weights`); renormalized to sum to 1.

    Example:
        >>> rgpe = RGPE.from_data(target_gp, agents, train_X, train_Y, generator=g)
        >>> acqf = LogExpectedImprovement(rgpe, best_f=train_Y.max())
    """

    weights: Tensor
    agent_weight_mean: Tensor | None
    agent_covariance_factor: Tensor | None

    def __init__(self, target_model: Model, agent_posteriors: AgentRFFPosteriors | None, weights: Tensor) -> None:
        super().__init__()
        if not isinstance(target_model, Model):
            raise TypeError(f"`target_model` must be a BoTorch Model, got {type(target_model).__name__}.")
        if target_model.num_outputs != 1:
            raise UnsupportedError(f"`target_model` must have one output, got {target_model.num_outputs}.")
        if agent_posteriors is not None and not isinstance(agent_posteriors, AgentRFFPosteriors):
            raise TypeError(
                f"`agent_posteriors` must be an AgentRFFPosteriors or None, got {type(agent_posteriors).__name__}."
            )
        N = 0 if agent_posteriors is None else agent_posteriors.num_agents
        w = normalized_weights(weights, N)
        self.target_model = target_model
        self.agent_posteriors = agent_posteriors
        self.register_buffer("weights", w.clone())
        if agent_posteriors is not None and N > 0 and bool((w[:N] > 0).any()):
            mean, factor = agent_posteriors.linear_combination(w[:N])
            self.register_buffer("agent_weight_mean", mean)
            self.register_buffer("agent_covariance_factor", factor)
        else:
            self.register_buffer("agent_weight_mean", None)
            self.register_buffer("agent_covariance_factor", None)

    @classmethod
    def from_data(
        cls,
        target_model: Model,
        agent_posteriors: AgentRFFPosteriors | None,
        train_X: Tensor,
        train_Y: Tensor,
        **kwargs: Any,
    ) -> RGPE:
        r"""Compute the weights with :func:`compute_rgpe_weights` (``kwargs`` passed on) and build."""
        w = compute_rgpe_weights(target_model, agent_posteriors, train_X, train_Y, **kwargs)
        return cls(target_model, agent_posteriors, w)

    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        return self.target_model.batch_shape

    @property
    def target_weight(self) -> Tensor:
        return self.weights[-1]

    def posterior(
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: Any | None = None,
        **kwargs: Any,
    ) -> GPyTorchPosterior:
        r"""The ensemble's Gaussian posterior at ``X`` (``batch_shape x q x d``).

        Returns:
            A ``GPyTorchPosterior`` over ``batch_shape x q`` with the full
            ``q x q`` covariance. Observation noise is not supported (the
            ensemble models the latent function).
        """
        check_single_output(output_indices)
        if observation_noise is not False:
            raise UnsupportedError("RGPE models the latent function; `observation_noise` is not supported.")
        check_tensor("X", X)
        if X.ndim < 2:
            raise ValueError(f"`X` must be at least 2-dimensional (q x d), got shape {tuple(X.shape)}.")
        wt = self.weights[-1].to(X)
        post_t = self.target_model.posterior(X)
        mvn_t = getattr(post_t, "distribution", None)
        if not isinstance(post_t, GPyTorchPosterior) or not isinstance(mvn_t, MultivariateNormal):
            raise UnsupportedError("`target_model` must return a Gaussian (GPyTorchPosterior) posterior.")
        mean = wt * post_t.mean.squeeze(-1)
        cov = wt.square() * mvn_t.covariance_matrix
        if self.agent_weight_mean is not None:
            # set together in __init__, and only with agents
            assert self.agent_posteriors is not None and self.agent_covariance_factor is not None
            phi = self.agent_posteriors.features(X)  # batch x q x M, in X's dtype
            agents = RFFWeightPosterior(self.agent_weight_mean.to(phi), self.agent_covariance_factor.to(phi))
            mean_a, cov_a = agents.predict(phi)
            mean = mean + mean_a
            cov = cov + cov_a
        posterior = GPyTorchPosterior(MultivariateNormal(mean, DenseLinearOperator(cov)))
        if posterior_transform is not None:
            return posterior_transform(posterior)
        return posterior

    def transform_inputs(self, X: Tensor, input_transform: Any | None = None) -> Tensor:
        return X
