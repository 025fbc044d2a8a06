"""Tests for fbo_torch.privacy: accountants, calibration and the per-run ledger."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants import IAccountant, create_accountant

from fbo_torch.privacy import (
    ACCOUNTANTS,
    ClassicRDPAccountant,
    PrivacyLedger,
    append_release,
    calibrate_noise,
    check_accountant_name,
    compute_epsilon,
    default_delta,
    get_epsilon,
    num_releases,
)
from fbo_torch.privacy.accountants import check_accountant_state
from fbo_torch.privacy.analysis import compute_mu_history, get_privacy_spent_classic

N = 200
DELTA = 1.0 / N**1.1
T = 40
# (q, z) -> epsilon reported in the DP-FTS-DE paper (N = 200, T = 40, delta = 1/N^1.1)
PAPER = {
    (0.15, 1.0): 5.93,
    (0.25, 1.0): 9.91,
    (0.5, 1.0): 20.12,
    (0.25, 1.2): 7.39,
    (0.25, 1.5): 5.22,
}
STEPS = (10, 20, 40)
Q_STEPS = 0.05  # sample rate of the steps grid (small q keeps Opacus' fractional-order RDP cheap)

pytestmark = pytest.mark.filterwarnings("ignore:GDP accounting:UserWarning")


def _quiet_accountant(name: str) -> IAccountant:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_accountant(name)


@pytest.fixture(scope="module")
def table() -> dict[tuple[str, float, float, int], float]:
    """epsilon for every accountant at the paper settings and a few step counts (computed once)."""
    out = {}
    for name in ACCOUNTANTS:
        for q, z in PAPER:
            out[(name, q, z, T)] = compute_epsilon(q, z, T, DELTA, accountant=name)
        for steps in STEPS:
            out[(name, Q_STEPS, 1.0, steps)] = compute_epsilon(Q_STEPS, 1.0, steps, DELTA, accountant=name)
    return out


# --------------------------------------------------------------------------- #
# epsilon values
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(("q", "z"), list(PAPER))
def test_rdp_classic_reproduces_paper(table, q, z):
    assert round(table[("rdp-classic", q, z, T)], 2) == PAPER[(q, z)]


@pytest.mark.parametrize(("q", "z"), list(PAPER))
def test_tighter_accountants_report_less(table, q, z):
    classic = table[("rdp-classic", q, z, T)]
    rdp = table[("rdp", q, z, T)]
    prv = table[("prv", q, z, T)]
    for eps in (rdp, prv, table[("gdp", q, z, T)]):
        assert math.isfinite(eps) and eps > 0
    assert rdp < classic
    assert prv < classic
    assert prv < rdp  # PRV is the tightest of the guarantees


@pytest.mark.parametrize("name", ACCOUNTANTS)
def test_monotone(table, name):
    # increasing in q (z = 1)
    by_q = [table[(name, q, 1.0, T)] for q in (0.15, 0.25, 0.5)]
    assert by_q == sorted(by_q) and len(set(by_q)) == 3
    # decreasing in z (q = 0.25)
    by_z = [table[(name, 0.25, z, T)] for z in (1.0, 1.2, 1.5)]
    assert by_z == sorted(by_z, reverse=True) and len(set(by_z)) == 3
    # increasing in steps
    by_t = [table[(name, Q_STEPS, 1.0, s)] for s in STEPS]
    assert by_t == sorted(by_t) and len(set(by_t)) == 3


@settings(max_examples=25, deadline=None)
@given(
    q=st.floats(0.01, 1.0),
    z=st.floats(0.3, 20.0),
    steps=st.integers(1, 500),
    dq=st.floats(1.05, 2.0),
    dz=st.floats(1.05, 2.0),
)
def test_gdp_monotone_property(q, z, steps, dq, dz):
    """Cheap accountant: monotonicity on random settings (the rest use the fixed grid above)."""
    eps = compute_epsilon(q, z, steps, DELTA, accountant="gdp")
    slack = 1e-9 * eps + 1e-12 if math.isfinite(eps) else 0.0  # ε comes from a root finder
    assert compute_epsilon(q, z, steps + 7, DELTA, accountant="gdp") >= eps - slack
    assert compute_epsilon(min(q * dq, 1.0), z, steps, DELTA, accountant="gdp") >= eps - slack
    assert compute_epsilon(q, z * dz, steps, DELTA, accountant="gdp") <= eps + slack


@settings(max_examples=50, deadline=None)
@given(
    rdp=st.lists(st.floats(0.0, 50.0), min_size=3, max_size=3),
    d1=st.floats(1e-12, 0.5),
    d2=st.floats(1e-12, 0.5),
)
def test_classic_conversion_matches_definition(rdp, d1, d2):
    orders = [2, 8, 64]
    eps, order = get_privacy_spent_classic(orders=orders, rdp=rdp, delta=d1)
    brute = [r + math.log(1 / d1) / (a - 1) for r, a in zip(rdp, orders, strict=True)]
    assert eps == pytest.approx(min(brute), rel=1e-12)
    assert order == orders[int(np.argmin(brute))]
    # smaller delta -> larger epsilon
    eps2, _ = get_privacy_spent_classic(orders=orders, rdp=rdp, delta=d2)
    if d2 <= d1:
        assert eps2 >= eps - 1e-12
    else:
        assert eps2 <= eps + 1e-12


def test_classic_conversion_infinite_rdp():
    eps, order = get_privacy_spent_classic(orders=[2, 3], rdp=[math.inf, math.inf], delta=1e-5)
    assert eps == math.inf and math.isnan(order)
    with pytest.raises(ValueError, match="same length"):
        get_privacy_spent_classic(orders=[2, 3], rdp=[1.0], delta=1e-5)


def test_rdp_classic_best_order_is_integer():
    acc = create_accountant("rdp-classic")
    for _ in range(T):
        acc.step(noise_multiplier=1.0, sample_rate=0.25)
    eps, order = acc.get_privacy_spent(delta=DELTA)
    assert round(eps, 2) == 9.91
    assert order == int(order) and 2 <= order <= 256


@pytest.mark.parametrize("name", ACCOUNTANTS)
def test_zero_noise_and_zero_steps(name):
    assert compute_epsilon(0.3, 0.0, 10, DELTA, accountant=name) == math.inf
    assert compute_epsilon(0.3, 1.0, 0, DELTA, accountant=name) == 0.0
    acc = _quiet_accountant(name)
    assert get_epsilon(acc, DELTA) == 0.0 and len(acc) == 0
    for z in (2.0, 0.0, 2.0):  # one non-private release: no privacy left, whatever follows
        acc.history = append_release(acc.history, z, 0.1)
    assert get_epsilon(acc, DELTA) == math.inf


# --------------------------------------------------------------------------- #
# accountant interface
# --------------------------------------------------------------------------- #


def _schedule(i: int) -> tuple[float, float]:
    """(z, q) of round i: a schedule that changes every few rounds."""
    return 1.0 + 0.5 * (i // 6), 0.02 if i % 7 < 5 else 0.03


def _heterogeneous_steps(acc: IAccountant, start: int, stop: int) -> None:
    """Record rounds start..stop-1 of the schedule (as the ledger does; gdp included)."""
    for i in range(start, stop):
        acc.history = append_release(acc.history, *_schedule(i))


def test_history_run_length_and_len():
    acc = create_accountant("rdp")
    _heterogeneous_steps(acc, 0, 15)
    assert num_releases(acc.history) == 15
    assert acc.history[0] == (1.0, 0.02, 5)
    # append_release merges exactly as Opacus' own step
    stepped = create_accountant("rdp")
    for i in range(15):
        z, q = _schedule(i)
        stepped.step(noise_multiplier=z, sample_rate=q)
    assert stepped.history == acc.history and len(acc) == len(stepped) == len(acc.history)  # Opacus' len: segments
    # heterogeneous composition: splitting a constant run into segments changes nothing
    a, b = create_accountant("rdp-classic"), create_accountant("rdp-classic")
    a.history = [(1.0, 0.25, 40)]
    b.history = [(1.0, 0.25, 10), (1.0, 0.25, 30)]
    assert get_epsilon(a, DELTA) == pytest.approx(get_epsilon(b, DELTA), rel=1e-12)
    # and a heterogeneous run lies between the all-low and all-high runs
    c = create_accountant("rdp-classic")
    c.history = [(1.0, 0.25, 20), (1.5, 0.25, 20)]
    lo, hi = compute_epsilon(0.25, 1.5, 40, DELTA, "rdp-classic"), get_epsilon(a, DELTA)
    assert lo < get_epsilon(c, DELTA) < hi


def test_gdp_heterogeneous_composes_mu():
    acc = _quiet_accountant("gdp")
    one, two = [(1.0, 0.25, 20)], [(2.0, 0.1, 30)]
    assert compute_mu_history(one + two) == pytest.approx(math.hypot(compute_mu_history(one), compute_mu_history(two)))
    # more privacy loss than either segment alone
    assert get_epsilon(acc, DELTA, history=one + two) > max(get_epsilon(acc, DELTA, history=h) for h in (one, two))
    # a single segment agrees with Opacus' GaussianAccountant, which cannot hold two
    acc.history = one
    assert get_epsilon(acc, DELTA) == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)
    with pytest.raises(ValueError, match="constant"):
        acc.step(noise_multiplier=2.0, sample_rate=0.1)


@pytest.mark.parametrize("name", ACCOUNTANTS)
def test_state_dict_round_trip(name):
    full = _quiet_accountant(name)
    _heterogeneous_steps(full, 0, 15)
    first = _quiet_accountant(name)
    _heterogeneous_steps(first, 0, 10)
    state = first.state_dict()
    assert state["mechanism"] == name
    resumed = _quiet_accountant(name)
    resumed.load_state_dict(state)
    _heterogeneous_steps(resumed, 10, 15)
    _heterogeneous_steps(first, 10, 15)  # the saved state is a copy
    assert num_releases(state["history"]) == 10
    assert resumed.history == full.history
    assert num_releases(resumed.history) == num_releases(full.history) == 15
    if name != "prv":  # prv is a deterministic function of the same history; skip the cost
        assert get_epsilon(resumed, DELTA) == get_epsilon(full, DELTA)


def test_rdp_epsilon_is_opacus_rdp_accountants():
    # get_epsilon caches the one-step RDP of each (z, q); the value is Opacus' own, to the bit
    acc = create_accountant("rdp")
    _heterogeneous_steps(acc, 0, 12)
    assert get_epsilon(acc, DELTA) == acc.get_epsilon(DELTA)
    alphas = [1.5, 2.0, 8.0, 32.0]
    assert get_epsilon(acc, DELTA, alphas=alphas) == acc.get_epsilon(DELTA, alphas=alphas)


def test_saved_accountant_state_is_checked():
    state = create_accountant("rdp").state_dict()
    with pytest.raises(ValueError, match="mechanism"):
        check_accountant_state(state, "rdp-classic")
    with pytest.raises(ValueError, match="empty"):
        check_accountant_state({}, "rdp-classic")
    with pytest.raises(ValueError, match="no key 'history'"):
        check_accountant_state({"mechanism": "rdp-classic"}, "rdp-classic")
    with pytest.raises(ValueError, match=r"history\[0\].sample_rate"):
        check_accountant_state({"history": [(1.0, 1.5, 3)], "mechanism": "rdp-classic"}, "rdp-classic")
    with pytest.raises(ValueError, match=r"history\[1\].num_steps"):
        check_accountant_state({"history": [(1.0, 0.5, 3), (1.0, 0.5, 0)], "mechanism": "rdp"}, "rdp")
    with pytest.raises(ValueError, match=r"history\[0\]. must be a"):
        check_accountant_state({"history": [(1.0, 0.5)], "mechanism": "rdp"}, "rdp")


# --------------------------------------------------------------------------- #
# calibration
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", ACCOUNTANTS)
def test_calibrate_noise_inverts_compute_epsilon(name):
    q, steps, target = 0.02, 100, 1.0  # small q keeps Opacus' fractional-order RDP cheap
    z = calibrate_noise(target, q, steps, DELTA, accountant=name)
    eps = compute_epsilon(q, z, steps, DELTA, accountant=name)
    assert eps <= target
    assert eps >= target - 0.01
    # a bit less noise overshoots the budget: z is (nearly) the smallest
    assert compute_epsilon(q, 0.98 * z, steps, DELTA, accountant=name) > target


def test_calibrate_noise_paper_setting_and_edges():
    # the paper's z = 1.2 gives 7.39 with q = 0.25: calibrating to 7.39 recovers z ~ 1.2
    z = calibrate_noise(7.3906, 0.25, T, DELTA, accountant="rdp-classic", epsilon_tolerance=1e-3)
    assert z == pytest.approx(1.2, abs=2e-3)
    assert compute_epsilon(0.25, z, T, DELTA, accountant="rdp-classic") <= 7.3906
    assert calibrate_noise(1.0, 0.25, 0, DELTA, accountant="rdp-classic") == 0.0
    with pytest.raises(ValueError, match="not reachable"):
        calibrate_noise(1e-3, 1.0, 10_000, DELTA, accountant="gdp", max_noise_multiplier=10.0)


# --------------------------------------------------------------------------- #
# ledger
# --------------------------------------------------------------------------- #


def test_ledger_default_delta():
    ledger = PrivacyLedger("rdp-classic", num_agents=N)
    assert ledger.delta == pytest.approx(N**-1.1) == default_delta(N)
    assert PrivacyLedger("rdp-classic", delta=1e-5, num_agents=N).delta == 1e-5
    with pytest.raises(ValueError, match="delta"):
        PrivacyLedger("rdp-classic")
    with pytest.raises(ValueError, match="num_agents"):
        PrivacyLedger("rdp-classic", num_agents=1)


def test_ledger_matches_paper_and_records_per_round():
    ledger = PrivacyLedger("rdp-classic", num_agents=N)
    assert ledger.epsilon == 0.0 and ledger.rounds == 0 and not ledger.exhausted
    assert ledger.can_release(1.0, 0.25)  # no budget: always
    for _ in range(T):
        ledger.record(noise_multiplier=1.0, sample_rate=0.25)
    assert ledger.rounds == T == len(ledger.epsilons) == num_releases(ledger.accountant.history)
    assert round(ledger.epsilon, 2) == 9.91
    assert ledger.epsilons == sorted(ledger.epsilons)
    assert ledger.epsilons[9] == pytest.approx(compute_epsilon(0.25, 1.0, 10, DELTA, "rdp-classic"))


def test_ledger_budget():
    budget = 6.0
    ledger = PrivacyLedger("rdp-classic", num_agents=N, max_epsilon=budget)
    while ledger.can_release(1.0, 0.5):
        next_eps = compute_epsilon(0.5, 1.0, ledger.rounds + 1, ledger.delta, "rdp-classic")
        assert next_eps <= budget
        assert ledger.record(1.0, 0.5) == pytest.approx(next_eps)
        assert not ledger.exhausted
    # can_release is False exactly because the next release would overshoot
    assert compute_epsilon(0.5, 1.0, ledger.rounds + 1, ledger.delta, "rdp-classic") > budget
    assert ledger.rounds >= 1 and ledger.epsilon <= budget
    # a smaller release may still fit
    assert ledger.can_release(4.0, 0.05)
    # recording past the budget is kept (the release happened) but warns
    with pytest.warns(RuntimeWarning, match="budget exceeded"):
        eps = ledger.record(1.0, 0.5)
    assert eps > budget and ledger.exhausted and ledger.remaining < 0
    assert not ledger.can_release(50.0, 0.01)
    # a non-private round makes epsilon infinite
    ledger2 = PrivacyLedger("rdp", num_agents=N, max_epsilon=100.0)
    assert not ledger2.can_release(0.0, 0.5)
    with pytest.warns(RuntimeWarning):
        assert ledger2.record(0.0, 0.5) == math.inf


def test_ledger_state_dict_round_trip():
    schedule = [(1.0 + 0.2 * (i // 5), 0.25) for i in range(15)]
    full = PrivacyLedger("rdp-classic", num_agents=N, max_epsilon=50.0)
    for z, q in schedule:
        full.record(z, q)
    first = PrivacyLedger("rdp-classic", num_agents=N, max_epsilon=50.0)
    for z, q in schedule[:10]:
        first.record(z, q)
    resumed = PrivacyLedger("rdp-classic", delta=0.5)  # non-strict: delta and budget come from the state
    resumed.load_state_dict(first.state_dict(), strict=False)
    assert resumed.delta == first.delta and resumed.max_epsilon == 50.0 and resumed.num_agents == N
    for z, q in schedule[10:]:
        resumed.record(z, q)
    assert resumed.epsilons == full.epsilons
    assert resumed.epsilon == full.epsilon and resumed.rounds == 15
    assert resumed.accountant.history == full.accountant.history
    # mismatched mechanism or inconsistent state is refused
    with pytest.raises(ValueError, match="mechanism"):
        PrivacyLedger("gdp", num_agents=N).load_state_dict(first.state_dict())
    bad = first.state_dict()
    bad["epsilons"] = bad["epsilons"][:-1]
    with pytest.raises(ValueError, match="inconsistent"):
        PrivacyLedger("rdp-classic", num_agents=N).load_state_dict(bad)


@pytest.mark.parametrize("accountant", ["rdp", "rdp-classic"])
def test_a_forged_ledger_is_refused(accountant):
    """A saved ledger is verified, not trusted: epsilons that its releases do not give are refused."""
    ledger = PrivacyLedger(accountant, num_agents=N)
    for _ in range(5):
        ledger.record(1.0, 0.35)
    state = ledger.state_dict()
    PrivacyLedger(accountant, num_agents=N).load_state_dict(state)  # the true one loads
    lower = dict(state, epsilons=[e / 2 for e in state["epsilons"]])  # the last epsilon halved, and the others
    with pytest.raises(ValueError, match="do not follow from its steps"):
        PrivacyLedger(accountant, num_agents=N).load_state_dict(lower)
    one = dict(state, epsilons=state["epsilons"][:2] + [state["epsilons"][2] * 0.999] + state["epsilons"][3:])
    with pytest.raises(ValueError, match="after release 3"):
        PrivacyLedger(accountant, num_agents=N).load_state_dict(one)
    fewer = dict(
        state, accountant={"history": [(1.0, 0.35, 2)], "mechanism": ledger.mechanism}, epsilons=state["epsilons"][:2]
    )  # consistent, but a history cut short...
    resumed = PrivacyLedger(accountant, num_agents=N)
    resumed.load_state_dict(fewer)  # ...is a valid ledger of 2 releases: the server checks its own round count
    assert resumed.rounds == 2


def test_a_saved_ledger_cannot_change_the_runs_guarantee_or_lift_its_budget():
    """Before: a state with δ 1e-5 -> 0.2 (epsilons recomputed) reported a smaller ε, and a saved
    `max_epsilon` of 1e9 or None replaced the run's budget."""
    run = dict(accountant="rdp", delta=1e-5, num_agents=N, max_epsilon=3.0)
    saved = PrivacyLedger(**{**run, "max_epsilon": None})
    for _ in range(5):
        saved.record(1.0, 0.35)
    honest = saved.state_dict()
    loose = PrivacyLedger("rdp", delta=0.2)
    for _ in range(5):
        loose.record(1.0, 0.35)
    forged = dict(loose.state_dict(), num_agents=N)  # consistent: epsilons follow from δ = 0.2
    assert forged["epsilons"][-1] < honest["epsilons"][-1]
    with pytest.raises(ValueError, match="delta = 0.2, this run's is 1e-05"):
        PrivacyLedger(**run).load_state_dict(forged)
    with pytest.raises(ValueError, match="num_agents = 7, this run's is"):
        PrivacyLedger(**run).load_state_dict(dict(honest, num_agents=7))
    for budget in (1e9, None):
        resumed = PrivacyLedger(**run)
        resumed.load_state_dict(dict(honest, max_epsilon=budget))
        assert resumed.max_epsilon == 3.0 and resumed.epsilons == honest["epsilons"]


