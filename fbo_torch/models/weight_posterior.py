r"""The Gaussian posterior of the weights of the shared random-feature model, batched.

Every agent models its function as ``f(x) = φ(x)ᵀω`` on the shared
:class:`~fbo_torch.features.RandomFourierFeatures` map ``φ`` (``M`` features)
with prior ``ω ~ N(0, I)``. With data ``(Φ, y)`` and noise variance ``σ²`` the
weight posterior is (FTS eq. 2-3)

    ω | D ~ N(ν, C),   C = σ²Σ⁻¹,   Σ = ΦᵀΦ + σ²I,   ν = Σ⁻¹Φᵀy;

an agent that sends its posterior sends ``(ν, C)``. :class:`RFFWeightPosterior`
is that Gaussian for a batch (``batch_shape x M`` means, ``batch_shape x M x M``
covariance roots ``R`` with ``RRᵀ = C``), produced from data
(:meth:`~RFFWeightPosterior.from_data`, or from the Cholesky factor of ``Σ`` a
model already holds) and from messages (:meth:`~RFFWeightPosterior.from_covariance`).
Every solve is a Cholesky/triangular solve in the posterior's dtype (float64 in
the engine); no matrix is inverted except where a root of ``C`` itself is asked for.

The functions below are the algebra of the data side, shared by every model
on the map: the weight-space factors (``L`` with ``LLᵀ = Σ`` and ``Φᵀy``), the
function-space ones (appendix B: ``L`` of ``ΦΦᵀ + σ²I``, ``V = L⁻¹Φ``,
``z = L⁻¹y``) and their ``O(M²)`` / ``O(nM)`` one-observation updates.

Users: :class:`~fbo_torch.models.rff_blr.RFFBayesianLinear` (from data, with
updates; :meth:`~fbo_torch.models.rff_blr.RFFBayesianLinear.weight_posterior`),
:class:`~fbo_torch.models.agent_posteriors.AgentRFFPosteriors` (from messages
or a model) and :class:`~fbo_torch.acquisition.rgpe.RGPE` (a weighted sum of
agents, :meth:`~RFFWeightPosterior.combine`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


def _noise_view(noise: Tensor) -> Tensor:
    """``batch_shape`` noise variances as ``batch_shape x 1 x 1``."""
    return noise.unsqueeze(-1).unsqueeze(-1)


def weight_space_factors(phi: Tensor, y: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    r"""``(L, Φᵀy)``: the Cholesky factor of ``Σ = ΦᵀΦ + σ²I`` and the right-hand side.

    Args:
        phi: ``batch_shape x n x M`` features (zero rows for padding).
        y: ``batch_shape x n`` observations.
        noise: ``batch_shape`` noise variances ``σ²``.

    Returns:
        ``batch_shape x M x M`` and ``batch_shape x M``; the mean is ``ν = cholesky_solve_vec(L, Φᵀy)``.
    """
    M = phi.shape[-1]
    eye = torch.eye(M, dtype=phi.dtype, device=phi.device)
    sigma = phi.transpose(-1, -2) @ phi + _noise_view(noise) * eye
    chol = torch.linalg.cholesky(sigma)
    rhs = (phi.transpose(-1, -2) @ y.unsqueeze(-1)).squeeze(-1)
    return chol, rhs


def function_space_factors(phi: Tensor, y: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""``(V, z, L)``: ``L`` the Cholesky factor of ``K = ΦΦᵀ + σ²I``, ``V = L⁻¹Φ``, ``z = L⁻¹y``.

    Then ``ν = Vᵀz`` and ``C = I − VᵀV`` (Woodbury): ``batch_shape·n·M`` numbers
    instead of ``batch_shape·M²``, the cheaper form while ``n < M``.

    Args:
        phi: ``batch_shape x n x M`` features.
        y: ``batch_shape x n`` observations.
        noise: ``batch_shape`` noise variances ``σ²``.

    Returns:
        ``batch_shape x n x M`` (row-major), ``batch_shape x n`` and ``batch_shape x n x n``.
    """
    n = phi.shape[-2]
    eye = torch.eye(n, dtype=phi.dtype, device=phi.device)
    kchol = torch.linalg.cholesky(phi @ phi.mT + _noise_view(noise) * eye)
    # V = L⁻¹Φ solved as Vᵀ = ΦᵀL⁻ᵀ: Φᵀ is already column-major for LAPACK and Vᵀ comes
    # back column-major, i.e. V row-major, with no copies. The sampler and the updates
    # read V and L row by row, so both are stored row-major (halves every later draw).
    V = torch.linalg.solve_triangular(kchol.mT, phi.mT, upper=True, left=False).mT
    z = torch.linalg.solve_triangular(kchol, y.unsqueeze(-1), upper=False).squeeze(-1)
    return V.contiguous(), z, kchol.contiguous()


