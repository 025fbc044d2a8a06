"""The round engine: one copy of the round for any batch, no host synchronization, faults survived."""

import math
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from fbo_torch.acquisition.search import maximize_broadcast
from fbo_torch.federation.agents import Agents
from fbo_torch.federation.faults import FaultInjector, evaluate_agents
from fbo_torch.federation.server import DPFTSDEServer
from fbo_torch.federation.settings import DPFTSDESettings
from fbo_torch.objectives.synthetic import GPSampleContinuousFederation, GPSampleGridFederation
from fbo_torch.optim.domain import Domain
from fbo_torch.protocol.keys import federation_agent_keys, federation_keys
from fbo_torch.simulate.dp_fts_de import DPFTSDERunner
from fbo_torch.utils import keyed_random as kr

f64 = torch.float64
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from op_count import SYNC_OPS


@pytest.fixture(scope="module")
def objective():
    return GPSampleContinuousFederation(
        dim=2,
        num_groups=1,
        agents_per_group=6,
        perturbation=0.05,
        perturb_first=True,
        num_basis=128,
        lengthscale=0.2,
        seed=0,
    )


def _settings(**kw):
    base = dict(
        num_iterations=4,
        num_init=3,
        num_features=30,
        rff_lengthscale=0.2,
        num_regions=2,
        sample_rate=0.6,
        noise_multiplier=1.0,
        clip_norm=5.0,
        gp_refit_every=2,
        gp_sample_features=32,
    )
    base.update(kw)
    return DPFTSDESettings(**base)


def _domain(obj):
    return Domain(
        obj.bounds, raw_samples=64, num_restarts=2, maxiter=10, raw_samples_rff=64, num_restarts_rff=2, maxiter_rff=10
    )


def test_a_round_reads_no_device_value_on_the_host(objective, monkeypatch):
    # every op that would synchronize a GPU with the host (.item(), bool(), nonzero) is counted
    # by the profiler on any device; a round (after the first, which fits the GPs) has none.
    # FBO_SYNC_FREE=1: the CPU runs the GPU's code path (a CPU otherwise stops loops early)
    monkeypatch.setenv("FBO_SYNC_FREE", "1")
    r = DPFTSDERunner(objective, _settings(), num_inits=2, domain=_domain(objective), seed=0, accountant="rdp")
    r.step()
    for _ in range(2):  # a round with and without a GP refit (refit every 2 GP updates)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            r.step()
        syncs = [e.name for e in prof.events() if e.name in SYNC_OPS]
        assert syncs == []
    assert math.isfinite(r.epsilons[-1])


@pytest.mark.cuda
def test_a_round_on_cuda_never_synchronizes(objective):
    r = DPFTSDERunner(
        objective, _settings(), num_inits=2, domain=_domain(objective), seed=0, device="cuda", accountant="rdp-classic"
    )
    r.step()  # first round: GP fit, CUDA graph captures
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        r.step()
        r.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    res = r.result()
    assert torch.isfinite(res.loss).all()


def test_one_agent_alone_computes_what_the_batched_engine_computes(objective):
    # the agent step is one function of the agent's key and data: agent 3 alone (a deployment)
    # and agent 3 among 6 (the simulator) propose the same points and send the same ω
    s = _settings()
    dom = _domain(objective)
    feats = s.features(2)
    N = 6
    keys = federation_agent_keys(0, torch.zeros(N, dtype=torch.long), torch.arange(N))
    X0 = dom.random(N, 4, keys=kr.fold(keys, "init"))
    Y0 = objective(X0, keys=keys).unsqueeze(-1)
    many = Agents(keys, X0, Y0, dom, s, feats, capacity=3)
    one = Agents(keys[3:4], X0[3:4], Y0[3:4], dom, s, feats, capacity=3)
    for t in (1, 2):
        torch.testing.assert_close(one.message(t)[0], many.message(t)[3], atol=1e-10, rtol=1e-10)
        Xa, va = many.own_proposals(t)
        Xo, vo = one.own_proposals(t)
        torch.testing.assert_close(Xo[0], Xa[3], atol=1e-7, rtol=0)
        assert torch.equal(one.use_own(t, 0.5)[0], many.use_own(t, 0.5)[3])
        y = objective(Xa.unsqueeze(1), keys=many.round_keys(t, "eval")).squeeze(-1)
        many.observe(Xa, y)
        one.observe(Xa[3:4], y[3:4])
    torch.testing.assert_close(one.gp_params[0], many.gp_params[3], atol=1e-8, rtol=1e-8)


