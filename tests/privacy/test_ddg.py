"""The distributed discrete Gaussian's accounting against Rényi divergences computed directly.

The closed forms (KLS 2021 Prop. 14; Zhu & Wang 2019 Thm. 6) are upper bounds:
each is checked to hold — and, where ``τ`` vanishes, to be tight — against the
Rényi divergence of the discrete distributions themselves, built by exact
convolution on a support wide enough that the truncated mass is below 1e-100.
"""

import math

import numpy as np
import pytest
from opacus.accountants import create_accountant
from scipy.special import logsumexp

from fbo_torch.privacy import DDGConstants, DistributedDiscreteGaussianAccountant, PrivacyLedger, get_epsilon
from fbo_torch.privacy.analysis.ddg import (
    compute_rdp_ddg,
    compute_rdp_poisson_subsampled,
    ddg_tau,
    noise_multiplier_of,
    num_shares_of,
)


def log_pmf_of_sum(var: float, n: int, half_width: int) -> np.ndarray:
    """log pmf of the sum of ``n`` discrete Gaussians ``N_Z(0, var)`` on ``-half_width..half_width``."""
    x = np.arange(-half_width, half_width + 1)
    one = -(x**2) / (2 * var)
    one = one - logsumexp(one)
    out = one
    for _ in range(n - 1):
        nxt = np.full(len(x), -np.inf)
        for i, xi in enumerate(x):  # log Σ_y out(x_i - y) one(y), over y with x_i - y on the support
            ok = np.abs(xi - x) <= half_width
            nxt[i] = logsumexp(out[(xi - x[ok]) + half_width] + one[ok])
        out = nxt - logsumexp(nxt)
    return out


def shifted(lp: np.ndarray, s: int) -> np.ndarray:
    out = np.full_like(lp, -np.inf)
    if s >= 0:
        out[s:] = lp[: len(lp) - s]
    else:
        out[:s] = lp[-s:]
    return out


def renyi(lp_a: np.ndarray, lp_b: np.ndarray, alpha: float) -> float:
    """``D_α(A ‖ B)`` of two pmfs given by their logs on one support."""
    ok = np.isfinite(lp_a) & np.isfinite(lp_b)
    return float(logsumexp(alpha * lp_a[ok] + (1 - alpha) * lp_b[ok]) / (alpha - 1))


def width(var, n):
    return int(30 * math.sqrt(n * var)) + 12


@pytest.mark.parametrize("var", [0.25, 1.0, 4.0])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_the_closed_form_bounds_the_renyi_divergence_of_the_sum_of_discrete_gaussians(var, n):
    lp = log_pmf_of_sum(var, n, width(var, n))
    for shift in ([1], [2], [1, 1, -1], [3, -2]):
        d2, d1 = math.sqrt(sum(s * s for s in shift)), sum(abs(s) for s in shift)
        for alpha in (2, 3, 5, 10):
            direct = sum(renyi(shifted(lp, s), lp, alpha) for s in shift)  # a product over coordinates
            bound = compute_rdp_ddg(
                [alpha], l2_sensitivity=d2, l1_sensitivity=d1, local_variance=var, num_shares=n, dim=len(shift)
            )[0]
            assert direct <= bound * (1 + 1e-9), (shift, alpha, direct, bound)
            if var >= 1 and ddg_tau(var, n) < 1e-3:  # the bound is the continuous Gaussian's, and tight
                assert bound == pytest.approx(alpha * d2**2 / (2 * n * var), rel=2e-3)
                assert direct == pytest.approx(bound, rel=2e-3)


@pytest.mark.parametrize("var,n", [(0.5, 1), (1.0, 2), (4.0, 2)])
def test_the_subsampled_bound_holds_in_both_directions_of_the_mixture(var, n):
    """Poisson subsampling: the output is the mixture (1-q) Z + q (Z + Δ) against Z, and the reverse."""
    lp = log_pmf_of_sum(var, n, width(var, n))
    for s in (1, 2):

        def base(a, s=s):
            return compute_rdp_ddg(a, l2_sensitivity=s, l1_sensitivity=s, local_variance=var, num_shares=n, dim=1)

        for q in (0.05, 0.3, 0.7):
            mix = np.logaddexp(math.log1p(-q) + lp, math.log(q) + shifted(lp, s))
            for alpha in (2, 3, 6, 12):
                direct = max(renyi(mix, lp, alpha), renyi(lp, mix, alpha))
                bound = compute_rdp_poisson_subsampled([alpha], q, base)[0]
                assert direct <= bound * (1 + 1e-9), (s, q, alpha, direct, bound)
                assert bound <= 4 * direct  # Zhu & Wang's bound is within a small factor (their 3) of the truth
                assert bound <= base(np.array([alpha]))[0] + 1e-12


def test_a_fractional_order_gets_the_bound_of_the_next_integer_order():
    def base(a):
        return np.asarray(a, dtype=float) / 2

    out = compute_rdp_poisson_subsampled([2.5, 3.0], 0.1, base)
    assert out[0] == out[1]


def test_the_accountant_composes_with_opacus_and_the_ledger_replays_it():
    c = DDGConstants(l2_sensitivity=2062.0, l1_sensitivity=2062.0 * 200**0.5, local_variance=160000.0, dim=200)
    z = noise_multiplier_of(27, c.l2_sensitivity, c.local_variance)
    assert num_shares_of(z, c.l2_sensitivity, c.local_variance) == 27
    ledger = PrivacyLedger(DistributedDiscreteGaussianAccountant(c), delta=1e-5)
    for _ in range(3):
        ledger.record(z, 0.3)
    assert ledger.mechanism == "ddg" and ledger.rounds == 3
    # σ = 400 lattice units: τ is 0 and the mechanism is the Gaussian's, so ε with q = 1 is Opacus' RDP ε
    # of a Gaussian with the same z (Zhu & Wang amplification is looser than Opacus' exact SGM analysis)
    gauss = create_accountant("rdp")
    for _ in range(3):
        gauss.step(noise_multiplier=z, sample_rate=1.0)
    unsampled = PrivacyLedger(DistributedDiscreteGaussianAccountant(c), delta=1e-5)
    for _ in range(3):
        unsampled.record(z, 1.0)
    assert unsampled.epsilon == pytest.approx(gauss.get_epsilon(1e-5), rel=0.02)
    amplified = create_accountant("rdp")
    for _ in range(3):
        amplified.step(noise_multiplier=z, sample_rate=0.3)
    assert amplified.get_epsilon(1e-5) <= ledger.epsilon < unsampled.epsilon
    again = PrivacyLedger(DistributedDiscreteGaussianAccountant(c), delta=1e-5)
    again.load_state_dict(ledger.state_dict())  # verified by replay
    assert again.epsilons == ledger.epsilons
    forged = ledger.state_dict()
    forged["epsilons"] = [e / 2 for e in forged["epsilons"]]
    with pytest.raises(ValueError, match="do not follow"):
        PrivacyLedger(DistributedDiscreteGaussianAccountant(c), delta=1e-5).load_state_dict(forged)


def test_the_registered_accountant_is_the_continuous_limit():
    acc = create_accountant("ddg")
    assert isinstance(acc, DistributedDiscreteGaussianAccountant) and math.isinf(acc.constants.local_variance)
    eps = get_epsilon(acc, 1e-5, history=[(1.0, 1.0, 10)])
    gauss = get_epsilon(create_accountant("rdp"), 1e-5, history=[(1.0, 1.0, 10)])
    assert eps == pytest.approx(gauss, rel=0.02)
    with pytest.raises(ValueError, match="local_variance"):
        DDGConstants(local_variance=0.1)