def cholesky_solve_vec(chol: Tensor, rhs: Tensor) -> Tensor:
    r"""``(L Lᵀ)⁻¹ b`` for a batch of lower Cholesky factors ``L`` (``... x M x M``) and vectors ``b`` (``... x M``).

    Two batched triangular solves; equal to ``torch.cholesky_solve`` but one
    call per batch instead of one LAPACK call per matrix.
    """
    w = torch.linalg.solve_triangular(chol, rhs.unsqueeze(-1), upper=False)
    return torch.linalg.solve_triangular(chol.mT, w, upper=True).squeeze(-1)


def cholesky_rank_one_update(L: Tensor, x: Tensor) -> Tensor:
    r"""Return the Cholesky factor of ``L Lᵀ + x xᵀ``, batched, in ``O(M²)``.

    Writes ``LLᵀ + xxᵀ = L (I + ppᵀ) Lᵀ`` with ``p = L⁻¹x`` and uses the closed
    form of the Cholesky factor ``C`` of ``I + ppᵀ``: with
    ``t_k = 1 + Σ_{j≤k} p_j²`` (``t_0 = 1``),
    ``C_kk = √(t_k / t_{k-1})`` and ``C_ik = p_i p_k / √(t_k t_{k-1})`` for ``i > k``.
    Then ``L' = L C``; column ``k`` of ``L C`` is
    ``C_kk L[:, k] + p_k/√(t_k t_{k-1}) Σ_{i>k} p_i L[:, i]``, a reverse cumulative
    sum, so no ``M³`` product is formed. All steps are batched tensor ops.

    Args:
        L: ``batch x M x M`` lower-triangular Cholesky factors.
        x: ``batch x M`` update vectors (zero rows leave ``L`` unchanged).

    Returns:
        ``batch x M x M`` lower-triangular factor of ``LLᵀ + xxᵀ``.
    """
    p = torch.linalg.solve_triangular(L, x.unsqueeze(-1), upper=False).squeeze(-1)
    t = 1.0 + torch.cumsum(p * p, dim=-1)
    t_prev = torch.cat([torch.ones_like(t[..., :1]), t[..., :-1]], dim=-1)
    diag_scale = torch.sqrt(t / t_prev)
    off_scale = p / torch.sqrt(t * t_prev)
    # tail[..., r, k] = sum_{i > k} L[r, i] p_i  = (row total) - (inclusive cumsum);
    # computed in place to keep the number of M x M temporaries at three
    Lp = L * p.unsqueeze(-2)
    tail = torch.cumsum(Lp, dim=-1).neg_().add_(Lp.sum(-1, keepdim=True))
    del Lp
    out = tail.mul_(off_scale.unsqueeze(-2)).add_(L * diag_scale.unsqueeze(-2))
    return out.tril_()