def test_broadcast_maximizer_is_the_same_for_one_federation_or_many():
    feats = _settings().features(2)
    dom = Domain(torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64), raw_samples_rff=128, num_restarts_rff=4)
    from fbo_torch.protocol.partition import SubRegionPartition

    rb = SubRegionPartition(dom.bounds, 2).region_bounds()
    bc = torch.randn(3, 2, 30, generator=torch.Generator().manual_seed(0), dtype=f64)
    keys = federation_keys(0, torch.arange(3))
    X, v = maximize_broadcast(feats, bc, rb, dom, keys=keys)
    X1, v1 = maximize_broadcast(feats, bc[1:2], rb, dom, keys=keys[1:2])
    torch.testing.assert_close(X1[0], X[1], atol=1e-9, rtol=0)


def test_federation_survives_failed_evaluations_and_dropped_agents(objective):
    s = _settings(faults={"eval_failure_rate": 0.3, "dropout_rate": 0.4}, num_iterations=6)
    r = DPFTSDERunner(objective, s, num_inits=2, domain=_domain(objective), seed=1, accountant="rdp")
    res = r.run()
    assert res.failed.shape == (12, 6)
    # injected failures are recorded (30% of 72 agent-rounds: 21.6 expected, s.d. 3.9)
    assert 8 <= int(res.failed.sum()) <= 36
    # failed points are stored as such and kept out of the models
    assert torch.isnan(r.agents.train_Y.squeeze(-1)[:, 3:][res.failed]).all()
    assert not r.agents.mask[:, 3:][res.failed].any()
    # the server aggregated over the agents that reported: ~60% of them
    reported = [x for x in res.fraction_reported if not math.isnan(x)]
    assert 0.3 <= sum(reported) / len(reported) <= 0.9
    assert torch.isfinite(res.loss).all() and len(res.epsilon) == 6
    # accounting is unchanged by dropouts (each agent still joins with probability <= q)
    clean = DPFTSDERunner(
        objective, _settings(num_iterations=6), num_inits=2, domain=_domain(objective), seed=1, accountant="rdp"
    ).run()
    assert res.epsilon == clean.epsilon


def test_an_objective_that_raises_or_returns_nan_does_not_stop_the_run(objective):
    class Flaky(GPSampleGridFederation):
        def _evaluate(self, X, agents, noise):
            vals = super()._evaluate(X, agents, noise)
            if (agents == 2).any():
                raise RuntimeError("training diverged")
            return torch.where(agents.unsqueeze(-1) == 1, torch.nan, vals)

    obj = Flaky(num_groups=1, agents_per_group=4, grid_size=50, perturb_first=True, seed=0)
    y, f, raised = evaluate_agents(
        obj, torch.full((4, 1), 0.5, dtype=f64), torch.arange(4), kr.fold(7, torch.arange(4))
    )
    assert raised.tolist() == [False, False, True, False]
    assert torch.isnan(y[1]) and torch.isnan(y[2]) and torch.isfinite(y[[0, 3]]).all()
    f_true = obj.evaluate_true(torch.full((2, 1, 1), 0.5, dtype=f64), torch.tensor([0, 3])).squeeze(-1)
    assert torch.isnan(f[[1, 2]]).all() and torch.equal(f[[0, 3]], f_true)  # the noiseless values come along
    s = DPFTSDESettings(num_iterations=3, num_init=2, num_features=20, num_regions=1)
    res = DPFTSDERunner(obj, s, num_inits=1, seed=0).run()
    assert res.failed[1].all() and res.failed[2].all() and not res.failed[[0, 3]].any()
    assert torch.isfinite(res.loss[[0, 3]]).all()