def test_delta_at_or_above_one_over_n_warns_and_the_deployment_default_is_small():
    from fbo_torch.privacy import deployment_delta

    with pytest.warns(UserWarning, match="releasing one agent's data in full"):
        PrivacyLedger("rdp", delta=0.3, num_agents=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PrivacyLedger("rdp", num_agents=4)  # the papers' 1/N^1.1 is below 1/N
        PrivacyLedger("rdp", delta=deployment_delta(4), num_agents=4)
    assert deployment_delta(4) == 1e-5 and deployment_delta(10**6) == pytest.approx(1e-8)
    assert all(deployment_delta(n) * n <= 0.01 for n in (1, 2, 4, 100, 10**4, 10**7))
    assert default_delta(4) * 4 == pytest.approx(4**-0.1)  # 0.87: why deployments do not use it


def test_ledger_accepts_accountant_instance():
    acc = create_accountant("rdp-classic")
    ledger = PrivacyLedger(acc, num_agents=N)
    ledger.record(1.0, 0.25)
    assert ledger.mechanism == "rdp-classic" and acc.history == [(1.0, 0.25, 1)]
    with pytest.raises(ValueError, match="no recorded steps"):
        PrivacyLedger(acc, num_agents=N)


def test_rdp_classic_other_orders():
    # other orders to optimise over: without the best one (2 here), a larger epsilon
    acc = create_accountant("rdp-classic")
    acc.history = [(1.0, 0.25, T)]
    default = get_epsilon(acc, DELTA)
    assert get_epsilon(acc, DELTA, alphas=range(2, 65)) == default  # the best order here is 2
    assert get_epsilon(acc, DELTA, alphas=[4, 5]) > default
    assert compute_epsilon(0.25, 1.0, T, DELTA, "rdp-classic", alphas=[4, 5]) == get_epsilon(acc, DELTA, alphas=[4, 5])


# --------------------------------------------------------------------------- #
# validation
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        (dict(sample_rate=0.0), ValueError, "sample_rate"),
        (dict(sample_rate=1.5), ValueError, "sample_rate"),
        (dict(sample_rate=-0.1), ValueError, "sample_rate"),
        (dict(sample_rate=math.nan), ValueError, "sample_rate"),
        (dict(noise_multiplier=-1.0), ValueError, "noise_multiplier"),
        (dict(noise_multiplier=math.inf), ValueError, "noise_multiplier"),
        (dict(noise_multiplier=math.nan), ValueError, "noise_multiplier"),
        (dict(delta=0.0), ValueError, "delta"),
        (dict(delta=1.0), ValueError, "delta"),
        (dict(delta=-1e-5), ValueError, "delta"),
        (dict(steps=-1), ValueError, "steps"),
        (dict(steps=2.5), TypeError, "steps"),
        (dict(steps=True), TypeError, "steps"),
        (dict(accountant="moments"), ValueError, "rdp.*prv.*gdp.*rdp-classic"),
        (dict(accountant=3), TypeError, "accountant"),
    ],
)
def test_compute_epsilon_bad_input(kwargs, exc, match):
    args = dict(sample_rate=0.25, noise_multiplier=1.0, steps=10, delta=1e-5, accountant="rdp")
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        compute_epsilon(**args)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        (dict(target_epsilon=0.0), ValueError, "target_epsilon"),
        (dict(target_epsilon=-1.0), ValueError, "target_epsilon"),
        (dict(target_epsilon=math.inf), ValueError, "target_epsilon"),
        (dict(sample_rate=0.0), ValueError, "sample_rate"),
        (dict(delta=1.0), ValueError, "delta"),
        (dict(steps=-3), ValueError, "steps"),
        (dict(accountant="nope"), ValueError, "valid names"),
    ],
)
def test_calibrate_noise_bad_input(kwargs, exc, match):
    args = dict(target_epsilon=1.0, sample_rate=0.25, steps=10, delta=1e-5, accountant="rdp")
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        calibrate_noise(**args)


