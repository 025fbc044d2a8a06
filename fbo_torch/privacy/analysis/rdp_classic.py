r"""The classic moments accountant (Abadi et al., 2016) used by DP-FTS-DE.

DP-FTS-DE (Dai et al., 2021, Sec. 3.3 and 5) releases the server's aggregate
once per round through a Poisson-subsampled Gaussian mechanism (sampling rate
``q``, noise multiplier ``z``) and reports ``ε`` from the moments accountant with
``δ = 1/N^1.1``. Its published numbers are reproduced exactly by

1. the Rényi DP (RDP) of the Poisson-subsampled Gaussian mechanism at the
   **integer** orders ``α = 2, ..., 256`` (the moments accountant's log-moments
   ``λ = α - 1``), composed additively over rounds, and
2. the **classic** RDP → (ε, δ) conversion (Mironov 2017, Prop. 3; Abadi et al.
   2016, Thm. 2)

   .. math::

       \varepsilon(\delta) = \min_{\alpha} \Big[\mathrm{RDP}(\alpha)
           + \frac{\log(1/\delta)}{\alpha - 1}\Big].

Opacus' ``RDPAccountant`` uses the tighter conversion of Balle et al. (2020)
and fractional orders, so it reports a smaller ``ε`` for the same run; this
module exists to reproduce the papers' values. The RDP of one step comes from
``opacus.accountants.analysis.rdp.compute_rdp`` (imported on first use).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence

import numpy as np

#: RDP orders of the paper-compatible accountant: the integers 2, ..., 256.
DEFAULT_ORDERS: tuple[int, ...] = tuple(range(2, 257))


def _orders_array(orders: Sequence[float]) -> np.ndarray:
    orders_vec = np.atleast_1d(np.asarray(orders, dtype=float))
    if orders_vec.ndim != 1 or orders_vec.size == 0:
        raise ValueError(f"`orders` must be a non-empty 1-d sequence of RDP orders, got {orders!r}.")
    if not (np.isfinite(orders_vec).all() and (orders_vec > 1).all()):
        raise ValueError(f"`orders` must all be finite and > 1, got {orders_vec.tolist()}.")
    return orders_vec


@functools.lru_cache(maxsize=1024)
def _step_rdp(noise_multiplier: float, sample_rate: float, orders: tuple[float, ...]) -> np.ndarray:
    from fbo_torch.privacy.analysis import require_opacus

    compute_rdp = require_opacus("opacus.accountants.analysis.rdp").compute_rdp
    rdp = np.asarray(
        compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(orders)),
        dtype=float,
    )
    rdp.setflags(write=False)
    return rdp


def compute_rdp_history(
    history: Iterable[tuple[float, float, int]],
    orders: Sequence[float],
) -> np.ndarray:
    r"""RDP of a composition of Poisson-subsampled Gaussian mechanisms.

    For each ``(z, q, n)`` segment, ``n`` times the one-step RDP from
    ``opacus.accountants.analysis.rdp.compute_rdp``, summed over segments (RDP
    composes additively at each order). This is exactly the sum Opacus'
    ``RDPAccountant`` forms (``compute_rdp(steps=n)`` is ``n`` times the
    one-step value), but the one-step RDP of each ``(z, q)`` is cached, so a
    ledger that re-evaluates a growing history every round pays for each
    distinct ``(z, q)`` only once.

    Args:
        history: ``(noise_multiplier, sample_rate, num_steps)`` triples, as kept
            by Opacus accountants: ``num_steps`` consecutive releases with noise
            multiplier ``z`` (noise std / sensitivity, unitless) and Poisson
            sampling rate ``q``.
        orders: ``k`` RDP orders ``α > 1``.

    Returns:
        A length-``k`` float64 array of RDP values (``+inf`` where a segment has
        ``z = 0``); all zeros for an empty history.
    """
    orders_tuple = tuple(_orders_array(orders).tolist())
    rdp = np.zeros(len(orders_tuple))
    for noise_multiplier, sample_rate, num_steps in history:
        rdp = rdp + _step_rdp(float(noise_multiplier), float(sample_rate), orders_tuple) * int(num_steps)
    return rdp


def compute_rdp_classic(
    history: Iterable[tuple[float, float, int]],
    orders: Sequence[float] = DEFAULT_ORDERS,
) -> np.ndarray:
    r"""RDP of a history at the moments accountant's orders (integers 2..256 by default).

    :func:`compute_rdp_history` with :data:`DEFAULT_ORDERS` as default orders.

    Args:
        history: ``(noise_multiplier, sample_rate, num_steps)`` triples.
        orders: RDP orders ``α > 1``; defaults to the integers 2..256.

    Returns:
        A ``len(orders)`` float64 array of RDP values.
    """
    return compute_rdp_history(history, orders)


def get_privacy_spent_classic(
    *, orders: Sequence[float], rdp: Sequence[float], delta: float
) -> tuple[float, float]:
    r"""Classic RDP → (ε, δ) conversion, minimised over the orders.

    ``ε = min_α [rdp(α) + log(1/δ) / (α - 1)]``. This is looser than the
    conversion in ``opacus.accountants.analysis.rdp.get_privacy_spent`` (which
    subtracts ``log(α)/(α-1)`` and adds ``log((α-1)/α)``) but it is what the
    moments accountant of Abadi et al. and the DP-FTS-DE paper use.

    Args:
        orders: ``k`` RDP orders ``α > 1``.
        rdp: ``k`` RDP values at those orders (``+inf`` allowed).
        delta: Target ``δ`` in ``(0, 1)``.

    Returns:
        ``(epsilon, best_order)``: the smallest ``ε`` and the order attaining it;
        ``(inf, nan)`` when every order gives an infinite (or NaN) ``ε``.

    Raises:
        ValueError: If ``orders`` and ``rdp`` differ in length, an order is
            ``≤ 1``, or ``delta`` is outside ``(0, 1)``.
    """
    orders_vec = _orders_array(orders)
    rdp_vec = np.atleast_1d(np.asarray(rdp, dtype=float))
    if rdp_vec.shape != orders_vec.shape:
        raise ValueError(
            f"`orders` and `rdp` must have the same length, got {orders_vec.size} and {rdp_vec.size}."
        )
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"`delta` must lie in (0, 1), got {delta}.")
    eps = rdp_vec + math.log(1.0 / delta) / (orders_vec - 1.0)
    eps = np.where(np.isnan(eps), np.inf, eps)
    if not np.isfinite(eps).any():
        return math.inf, math.nan
    idx = int(np.argmin(eps))
    return float(max(eps[idx], 0.0)), float(orders_vec[idx])
