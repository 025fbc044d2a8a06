r"""RDP of a history of Poisson-subsampled Gaussian releases, composed with a cache.

An Opacus accountant's ``history`` is a run-length list of
``(noise_multiplier, sample_rate, num_steps)`` triples. Rényi DP composes
additively at each order, so the RDP of a history is
``Σ num_steps · RDP₁(z, q)``, where ``RDP₁`` is the one-step RDP from
``opacus.accountants.analysis.rdp.compute_rdp``. This is exactly the sum that
Opacus' ``RDPAccountant.get_privacy_spent`` forms (``compute_rdp(steps=n)`` is
``n`` times the one-step value); here the one-step RDP of each ``(z, q)`` is
cached, so a ledger that re-evaluates a growing history every round pays for
each distinct ``(z, q)`` once.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

import numpy as np


def check_orders(orders: Sequence[float] | np.ndarray) -> np.ndarray:
    r"""``orders`` as a 1-d float64 array, checked.

    Args:
        orders: ``k`` RDP orders ``α > 1``.

    Returns:
        A length-``k`` float64 array.

    Raises:
        ValueError: If ``orders`` is empty, not 1-d, or holds an order that is not finite and ``> 1``.
    """
    orders_vec = np.atleast_1d(np.asarray(orders, dtype=float))
    if orders_vec.ndim != 1 or orders_vec.size == 0:
        raise ValueError(f"`orders` must be a non-empty 1-d sequence of RDP orders, got {orders!r}.")
    if not (np.isfinite(orders_vec).all() and (orders_vec > 1).all()):
        raise ValueError(f"`orders` must all be finite and > 1, got {orders_vec.tolist()}.")
    return orders_vec


@functools.lru_cache(maxsize=1024)
def _step_rdp(noise_multiplier: float, sample_rate: float, orders: tuple[float, ...]) -> np.ndarray:
    from opacus.accountants.analysis.rdp import compute_rdp  # Opacus on first use (fbo_torch.privacy)

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
    orders_tuple = tuple(check_orders(orders).tolist())
    rdp = np.zeros(len(orders_tuple))
    for noise_multiplier, sample_rate, num_steps in history:
        rdp = rdp + _step_rdp(float(noise_multiplier), float(sample_rate), orders_tuple) * int(num_steps)
    return rdp


__all__ = ["check_orders", "compute_rdp_history"]