def test_accountant_and_ledger_bad_input():
    with pytest.raises(ValueError, match="valid names are 'rdp', 'prv', 'gdp', 'rdp-classic'"):
        check_accountant_name("moments")
    assert check_accountant_name(" RDP-Classic ") == "rdp-classic"
    acc = create_accountant("rdp-classic")
    with pytest.raises(ValueError, match="sample_rate"):
        append_release(acc.history, 1.0, 0.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        append_release(acc.history, -0.5, 0.1)
    with pytest.raises(ValueError, match="delta"):
        get_epsilon(acc, 0.0)
    with pytest.raises(ValueError, match=r"history\[0\].noise_multiplier"):
        get_epsilon(acc, DELTA, history=[(math.nan, 0.5, 1)])
    with pytest.raises(TypeError, match="IAccountant"):
        get_epsilon("rdp", DELTA)
    with pytest.raises(ValueError, match="eps_error"):
        compute_epsilon(0.25, 1.0, 10, DELTA, accountant="prv", eps_error=0.0)
    assert len(acc) == 0  # failed steps record nothing
    with pytest.raises(ValueError, match="max_epsilon"):
        PrivacyLedger("rdp", num_agents=N, max_epsilon=0.0)
    with pytest.raises(ValueError, match="delta"):
        PrivacyLedger("rdp", delta=1.5)
    with pytest.raises(ValueError, match="valid names"):
        PrivacyLedger("bogus", num_agents=N)
    ledger = PrivacyLedger("rdp", num_agents=N)
    with pytest.raises(ValueError, match="sample_rate"):
        ledger.can_release(1.0, 2.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        ledger.record(math.inf, 0.5)
    assert ledger.rounds == 0


# --------------------------------------------------------------------------- #
# a thin layer over Opacus: "rdp-classic" in Opacus' registry
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(("q", "z"), list(PAPER))
def test_rdp_classic_is_an_opacus_accountant(q, z):
    # Opacus' own factory creates it and it reports the paper's epsilon
    acc = create_accountant("rdp-classic")  # registered at import of fbo_torch.privacy
    assert type(acc) is ClassicRDPAccountant and acc.mechanism() == "rdp-classic"
    for _ in range(T):
        acc.step(noise_multiplier=z, sample_rate=q)
    assert acc.history == [(z, q, T)] and len(acc) == 1  # Opacus' len: history segments
    assert round(acc.get_epsilon(DELTA), 2) == PAPER[(q, z)]
    assert acc.get_epsilon(DELTA) == compute_epsilon(q, z, T, DELTA, accountant="rdp-classic")
    assert acc.get_epsilon(DELTA) == get_epsilon(acc, DELTA)


def test_rdp_classic_state_dict_round_trip_through_opacus():
    ours = create_accountant("rdp-classic")
    for k in range(12):
        ours.step(noise_multiplier=1.0 + 0.1 * (k // 4), sample_rate=0.25)
    back = create_accountant("rdp-classic")
    back.load_state_dict(ours.state_dict())
    assert back.history == ours.history and get_epsilon(back, DELTA) == get_epsilon(ours, DELTA)
    with pytest.raises(ValueError, match="mechanism"):  # Opacus' own check
        create_accountant("rdp").load_state_dict(ours.state_dict())


def test_no_fbo_torch_name_shadows_an_opacus_accountant():
    import opacus.accountants

    import fbo_torch.privacy as P

    assert not set(vars(P)) & set(opacus.accountants.__all__)
    for name in ACCOUNTANTS:  # every name fbo_torch reports with is Opacus' to create
        assert _quiet_accountant(name).mechanism() == name


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha:UserWarning")
@pytest.mark.parametrize("name", ["rdp", "rdp-classic", "prv"])
def test_calibrate_noise_agrees_with_opacus_get_noise_multiplier(name):
    # calibrate_noise keeps its own (faster) search; Opacus' calibration must land in the same window
    from opacus.accountants.utils import get_noise_multiplier

    q, steps, target, tol = 0.02, 100, 1.0, 0.01
    ours = calibrate_noise(target, q, steps, DELTA, accountant=name, epsilon_tolerance=tol)
    theirs = get_noise_multiplier(
        target_epsilon=target, target_delta=DELTA, sample_rate=q, steps=steps, accountant=name, epsilon_tolerance=tol
    )
    for z in (ours, theirs):
        assert target - tol <= compute_epsilon(q, z, steps, DELTA, accountant=name) <= target


@pytest.mark.filterwarnings("ignore:Secure RNG turned off:UserWarning", "ignore:Full backward hook:UserWarning")
def test_opacus_privacy_engine_trains_with_rdp_classic():
    import torch
    from opacus import PrivacyEngine

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    engine = PrivacyEngine(accountant="rdp-classic")
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader,
        noise_multiplier=1.1,
        max_grad_norm=1.0,
    )
    steps = 0
    for X, Y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X), Y).backward()
        opt.step()
        steps += 1
    eps = engine.get_epsilon(1e-5)
    assert eps == pytest.approx(compute_epsilon(16 / 64, 1.1, steps, 1e-5, accountant="rdp-classic"), rel=1e-12)


@pytest.mark.parametrize("opacus_first", [True, False])
def test_importing_fbo_torch_privacy_registers_rdp_classic(opacus_first):
    code = textwrap.dedent(
        f"""
        import sys
        {"import opacus.accountants" if opacus_first else ""}
        import fbo_torch.privacy
        print("opacus" in sys.modules)  # imported by whoever needs it, then registered with
        from opacus.accountants import create_accountant
        from opacus.accountants.utils import get_noise_multiplier
        print(type(create_accountant("rdp-classic")).__name__, type(create_accountant("ddg")).__name__)
        z = get_noise_multiplier(target_epsilon=9.91, target_delta=200 ** -1.1, sample_rate=0.25, steps=40,
                                 accountant="rdp-classic", epsilon_tolerance=0.005)
        print(abs(z - 1.0) < 0.005)
        # registering again (a reload) is harmless; a different accountant under the name is refused
        import importlib
        import fbo_torch.privacy.rdp_classic as m
        importlib.reload(m)
        print(type(create_accountant("rdp-classic")) is m.ClassicRDPAccountant)
        from opacus.accountants import RDPAccountant, register_accountant
        register_accountant("rdp-classic", RDPAccountant, force=True)
        try:
            importlib.reload(m)
        except ValueError as err:
            print("refused" if "different accountant" in str(err) else err)
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [
        str(opacus_first),
        "ClassicRDPAccountant",
        "DistributedDiscreteGaussianAccountant",
        "True",
        "True",
        "refused",
    ]


def test_opacus_is_imported_when_an_epsilon_is_computed_and_not_before():
    code = textwrap.dedent(
        f"""
        import sys
        import fbo_torch.federation, fbo_torch.simulate
        from fbo_torch.privacy import PrivacyLedger, compute_epsilon, get_epsilon
        print("opacus" in sys.modules, compute_epsilon(0.25, 1.0, 0, 0.01), compute_epsilon(0.25, 0.0, 3, 0.01))
        ledger = PrivacyLedger("rdp-classic", delta={DELTA!r})
        print("opacus" in sys.modules)
        for _ in range({T}):
            ledger.record(noise_multiplier=1.0, sample_rate=0.25)
        print(repr(get_epsilon(ledger.accountant, ledger.delta)))
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[:2] == ["False 0.0 inf", "True"]  # the trivial answers need no accountant
    # the same float in a fresh process as here, where Opacus was imported first
    assert float(lines[2]) == compute_epsilon(0.25, 1.0, T, DELTA, accountant="rdp-classic")


def test_analysis_imports_nothing_from_the_package_above():
    import ast
    from pathlib import Path

    import fbo_torch.privacy.analysis as analysis

    for path in Path(analysis.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                assert node.level == 0, path
                assert not mod.startswith("fbo_torch.privacy") or mod.startswith("fbo_torch.privacy.analysis"), (
                    path,
                    mod,
                )
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("fbo_torch.privacy") for a in node.names), path


def test_default_accountant_is_defined_once():
    import dataclasses
    import inspect

    from fbo_torch.federation.server import DPFTSDEServer
    from fbo_torch.federation.settings import PrivacySettings
    from fbo_torch.flower.config import FlowerRunConfig
    from fbo_torch.privacy import DEFAULT_ACCOUNTANT
    from fbo_torch.simulate.dp_fts_de import DPFTSDERunner

    assert DEFAULT_ACCOUNTANT in ACCOUNTANTS
    for fn in (DPFTSDEServer, DPFTSDERunner, PrivacyLedger, compute_epsilon, calibrate_noise):
        assert inspect.signature(fn).parameters["accountant"].default == DEFAULT_ACCOUNTANT, fn
    assert FlowerRunConfig.from_run_config({}).privacy.accountant == DEFAULT_ACCOUNTANT
    assert {f.name: f.default for f in dataclasses.fields(PrivacySettings)}["accountant"] == DEFAULT_ACCOUNTANT
