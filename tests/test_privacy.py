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

from fbo_torch.privacy import (
    ACCOUNTANTS,
    ClassicRDPAccountant,
    PrivacyAccountant,
    PrivacyLedger,
    calibrate_noise,
    compute_epsilon,
    default_delta,
    get_accountant,
)
from fbo_torch.privacy.analysis import get_privacy_spent_classic

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


def _quiet_accountant(name: str, **kwargs) -> PrivacyAccountant:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_accountant(name, **kwargs)


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
    brute = [r + math.log(1 / d1) / (a - 1) for r, a in zip(rdp, orders)]
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
    acc = get_accountant("rdp-classic")
    for _ in range(T):
        acc.step(noise_multiplier=1.0, sample_rate=0.25)
    eps, order = acc.get_privacy_spent(DELTA)
    assert round(eps, 2) == 9.91
    assert order == int(order) and 2 <= order <= 256


@pytest.mark.parametrize("name", ACCOUNTANTS)
def test_zero_noise_and_zero_steps(name):
    assert compute_epsilon(0.3, 0.0, 10, DELTA, accountant=name) == math.inf
    assert compute_epsilon(0.3, 1.0, 0, DELTA, accountant=name) == 0.0
    acc = _quiet_accountant(name)
    assert acc.get_epsilon(DELTA) == 0.0 and len(acc) == 0
    acc.step(2.0, 0.1)
    acc.step(0.0, 0.1)  # one non-private release: no privacy left, whatever follows
    acc.step(2.0, 0.1)
    assert acc.get_epsilon(DELTA) == math.inf


# --------------------------------------------------------------------------- #
# accountant interface
# --------------------------------------------------------------------------- #