def test_fault_injector_rates_and_validation():
    keys = kr.fold(kr.root_key(0, "faults"), torch.arange(4000))
    f = FaultInjector(eval_failure_rate=0.2, dropout_rate=0.5)
    rate = f.failed(keys, 3).double().mean().item()
    assert abs(rate - 0.2) < 5 * math.sqrt(0.2 * 0.8 / 4000)
    assert abs(f.dropped(keys, 3).double().mean().item() - 0.5) < 5 * math.sqrt(0.25 / 4000)
    assert not FaultInjector().failed(keys, 1).any()
    with pytest.raises(ValueError, match="dropout_rate"):
        FaultInjector(dropout_rate=1.0)
    with pytest.raises(ValueError, match="faults"):
        DPFTSDESettings(faults={"eval_failure": 0.1})


def test_authors_gp_and_repeated_query_rule():
    # the authors' setup: isotropic GPy-like GP with 10 restarts, a repeated query becomes random
    s = DPFTSDESettings(gp_kernel="authors", gp_restarts=10, repeated_query="random", num_regions=1)
    dom = Domain(torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64), raw_samples=64, num_restarts=2, maxiter=10)
    keys = kr.fold(kr.root_key(0, "authors"), torch.arange(3))
    X0 = dom.random(3, 6, keys=keys)
    Y0 = 3 * torch.sin(5 * X0).sum(-1, keepdim=True) + 2
    agents = Agents(keys, X0, Y0, dom, s, capacity=2)
    gp = agents.gp()
    hp = gp.hyperparameters
    assert (hp["lengthscale"][:, 0] == hp["lengthscale"][:, 1]).all()  # isotropic
    assert (hp["mean"] == 0).all() and not gp.spec.standardize
    # restarts never end below the warm start alone
    single = Agents(keys, X0, Y0, dom, DPFTSDESettings(gp_kernel="authors", num_regions=1), capacity=2).gp()
    assert (gp.mll() >= single.mll() - 1e-9).all()
    # a query equal to an earlier one is replaced by a point of the domain; others are kept
    X_rep = torch.stack([X0[0, 2], torch.tensor([0.3, 0.7], dtype=f64), X0[2, 5]])
    out = agents._replace_repeats(X_rep, round=1)
    assert not torch.equal(out[0], X_rep[0]) and not torch.equal(out[2], X_rep[2])
    assert torch.equal(out[1], X_rep[1])
    assert ((out >= 0) & (out <= 1)).all()


def test_broadcast_signal_parts_add_up(objective):
    # per region: aggregate = data part + sampled part (exactly, before noise); norms recorded per round
    s = _settings(num_iterations=2, noise_multiplier=0.0, clip_norm=0.5)  # small S: most vectors clipped
    r = DPFTSDERunner(objective, s, num_inits=1, domain=_domain(objective), seed=2)
    r.step()
    omegas = r.agents.message(2).view(1, 6, -1)
    server = DPFTSDEServer(6, r.domain.bounds, s, r.federation_keys, accountant=None)  # a copy: r keeps its rounds
    assert server.plan(1, 0.5)
    bc = server.release(omegas)
    rec = server.last_record
    data, sample = r._signal_parts(omegas, rec, 2)
    assert data.shape == sample.shape == (1, 2)
    # triangle inequality both ways bounds the aggregate's norm, which is the broadcast's (z = 0)
    total = bc.norm(dim=-1)
    assert (total <= data + sample + 1e-12).all() and (total >= (data - sample).abs() - 1e-12).all()
    res = r.run()
    assert len(res.data_norm) == 2 and all(len(x) == 2 for x in res.sample_norm)
