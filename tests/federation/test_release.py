"""The release mechanisms behind one interface: the registry, each built-in's release equal bit for bit to the
arithmetic it wraps (the central :class:`DPAggregator`, the secure :class:`SecureMechanism`), what the ledgers are
told, and a mechanism registered by a user, run by the server without any change to it."""

import math

import pytest
import torch

from fbo_torch.federation.aggregator import DPAggregator
from fbo_torch.federation.release import (
    RELEASES,
    CentralGaussianRelease,
    ReleaseMechanism,
    SecureDiscreteGaussianRelease,
    check_aggregation,
    get_release,
    register_release,
    unregister_release,
)
from fbo_torch.federation.secure import SecureMechanism, agent_secret, research_master
from fbo_torch.federation.server import DPFTSDEServer
from fbo_torch.federation.settings import DPFTSDESettings
from fbo_torch.protocol.randomness import KeyedServerRandomness, SecretServerRandomness

f64 = torch.float64
N, M, P, R = 6, 5, 2, 3
BOUNDS = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64)
SETTINGS = dict(num_regions=P, sample_rate=0.5, noise_multiplier=1.0, clip_norm=2.0, num_features=M)
KEYS = torch.tensor([5, 7, 11], dtype=torch.int64)


def _omegas(seed=0):
    return 3 * torch.randn(R, N, M, dtype=f64, generator=torch.Generator().manual_seed(seed))


def test_the_registry_holds_the_two_built_in_mechanisms_by_their_aggregation_names():
    assert RELEASES["central"] is CentralGaussianRelease and RELEASES["secure"] is SecureDiscreteGaussianRelease
    assert CentralGaussianRelease.sees_messages and not SecureDiscreteGaussianRelease.sees_messages
    assert check_aggregation("secure") == "secure"
    with pytest.raises(ValueError, match=r"`aggregation` must be one of .*'centrl'.*did you mean 'central'"):
        get_release("centrl")
    with pytest.raises(ValueError, match="`aggregation`"):
        DPFTSDESettings(aggregation="local", **SETTINGS)
    with pytest.raises(ValueError, match="takes a ReleaseMechanism subclass"):
        register_release(int)
    with pytest.raises(ValueError, match="non-empty string"):
        register_release(type("Nameless", (ReleaseMechanism,), {}))
    with pytest.raises(ValueError, match="already registered"):
        register_release(type("Other", (CentralGaussianRelease,), {"name": "central"}))


def test_each_mechanism_owns_its_parameter_checks():
    with pytest.raises(ValueError, match="needs `clip_norm`"):
        DPFTSDESettings(aggregation="secure", **{**SETTINGS, "clip_norm": None, "noise_multiplier": 0.0})
    DPFTSDESettings(**{**SETTINGS, "clip_norm": None, "noise_multiplier": 0.0})  # FTS-DE releases unclipped
    secure = DPFTSDESettings(aggregation="secure", dropout_tolerance=0.5, **SETTINGS)
    SecureDiscreteGaussianRelease.check(secure, 4)
    with pytest.raises(ValueError, match="at least 2 agents"):
        SecureDiscreteGaussianRelease.check(secure, 1)


@pytest.mark.parametrize("randomness", ["keys", "secret"])
def test_the_central_release_is_the_aggregators_bit_for_bit_and_the_ledger_is_told_z_and_q(randomness):
    settings = DPFTSDESettings(**SETTINGS)
    source = KeyedServerRandomness(KEYS) if randomness == "keys" else SecretServerRandomness(bytes(range(32)))
    server = DPFTSDEServer(N, BOUNDS, settings, source, delta=1e-4)
    assert isinstance(server.release_mechanism, CentralGaussianRelease) and server.mechanism is None
    direct = DPAggregator(0.5, 2.0, 1.0, server.aggregator.region_weights)  # the same ExplorationWeights
    again = KeyedServerRandomness(KEYS) if randomness == "keys" else SecretServerRandomness(bytes(range(32)))
    reported = torch.rand(R, N, generator=torch.Generator().manual_seed(1)) < 0.8
    for t in (1, 2, 3):
        omegas = _omegas(t)
        assert server.plan(t, 0.5)
        out = server.release(omegas, reported=reported)
        expected = direct.aggregate(omegas, round=t, reported=reported, randomness=again)
        assert torch.equal(out, expected)
        rec, ref = server.last_record, direct.history[-1]
        assert torch.equal(rec.sampled, ref.sampled) and torch.equal(rec.noise_norm, ref.noise_norm)
    assert server.ledger.accountant.history == [(1.0, 0.5, 3)]
    assert server.server_ledger is None and math.isnan(server.epsilon_server)


