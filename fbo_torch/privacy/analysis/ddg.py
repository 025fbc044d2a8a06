r"""RDP of the distributed discrete Gaussian mechanism, with and without Poisson subsampling.

With secure aggregation each of ``n`` agents adds its own share of integer
noise ``N_Z(0, σ²)`` (the discrete Gaussian, Canonne, Kamath & Steinke 2020)
to its integer vector, and only the sum is released. The sum of ``n`` discrete
Gaussians is not a discrete Gaussian, but it is nearly one: Kairouz, Liu &
Steinke (2021, "The Distributed Discrete Gaussian Mechanism for Federated
Learning with Secure Aggregation", Proposition 14) bound the Rényi divergence
between the noise sum ``Z`` and its shift by an integer vector ``Δ ∈ Z^d``: for
every ``α ≥ 1`` and ``σ ≥ 1/2``

.. math::

    D_α(Z + Δ \| Z) ≤ \min\Big\{ \tfrac{α}{2} ℓ_2^2 + τ d,\;
        \tfrac{α}{2}\big(ℓ_2^2 + 2 ℓ_1 τ + τ^2 d\big),\;
        \tfrac{α}{2}\big(ℓ_2 + τ \sqrt d\big)^2 \Big\},

with ``ℓ₂ = ‖Δ‖₂ / (√n σ)``, ``ℓ₁ = ‖Δ‖₁ / (√n σ)`` and
``τ = 10 Σ_{k=1}^{n-1} exp(−2π²σ² k/(k+1)) ≤ 10 (n−1) e^{−π²σ²}`` (:func:`ddg_tau`).
For ``σ`` of a few lattice units ``τ`` vanishes (below 10⁻⁶⁰ at ``σ = 4`` for
any ``n ≤ 10⁶``) and the bound is the continuous Gaussian's ``α ℓ₂²/2``
(:func:`compute_rdp_ddg`).

Poisson subsampling (each agent's signal enters with probability ``q``, the
sample hidden from the observer) is amplified with the general bound of Zhu &
Wang (2019, "Poisson Subsampled Rényi Differential Privacy", Theorem 6), for
integer ``α ≥ 2``:

.. math::

    ε'(α) ≤ \frac{1}{α-1} \log\Big( (1-q)^{α-1}(αq - q + 1)
        + \binom{α}{2} q^2 (1-q)^{α-2} e^{ε(2)}
        + 3 \sum_{l=3}^{α} \binom{α}{l} q^l (1-q)^{α-l} e^{(l-1) ε(l)} \Big)

(:func:`compute_rdp_poisson_subsampled`); at a fractional order the bound of
the next integer order is used (RDP is non-decreasing in ``α``). Opacus'
``compute_rdp`` is the exact analysis of the *continuous* sampled Gaussian and
does not apply to a discrete mechanism, which is why this module exists; the
conversion to (ε, δ) is Opacus' ``get_privacy_spent``
(:class:`~fbo_torch.privacy.ddg.DistributedDiscreteGaussianAccountant`).
``tests/privacy/test_ddg.py`` checks both bounds against Rényi divergences
computed directly from the discrete distributions on small cases.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from scipy.special import gammaln, logsumexp

from fbo_torch.privacy.analysis.rdp import check_orders


def ddg_tau(local_variance: float, num_shares: int) -> float:
    r"""``τ = 10 Σ_{k=1}^{n-1} exp(−2π²σ² k/(k+1))`` of the sum of ``n`` discrete Gaussians ``N_Z(0, σ²)``.

    Args:
        local_variance: ``σ²`` of each share (lattice units²); ``inf`` gives 0.
        num_shares: ``n ≥ 1``.

    Returns:
        ``τ`` (0 for one share or ``σ² = inf``).
    """
    n = int(num_shares)
    if n <= 1 or math.isinf(local_variance):
        return 0.0
    k = np.arange(1, n, dtype=float)
    return float(10.0 * np.exp(-2.0 * math.pi**2 * float(local_variance) * k / (k + 1)).sum())


def compute_rdp_ddg(
    orders: Sequence[float] | np.ndarray,
    *,
    l2_sensitivity: float,
    l1_sensitivity: float,
    local_variance: float,
    num_shares: int,
    dim: int,
) -> np.ndarray:
    r"""RDP of releasing ``x + Z``, ``Z`` the sum of ``n`` i.i.d. ``N_Z(0, σ²)^d`` (KLS 2021, Prop. 14).

    Args:
        orders: RDP orders ``α > 1``.
        l2_sensitivity / l1_sensitivity: ``‖Δ‖₂`` and ``‖Δ‖₁`` bounds of one agent's
            integer vector (lattice units).
        local_variance: ``σ² ≥ 1/4`` of each agent's share (``inf``: the continuous limit, ``τ = 0``).
        num_shares: ``n``, the shares in the sum.
        dim: ``d``, the vector's length.

    Returns:
        ``len(orders)`` RDP values (the minimum of the proposition's three bounds).
    """
    alpha = check_orders(orders)
    var = float(local_variance)
    if not var >= 0.25:
        raise ValueError(f"`local_variance` must be >= 1/4 (sigma >= 1/2, KLS Prop. 14), got {local_variance}.")
    n, d = int(num_shares), int(dim)
    if n < 1 or d < 1:
        raise ValueError(f"`num_shares` and `dim` must be >= 1, got {num_shares} and {dim}.")
    scale = math.sqrt(n * var)
    l2 = float(l2_sensitivity) / scale
    l1 = float(l1_sensitivity) / scale
    tau = ddg_tau(var, n)
    b1 = alpha / 2 * l2**2 + tau * d
    b2 = alpha / 2 * (l2**2 + 2 * l1 * tau + tau**2 * d)
    b3 = alpha / 2 * (l2 + tau * math.sqrt(d)) ** 2
    return np.minimum(np.minimum(b1, b2), b3)


def _log_binom(n: np.ndarray | float, k: np.ndarray | float) -> np.ndarray:
    return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)


def compute_rdp_poisson_subsampled(
    orders: Sequence[float] | np.ndarray, sample_rate: float, base_rdp: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    r"""Zhu & Wang's (2019, Thm. 6) RDP of a Poisson-subsampled mechanism whose RDP is ``base_rdp``.

    Args:
        orders: RDP orders ``α > 1``; a fractional order gets the bound of ``⌈α⌉``.
        sample_rate: ``q ∈ (0, 1]``; ``1`` returns the base mechanism's RDP.
        base_rdp: ``α ↦ ε(α)`` of the base mechanism, vectorized over integer orders (a callable
            taking a float array).

    Returns:
        ``len(orders)`` RDP values, each at most the base mechanism's (subsampling never hurts).
    """
    alpha = check_orders(orders)
    q = float(sample_rate)
    if not 0 < q <= 1:
        raise ValueError(f"`sample_rate` must lie in (0, 1], got {sample_rate}.")
    base = np.asarray(base_rdp(alpha), dtype=float)
    if q == 1.0:
        return base
    top = int(math.ceil(alpha.max()))
    ints = np.arange(2, top + 1, dtype=float)
    eps_int = np.asarray(base_rdp(ints), dtype=float)  # ε(2), ..., ε(top)
    log_q, log_1q = math.log(q), math.log1p(-q)
    out_int = np.empty(len(ints))
    for i, a in enumerate(ints):
        a_int = int(a)
        terms = [
            (a - 1) * log_1q + math.log(a * q - q + 1),
            _log_binom(a, 2.0) + 2 * log_q + (a - 2) * log_1q + eps_int[0],
        ]
        if a_int >= 3:
            ls = np.arange(3, a_int + 1, dtype=float)
            terms.extend(
                math.log(3.0)
                + _log_binom(a, ls)
                + ls * log_q
                + (a - ls) * log_1q
                + (ls - 1) * eps_int[ls.astype(int) - 2]
            )
        out_int[i] = logsumexp(np.asarray(terms, dtype=float)) / (a - 1)
    sub = out_int[np.ceil(alpha).astype(int) - 2]
    return np.minimum(sub, base)


@functools.lru_cache(maxsize=1024)
def _step_rdp(
    noise_multiplier: float, sample_rate: float, constants: tuple[float, float, float, int], orders: tuple[float, ...]
) -> np.ndarray:
    l2, l1, var, dim = constants
    shares = num_shares_of(noise_multiplier, l2, var)

    def base(a: np.ndarray) -> np.ndarray:
        if math.isinf(var):  # the continuous limit: l2 / (sqrt(n) sigma) = 1 / z
            return np.asarray(a, dtype=float) / (2 * noise_multiplier**2)
        return compute_rdp_ddg(a, l2_sensitivity=l2, l1_sensitivity=l1, local_variance=var, num_shares=shares, dim=dim)

    rdp = compute_rdp_poisson_subsampled(orders, sample_rate, base)
    rdp.setflags(write=False)
    return rdp


def num_shares_of(noise_multiplier: float, l2_sensitivity: float, local_variance: float) -> int:
    r"""The number of noise shares ``n`` a noise multiplier ``z = √(n σ²) / Δ₂`` stands for (``0`` for ``σ² = ∞``)."""
    if math.isinf(local_variance):
        return 0
    return max(1, int(round((noise_multiplier * l2_sensitivity) ** 2 / local_variance)))


def noise_multiplier_of(num_shares: int, l2_sensitivity: float, local_variance: float) -> float:
    r"""``z = √(n σ²) / Δ₂``: the noise multiplier of the sum of ``n`` shares (the inverse of :func:`num_shares_of`)."""
    return math.sqrt(int(num_shares) * float(local_variance)) / float(l2_sensitivity)


def compute_rdp_ddg_history(
    history: Iterable[tuple[float, float, int]],
    orders: Sequence[float],
    *,
    l2_sensitivity: float,
    l1_sensitivity: float,
    local_variance: float,
    dim: int,
) -> np.ndarray:
    r"""RDP of a run-length history of distributed discrete Gaussian releases, composed additively.

    Args:
        history: ``(noise_multiplier, sample_rate, num_steps)`` triples, as kept by Opacus
            accountants; a release's noise multiplier ``z = √(n σ²) / Δ₂`` names its
            number of shares ``n`` (:func:`num_shares_of`).
        orders: RDP orders ``α > 1``.
        l2_sensitivity / l1_sensitivity / local_variance / dim: The mechanism's constants
            (:func:`compute_rdp_ddg`).

    Returns:
        ``len(orders)`` RDP values (``+inf`` where a release had ``z = 0``).
    """
    orders_tuple = tuple(check_orders(orders).tolist())
    constants = (float(l2_sensitivity), float(l1_sensitivity), float(local_variance), int(dim))
    rdp = np.zeros(len(orders_tuple))
    for z, q, steps in history:
        if float(z) == 0.0:
            return np.full(len(orders_tuple), np.inf)
        rdp = rdp + _step_rdp(float(z), float(q), constants, orders_tuple) * int(steps)
    return rdp


__all__ = [
    "compute_rdp_ddg",
    "compute_rdp_ddg_history",
    "compute_rdp_poisson_subsampled",
    "ddg_tau",
    "noise_multiplier_of",
    "num_shares_of",
]
