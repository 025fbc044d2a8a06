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
module exists to reproduce the papers' values. The RDP of a history comes from
:func:`~fbo_torch.privacy.analysis.rdp.compute_rdp_history` (Opacus' ``compute_rdp``
per segment).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from fbo_torch.privacy.analysis.rdp import check_orders, compute_rdp_history

#: RDP orders of the paper-compatible accountant: the integers 2, ..., 256.
DEFAULT_ORDERS: tuple[int, ...] = tuple(range(2, 257))


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
    *, orders: Sequence[float], rdp: Sequence[float] | np.ndarray, delta: float
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
    orders_vec = check_orders(orders)
    rdp_vec = np.atleast_1d(np.asarray(rdp, dtype=float))
    if rdp_vec.shape != orders_vec.shape:
        raise ValueError(f"`orders` and `rdp` must have the same length, got {orders_vec.size} and {rdp_vec.size}.")
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"`delta` must lie in (0, 1), got {delta}.")
    eps = rdp_vec + math.log(1.0 / delta) / (orders_vec - 1.0)
    eps = np.where(np.isnan(eps), np.inf, eps)
    if not np.isfinite(eps).any():
        return math.inf, math.nan
    idx = int(np.argmin(eps))
    return float(max(eps[idx], 0.0)), float(orders_vec[idx])


__all__ = ["DEFAULT_ORDERS", "compute_rdp_classic", "get_privacy_spent_classic"]
