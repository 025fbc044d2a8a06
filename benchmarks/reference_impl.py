r"""A re-implementation of the authors' reference method, "done their way".

This module is the yardstick that ``fbo_torch``'s speed claims are measured
against. It re-implements, in plain NumPy/SciPy and from the published
description only (FTS, Dai et al. 2020, appendix A/B; DP-FTS-DE, Dai et al. 2021,
Algorithms 1-2 and Sec. 3.3; the thesis, appendix B.1 and C.2), the way the
authors' research code computes one DP-FTS-DE round. It is **not** a copy of that
code (which we do not have) and it is deliberately neither slowed down nor sped
up beyond that approach:

* Random Fourier features ``φ(x) = √(2/M)·cos(Sx + b)``, ``S ~ N(0, ℓ⁻² I)``,
  ``b ~ U(0, 2π)``, each ``φ(x)`` rescaled to squared norm ``σ₀²``.
* Bayesian linear regression on the features with **explicit inverses**:
  ``Σ = ΦᵀΦ + σ²I``, ``ν = Σ⁻¹Φᵀy``, ``ω ~ N(ν, σ²Σ⁻¹)`` drawn by
  ``Generator.multivariate_normal`` (an SVD of the ``M x M`` covariance per draw,
  like ``np.random.multivariate_normal``).
* Each agent's own GP: exact isotropic RBF GP (signal variance, lengthscale,
  noise), hyperparameters re-fitted every 5 iterations by maximizing the log
  marginal likelihood with 10 restarts of SciPy's L-BFGS-B, with analytic
  gradients (as GPy's ``optimize_restarts`` does). Its Thompson sample uses
  *fresh* random features of the fitted kernel every iteration.
* Acquisition maximization: 1,000 uniform random points scored **one at a time**
  in a Python loop, then 20 L-BFGS-B runs (SciPy, finite-difference gradients)
  from uniformly random starting points; the best value wins.
* The server is a Python loop over agents: Poisson subsampling with rate ``q``,
  clipping to ``S/√P``, per-sub-region weighted sums divided by ``q``, Gaussian
  noise with standard deviation ``z·max(φ)·S/q``.

Everything works on one agent at a time, exactly as the reference does; nothing
here imports torch.

Main entry points: :class:`ReferenceRFF`, :func:`reference_blr_posterior`,
:func:`reference_sample_omega`, :func:`reference_gp_fit`,
:func:`reference_maximize`, :class:`BoxPartition`, :class:`ReferenceAgent`,
:func:`reference_server`, :func:`reference_round`. Running the file
(``python benchmarks/reference_impl.py``) prints the timings of one acquisition
maximization and one agent-round on this machine.

Judgement calls (where the description leaves room) are marked ``JUDGEMENT`` in
the docstrings below. In short:

* L-BFGS-B restarts start from fresh uniform random points (not the best of the
  1,000 scored ones); gradients by SciPy's finite differences.
* GP fit: analytic gradients (GPy has them), log-parameters, loose bounds
  (noise ≥ 1e-6), zero mean, no output normalization; first restart warm-starts
  from the current hyperparameters, the other nine from ``softplus(N(0, 1))``
  like GPy's ``randomize()``. Plain NumPy is lighter than GPy per evaluation, so
  the re-fit cost here is a *lower* bound on the original's.
* The GP re-fit schedule (``n_iter % 5 == 0``) runs whichever branch is taken.
* The own-GP Thompson sample is the plain posterior (no ``β_t`` inflation).
* ``Φ`` of the observations is built in one vectorized call; only the
  acquisition is scored point by point.
* A round starts with the agents' messages (same information flow as
  Algorithm 2, loop cut elsewhere).

Timing note: BLAS threads are left at the library default (nothing here sets
them). On a shared 2-core machine a multi-threaded OpenBLAS busy-waits and the
small ``100 x 100`` inverses/SVDs can become 10-100x slower; compare both sides
under the same thread settings (e.g. ``OPENBLAS_NUM_THREADS=1`` and
``torch.set_num_threads(1)``) and report CPU time next to wall time.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.linalg import cho_solve, cholesky
from scipy.optimize import minimize

__all__ = [
    "ReferenceRFF",
    "reference_blr_posterior",
    "reference_sample_omega",
    "reference_gp_fit",
    "gp_neg_log_marginal_likelihood",
    "reference_maximize",
    "BoxPartition",
    "ReferenceAgent",
    "ServerArgs",
    "reference_server",
    "de_weights",
    "adaptive_a",
    "make_agents",
    "RoundResult",
    "reference_round",
    "PHASES",
]

#: Keys of the per-phase timings returned by :func:`reference_round`.
PHASES = (
    "posterior_sampling",  # shared-feature BLR posterior + ω draw (sent to the server)
    "server",  # subsampling, clipping, weighted sums, noise
    "gp_refit",  # own-GP hyperparameter re-fit (every `refit_every` iterations)
    "own_ts_sample",  # fresh RFF of the fitted kernel + BLR posterior + ω draw (own-TS branch)
    "acquisition",  # reference_maximize (either branch)
    "objective",  # querying the objective
)


# --------------------------------------------------------------------- features
class ReferenceRFF:
    r"""Random Fourier features of the SE kernel, normalized as the papers do.

    ``φ(x) = √(2/M)·cos(S x + b)`` with ``S`` (``M x d``) drawn from
    ``N(0, ℓ⁻² I)`` and ``b`` from ``U(0, 2π)``; each ``φ(x)`` is then rescaled so
    that ``φ(x)ᵀφ(x) = σ₀²`` (thesis appendix B.1). The ``√(2/M)`` factor cancels
    in the rescaling; it is kept because the reference computes it.

    Args:
        dim: Input dimension ``d``.
        M: Number of features.
        lengthscale: SE lengthscale ``ℓ`` (isotropic).
        sigma0_sq: Signal variance ``σ₀²`` (the papers use 1 for shared features).
        rng: ``numpy.random.Generator`` used for ``S`` and ``b``.
    """

    def __init__(
        self,
        dim: int,
        M: int,
        lengthscale: float,
        sigma0_sq: float = 1.0,
        rng: np.random.Generator | None = None,
    ) -> None:
        rng = np.random.default_rng() if rng is None else rng
        S = rng.normal(0.0, 1.0, size=(M, dim)) / float(lengthscale)
        b = rng.uniform(0.0, 2.0 * math.pi, size=M)
        self._set(S, b, sigma0_sq)

    @classmethod
    def from_arrays(cls, S: Any, b: Any, sigma0_sq: float = 1.0) -> ReferenceRFF:
        """Build the map from given spectral samples ``S`` (``M x d``) and phases ``b`` (``M``).

        Use this to hand the reference exactly the map ``fbo_torch`` uses, e.g.
        ``ReferenceRFF.from_arrays(rff.spectral.numpy(), rff.phase.numpy(),
        float(rff.outputscale))``.
        """
        obj = cls.__new__(cls)
        obj._set(np.asarray(S, dtype=np.float64), np.asarray(b, dtype=np.float64), sigma0_sq)
        return obj

    def _set(self, S: np.ndarray, b: np.ndarray, sigma0_sq: float) -> None:
        S = np.atleast_2d(np.asarray(S, dtype=np.float64))
        b = np.asarray(b, dtype=np.float64).reshape(-1)
        if S.shape[0] != b.shape[0]:
            raise ValueError(f"S has {S.shape[0]} rows but b has {b.shape[0]} entries")
        if not sigma0_sq > 0:
            raise ValueError("sigma0_sq must be positive")
        self.S = S
        self.b = b
        self.M, self.dim = S.shape
        self.sigma0_sq = float(sigma0_sq)
        self._scale = math.sqrt(2.0 / self.M)
        self._sigma0 = math.sqrt(self.sigma0_sq)

    def phi(self, x: np.ndarray) -> np.ndarray:
        """Features of ONE point ``x`` (shape ``(d,)``) -> ``(M,)``; as used per-point in acquisition."""
        f = self._scale * np.cos(self.S @ x + self.b)
        return f * (self._sigma0 / np.sqrt(np.inner(f, f)))

    def phi_batch(self, X: np.ndarray) -> np.ndarray:
        """Features of a batch ``X`` (``n x d``) -> ``n x M`` (used to build ``Φ`` of the observations)."""
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        F = self._scale * np.cos(X @ self.S.T + self.b)
        return F * (self._sigma0 / np.linalg.norm(F, axis=1, keepdims=True))


# ------------------------------------------------------- Bayesian linear model
def reference_blr_posterior(Phi: np.ndarray, y: np.ndarray, noise: float) -> tuple[np.ndarray, np.ndarray]:
    r"""Weight posterior of Bayesian linear regression on features, explicit inverse.

    ``Σ = ΦᵀΦ + σ²I``, ``ν = Σ⁻¹Φᵀy``, covariance ``σ²Σ⁻¹`` (FTS eq. 2-3), with
    ``Σ⁻¹`` from ``np.linalg.inv`` as in the reference.

    Args:
        Phi: ``n x M`` feature matrix of the observations.
        y: ``n`` observations.
        noise: Noise variance ``σ²``.

    Returns:
        ``(nu, cov)``: mean ``(M,)`` and covariance ``(M, M)``.
    """
    Phi = np.asarray(Phi, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    M = Phi.shape[1]
    Sigma = Phi.T @ Phi + noise * np.identity(M)
    Sigma_inv = np.linalg.inv(Sigma)
    nu = Sigma_inv @ (Phi.T @ y)
    return nu, noise * Sigma_inv


def reference_sample_omega(nu: np.ndarray, cov: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw ``ω ~ N(nu, cov)`` via ``Generator.multivariate_normal`` (SVD method, default checks).

    The explicit inverse makes ``cov`` very slightly asymmetric with
    ``noise = 1e-6``; NumPy then warns that it is not PSD. The warning is
    silenced here (the check itself still runs, as it does by default).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return rng.multivariate_normal(nu, cov)


# ------------------------------------------------------------------- agent GP
def _sqdist(X: np.ndarray) -> np.ndarray:
    sq = np.sum(X * X, axis=1)
    D = sq[:, None] + sq[None, :] - 2.0 * (X @ X.T)
    np.maximum(D, 0.0, out=D)
    return D


def gp_neg_log_marginal_likelihood(
    log_params: np.ndarray, X: np.ndarray, y: np.ndarray, D2: np.ndarray | None = None
) -> tuple[float, np.ndarray]:
    r"""Negative log marginal likelihood of a zero-mean isotropic RBF GP and its gradient.

    ``k(x, x') = v·exp(-‖x - x'‖² / (2ℓ²))``, observation noise ``σ_n²``;
    ``log_params = (log v, log ℓ, log σ_n²)``. Gradient w.r.t. the log-parameters
    (analytic, as GPy provides).
    """
    n = X.shape[0]
    D2 = _sqdist(X) if D2 is None else D2
    v, ls, sn = np.exp(log_params)
    Kf = v * np.exp(-0.5 * D2 / (ls * ls))
    K = Kf + sn * np.identity(n)
    try:
        L = cholesky(K, lower=True)
    except np.linalg.LinAlgError:
        return 1e25, np.zeros(3)
    alpha = cho_solve((L, True), y)
    nll = 0.5 * float(y @ alpha) + float(np.sum(np.log(np.diag(L)))) + 0.5 * n * math.log(2 * math.pi)
    W = np.outer(alpha, alpha) - cho_solve((L, True), np.identity(n))  # ααᵀ - K⁻¹
    # d nll / dθ = -0.5 tr(W dK/dθ)
    g_v = -0.5 * np.sum(W * Kf)
    g_ls = -0.5 * np.sum(W * (Kf * D2 / (ls * ls)))
    g_sn = -0.5 * sn * np.trace(W)
    return nll, np.array([g_v, g_ls, g_sn])


#: Box for the log-parameters (log v, log ℓ, log σ_n²). JUDGEMENT: GPy's Logexp
#: constraint is unbounded; these loose bounds only keep the optimizer out of
#: numerically degenerate corners (noise floor 1e-6, like the shared-feature noise).
GP_LOG_BOUNDS = ((math.log(1e-6), math.log(1e4)), (math.log(1e-3), math.log(1e3)), (math.log(1e-6), math.log(1e2)))


def reference_gp_fit(
    X: np.ndarray,
    y: np.ndarray,
    rng: np.random.Generator,
    restarts: int = 10,
    init: tuple[float, float, float] = (1.0, 1.0, 1.0),
    maxiter: int = 1000,
) -> tuple[float, float, float]:
    r"""Fit (variance, lengthscale, noise) of an isotropic RBF GP by maximizing the marginal likelihood.

    ``restarts`` runs of SciPy L-BFGS-B on the log-parameters with analytic
    gradients; the best optimum wins. Like GPy's ``optimize_restarts`` the first
    run starts from ``init`` (the current hyperparameters) and every other run
    from a random point: each parameter is ``softplus(N(0, 1))``, which is what
    GPy's ``randomize()`` draws for a Logexp-constrained parameter without prior.

    JUDGEMENT: no mean function and no output normalization (GPy's GPRegression
    defaults); parameters bounded by :data:`GP_LOG_BOUNDS`.

    Returns:
        ``(variance, lengthscale, noise)``.
    """
    X = np.atleast_2d(np.asarray(X, dtype=np.float64))
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    D2 = _sqdist(X)
    lo = np.array([b[0] for b in GP_LOG_BOUNDS])
    hi = np.array([b[1] for b in GP_LOG_BOUNDS])
    best_val, best_p = np.inf, np.clip(np.log(np.asarray(init, dtype=np.float64)), lo, hi)
    for r in range(restarts):
        if r == 0:
            p0 = np.clip(np.log(np.asarray(init, dtype=np.float64)), lo, hi)
        else:
            p0 = np.clip(np.log(np.logaddexp(0.0, rng.normal(size=3))), lo, hi)
        res = minimize(
            gp_neg_log_marginal_likelihood,
            p0,
            args=(X, y, D2),
            jac=True,
            method="L-BFGS-B",
            bounds=GP_LOG_BOUNDS,
            options={"maxiter": maxiter},
        )
        if np.isfinite(res.fun) and res.fun < best_val:
            best_val, best_p = float(res.fun), res.x
    v, ls, sn = np.exp(best_p)
    return float(v), float(ls), float(sn)


# ------------------------------------------------------ acquisition maximizer
def reference_maximize(
    score_one: Callable[[np.ndarray], float],
    bounds: np.ndarray,
    rng: np.random.Generator,
    n_random: int = 1000,
    n_restarts: int = 20,
    restart_from: str = "random",
) -> tuple[np.ndarray, float]:
    r"""Maximize ``score_one`` over a box the reference's way.

    1. Draw ``n_random`` uniform points and score them **one by one** in a Python
       loop; keep the best.
    2. Run SciPy L-BFGS-B on ``-score_one`` from ``n_restarts`` starting points,
       without a gradient (SciPy then uses 2-point finite differences, i.e. what
       ``approx_grad`` does: ``d + 1`` single-point scores per gradient).
       Keep a result when it is at least as good as the best so far.
    3. Return the best point, clipped to the box, and its score.

    JUDGEMENT: ``restart_from="random"`` (default) draws the starting points
    uniformly at random, separately from the 1,000 scored points, which is what
    the thesis says ("L-BFGS-B with 20 random restarts") and what the
    BayesianOptimization-style ``acq_max`` such research code is built on does.
    ``restart_from="best"`` starts from the ``n_restarts`` best random points
    instead (same cost, offered for comparison). No analytic gradients: the
    reference's acquisition is a plain NumPy function of a single point.

    Args:
        score_one: Function of one point ``x`` (``(d,)``) returning a float.
        bounds: ``d x 2`` array of (lower, upper).
        rng: Random generator.
        n_random: Number of random points scored.
        n_restarts: Number of L-BFGS-B runs.
        restart_from: ``"random"`` or ``"best"``.

    Returns:
        ``(x_best, value_best)``.
    """
    bounds = np.asarray(bounds, dtype=np.float64)
    d = bounds.shape[0]
    x_tries = rng.uniform(bounds[:, 0], bounds[:, 1], size=(n_random, d))
    ys = np.array([score_one(x) for x in x_tries])
    i_best = int(np.argmax(ys))
    x_max, max_acq = x_tries[i_best], float(ys[i_best])

    if restart_from == "random":
        x_seeds = rng.uniform(bounds[:, 0], bounds[:, 1], size=(n_restarts, d))
    elif restart_from == "best":
        x_seeds = x_tries[np.argsort(-ys)[:n_restarts]]
    else:
        raise ValueError("restart_from must be 'random' or 'best'")

    def neg(x: np.ndarray) -> float:
        return -score_one(x)

    for x0 in x_seeds:
        res = minimize(neg, x0, bounds=bounds, method="L-BFGS-B")
        val = -float(res.fun)
        if val >= max_acq:
            x_max, max_acq = res.x, val
    return np.clip(x_max, bounds[:, 0], bounds[:, 1]), max_acq


# ----------------------------------------------------------------- sub-regions
class BoxPartition:
    r"""``P`` equal-volume boxes of a box domain (thesis appendix C.2.1 / C.2.2.1).

    If ``P = 2^k`` with ``k ≤ d``, the first ``k`` dimensions are halved and the
    region index is the binary number of the halves (first dimension most
    significant): for ``d = 2, P = 4`` regions 0..3 are
    ``[0,.5)x[0,.5)``, ``[0,.5)x[.5,1]``, ``[.5,1]x[0,.5)``, ``[.5,1]x[.5,1]``,
    i.e. the thesis' ``X_1..X_4``. Otherwise, for ``d = 1``, the interval is cut
    into ``P`` equal pieces (``[0, 1/3), [1/3, 2/3), [2/3, 1]`` for ``P = 3``).
    Lower boundaries are closed, upper ones open except at the domain's edge.
    """

    def __init__(self, dim: int, P: int, bounds: np.ndarray | None = None) -> None:
        self.dim, self.P = int(dim), int(P)
        self.bounds = np.tile([0.0, 1.0], (dim, 1)) if bounds is None else np.asarray(bounds, dtype=np.float64)
        if P < 1:
            raise ValueError("P must be >= 1")
        k = int(round(math.log2(P))) if P > 0 else 0
        if 2**k == P and k <= dim:
            self._mode, self._k = "halves", k
        elif dim == 1:
            self._mode, self._k = "intervals", 1
        else:
            raise ValueError(f"P={P} is not supported for dim={dim} (need P=2^k with k<=dim, or dim=1)")

    def _unit(self, x: np.ndarray) -> np.ndarray:
        lo, hi = self.bounds[:, 0], self.bounds[:, 1]
        return (np.asarray(x, dtype=np.float64) - lo) / (hi - lo)

    def region_of(self, x: np.ndarray) -> int:
        """Index (0-based) of the sub-region containing one point ``x``."""
        u = self._unit(x)
        if self._mode == "halves":
            idx = 0
            for j in range(self._k):
                idx = 2 * idx + (1 if u[j] >= 0.5 else 0)
            return idx
        return min(int(u[0] * self.P), self.P - 1)

    def region_bounds(self, i: int) -> np.ndarray:
        """``d x 2`` bounds of sub-region ``i``."""
        ub = np.tile([0.0, 1.0], (self.dim, 1))
        if self._mode == "halves":
            for j in range(self._k):
                bit = (i >> (self._k - 1 - j)) & 1
                ub[j] = [0.5 * bit, 0.5 * bit + 0.5]
        else:
            ub[0] = [i / self.P, (i + 1) / self.P]
        lo, hi = self.bounds[:, 0], self.bounds[:, 1]
        return np.stack([lo + ub[:, 0] * (hi - lo), lo + ub[:, 1] * (hi - lo)], axis=1)

    def sample(self, i: int, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` uniform points in sub-region ``i`` (used for the agents' initial points)."""
        rb = self.region_bounds(i)
        return rng.uniform(rb[:, 0], rb[:, 1], size=(n, self.dim))


