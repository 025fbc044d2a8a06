"""Secure aggregation's agent-side mechanism: bounds (at the bound), sensitivity, hostile integers, accounting."""

import math

import numpy as np
import pytest
import torch
from opacus.accountants.analysis.rdp import get_privacy_spent

from fbo_torch.federation.secure import SecureMechanism, agent_secret, min_survivors, research_master
from fbo_torch.federation.server import DPFTSDEServer
from fbo_torch.federation.settings import DPFTSDESettings
from fbo_torch.objectives import build_objective
from fbo_torch.privacy.analysis.ddg import compute_rdp_ddg, compute_rdp_poisson_subsampled
from fbo_torch.privacy.ddg import DDG_ORDERS
from fbo_torch.simulate.dp_fts_de import DPFTSDERunner

f64 = torch.float64
N, M, P = 5, 6, 2
SECRETS = [agent_secret(research_master(0), 0, n) for n in range(N)]


def mech(**kw):
    args = dict(
        num_agents=N, num_regions=P, num_features=M, clip_norm=2.0, noise_multiplier=1.0, min_survivors=N, scale=1024
    )
    return SecureMechanism(**{**args, **kw})


def test_the_honest_sum_cannot_wrap_and_one_bit_less_would():
    m = mech()
    A, bits = m.entry_bound, m.bits
    assert A == math.ceil(1024 / math.sqrt(P)) + 40 * math.ceil(math.sqrt(m.local_variance))
    assert 2 * m.sum_bound < m.modulus <= 4 * m.sum_bound + 1
    for sign in (1, -1):  # every agent at the largest honest entry, in every coordinate
        y = torch.full((N, m.dim), sign * A, dtype=torch.int64)
        total = m.modular_sum(y, torch.ones(N, dtype=torch.bool))
        assert torch.equal(m.centre(total), torch.full((m.dim,), sign * N * A))
        smaller = 1 << (bits - 1)  # one bit less: the same sum wraps
        r = (sign * N * A) % smaller
        assert (r - smaller if r >= smaller // 2 else r) != sign * N * A


def test_every_contribution_is_within_the_bounds_the_proofs_use():
    m = mech()
    big = torch.zeros(N, M, dtype=f64)
    big[:, 0] = 1e300  # clipped to S/√P, all in one entry: the largest honest signal entry
    big[1] = torch.randn(M, dtype=f64) * 50
    sampled = torch.ones(N, dtype=torch.bool)
    ratios = torch.ones(N, P, dtype=f64)
    signal_max = math.ceil(m.scale / math.sqrt(P))
    for t in range(1, 6):
        y, clipped = m.contributions(big, sampled, ratios, SECRETS, t)
        assert y.dtype == torch.int64 and tuple(y.shape) == (N, m.dim) and clipped.all()
        assert int(y.abs().max()) <= m.entry_bound
        quiet = SecureMechanism(**{**m.__dict__, "noise_multiplier": 0.0})  # the signal alone
        s, _ = quiet.contributions(big, sampled, ratios, SECRETS, t)
        assert int(s.abs().max()) <= signal_max
        assert float(s.to(f64).norm(dim=-1).max()) <= m.l2_sensitivity  # ‖round(x)‖₂ ≤ c + √d
        assert float(s.to(f64).abs().sum(-1).max()) <= m.l1_sensitivity


def test_the_null_message_is_exactly_the_noise_share_and_ratios_cannot_be_inflated():
    m = mech()
    omegas = torch.randn(N, M, dtype=f64)
    ratios = torch.full((N, P), 0.5, dtype=f64)
    noise, _ = m.contributions(torch.zeros(N, M, dtype=f64), torch.ones(N, dtype=torch.bool), ratios, SECRETS, 3)
    for sampled, om in (
        (torch.zeros(N, dtype=torch.bool), omegas),  # not sampled
        (torch.ones(N, dtype=torch.bool), torch.full((N, M), math.nan, dtype=f64)),
    ):  # invalid ω
        y, _ = m.contributions(om, sampled, ratios, SECRETS, 3)
        assert torch.equal(y, noise)
    # a server sending ratios above 1 cannot make an agent exceed the sensitivity
    y_hi, _ = m.contributions(omegas, torch.ones(N, dtype=torch.bool), torch.full((N, P), 1e6, dtype=f64), SECRETS, 3)
    y_one, _ = m.contributions(omegas, torch.ones(N, dtype=torch.bool), torch.ones(N, P, dtype=f64), SECRETS, 3)
    assert torch.equal(y_hi, y_one)


def test_rounding_is_unbiased_over_rounds():
    m = mech(noise_multiplier=0.0, scale=8)  # a coarse lattice, no noise: the rounding alone
    omegas = torch.randn(N, M, dtype=f64, generator=torch.Generator().manual_seed(1)) * 0.3
    ratios = torch.rand(N, P, dtype=f64, generator=torch.Generator().manual_seed(2))
    sampled = torch.ones(N, dtype=torch.bool)
    ys = torch.stack([m.contributions(omegas, sampled, ratios, SECRETS, t)[0] for t in range(400)]).to(f64)
    from fbo_torch.federation import clip_vectors

    clipped, _ = clip_vectors(omegas, m.clip_norm / math.sqrt(P))
    x = (ratios[:, :, None] * clipped[:, None, :] * (m.scale / m.clip_norm)).reshape(N, -1)
    frac = x - x.floor()
    se = (frac * (1 - frac) / len(ys)).sqrt().clamp_min(1e-3)
    assert ((ys.mean(0) - x).abs() <= 5 * se).all()
    assert ((ys - x).abs() < 1).all()


def test_a_hostile_agents_integers_shift_the_sum_but_cannot_cross_into_another_agents():
    m = mech()
    omegas = torch.randn(N, M, dtype=f64)
    y, _ = m.contributions(omegas, torch.ones(N, dtype=torch.bool), torch.ones(N, P, dtype=f64), SECRETS, 1)
    honest = y[:4].sum(0)  # agents 0..3 honest, agent 4 hostile
    honest_dec, out = m.decode(m.reduce(honest))
    assert int(out) == 0
    gen = torch.Generator().manual_seed(3)
    attacks = [
        torch.full((m.dim,), m.modulus - 1),
        torch.full((m.dim,), m.modulus // 2),
        torch.randint(0, m.modulus, (m.dim,), generator=gen),
    ]
    for v in attacks:
        total = m.reduce(honest + v)
        released, flagged = m.decode(total)
        # the hostile residue enters additively: removing it gives back the honest sum exactly
        assert torch.equal(m.decode(m.reduce(total - v))[0], honest_dec)
        # whatever it sent, every coordinate moved by at most 2B lattice units, the vector by at most 2R
        lattice = m.clip_norm / m.scale
        assert float((released - honest_dec).abs().max()) <= 2 * m.release_entry_bound * lattice + 1e-9
        assert float(released.abs().max()) <= m.release_entry_bound * lattice
        assert float((released - honest_dec).norm()) <= 2 * m.release_norm_bound * lattice * (1 + 1e-12)
    assert int(m.decode(m.reduce(honest + attacks[1]))[1]) > 0  # an impossible sum is flagged


def test_the_release_bounds_hold_for_honest_sums_and_are_far_inside_the_worst_case():
    """B and R hold an honest sum of N shares but with probability < 1e-30 (sub-Gaussian tails, tau = 12):
    at tau = 3 the same tail bounds predict the fraction of coordinates outside, which a sample matches."""
    m = mech()
    sigma = math.sqrt(m.local_variance)
    assert m.release_entry_bound == N * math.ceil(m.scale / math.sqrt(P)) + math.ceil(12 * math.sqrt(N) * sigma)
    assert m.release_entry_bound < m.sum_bound / 3  # 40 N sigma of noise range before, 12 sqrt(N) sigma now
    zeros = torch.zeros(N, M, dtype=f64)
    sums = torch.stack(
        [
            m.contributions(zeros, torch.zeros(N, dtype=torch.bool), torch.ones(N, P, dtype=f64), SECRETS, t)[0].sum(0)
            for t in range(1, 201)
        ]
    ).to(f64)  # 200 rounds of pure noise: 200 x d sums of N shares
    assert float(sums.abs().max()) < 12 * math.sqrt(N) * sigma and float(sums.norm(dim=-1).max()) < m.release_norm_bound
    outside = float((sums.abs() > 3 * math.sqrt(N) * sigma).double().mean())
    assert outside <= 2 * math.exp(-4.5)  # the sub-Gaussian bound at tau = 3 (a Gaussian gives 0.0027)
    for total in sums.to(torch.int64):
        assert int(m.decode(m.reduce(total))[1]) == 0


def test_mechanism_constants_are_checked_naming_the_setting():
    with pytest.raises(ValueError, match="min_survivors = 1"):
        mech(min_survivors=1)
    with pytest.raises(ValueError, match="at least 2 agents"):
        mech(num_agents=1, min_survivors=1)
    with pytest.raises(ValueError, match="lattice_scale"):
        mech(scale=2**20)
    with pytest.raises(ValueError, match="clip_norm"):
        mech(clip_norm=math.inf)
    with pytest.raises(ValueError, match="aggregation"):
        DPFTSDESettings(aggregation="federated")
    with pytest.raises(ValueError, match="needs `clip_norm`"):
        DPFTSDESettings(aggregation="secure")
    with pytest.raises(ValueError, match="dropout_tolerance"):
        DPFTSDESettings(dropout_tolerance=1.0)
    assert DPFTSDESettings().aggregation == "central"  # the default
    assert min_survivors(10, 0.25) == 8 and min_survivors(29, 0.0) == 29 and min_survivors(4, 0.5) == 2


def _objective(n=6):
    return build_objective(
        {
            "type": "gp_grid",
            "num_groups": 1,
            "agents_per_group": n,
            "grid_size": 100,
            "perturbation": 0.05,
            "perturb_first": True,
        }
    )


SETTINGS = dict(
    num_iterations=4,
    num_init=2,
    num_features=M,
    num_regions=P,
    sample_rate=0.5,
    noise_multiplier=1.0,
    clip_norm=1.0,
    gp_sample_features=16,
    gp_fit_maxiter=5,
)


def _epsilons_by_hand(settings, mechanism, shares, delta):
    """Both ε figures recomputed from the closed forms, independently of the ledger and accountant."""
    orders = list(DDG_ORDERS)

    def base(k):
        return lambda a: compute_rdp_ddg(
            a,
            l2_sensitivity=mechanism.l2_sensitivity,
            l1_sensitivity=mechanism.l1_sensitivity,
            local_variance=mechanism.local_variance,
            num_shares=k,
            dim=mechanism.dim,
        )

    others = sum(compute_rdp_poisson_subsampled(orders, settings.sample_rate, base(max(k - 1, 1))) for k in shares)
    server = sum(base(k)(np.asarray(orders, dtype=float)) for k in shares)
    return (
        get_privacy_spent(orders=orders, rdp=others, delta=delta)[0],
        get_privacy_spent(orders=orders, rdp=server, delta=delta)[0],
    )


def test_the_simulator_logs_both_epsilons_and_they_match_a_recomputation():
    settings = DPFTSDESettings(aggregation="secure", **SETTINGS)
    runner = DPFTSDERunner(_objective(), settings, 2, seed=0, delta=1e-4)
    res = runner.run()
    assert res.accountant == "ddg" and all(res.released) and len(res.epsilon_server) == 4
    mech_ = runner.server.mechanism
    for t in range(1, 5):
        others, server = _epsilons_by_hand(settings, mech_, [6] * t, 1e-4)
        assert res.epsilon[t - 1] == pytest.approx(others, rel=1e-9)
        assert res.epsilon_server[t - 1] == pytest.approx(server, rel=1e-9)
    # a curious agent removes its own share and does not know the sample; the server knows the sample
    assert res.epsilon_server[-1] != res.epsilon[-1]
    assert all(math.isfinite(v) for row in res.noise_norm for v in row)


def test_dropouts_up_to_the_tolerance_still_release_and_beyond_it_release_nothing():
    objective = _objective(8)
    faults = {"dropout_rate": 0.3}
    settings = DPFTSDESettings(aggregation="secure", dropout_tolerance=0.5, faults=faults, **SETTINGS)
    runner = DPFTSDERunner(objective, settings, 3, seed=2, delta=1e-4)
    runner.run()
    released = [r for r in runner.server.rounds if r.released]
    assert released and all(r.record.num_reported[r.record.released].min() >= 4 for r in released)
    strict = DPFTSDESettings(aggregation="secure", faults={"dropout_rate": 0.9}, **SETTINGS)  # k_min = N
    runner = DPFTSDERunner(objective, strict, 1, seed=2, delta=1e-4)
    res = runner.run()
    assert not any(res.released) and runner.ledger.rounds == 0  # too few survivors: nothing released or charged
    assert {r.reason for r in runner.server.rounds} == {"too few survivors"}


def test_a_secure_server_state_survives_a_crash_between_commit_and_reveal():
    settings = DPFTSDESettings(aggregation="secure", **SETTINGS)
    bounds = torch.tensor([[0.0], [1.0]], dtype=f64)
    server = DPFTSDEServer(4, bounds, settings, torch.tensor([1]), delta=1e-4)
    server.plan(1, 0.5)
    server.secure_cohort()
    server.commit_secure(torch.ones(1, 4, dtype=torch.bool))
    saved = server.state_dict()  # the process dies here, before the sum is revealed
    again = DPFTSDEServer(4, bounds, settings, torch.tensor([1]), delta=1e-4)
    again.load_state_dict(saved)
    assert again.rounds[0].reason == "unmask failed" and not again.rounds[0].released
    assert again.ledger.rounds == again.server_ledger.rounds == 1 and again.epsilon == server.epsilon > 0
    forged = dict(saved, server_ledger={**saved["server_ledger"], "epsilons": [0.01]})
    with pytest.raises(ValueError):
        DPFTSDEServer(4, bounds, settings, torch.tensor([1]), delta=1e-4).load_state_dict(forged)
