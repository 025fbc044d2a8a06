r"""Transfer acquisition function (TAF), adapted to federated BO.

TAF (Wistuba, Schilling & Schmidt-Thieme 2018, "Scalable Gaussian process-based
transfer surrogates for hyperparameter optimization", Machine Learning 107)
scores a candidate by a weighted average of the target's expected
improvement and the improvement each previous task's surrogate *predicts*:

    a(x) = (w_t EI_t(x) + Σ_n w_n I_n(x)) / (w_t + Σ_n w_n),
    I_n(x) = max(μ_n(x) - y_n^*, 0).

We implement the **ranking-based variant (TAF with TST-R weights)**, in the
maximization convention:

* ``EI_t`` is the analytic expected improvement of the target model over
  ``best_f`` (default: the best observed target value; Feurer et al.'s
  reference code uses the best posterior mean at the observed inputs, which can
  be passed as ``best_f``), computed exactly as BoTorch's ``ExpectedImprovement``.
* ``μ_n`` is agent ``n``'s posterior mean ``φ(x)ᵀν_n``; its variance is not used.
* Weights (TST-R, Wistuba et al. 2016/2018): ``δ_n`` is the fraction of pairs of
  the target's observations that ``μ_n`` ranks differently from ``y`` (pairs
  with tied ``y`` skipped, tied means counting ½); ``w_n = ¾(1 - (δ_n/ρ)²)`` if
  ``δ_n/ρ < 1`` else 0 (Epanechnikov kernel with bandwidth ``ρ``; strict ``<`` as
  in the authors' code), and the target gets the kernel's maximum ``w_t = ¾``.
  With fewer than two distinct observations every agent gets ``¾`` too. The
  default ``ρ = 0.5`` is the value the FTS first author used for TAF as a
  meta-BO baseline (Dai 2021, PhD thesis, App. D.2: "ρ = 0.5 in all
  experiments", 0.1 and 0.9 performing similarly); the FTS paper does not
  state its ``ρ``. The reference code of Feurer et al. defaults to 0.1.
* The incumbent ``y_n^*``: with ``incumbent="agent"`` (default, the FTS paper's
  adaptation, Sec. 3.2) it is the best value agent ``n`` has *observed*, sent
  with its posterior; with ``incumbent="target"`` (Wistuba et al.'s original)
  it is ``max_j μ_n(x_j)`` over the target's observed inputs, i.e. the
  improvement agent ``n`` predicts over the best configuration the target has
  tried, computed by the target itself (no incumbent needs to be sent).

With no agents the weights reduce to ``w_t = 1`` and TAF is exactly EI.
Alternatively ``weights`` may be given (e.g. RGPE's ranking weights).

**Cost.** The agents' part is one ``b x M`` by ``M x N`` product per batch of
``b`` candidates; no loop over agents.
"""

from __future__ import annotations

from typing import Literal

import torch
from botorch.acquisition.analytic import AnalyticAcquisitionFunction
from botorch.acquisition.objective import PosteriorTransform
from botorch.models.model import Model
from botorch.utils.probability.utils import ndtr, phi
from botorch.utils.transforms import t_batch_mode_transform
from torch import Tensor

from fbo_torch.acquisition.rgpe import _pair_signs, normalized_weights, ranking_loss
from fbo_torch.models.agent_posteriors import AgentRFFPosteriors
from fbo_torch.utils.validation import check_finite, check_floating, check_ndim, check_positive, check_tensor

#: Epanechnikov kernel maximum, TST-R's weight of the target model.
_TARGET_WEIGHT = 0.75


def compute_taf_weights(
    agent_posteriors: AgentRFFPosteriors | None,
    train_X: Tensor,
    train_Y: Tensor,
    bandwidth: float = 0.5,
) -> Tensor:
    r"""TST-R ranking weights of Wistuba et al. (see the module docstring), normalized.

    Args:
        agent_posteriors: The agents' posteriors, or ``None``.
        train_X: ``n x d`` target observations' inputs.
        train_Y: ``n x 1`` (or ``n``) target observations.
        bandwidth: Kernel bandwidth ``ρ > 0``.

    Returns:
        ``N + 1`` non-negative weights summing to 1: agents first, target last.
    """
    check_positive("bandwidth", bandwidth)
    y = _check_data(train_X, train_Y)
    if agent_posteriors is None:
        return torch.ones(1, dtype=train_X.dtype, device=train_X.device)
    if not isinstance(agent_posteriors, AgentRFFPosteriors):
        raise TypeError(
            f"`agent_posteriors` must be an AgentRFFPosteriors or None, got {type(agent_posteriors).__name__}."
        )
    like = agent_posteriors.weight_mean
    y = y.to(like)
    N = agent_posteriors.num_agents
    num_pairs = _pair_signs(y).abs().sum()
    if not bool(num_pairs > 0):  # nothing to rank: every agent as good as the target
        w = torch.full((N + 1,), _TARGET_WEIGHT, dtype=like.dtype, device=like.device)
    else:
        with torch.no_grad():
            mu = agent_posteriors.predict_mean(train_X.to(like)).mT  # N x n
            frac = ranking_loss(mu, y) / num_pairs  # fraction of discordant pairs
        t = frac / float(bandwidth)
        w_agents = torch.where(t < 1, _TARGET_WEIGHT * (1 - t.square()), torch.zeros_like(t))
        w = torch.cat([w_agents, w_agents.new_full((1,), _TARGET_WEIGHT)])
    return w / w.sum()


