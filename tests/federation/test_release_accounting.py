"""One computation of epsilon per release mechanism: the worst case a node's privacy floor checks
(ReleaseMechanism.worst_case_epsilon) is what the mechanism's own ledgers record for the charges it makes."""

import math

import pytest

from fbo_torch.federation.release import ReleaseMechanism, get_release, secure_epsilons
from fbo_torch.federation.settings import DPFTSDESettings

N, T, DELTA = 6, 5, 1e-5
SETTINGS = dict(num_regions=2, sample_rate=0.5, noise_multiplier=1.0, clip_norm=2.0, num_features=5)


def _charged(ledger, charge, times=T):
    for _ in range(times):
        ledger.record(*charge)
    return ledger.epsilon


@pytest.mark.parametrize("accountant", ["rdp", "rdp-classic"])
def test_a_central_release_s_worst_case_is_its_ledger_after_t_releases(accountant):
    release = get_release("central").accounting(DPFTSDESettings(**SETTINGS), N)
    ledger, server_ledger = release.ledgers(accountant, DELTA, None)
    assert server_ledger is None
    eps = release.worst_case_epsilon(T, DELTA, accountant, threshold=2)
    assert eps == pytest.approx(_charged(ledger, release.charge()), rel=1e-12) and 0 < eps < math.inf
    assert release.worst_case_epsilon(0, DELTA, accountant, threshold=2) == 0.0


def test_a_secure_release_s_worst_case_is_the_larger_of_its_two_ledgers():
    settings = DPFTSDESettings(aggregation="secure", dropout_tolerance=0.25, **SETTINGS)
    release = get_release("secure").accounting(settings, N)
    t = release.lattice.min_survivors
    ledger, server_ledger = release.ledgers("rdp", DELTA, None)
    against_server, against_agents = secure_epsilons(release.lattice, t, settings.sample_rate, T, DELTA)
    assert against_agents == pytest.approx(_charged(ledger, release.charge()), rel=1e-12)
    assert against_server == pytest.approx(_charged(server_ledger, release.charge(t, server=True)), rel=1e-12)
    assert release.worst_case_epsilon(T, DELTA, "rdp", t) == max(against_server, against_agents)
    assert secure_epsilons(release.lattice, t, settings.sample_rate, 0, DELTA) == (0.0, 0.0)


def test_a_mechanism_built_for_accounting_cannot_release():
    release = get_release("secure").accounting(DPFTSDESettings(aggregation="secure", **SETTINGS), N)
    assert isinstance(release, ReleaseMechanism)
    with pytest.raises(RuntimeError, match="built for accounting"):
        release.aggregator.weights(1)
