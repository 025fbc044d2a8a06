r"""One-shot ε of a constant run, and the noise multiplier that meets a budget.

:func:`compute_epsilon` is ε after ``T`` identical releases of the
Poisson-subsampled Gaussian mechanism; :func:`calibrate_noise` inverts it in
the noise multiplier. Both take an accountant name (:data:`~fbo_torch.privacy.ACCOUNTANTS`)
or an Opacus accountant, and compute ε with :func:`~fbo_torch.privacy.get_epsilon`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fbo_torch.privacy.accountants import (
    DEFAULT_ACCOUNTANT,
    check_accountant_name,
    check_delta,
    check_noise_multiplier,
    check_sample_rate,
    check_steps,
    get_epsilon,
    is_accountant,
    new_accountant,
)
from fbo_torch.utils.validation import check_positive

if TYPE_CHECKING:
    from opacus.accountants import IAccountant

#: Largest noise multiplier :func:`calibrate_noise` will search up to.
MAX_NOISE_MULTIPLIER = 1e6


def _accountant(accountant: str | IAccountant) -> IAccountant:
    if is_accountant(accountant):
        return accountant
    return new_accountant(accountant)


def compute_epsilon(
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    delta: float,
    accountant: str | IAccountant = DEFAULT_ACCOUNTANT,
    **kwargs: Any,
) -> float:
    r"""ε after ``steps`` identical releases of the Poisson-subsampled Gaussian mechanism.

    Args:
        sample_rate: Poisson sampling rate ``q ∈ (0, 1]`` per round.
        noise_multiplier: ``z ≥ 0`` (noise std / sensitivity). ``z = 0`` gives ``+inf``.
        steps: Number of releases ``T ≥ 0`` (rounds). ``T = 0`` gives ``0.0``.
        delta: Target ``δ ∈ (0, 1)``.
        accountant: Accountant name (one of :data:`~fbo_torch.privacy.ACCOUNTANTS`)
            or an Opacus accountant whose type is used (its history is ignored).
        **kwargs: Options of the accountant's ``get_epsilon`` (``alphas``, ``eps_error``, ...).

    Returns:
        ``ε`` as a Python float.

    Example:
        >>> compute_epsilon(0.25, 1.0, 40, 200 ** -1.1, accountant="rdp-classic")  # doctest: +ELLIPSIS
        9.908...
    """
    q = check_sample_rate(sample_rate)
    z = check_noise_multiplier(noise_multiplier)
    steps = check_steps(steps)
    delta = check_delta(delta)
    if not is_accountant(accountant):
        check_accountant_name(accountant)
    if steps == 0:
        return 0.0
    if z == 0.0:
        return math.inf
    return get_epsilon(_accountant(accountant), delta, history=[(z, q, steps)], **kwargs)


def calibrate_noise(
    target_epsilon: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str | IAccountant = DEFAULT_ACCOUNTANT,
    *,
    epsilon_tolerance: float = 0.01,
    max_noise_multiplier: float = MAX_NOISE_MULTIPLIER,
    **kwargs: Any,
) -> float:
    r"""Smallest noise multiplier whose ε after ``steps`` rounds is at most ``target_epsilon``.

    A safeguarded search on ``z`` with the same accountant as :func:`compute_epsilon`, so
    ``compute_epsilon(sample_rate, z, steps, delta, accountant) ≤ target_epsilon``
    holds for the returned ``z`` (it is the upper end of the final bracket: the
    search never under-counts), and ``target_epsilon - ε(z) ≤ epsilon_tolerance``
    unless ``z`` is resolved to relative precision ``1e-9`` first. For ``"prv"``
    the search starts from the (cheaper) ``"rdp"`` answer, which lies slightly
    above the PRV one.

    Why not ``opacus.accountants.utils.get_noise_multiplier`` (which accepts every
    name here, ``"rdp-classic"`` included, and gives the same ``z`` within the
    tolerance; a test checks that): it bisects linearly from ``[0, 20]``, so it
    needs two to three and a half times as many ε evaluations as this search, which
    interpolates ``log ε`` in ``log z`` (the cost matters for ``"prv"``, see
    ``docs/design.md``); it has no ``max_noise_multiplier`` and no ``steps = 0``;
    and bisecting toward ``z → 0`` makes PRV's discretisation blow up.

    Args:
        target_epsilon: Budget ``ε > 0``.
        sample_rate: Poisson sampling rate ``q ∈ (0, 1]``.
        steps: Number of releases ``T ≥ 0``; ``T = 0`` needs no noise (returns ``0.0``).
        delta: Target ``δ ∈ (0, 1)``.
        accountant: Accountant name or Opacus accountant, as in :func:`compute_epsilon`.
        epsilon_tolerance: How far below the target the returned ``ε`` may be.
        max_noise_multiplier: Give up beyond this ``z``.
        **kwargs: Options of the accountant's ``get_epsilon``, as in :func:`compute_epsilon`.

    Returns:
        The noise multiplier ``z`` (a Python float).

    Raises:
        ValueError: On invalid arguments, or if even ``max_noise_multiplier``
            does not meet the target.
    """
    check_positive("target_epsilon", target_epsilon)
    target = float(target_epsilon)
    q = check_sample_rate(sample_rate)
    steps = check_steps(steps)
    delta = check_delta(delta)
    check_positive("epsilon_tolerance", epsilon_tolerance)
    check_positive("max_noise_multiplier", max_noise_multiplier)
    if not is_accountant(accountant):
        check_accountant_name(accountant)
    if steps == 0:
        return 0.0
    acc = _accountant(accountant)

    def eps_at(z: float) -> float:
        return get_epsilon(acc, delta, history=[(z, q, steps)], **kwargs)

    z0, factor = 1.0, 2.0
    from opacus.accountants import PRVAccountant

    if isinstance(acc, PRVAccountant):
        # PRV evaluations are slow (and blow up for tiny z): start from the RDP
        # answer, which is close above the PRV one, and bracket in small steps.
        try:
            z0 = calibrate_noise(
                target,
                q,
                steps,
                delta,
                "rdp",
                epsilon_tolerance=epsilon_tolerance,
                max_noise_multiplier=max_noise_multiplier,
            )
            factor = 1.25
        except ValueError:  # RDP's finite orders floor ε; PRV may still reach the target
            pass
    return _bisect_noise(eps_at, target, float(epsilon_tolerance), float(max_noise_multiplier), z0=z0, factor=factor)


def _bisect_noise(
    eps_at: Callable[[float], float],
    target: float,
    tol: float,
    z_max: float,
    z0: float = 1.0,
    factor: float = 2.0,
) -> float:
    r"""Safeguarded root search for ``eps_at(z) ∈ [target - tol, target]``.

    Keeps a bracket with ``eps_at(z_lo) > target ≥ eps_at(z_hi)`` and returns
    ``z_hi``, so the result is always feasible. Proposals interpolate
    ``log ε`` linearly in ``log z`` (ε of the subsampled Gaussian is close to a
    power law in ``z``) aiming at ``target - tol/2``, with a bisection step in
    ``log z`` whenever interpolation is unavailable or stalls on one side.
    """
    goal = target - 0.5 * min(tol, target)
    # -- bracket: step from z0 by `factor` until eps_at crosses the target -- #
    z = z0
    eps = eps_at(z)
    if eps > target:
        z_lo, eps_lo = z, eps
        while True:
            z *= factor
            if z > z_max:
                raise ValueError(
                    f"`target_epsilon` = {target} is not reachable with a noise multiplier "
                    f"<= {z_max:g}: the privacy budget is too low for this accountant (the RDP "
                    "accountants cannot go below log(1/delta)/(max_order - 1) or so, however large z is)."
                )
            eps = eps_at(z)
            if eps <= target:
                z_hi, eps_hi = z, eps
                break
            z_lo, eps_lo = z, eps
    else:
        z_hi, eps_hi = z, eps
        while True:
            z /= factor
            eps = eps_at(z)
            if eps > target:
                z_lo, eps_lo = z, eps
                break
            z_hi, eps_hi = z, eps
            if z < 1e-12:  # ε stays within budget for (numerically) no noise at all
                return z_hi
    # -- refine ----------------------------------------------------------- #
    prev_side, repeats = 0, 0  # which end moved last, and how many times in a row
    for _ in range(200):
        if target - eps_hi <= tol or z_hi - z_lo <= 1e-9 * z_hi:
            break
        u_lo, u_hi = math.log(z_lo), math.log(z_hi)
        u = 0.5 * (u_lo + u_hi)  # bisection in log z
        if repeats < 2 and math.isfinite(eps_lo) and eps_hi > 0.0 and eps_lo > eps_hi:
            v_lo, v_hi = math.log(eps_lo), math.log(eps_hi)
            u_int = u_lo + (math.log(goal) - v_lo) * (u_hi - u_lo) / (v_hi - v_lo)
            width = u_hi - u_lo
            u = min(max(u_int, u_lo + 0.02 * width), u_hi - 0.02 * width)
        z = math.exp(u)
        eps = eps_at(z)
        side = 1 if eps <= target else -1
        if side > 0:
            z_hi, eps_hi = z, eps
        else:
            z_lo, eps_lo = z, eps
        repeats = repeats + 1 if side == prev_side else 0
        prev_side = side
        if repeats >= 2:
            repeats, prev_side = 2, 0  # next step bisects, then interpolation resumes
    return z_hi


__all__ = ["MAX_NOISE_MULTIPLIER", "calibrate_noise", "compute_epsilon"]