def whitened_new_row(V: Tensor, phi_new: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    r"""The new row of the Cholesky factor of ``K = ΦΦᵀ + σ²I`` for one more observation.

    With ``V = L⁻¹Φ`` the off-diagonal part is ``l = L⁻¹Φφ = Vφ`` (a
    matrix-vector product, no triangular solve) and the diagonal
    ``d = √(φᵀφ + σ² − lᵀl)``: ``O(nM)`` per agent, batched.

    Args:
        V: ``N x n x M`` whitened features.
        phi_new: ``N x M`` features of the new observation.
        noise: ``N`` noise variances ``σ²``.

    Returns:
        ``(l, d)``: ``N x n`` and ``N``.
    """
    row = (V @ phi_new.unsqueeze(-1)).squeeze(-1)
    kappa = (phi_new * phi_new).sum(-1) + noise
    d = torch.sqrt((kappa - (row * row).sum(-1)).clamp_min(torch.finfo(V.dtype).tiny))
    return row, d


def psd_factor(C: Tensor) -> Tensor:
    r"""Return ``R`` with ``R Rᵀ = C`` for a batch of symmetric PSD matrices.

    Uses the Cholesky factor where it exists and falls back, per batch element,
    to ``V diag(√max(λ, 0))`` from an eigendecomposition for matrices that are
    only positive semi-definite (e.g. a zero matrix, or round-off making a
    tiny eigenvalue negative). No matrix is inverted.

    Args:
        C: ``... x M x M`` symmetric positive semi-definite matrices.

    Returns:
        ``... x M x M`` factors (lower triangular where Cholesky succeeded).
    """
    C = 0.5 * (C + C.mT)
    L, info = torch.linalg.cholesky_ex(C)
    bad = info != 0
    if bool(bad.any()):
        evals, evecs = torch.linalg.eigh(C[bad])
        L = L.clone()
        L[bad] = evecs * evals.clamp_min(0.0).sqrt().unsqueeze(-2)
    return L


class RFFWeightPosterior(NamedTuple):
    r"""``ω ~ N(mean, root rootᵀ)`` for a batch: the RFF weight posterior of one or many agents.

    Attributes:
        mean: ``batch_shape x M`` posterior means ``ν``.
        root: ``batch_shape x M x M`` roots ``R`` of the covariances, ``RRᵀ = C``.

    A ``NamedTuple``: ``mean, root = posterior`` unpacks it.
    """

    mean: Tensor
    root: Tensor

    @classmethod
    def from_data(cls, phi: Tensor, y: Tensor, noise: Tensor) -> RFFWeightPosterior:
        r"""The posterior given features ``phi`` (``batch_shape x n x M``, zero rows for padding),
        observations ``y`` (``batch_shape x n``) and noise variances ``noise`` (``batch_shape``)."""
        chol, rhs = weight_space_factors(phi, y, noise)
        return cls.from_precision_cholesky(cholesky_solve_vec(chol, rhs), chol, noise)

    @classmethod
    def from_precision_cholesky(cls, mean: Tensor, chol: Tensor, noise: Tensor) -> RFFWeightPosterior:
        r"""From ``ν`` and the Cholesky factor ``L`` of ``Σ = ΦᵀΦ + σ²I`` (``batch_shape x M x M``):
        ``C = σ²L⁻ᵀL⁻¹`` has the root ``R = σL⁻ᵀ``, one batched triangular solve (``C`` is never
        formed and re-factorized)."""
        eye = torch.eye(chol.shape[-1], dtype=chol.dtype, device=chol.device).expand_as(chol)
        Linv = torch.linalg.solve_triangular(chol, eye, upper=False)
        return cls(mean, _noise_view(noise.sqrt()) * Linv.mT)

    @classmethod
    def from_covariance(cls, mean: Tensor, covariance: Tensor) -> RFFWeightPosterior:
        r"""From a message's ``ν`` and ``C`` (``batch_shape x M x M``, symmetric PSD): ``R`` from
        :func:`psd_factor`."""
        return cls(mean, psd_factor(covariance.to(mean)))

    @property
    def batch_shape(self) -> torch.Size:
        return self.mean.shape[:-1]

    def covariance(self) -> Tensor:
        r"""``C = RRᵀ``, ``batch_shape x M x M`` (diagnostics and messages, not the hot path)."""
        return self.root @ self.root.mT

    def predict(self, phi: Tensor) -> tuple[Tensor, Tensor]:
        r"""Mean ``φν`` and covariance ``(φR)(φR)ᵀ`` of ``f = φᵀω`` at features ``phi``.

        Args:
            phi: ``... x q x M`` features; ``...`` broadcasts with ``batch_shape``.

        Returns:
            ``(mean, cov)``: ``... x q`` and ``... x q x q`` (for ``q = 1`` the
            variance as a squared norm).
        """
        V = phi @ self.root
        nu = self.mean
        mean = phi @ nu if nu.ndim == 1 else (phi @ nu.unsqueeze(-1)).squeeze(-1)
        cov = V.square().sum(-1, keepdim=True) if phi.shape[-2] == 1 else V @ V.mT
        return mean, cov

    def combine(self, weights: Tensor) -> RFFWeightPosterior:
        r"""The posterior of ``Σ_n w_n ω_n`` for independent agents (``batch_shape = [N]``).

        Since every agent shares ``φ``, ``Σ_n w_n φᵀω_n = φᵀ(Σ_n w_n ω_n)`` with
        ``Σ_n w_n ω_n ~ N(Σ w_n ν_n, Σ w_n² C_n)``.

        Args:
            weights: ``N`` weights.

        Returns:
            An unbatched posterior (``M`` mean, ``M x M`` root ``R̄`` with ``R̄R̄ᵀ = Σ_n w_n² C_n``).
        """
        N, M = self.mean.shape
        w = weights.to(self.mean).reshape(-1)
        wide = self.root.permute(1, 0, 2).reshape(M, N * M)  # [R_1, ..., R_N]
        scaled = wide * w.repeat_interleave(M)  # blocks w_n R_n
        return type(self)(w @ self.mean, psd_factor(scaled @ scaled.mT))


__all__ = [
    "RFFWeightPosterior",
    "cholesky_rank_one_update",
    "cholesky_solve_vec",
    "function_space_factors",
    "psd_factor",
    "weight_space_factors",
    "whitened_new_row",
]
