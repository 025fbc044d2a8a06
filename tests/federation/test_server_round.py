"""The server's round (plan, then release), what it does with invalid messages, and hostile agents."""

import functools
import math

import pytest
import torch

from fbo_torch.federation import DPAggregator, clip_vectors
from fbo_torch.federation.faults import BYZANTINE_KINDS, FaultInjector
from fbo_torch.federation.server import DPFTSDEServer
from fbo_torch.federation.settings import DPFTSDESettings
from fbo_torch.objectives import build_objective
from fbo_torch.optim.domain import Domain
from fbo_torch.simulate.dp_fts_de import DPFTSDERunner

f64 = torch.float64
N, M, P = 6, 8, 2
BOUNDS = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64)


def _server(accountant="rdp", **kw):
    kw = {"num_regions": P, "sample_rate": 0.5, "noise_multiplier": 1.0, "clip_norm": 2.0, "num_features": M, **kw}
    s = DPFTSDESettings(**kw)
    return DPFTSDEServer(N, BOUNDS, s, torch.tensor([5], dtype=torch.int64), accountant=accountant)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_one_non_finite_vector_does_not_poison_the_release(bad):
    """One agent's ω with one non-finite entry: dropped (not sampled, counted invalid), every broadcast
    entry finite and equal to the release without that agent, sampled or not (its coin is irrelevant)."""
    omegas = torch.randn(1, N, M, dtype=f64, generator=torch.Generator().manual_seed(0))
    for agent in range(N):
        server, clean = _server(), _server()
        poisoned = omegas.clone()
        poisoned[0, agent, 3] = bad
        server.plan(1, 0.5), clean.plan(1, 0.5)
        out = server.release(poisoned)
        rec = server.last_record
        assert torch.isfinite(out).all()
        assert not rec.valid[0, agent] and not rec.sampled[0, agent] and int(rec.num_invalid[0]) == 1
        reported = torch.ones(1, N, dtype=torch.bool)
        reported[0, agent] = False
        torch.testing.assert_close(out, clean.release(omegas, reported=reported), rtol=0, atol=0)
        assert server.epsilons == clean.epsilons  # the accounting is the dropout's


def test_a_vector_whose_norm_overflows_is_clipped_onto_the_bound():
    w = torch.randn(3, M, dtype=f64) * 1e300  # finite entries, norm = inf in float64
    assert torch.isfinite(w).all() and not torch.isfinite(w.norm(dim=-1)).any()
    out, was = clip_vectors(w, 1.5)
    assert was.all() and torch.isfinite(out).all()
    torch.testing.assert_close(out.norm(dim=-1), torch.full((3,), 1.5, dtype=f64), rtol=1e-14, atol=0)
    assert (torch.sign(out) == torch.sign(w)).all()  # each entry keeps its sign
    moderate = torch.randn(3, M, dtype=f64) * 1e100  # below the saturation: the direction is kept exactly
    out, _ = clip_vectors(moderate, 1.5)
    torch.testing.assert_close(out, moderate / moderate.norm(dim=-1, keepdim=True) * 1.5, rtol=1e-14, atol=0)


def test_a_round_without_a_valid_message_releases_nothing_and_charges_nothing():
    server = _server()
    assert server.plan(1, 0.5)
    assert server.release(torch.randn(1, N, M, dtype=f64)) is not None
    eps1 = server.epsilon
    assert server.plan(2, 0.5)
    assert server.release(torch.full((1, N, M), math.nan, dtype=f64), num_valid=0) is None
    assert server.ledger.rounds == 1 and server.epsilon == eps1
    assert [(r.round, r.released, r.reason) for r in server.rounds] == [(1, True, ""), (2, False, "no valid message")]
    assert server.plan(3, 0.5)  # the federation goes on


def test_rounds_are_planned_and_released_in_order_and_recorded_once():
    server = _server(max_epsilon=3.0)
    with pytest.raises(RuntimeError, match="plan"):
        server.release(torch.zeros(1, N, M, dtype=f64))
    assert server.plan(1, 0.5)
    with pytest.raises(RuntimeError, match="release round 1"):
        server.plan(2, 0.5)
    server.release(torch.zeros(1, N, M, dtype=f64))
    with pytest.raises(RuntimeError, match="plan round 2"):
        server.plan(3, 0.5)
    t = 2
    while server.plan(t, 0.5):
        server.release(torch.zeros(1, N, M, dtype=f64))
        t += 1
    assert server.rounds[-1].reason == "budget" and server.epsilon <= 3.0
    assert not server.plan(t + 1, 0.5) and server.rounds[-1].reason == "budget"  # stopped for good
    assert len(server.rounds) == t + 1 and server.ledger.rounds == t - 1


def test_a_saved_server_is_verified_against_its_ledger():
    server = _server()
    for t in (1, 2, 3):
        server.plan(t, 0.5)
        server.release(torch.randn(1, N, M, dtype=f64))
    state = server.state_dict()
    fresh = _server()
    fresh.load_state_dict(state)
    assert fresh.epsilons == server.epsilons and fresh.ledger.rounds == 3
    lowered = dict(state, rounds=[dict(r, epsilon=r["epsilon"] / 2) for r in state["rounds"]])
    with pytest.raises(ValueError, match="refusing"):
        _server().load_state_dict(lowered)
    forged = dict(state, ledger=dict(state["ledger"], epsilons=[e / 2 for e in state["ledger"]["epsilons"]]))
    with pytest.raises(ValueError, match="do not follow from its steps"):
        _server().load_state_dict(forged)
    rolled_back = dict(state, ledger=_one_release_ledger())  # 3 releases recorded, a ledger of 1
    with pytest.raises(ValueError, match="cannot account"):
        _server().load_state_dict(rolled_back)