def _check_data(train_X: Tensor, train_Y: Tensor) -> Tensor:
    check_ndim("train_X", train_X, 2, "n x d")
    check_tensor("train_Y", train_Y)
    check_floating("train_X", train_X)
    check_floating("train_Y", train_Y)
    ok = train_Y.ndim == 1 or (train_Y.ndim == 2 and train_Y.shape[-1] == 1)
    if not ok or train_Y.shape[0] != train_X.shape[0]:
        raise ValueError(
            f"`train_Y` must be n x 1 with n = {train_X.shape[0]} to match `train_X`, got {tuple(train_Y.shape)}."
        )
    check_finite("train_X", train_X)
    check_finite("train_Y", train_Y)
    return train_Y.reshape(-1)


class TransferAcquisitionFunction(AnalyticAcquisitionFunction):
    r"""TAF: weighted target EI plus every agent's predicted improvement (q = 1).

    ``a(x) = w_t EI_t(x) + Σ_n w_n max(μ_n(x) - y_n^*, 0)`` with weights summing
    to 1 (see the module docstring for the variant, the weights and the incumbent).

    Args:
        model: The target agent's single-output model (e.g. ``SingleTaskGP``).
        agent_posteriors: The other agents' posteriors, or ``None`` (then TAF = EI).
        train_X: ``n x d`` target observations' inputs.
        train_Y: ``n x 1`` target observations.
        best_f: Target incumbent for EI; defaults to ``train_Y.max()``.
        bandwidth: TST-R kernel bandwidth ``ρ`` (default 0.5).
        incumbent: ``"agent"`` (each agent's own best observation, FTS Sec. 3.2;
            needs ``agent_posteriors.incumbents``) or ``"target"`` (Wistuba et al.:
            ``max_j μ_n(x_j)`` over the target's inputs).
        weights: Optional ``N + 1`` weights (agents, then target) replacing the
            TST-R weights, e.g. RGPE's; renormalized to sum to 1.
        posterior_transform: Optional BoTorch ``PosteriorTransform`` for the target.

    Example:
        >>> taf = TransferAcquisitionFunction(gp, agents, train_X, train_Y)
        >>> x, _ = optimize_acqf(taf, bounds, q=1, num_restarts=10, raw_samples=512)
    """

    best_f: Tensor
    weights: Tensor
    agent_incumbents: Tensor | None

    def __init__(
        self,
        model: Model,
        agent_posteriors: AgentRFFPosteriors | None,
        train_X: Tensor,
        train_Y: Tensor,
        best_f: float | Tensor | None = None,
        bandwidth: float = 0.5,
        incumbent: Literal["agent", "target"] = "agent",
        weights: Tensor | None = None,
        posterior_transform: PosteriorTransform | None = None,
    ) -> None:
        super().__init__(model=model, posterior_transform=posterior_transform)
        y = _check_data(train_X, train_Y)
        if incumbent not in ("agent", "target"):
            raise ValueError(f"`incumbent` must be 'agent' or 'target', got {incumbent!r}.")
        if agent_posteriors is not None and not isinstance(agent_posteriors, AgentRFFPosteriors):
            raise TypeError(
                f"`agent_posteriors` must be an AgentRFFPosteriors or None, got {type(agent_posteriors).__name__}."
            )
        N = 0 if agent_posteriors is None else agent_posteriors.num_agents
        if best_f is None:
            best_f = y.max()
        best_f = torch.as_tensor(best_f, dtype=train_X.dtype, device=train_X.device)
        check_finite("best_f", best_f)
        self.register_buffer("best_f", best_f.detach().clone())

        if weights is None:
            w = compute_taf_weights(agent_posteriors, train_X, train_Y, bandwidth)
        else:
            w = normalized_weights(weights, N).to(train_X)
        self.register_buffer("weights", w.to(train_X))

        self.agent_posteriors = agent_posteriors
        self.incumbent = incumbent
        if agent_posteriors is not None and N > 0:
            if incumbent == "agent":
                if agent_posteriors.incumbents is None:
                    raise ValueError(
                        "`incumbent='agent'` needs every agent's incumbent (`agent_posteriors.incumbents` is None: "
                        "send PosteriorMessage(incumbent=...)), or use `incumbent='target'`."
                    )
                inc = agent_posteriors.incumbents
            else:
                with torch.no_grad():
                    inc = agent_posteriors.predict_mean(train_X).amax(dim=0)
            self.register_buffer("agent_incumbents", inc.detach().clone())
        else:
            self.register_buffer("agent_incumbents", None)

    @property
    def target_weight(self) -> Tensor:
        return self.weights[-1]

    @t_batch_mode_transform(expected_q=1)  # type: ignore[arg-type]  # BoTorch's annotation rejects subclasses' methods
    def forward(self, X: Tensor) -> Tensor:
        r"""Evaluate TAF at ``X``: ``(b1 x ... bk) x 1 x d`` -> ``(b1 x ... bk)``."""
        mean, sigma = self._mean_and_sigma(X)  # (b) x 1
        assert sigma is not None  # compute_sigma=True (the default) gives it
        u = (mean - self.best_f) / sigma
        ei = (sigma * (phi(u) + u * ndtr(u))).squeeze(-1)
        value = self.weights[-1] * ei
        if self.agent_incumbents is not None:
            assert self.agent_posteriors is not None  # agent_incumbents is set only with agents
            mu = self.agent_posteriors.predict_mean(X.squeeze(-2)).to(value)  # (b) x N
            improvement = (mu - self.agent_incumbents.to(mu)).clamp_min(0.0)
            value = value + improvement @ self.weights[:-1].to(mu)
        return value

    def extra_repr(self) -> str:
        return f"incumbent={self.incumbent!r}, target_weight={float(self.weights[-1]):.4g}"