def test_the_secure_release_decodes_the_sum_bit_for_bit_and_both_ledgers_are_told_their_shares():
    settings = DPFTSDESettings(aggregation="secure", dropout_tolerance=0.34, **SETTINGS)  # k_min = 4
    server = DPFTSDEServer(N, BOUNDS, settings, SecretServerRandomness(bytes(range(32))), delta=1e-4)
    lattice = server.mechanism
    assert isinstance(lattice, SecureMechanism) and lattice == SecureMechanism.from_settings(settings, N)
    assert server.secure and lattice.min_survivors == 4
    coins = SecretServerRandomness(bytes(range(32)))
    secrets = [agent_secret(research_master(0), r, n) for r in range(R) for n in range(N)]
    survivors = torch.ones(R, N, dtype=torch.bool)
    survivors[1, :3] = False  # 3 vectors: this federation releases nothing
    survivors[2, 0] = False  # 5 vectors: the round is charged for 5 shares
    with pytest.raises(RuntimeError, match="never receives ω"):
        server.plan(1, 0.5)
        server.release(_omegas())
    sampled, ratios = server.secure_cohort(R)
    W = server.aggregator.weights(1)
    assert torch.equal(sampled, coins.coins(1, torch.Size([R, N]), torch.zeros((), dtype=f64)) < 0.5)
    assert torch.equal(ratios, W / W.max())
    y, _ = lattice.contributions(_omegas().reshape(R * N, M), sampled.reshape(-1), ratios.T.repeat(R, 1), secrets, 1)
    total = lattice.modular_sum(y.view(R, N, -1), survivors)
    released = server.commit_secure(survivors)
    assert released.tolist() == [True, False, True]
    out = server.reveal_secure(total)
    vec, _ = lattice.decode(total)
    expected = torch.where(released.view(-1, 1, 1), vec * (float(W.max()) / 0.5), 0.0)
    assert torch.equal(out, expected)
    assert torch.equal(server.last_record.sampled, sampled & survivors)
    z = lattice.noise_multiplier_of
    assert server.ledger.accountant.history == [(z(4), 0.5, 1)]  # a curious agent knows its own share
    assert server.server_ledger.accountant.history == [(z(5), 1.0, 1)]
    assert server.privacy_parameters()["secure"]["min_survivors"] == 4


class UnamplifiedGaussianRelease(CentralGaussianRelease):
    """The central release accounted without amplification by sampling: for a server that publishes
    which agents it sampled (the worked example of ``docs/design.md``)."""

    name = "central-unamplified"

    def charge(self, num_shares=None, server=False):
        return self.settings.noise_multiplier, 1.0


@pytest.fixture
def unamplified():
    register_release(UnamplifiedGaussianRelease)
    yield UnamplifiedGaussianRelease
    unregister_release(UnamplifiedGaussianRelease.name)


def test_a_registered_mechanism_runs_in_the_server_unchanged(unamplified):
    central = DPFTSDEServer(N, BOUNDS, DPFTSDESettings(**SETTINGS), KEYS, delta=1e-4)
    mine = DPFTSDEServer(N, BOUNDS, DPFTSDESettings(aggregation=unamplified.name, **SETTINGS), KEYS, delta=1e-4)
    assert isinstance(mine.release_mechanism, unamplified)
    for t in (1, 2):
        central.plan(t, 0.5), mine.plan(t, 0.5)
        assert torch.equal(central.release(_omegas(t)), mine.release(_omegas(t)))  # the same release ...
    assert mine.ledger.accountant.history == [(1.0, 1.0, 2)]  # ... accounted as told
    assert mine.epsilon > central.epsilon
    assert mine.privacy_parameters()["aggregation"] == unamplified.name
    again = DPFTSDEServer(N, BOUNDS, DPFTSDESettings(aggregation=unamplified.name, **SETTINGS), KEYS, delta=1e-4)
    again.load_state_dict(mine.state_dict())  # a saved ledger is checked against the mechanism's charges
    assert again.epsilon == mine.epsilon
    with pytest.raises(ValueError, match="other privacy parameters"):
        central.load_state_dict(mine.state_dict())


def test_unregistering_leaves_the_built_ins():
    unregister_release("no-such-release")
    assert {"central", "secure"} <= set(RELEASES)