def _one_release_ledger():
    s = _server()
    s.plan(1, 0.5)
    s.release(torch.randn(1, N, M, dtype=f64))
    return s.ledger.state_dict()


def test_fault_config_names_the_bad_key():
    with pytest.raises(ValueError, match="byzantine_kind"):
        DPFTSDESettings(faults={"byzantine_rate": 0.2, "byzantine_kind": "evil"})
    with pytest.raises(ValueError, match="faults.byzantine_rate"):
        DPFTSDESettings(faults={"byzantine_rate": 1.0})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['byzantine'\]"):
        DPFTSDESettings(faults={"byzantine": 0.2})


def test_hostile_agents_send_their_attack_every_round_and_honest_agents_are_untouched():
    keys = torch.arange(400, dtype=torch.int64)
    omegas = torch.randn(400, M, dtype=f64)
    for kind in BYZANTINE_KINDS:
        f = FaultInjector(byzantine_rate=0.25, byzantine_kind=kind)
        hostile = f.byzantine(keys)
        assert abs(hostile.double().mean().item() - 0.25) < 5 * math.sqrt(0.25 * 0.75 / 400)
        assert torch.equal(hostile, f.byzantine(keys))  # the same agents in every round
        sent = f.corrupt(omegas, keys, round=3)
        assert torch.equal(sent[~hostile], omegas[~hostile])
        finite = torch.isfinite(sent[hostile]).all(-1)
        assert (~finite).all() if kind in ("nan", "inf") else finite.all()
        if kind in ("nan", "inf"):
            assert (torch.isfinite(sent[hostile]).sum(-1) == M - 1).all()  # one poisoned entry each


@functools.cache
def _honest():
    return _run(None)


def _run(faults, R=16):
    obj = build_objective(
        {
            "type": "gp_grid",
            "num_groups": 1,
            "agents_per_group": 8,
            "perturb_first": True,
            "perturbation": 0.02,
            "grid_size": 200,
            "lengthscale": 0.05,
        }
    )
    s = DPFTSDESettings(
        num_iterations=10,
        num_init=3,
        num_features=30,
        rff_lengthscale=0.05,
        num_regions=2,
        sample_rate=0.75,
        noise_multiplier=0.5,
        clip_norm=2.0,
        gp_sample_features=32,
        gp_fit_maxiter=15,
        p1_equals_p2=False,
        faults=faults,
    )
    runner = DPFTSDERunner(obj, s, num_inits=R, domain=Domain(obj.bounds, obj.candidates), seed=1)
    releases, release = [], runner.server.release

    def record(*args, **kwargs):
        out = release(*args, **kwargs)
        releases.append(out)
        return out

    runner.server.release = record
    res = runner.run()
    per_rep = res.loss[:, -1].view(R, -1).mean(1)  # agents of a repetition share broadcasts: reps are the units
    return res, releases, per_rep, runner


@pytest.mark.parametrize("kind", BYZANTINE_KINDS)
def test_a_federation_with_hostile_agents_runs_to_the_end_with_finite_broadcasts_and_honest_regret(kind):
    honest, _, h, _ = _honest()
    res, releases, b, runner = _run({"byzantine_rate": 0.25, "byzantine_kind": kind})
    assert int(runner.faults.byzantine(runner.agent_keys).sum()) > 16  # ~25% of 128 agents are hostile
    assert len(releases) == 10 and all(torch.isfinite(x).all() for x in releases)
    assert res.epsilon == honest.epsilon  # invalid messages change no accounting
    assert torch.isfinite(res.loss).all() and res.used_server.any()
    # regret close to the honest run's: within 3 standard errors of the difference of the means
    se = math.sqrt(h.var().item() / h.numel() + b.var().item() / b.numel())
    assert b.mean().item() <= h.mean().item() + 3 * se, (b.mean().item(), h.mean().item(), se)


def test_a_non_probability_p_t_or_sample_rate_is_refused():
    """Before: plan(p_t=NaN) was accepted (NaN < threshold is False: it released), and a DPAggregator
    sample rate given as the text "0.5" was read as 0.5."""

    with pytest.raises(ValueError, match="`p_t` must lie in"):
        _server().plan(1, math.nan)
    with pytest.raises(TypeError, match="`sample_rate` must be a number, got str '0.5'"):
        DPAggregator("0.5", 1.0, 1.0, torch.ones(1, N, dtype=f64))


def test_the_server_asks_the_algorithm_whether_it_is_private(monkeypatch):
    """Private or not is the algorithm's say (``Method.is_private``), not a re-spelled ``z > 0``."""
    from fbo_torch.methods.fts_de import FTSDE

    assert _server().private and _server().ledger is not None
    assert not _server(noise_multiplier=0.0).private  # FTSDE: z > 0
    monkeypatch.setattr(FTSDE, "is_private", classmethod(lambda cls, settings: False))
    server = _server()  # z = 1, but the algorithm says it does not release privately
    assert not server.private and server.ledger is None and math.isnan(server.epsilon)