# ---------------------------------------------------------------------- agent
@dataclass(eq=False)
class ReferenceAgent:
    r"""One agent of the reference: its data, iteration counter and GP hyperparameters.

    Attributes:
        X: ``n x d`` queried inputs.
        y: ``n`` observations.
        bounds: ``d x 2`` domain.
        region: Sub-region it explored at initialization.
        n_iter: BO iterations done so far (the refit schedule counts these).
        gp_params: ``(variance, lengthscale, noise)`` of its own GP.
        refit_every / gp_restarts: Refit schedule (every 5 iterations, 10 restarts).
        M_own: Number of fresh random features of its own TS sample.
    """

    X: np.ndarray
    y: np.ndarray
    bounds: np.ndarray
    region: int = 0
    n_iter: int = 0
    gp_params: tuple[float, float, float] = (1.0, 1.0, 1.0)
    refit_every: int = 5
    gp_restarts: int = 10
    M_own: int = 100
    n_random: int = 1000
    n_restarts: int = 20

    # -- data
    def observe(self, x: np.ndarray, y: float) -> None:
        """Append one observation."""
        self.X = np.vstack([self.X, np.asarray(x, dtype=np.float64).reshape(1, -1)])
        self.y = np.append(self.y, float(y))

    # -- message to the server
    def send_omega(self, features: ReferenceRFF, noise: float, rng: np.random.Generator) -> np.ndarray:
        """Sample ``ω_n`` from the BLR posterior on the shared features (what the agent sends).

        JUDGEMENT: ``Φ`` of the observations is computed in one vectorized call
        (only the acquisition is scored point by point); the posterior is
        recomputed from scratch every round, as the reference does.
        """
        Phi = features.phi_batch(self.X)
        nu, cov = reference_blr_posterior(Phi, self.y, noise)
        return reference_sample_omega(nu, cov, rng)

    # -- own GP
    def due_for_refit(self) -> bool:
        """Whether the schedule re-fits the GP in the current iteration (``n_iter % refit_every == 0``)."""
        return self.n_iter % self.refit_every == 0

    def refit_gp(self, rng: np.random.Generator) -> None:
        """Re-fit the GP hyperparameters (``gp_restarts`` L-BFGS-B runs, warm start first)."""
        self.gp_params = reference_gp_fit(self.X, self.y, rng, restarts=self.gp_restarts, init=self.gp_params)

    def own_ts_sample(self, rng: np.random.Generator) -> tuple[ReferenceRFF, np.ndarray]:
        r"""Fresh RFF of the fitted kernel and a weight sample from the BLR posterior on them.

        The features have ``σ₀² = variance`` and ``ℓ = lengthscale`` of the GP,
        the posterior uses its fitted noise.
        """
        v, ls, sn = self.gp_params
        feats = ReferenceRFF(self.X.shape[1], self.M_own, ls, v, rng)
        nu, cov = reference_blr_posterior(feats.phi_batch(self.X), self.y, sn)
        return feats, reference_sample_omega(nu, cov, rng)

    # -- the two branches
    def step_own_ts(
        self,
        objective: Callable[[np.ndarray], float],
        rng: np.random.Generator,
        refit: bool | None = None,
        timings: dict[str, float] | None = None,
    ) -> tuple[np.ndarray, float]:
        """One iteration that maximizes a sample of its own GP (``r ≤ p_t`` branch)."""
        return self._step("own", objective, rng, None, None, refit, timings)

    def step_from_server(
        self,
        server_vectors: np.ndarray,
        partition: BoxPartition,
        features: ReferenceRFF,
        objective: Callable[[np.ndarray], float],
        rng: np.random.Generator,
        refit: bool | None = None,
        timings: dict[str, float] | None = None,
    ) -> tuple[np.ndarray, float]:
        r"""One iteration that maximizes ``x ↦ φ(x)ᵀω^(i[x])`` built from the server's ``P x M`` vectors."""
        return self._step("server", objective, rng, (server_vectors, partition), features, refit, timings)

    def _step(
        self,
        branch: str,
        objective: Callable[[np.ndarray], float],
        rng: np.random.Generator,
        server: tuple[np.ndarray, BoxPartition] | None,
        features: ReferenceRFF | None,
        refit: bool | None,
        timings: dict[str, float] | None,
    ) -> tuple[np.ndarray, float]:
        tm = {k: 0.0 for k in PHASES} if timings is None else timings
        # GP hyperparameters follow their schedule whichever branch is taken
        # (JUDGEMENT: the reference updates its GP every iteration and re-fits
        # the hyperparameters on the schedule, independent of the branch).
        if self.due_for_refit() if refit is None else refit:
            t0 = time.perf_counter()
            self.refit_gp(rng)
            tm["gp_refit"] += time.perf_counter() - t0

        if branch == "own":
            t0 = time.perf_counter()
            feats, w = self.own_ts_sample(rng)
            tm["own_ts_sample"] += time.perf_counter() - t0

            def score(x: np.ndarray) -> float:
                return float(feats.phi(x) @ w)

        else:
            assert server is not None and features is not None
            vectors, part = server

            def score(x: np.ndarray) -> float:
                return float(features.phi(x) @ vectors[part.region_of(x)])

        t0 = time.perf_counter()
        x_new, _ = reference_maximize(score, self.bounds, rng, self.n_random, self.n_restarts)
        tm["acquisition"] += time.perf_counter() - t0

        t0 = time.perf_counter()
        y_new = float(objective(x_new))
        tm["objective"] += time.perf_counter() - t0
        self.observe(x_new, y_new)
        self.n_iter += 1
        return x_new, y_new