def _heterogeneous_steps(acc: PrivacyAccountant, start: int, stop: int) -> None:
    """Step rounds start..stop-1 with a (z, q) schedule that changes every few rounds."""
    for i in range(start, stop):
        acc.step(noise_multiplier=1.0 + 0.5 * (i // 6), sample_rate=0.02 if i % 7 < 5 else 0.03)


def test_history_run_length_and_len():
    acc = get_accountant("rdp")
    _heterogeneous_steps(acc, 0, 15)
    assert len(acc) == 15
    assert sum(n for _, _, n in acc.history) == 15
    assert acc.history[0] == (1.0, 0.02, 5)
    assert acc.mechanism() == "rdp"
    # heterogeneous composition: splitting a constant run into segments changes nothing
    a, b = get_accountant("rdp-classic"), get_accountant("rdp-classic")
    a.history = [(1.0, 0.25, 40)]
    b.history = [(1.0, 0.25, 10), (1.0, 0.25, 30)]
    assert a.get_epsilon(DELTA) == pytest.approx(b.get_epsilon(DELTA), rel=1e-12)
    # and a heterogeneous run lies between the all-low and all-high runs
    c = get_accountant("rdp-classic")
    c.history = [(1.0, 0.25, 20), (1.5, 0.25, 20)]
    lo, hi = compute_epsilon(0.25, 1.5, 40, DELTA, "rdp-classic"), a.get_epsilon(DELTA)
    assert lo < c.get_epsilon(DELTA) < hi


def test_gdp_heterogeneous_composes_mu():
    acc = _quiet_accountant("gdp")
    acc.history = [(1.0, 0.25, 20), (2.0, 0.1, 30)]
    one = _quiet_accountant("gdp")
    one.history = [(1.0, 0.25, 20)]
    two = _quiet_accountant("gdp")
    two.history = [(2.0, 0.1, 30)]
    assert acc.get_mu() == pytest.approx(math.hypot(one.get_mu(), two.get_mu()))
    # a single segment agrees with Opacus' GaussianAccountant
    assert one.get_epsilon(DELTA) == pytest.approx(one.to_opacus().get_epsilon(DELTA), rel=1e-9)


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
    assert sum(n for *_, n in state["history"]) == 10
    assert resumed.history == full.history
    assert len(resumed) == len(full) == 15
    if name != "prv":  # prv is a deterministic function of the same history; skip the cost
        assert resumed.get_epsilon(DELTA) == full.get_epsilon(DELTA)


def test_state_dict_is_opacus_compatible():
    from opacus.accountants import RDPAccountant as OpacusRDP

    ours = get_accountant("rdp")
    _heterogeneous_steps(ours, 0, 12)
    theirs = OpacusRDP()
    theirs.load_state_dict(ours.state_dict())
    assert theirs.get_epsilon(DELTA) == pytest.approx(ours.get_epsilon(DELTA), rel=1e-12)
    other = get_accountant("rdp-classic")
    with pytest.raises(ValueError, match="mechanism"):
        other.load_state_dict(ours.state_dict())
    with pytest.raises(ValueError, match="empty"):
        other.load_state_dict({})
    with pytest.raises(ValueError, match="sample_rate"):
        other.load_state_dict({"history": [(1.0, 1.5, 3)], "mechanism": "rdp-classic"})


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
    assert ledger.rounds == T == len(ledger.epsilons) == len(ledger.accountant)
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
    resumed = PrivacyLedger("rdp-classic", delta=0.5)  # delta and budget come from the state
    resumed.load_state_dict(first.state_dict())
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
    fewer = dict(state, accountant={"history": [(1.0, 0.35, 2)], "mechanism": ledger.mechanism},
                 epsilons=state["epsilons"][:2])  # consistent, but a history cut short...
    resumed = PrivacyLedger(accountant, num_agents=N)
    resumed.load_state_dict(fewer)  # ...is a valid ledger of 2 releases: the server checks its own round count
    assert resumed.rounds == 2


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
    acc = ClassicRDPAccountant(orders=range(2, 65))
    ledger = PrivacyLedger(acc, num_agents=N)
    ledger.record(1.0, 0.25)
    assert ledger.mechanism == "rdp-classic" and len(acc) == 1
    with pytest.raises(ValueError, match="no recorded steps"):
        PrivacyLedger(acc, num_agents=N)


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
        get_accountant("moments")
    acc = get_accountant("rdp-classic")
    with pytest.raises(ValueError, match="sample_rate"):
        acc.step(1.0, 0.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        acc.step(-0.5, 0.1)
    with pytest.raises(ValueError, match="delta"):
        acc.get_epsilon(0.0)
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
# lazy Opacus import
# --------------------------------------------------------------------------- #


def test_lazy_opacus_import():
    code = textwrap.dedent(
        """
        import sys
        import fbo_torch.privacy as P
        assert "opacus" not in sys.modules, "import fbo_torch.privacy imported opacus"
        # input validation needs no opacus either
        try:
            P.compute_epsilon(0.0, 1.0, 10, 1e-5)
        except ValueError:
            pass
        assert "opacus" not in sys.modules
        # pretend opacus is not installed
        sys.modules["opacus"] = None
        for name in P.ACCOUNTANTS:
            try:
                P.get_accountant(name)
            except ImportError as err:
                assert "pip install opacus" in str(err), str(err)
            else:
                raise AssertionError(name + " did not raise ImportError")
        print("OK")
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "OK"


# --------------------------------------------------------------------------- #
# Opacus-native "rdp-classic" (issue 13.4)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(("q", "z"), list(PAPER))
def test_rdp_classic_is_an_opacus_accountant(q, z):
    # Opacus' own factory creates it and it reports the paper's epsilon
    from opacus.accountants import IAccountant, create_accountant

    get_accountant("rdp-classic")  # any fbo_torch accountant registers it
    acc = create_accountant("rdp-classic")
    assert isinstance(acc, IAccountant) and acc.mechanism() == "rdp-classic"
    for _ in range(T):
        acc.step(noise_multiplier=z, sample_rate=q)
    assert acc.history == [(z, q, T)] and len(acc) == 1  # Opacus' len: history segments
    assert round(acc.get_epsilon(DELTA), 2) == PAPER[(q, z)]
    assert acc.get_epsilon(DELTA) == compute_epsilon(q, z, T, DELTA, accountant="rdp-classic")


def test_rdp_classic_state_dicts_are_interchangeable_with_opacus():
    from opacus.accountants import create_accountant

    ours = get_accountant("rdp-classic")
    for k in range(12):
        ours.step(1.0 + 0.1 * (k // 4), 0.25)
    theirs = create_accountant("rdp-classic")
    theirs.load_state_dict(ours.state_dict())
    assert theirs.get_epsilon(DELTA) == ours.get_epsilon(DELTA)
    assert ours.to_opacus().get_epsilon(DELTA) == ours.get_epsilon(DELTA)
    back = get_accountant("rdp-classic")
    back.load_state_dict(theirs.state_dict())
    assert back.history == ours.history
    with pytest.raises(ValueError, match="default orders"):
        ClassicRDPAccountant(orders=[2, 3, 4]).to_opacus()


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha:UserWarning")
@pytest.mark.parametrize("name", ["rdp", "rdp-classic", "prv"])
def test_calibrate_noise_agrees_with_opacus_get_noise_multiplier(name):
    # calibrate_noise keeps its own (faster) search; Opacus' calibration must land in the same window
    from opacus.accountants.utils import get_noise_multiplier

    q, steps, target, tol = 0.02, 100, 1.0, 0.01
    ours = calibrate_noise(target, q, steps, DELTA, accountant=name, epsilon_tolerance=tol)
    theirs = get_noise_multiplier(target_epsilon=target, target_delta=DELTA, sample_rate=q, steps=steps,
                                  accountant=name, epsilon_tolerance=tol)
    for z in (ours, theirs):
        assert target - tol <= compute_epsilon(q, z, steps, DELTA, accountant=name) <= target


@pytest.mark.filterwarnings("ignore:Secure RNG turned off:UserWarning", "ignore:Full backward hook:UserWarning")
def test_opacus_privacy_engine_trains_with_rdp_classic():
    import torch
    from opacus import PrivacyEngine

    get_accountant("rdp-classic")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    engine = PrivacyEngine(accountant="rdp-classic")
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), data_loader=loader,
        noise_multiplier=1.1, max_grad_norm=1.0,
    )
    steps = 0
    for X, Y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X), Y).backward()
        opt.step()
        steps += 1
    eps = engine.get_epsilon(1e-5)
    assert eps == pytest.approx(compute_epsilon(16 / 64, 1.1, steps, 1e-5, accountant="rdp-classic"), rel=1e-12)


def test_opacus_imported_first_gets_rdp_classic_at_import():
    code = textwrap.dedent(
        """
        import opacus.accountants
        import fbo_torch.privacy
        from opacus.accountants import create_accountant
        from opacus.accountants.utils import get_noise_multiplier
        print(type(create_accountant("rdp-classic")).__name__)
        z = get_noise_multiplier(target_epsilon=9.91, target_delta=200 ** -1.1, sample_rate=0.25, steps=40,
                                 accountant="rdp-classic", epsilon_tolerance=0.005)
        print(abs(z - 1.0) < 0.005)
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["OpacusClassicRDPAccountant", "True"]
