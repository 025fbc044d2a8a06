r"""Gaussian DP of a history of Poisson-subsampled Gaussian releases.

Each segment of ``n`` releases with noise multiplier ``z`` and sampling rate
``q`` is ``μ``-GDP with ``μ = q · sqrt(n · (exp(z⁻²) - 1))`` (central limit
theorem of Bu et al., 2020, ``opacus.accountants.analysis.gdp.compute_mu_poisson``);
GDP composes as ``μ = sqrt(Σ μ_i²)``, and ε follows from the GDP/(ε, δ)
duality (``eps_from_mu``). For a one-segment history this is Opacus'
``GaussianAccountant.get_epsilon``; unlike that accountant, histories whose
``(z, q)`` change between segments are allowed.

.. warning:: The CLT is an approximation and can *under*-estimate ε for few
   steps or large ``q``. Prefer RDP or PRV accounting for guarantees.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

#: Upper end of the bracket Opacus' ``eps_from_mu`` searches (``exp(ε)`` overflows a little above 700).
MAX_GDP_EPSILON = 500.0


def compute_mu_history(history: Iterable[tuple[float, float, int]]) -> float:
    r"""The composed GDP parameter ``μ`` of a history.

    Args:
        history: ``(noise_multiplier, sample_rate, num_steps)`` triples.

    Returns:
        ``μ ≥ 0`` (``0.0`` for an empty history, ``+inf`` if a segment has ``z = 0``).
    """
    from opacus.accountants.analysis.gdp import compute_mu_poisson  # Opacus on first use (fbo_torch.privacy)

    history = list(history)
    if any(z == 0.0 for z, _, _ in history):
        return math.inf
    mu_sq = sum(float(compute_mu_poisson(steps=n, noise_multiplier=z, sample_rate=q)) ** 2 for z, q, n in history)
    return math.sqrt(mu_sq)


def compute_eps_history(history: Iterable[tuple[float, float, int]], delta: float) -> float:
    r"""ε of a history's composed ``μ``-GDP guarantee at target ``δ``.

    Args:
        history: ``(noise_multiplier, sample_rate, num_steps)`` triples.
        delta: Target ``δ ∈ (0, 1)``.

    Returns:
        ``ε ≥ 0``: ``0.0`` if ``μ = 0`` or ``δ`` is met at ``ε = 0``; ``+inf`` if
        ``μ`` is infinite or ``ε`` exceeds :data:`MAX_GDP_EPSILON` (reported as
        "no privacy" rather than under-counted).
    """
    from opacus.accountants.analysis.gdp import delta_eps_mu, eps_from_mu

    mu = compute_mu_history(history)
    if not math.isfinite(mu):
        return math.inf
    if mu == 0.0:
        return 0.0

    def excess(eps: float) -> float:
        return float(delta_eps_mu(eps=eps, mu=mu)) - delta

    if excess(0.0) <= 0.0:
        return 0.0
    if excess(MAX_GDP_EPSILON) > 0.0:
        return math.inf
    return float(eps_from_mu(mu=mu, delta=delta))


__all__ = ["MAX_GDP_EPSILON", "compute_eps_history", "compute_mu_history"]