# --------------------------------------------------------------------- server
@dataclass
class ServerArgs:
    r"""Server settings of DP-FTS-DE: sampling rate ``q``, clipping ``S``, noise multiplier ``z``,
    and the ``P x N`` weights ``φ_n^(i)`` (rows usually sum to 1)."""

    q: float
    S: float
    z: float
    weights: np.ndarray


def reference_server(
    omegas: Sequence[np.ndarray],
    q: float,
    S: float,
    z: float,
    weights: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    r"""The central server's step (Algorithm 1, lines 5-11) as a Python loop over agents.

    Each agent is kept with probability ``q`` (Poisson subsampling); a kept
    ``ω_n`` is clipped to L2 norm ``S/√P`` and added as ``φ_n^(i) ω̂_n / q`` to
    every sub-region ``i``; finally each region vector gets
    ``N(0, (z·φ_max·S/q)² I)`` noise, ``φ_max = max_{i,n} φ_n^(i)``.

    Returns:
        ``P x M`` array of region vectors ``ω^(i)``.
    """
    weights = np.asarray(weights, dtype=np.float64)
    P, N = weights.shape
    M = len(omegas[0])
    clip = S / math.sqrt(P)
    out = [np.zeros(M) for _ in range(P)]
    for n in range(N):
        if rng.uniform() >= q:
            continue
        w = np.asarray(omegas[n], dtype=np.float64)
        w_hat = w / max(1.0, np.linalg.norm(w) / clip)
        for i in range(P):
            out[i] += (weights[i, n] / q) * w_hat
    sd = z * np.max(weights) * S / q
    for i in range(P):
        out[i] += rng.normal(0.0, sd, size=M)
    return np.array(out)


def adaptive_a(t: int, a0: float = 16.0, b: float = 1.0, hold: int = 10, decay: int = 30) -> float:
    r"""The exponent ``a`` of the adaptive DE weights at round ``t`` (1-based).

    ``a = a0`` for ``t ≤ hold``; over the next ``decay`` rounds ``a`` goes
    linearly from ``a0`` (round ``hold + 1``) to ``b`` (round ``hold + decay``);
    then ``a = b``. Defaults: the real-world schedule (thesis C.2: 16 for 10
    rounds, decay over the next 30, uniform after round 40). The synthetic
    schedule is ``hold=5, decay=5``, which reproduces the thesis' listed values
    ``a = 16, 12.25, 8.5, 4.75, 1`` for ``t = 6..10``.

    JUDGEMENT: the real-world decay is given only in words; we use the same
    convention as the synthetic list (the first decay round still has ``a0``).
    """
    if t <= hold:
        return float(a0)
    if t >= hold + decay:
        return float(b)
    if decay <= 1:
        return float(b)
    return a0 + (b - a0) * (t - hold - 1) / (decay - 1)


def de_weights(regions: Sequence[int], P: int, a: float, b: float = 1.0) -> np.ndarray:
    r"""``P x N`` DE weights: ``φ_n^(i) ∝ e^a`` if agent ``n`` explored region ``i``, ``∝ e^b`` otherwise.

    Each row is normalized to sum to 1.
    """
    regions = np.asarray(regions)
    W = np.where(np.arange(P)[:, None] == regions[None, :], math.exp(a), math.exp(b))
    return W / W.sum(axis=1, keepdims=True)


# ---------------------------------------------------------------------- round
def make_agents(
    objectives: Sequence[Callable[[np.ndarray], float]],
    partition: BoxPartition,
    n_init: int,
    rng: np.random.Generator,
    **agent_kwargs: Any,
) -> list[ReferenceAgent]:
    """Create agents; agent ``n`` queries ``n_init`` random points of sub-region ``n mod P`` (Algorithm 2, line 2)."""
    agents = []
    for n, f in enumerate(objectives):
        region = n % partition.P
        X = partition.sample(region, n_init, rng)
        y = np.array([float(f(x)) for x in X])
        agents.append(ReferenceAgent(X=X, y=y, bounds=partition.bounds.copy(), region=region, **agent_kwargs))
    return agents


@dataclass
class RoundResult:
    """What :func:`reference_round` returns.

    Attributes:
        server_vectors: ``P x M`` vectors the server broadcast this round.
        timings: Seconds summed over all agents, per phase (keys :data:`PHASES`, plus ``"total"``).
        per_agent: The same timings for each agent (server time not included).
        branches: ``"own"`` or ``"server"`` for each agent.
        x_new / y_new: The new query and observation of each agent.
    """

    server_vectors: np.ndarray
    timings: dict[str, float]
    per_agent: list[dict[str, float]] = field(default_factory=list)
    branches: list[str] = field(default_factory=list)
    x_new: list[np.ndarray] = field(default_factory=list)
    y_new: list[float] = field(default_factory=list)


def _objective_for(objective_fn: Any, n: int) -> Callable[[np.ndarray], float]:
    if isinstance(objective_fn, Sequence):
        return objective_fn[n]
    return lambda x: objective_fn(n, x)


def reference_round(
    agents: Sequence[ReferenceAgent],
    features: ReferenceRFF,
    objective_fn: Callable[[int, np.ndarray], float] | Sequence[Callable[[np.ndarray], float]],
    t: int,
    p_t: float | None,
    server_args: ServerArgs | dict[str, Any],
    rng: np.random.Generator,
    partition: BoxPartition | None = None,
    noise: float = 1e-6,
    refit: bool | None = None,
) -> RoundResult:
    r"""One full DP-FTS-DE round for all agents, agent by agent, with per-phase timings.

    1. Every agent samples ``ω_n`` from its BLR posterior on the shared
       ``features`` (noise ``noise``) and sends it.
    2. :func:`reference_server` forms the ``P x M`` region vectors.
    3. Every agent, in turn: re-fits its GP if due (or as ``refit`` forces);
       draws ``r ~ U(0, 1)``; if ``r ≤ p_t`` maximizes a sample of its own GP,
       else the piecewise ``φ(x)ᵀω^(i[x])``; queries its objective; appends.

    JUDGEMENT: the round starts with the agents' messages, so the vectors an
    agent uses were built from everyone's data up to the previous round — the
    same information as Algorithm 2 (``ω^{joint}_{t-1}`` from the ``ω_{n,t-1}``
    sampled after the previous query), only the loop is cut in another place.

    Args:
        agents: The agents (mutated: each gets one observation).
        features: Shared random features.
        objective_fn: ``f(n, x)``, or a sequence of per-agent ``f(x)``.
        t: Round index (1-based), used for ``p_t`` when it is ``None``.
        p_t: Probability of using the own GP; ``None`` gives ``1 - 1/t``.
        server_args: :class:`ServerArgs` or a dict with ``q, S, z, weights``.
        rng: Random generator.
        partition: Sub-regions; defaults to ``P`` = rows of the weights.
        noise: Noise variance of the shared-feature posterior (1e-6 in the papers).
        refit: ``None`` follows each agent's schedule; ``True``/``False`` forces.
    """
    sa = server_args if isinstance(server_args, ServerArgs) else ServerArgs(**server_args)
    weights = np.asarray(sa.weights, dtype=np.float64)
    if partition is None:
        partition = BoxPartition(features.dim, weights.shape[0], agents[0].bounds)
    if p_t is None:
        p_t = 1.0 - 1.0 / t
    per_agent = [{k: 0.0 for k in PHASES} for _ in agents]
    t_start = time.perf_counter()

    omegas = []
    for a, tm in zip(agents, per_agent, strict=False):
        t0 = time.perf_counter()
        omegas.append(a.send_omega(features, noise, rng))
        tm["posterior_sampling"] += time.perf_counter() - t0

    t0 = time.perf_counter()
    vectors = reference_server(omegas, sa.q, sa.S, sa.z, weights, rng)
    t_server = time.perf_counter() - t0

    res = RoundResult(server_vectors=vectors, timings={}, per_agent=per_agent)
    for n, (a, tm) in enumerate(zip(agents, per_agent, strict=False)):
        f = _objective_for(objective_fn, n)
        if rng.uniform() <= p_t:
            x, y = a.step_own_ts(f, rng, refit=refit, timings=tm)
            res.branches.append("own")
        else:
            x, y = a.step_from_server(vectors, partition, features, f, rng, refit=refit, timings=tm)
            res.branches.append("server")
        res.x_new.append(x)
        res.y_new.append(y)

    totals = {k: sum(tm[k] for tm in per_agent) for k in PHASES}
    totals["server"] = t_server
    totals["total"] = time.perf_counter() - t_start
    res.timings = totals
    return res


# --------------------------------------------------------------------- timing
def _demo_objective(x: np.ndarray) -> float:
    """A cheap smooth 2-D test function (not part of the timed phases except ``objective``)."""
    return float(np.sin(3.0 * x[0]) * np.cos(2.0 * x[1]) + 0.5 * x[0] - (x[1] - 0.3) ** 2)


def _time_it(reps: int = 7, seed: int = 0) -> None:  # pragma: no cover - manual benchmark
    """Print wall and CPU (process) times of one acquisition maximization and of agent-rounds.

    Setting: D = 2, M = 100 shared features (ℓ = 0.01, noise 1e-6), 20 observations,
    P = 4, one agent. CPU time is less sensitive to other jobs on a shared
    machine; with multi-threaded BLAS it also counts busy-waiting threads.
    """
    import os
    import statistics

    def clock(fn: Callable[[], Any]) -> tuple[float, float, Any]:
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        return time.perf_counter() - w0, time.process_time() - c0, out

    def fmt(xs: list[float]) -> str:
        return f"median {statistics.median(xs):.3f} s (min {min(xs):.3f}, max {max(xs):.3f})"

    print(f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, {reps} reps")
    rng = np.random.default_rng(seed)
    D, M, n_obs = 2, 100, 20
    feats = ReferenceRFF(D, M, 0.01, 1.0, rng)
    bounds = np.tile([0.0, 1.0], (D, 1))
    X = rng.uniform(size=(n_obs, D))
    y = np.array([_demo_objective(x) for x in X])
    nu, cov = reference_blr_posterior(feats.phi_batch(X), y, 1e-6)
    w = reference_sample_omega(nu, cov, rng)

    walls, cpus = [], []
    for _ in range(reps):
        wt, ct, _ = clock(lambda: reference_maximize(lambda x: float(feats.phi(x) @ w), bounds, rng))
        walls.append(wt)
        cpus.append(ct)
    print(f"reference_maximize of phi(x)·w (M={M}, D={D}): wall {fmt(walls)}; cpu {fmt(cpus)}")

    part = BoxPartition(D, 4)
    gp0 = reference_gp_fit(X, y, rng)
    for refit in (False, True):
        for branch_p in (1.0, 0.0):
            walls, cpus, phases = [], [], []
            for _ in range(reps):
                a = ReferenceAgent(X=X.copy(), y=y.copy(), bounds=bounds, gp_params=gp0)
                sa = ServerArgs(q=0.35, S=22.0, z=1.0, weights=de_weights([0], 4, 16.0))
                wt, ct, r = clock(
                    lambda a=a, branch_p=branch_p, sa=sa, refit=refit: reference_round(
                        [a], feats, [_demo_objective], 2, branch_p, sa, rng, part, refit=refit
                    )
                )
                walls.append(wt)
                cpus.append(ct)
                phases.append(r.timings)
            branch = "own-GP TS branch" if branch_p == 1.0 else "server (piecewise) branch"
            ph = {k: round(statistics.median(p[k] for p in phases), 4) for k in PHASES}
            print(
                f"agent-round, {branch}, refit={refit}: wall {fmt(walls)}; cpu {fmt(cpus)}\n"
                f"    median phases (wall): {ph}"
            )


if __name__ == "__main__":  # pragma: no cover
    _time_it()
