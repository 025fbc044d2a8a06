import math

import pytest
import torch

from fbo_torch.federation.settings import DPFTSDESettings, FTSSettings
from fbo_torch.objectives.synthetic import GPSampleContinuousFederation, GPSampleGridFederation
from fbo_torch.optim.domain import Domain
from fbo_torch.privacy import compute_epsilon, default_delta
from fbo_torch.simulate.dp_fts_de import DPFTSDERunner
from fbo_torch.simulate.fts import FederationHistory, FTSRunner


@pytest.fixture(scope="module")
def grid_objective():
    return GPSampleGridFederation(num_groups=2, agents_per_group=6, perturbation=0.02, grid_size=200, seed=0)


def fts_runner(obj, alg="fts", **kw):
    dom = Domain(obj.bounds, obj.candidates)
    hist = FederationHistory(obj, dom, t_n=20, seed=1) if alg == "fts" else None
    s = FTSSettings(algorithm=alg, num_iterations=4, num_features=30, **kw)
    return FTSRunner(obj, s, obj.targets, num_inits=2, history=hist, seed=3)


def test_fts_runner_shapes_sources_and_reproducibility(grid_objective):
    r1 = fts_runner(grid_objective, p_t=0.0)  # always use messages
    res1 = r1.run()
    assert res1.loss.shape == (4, 5) and res1.sources.shape == (4, 4)
    assert (res1.loss[:, 1:] <= res1.loss[:, :-1] + 1e-12).all()  # best-so-far never gets worse
    assert (res1.loss >= -1e-12).all()
    # messages only from the target's own group, never the target itself, never reused (one-shot)
    groups = grid_objective.group_of_agent
    for r in range(4):
        src = res1.sources[r]
        assert (src >= 0).all()
        assert (groups[src] == groups[res1.targets[r]]).all() and (src != res1.targets[r]).all()
        assert len(set(src.tolist())) == 4
    res2 = fts_runner(grid_objective, p_t=0.0).run()
    assert torch.equal(res1.loss, res2.loss) and torch.equal(res1.sources, res2.sources)
    ts = fts_runner(grid_objective, alg="ts").run()
    assert (ts.sources == -1).all() and ts.parameters_per_agent == 0
    # same initial points for every method
    assert torch.equal(ts.queries[:, :1], res1.queries[:, :1])


def test_fts_runner_checkpoint_resume_is_exact(grid_objective):
    full = fts_runner(grid_objective, p_t=0.5).run()
    r = fts_runner(grid_objective, p_t=0.5)
    r.step()
    r.step()
    state = r.state_dict()
    r2 = fts_runner(grid_objective, p_t=0.5)
    r2.load_state_dict(state)
    res = r2.run()
    torch.testing.assert_close(res.loss, full.loss)
    assert torch.equal(res.sources, full.sources)


def test_fts_every_round_communication(grid_objective):
    r = fts_runner(grid_objective, p_t=0.0, communication="every-round")
    res = r.run()
    assert r.others_X.shape[1] == 20 + 4  # the other agents kept optimizing
    assert (res.sources >= 0).all()


def test_fts_continuous_domain():
    obj = GPSampleContinuousFederation(dim=2, num_groups=1, agents_per_group=4, num_basis=128, lengthscale=0.2, seed=0)
    dom = Domain(obj.bounds, raw_samples=128, num_restarts=2, maxiter=20)
    hist = FederationHistory(obj, dom, t_n=10, seed=0)
    s = FTSSettings(algorithm="fts", num_iterations=3, num_features=40, rff_lengthscale=0.2, p_t=0.5)
    res = FTSRunner(obj, s, obj.targets, num_inits=2, history=hist, domain=dom, seed=0).run()
    assert res.queries.shape == (2, 4, 2)
    assert ((res.queries >= 0) & (res.queries <= 1)).all()
    assert torch.isfinite(res.loss).all()


def dp_runner(obj, **kw):
    base = dict(num_iterations=3, num_init=3, num_features=30, num_regions=2)
    base.update(kw)
    return DPFTSDERunner(obj, DPFTSDESettings(**base), num_inits=2, seed=1, accountant="rdp-classic")


@pytest.fixture(scope="module")
def dp_objective():
    return GPSampleGridFederation(
        num_groups=1, agents_per_group=8, perturbation=0.02, perturb_first=True, grid_size=200, seed=2
    )


def test_dp_runner_tiny_end_to_end_reproducible(dp_objective):
    kw = dict(sample_rate=0.5, noise_multiplier=1.0, clip_norm=5.0)
    r = dp_runner(dp_objective, **kw)
    # distributed exploration: initial points inside each agent's assigned region
    regions = r.partition.region_of(r.X[:, :3])
    assert (regions == r.assignment.repeat(2).unsqueeze(-1)).all()
    res = r.run()
    assert res.loss.shape == (16, 4) and res.used_server.shape == (16, 3)
    assert res.released == [True, True, True]
    res2 = dp_runner(dp_objective, **kw).run()
    assert torch.equal(res.loss, res2.loss) and res.epsilon == res2.epsilon
    # the ledger's ε after each round is the accountant's ε for that many releases
    delta = default_delta(8)
    for t, eps in enumerate(res.epsilon, start=1):
        assert eps == pytest.approx(compute_epsilon(0.5, 1.0, t, delta, accountant="rdp-classic"))
    assert res.epsilon == sorted(res.epsilon)


def test_dp_runner_resume_and_ledger(dp_objective):
    kw = dict(sample_rate=0.5, noise_multiplier=1.0, clip_norm=5.0)
    full = dp_runner(dp_objective, **kw).run()
    r = dp_runner(dp_objective, **kw)
    r.step()
    state = r.state_dict()
    r2 = dp_runner(dp_objective, **kw)
    r2.load_state_dict(state)
    assert r2.ledger.rounds == 1
    res = r2.run()
    torch.testing.assert_close(res.loss, full.loss)
    assert res.epsilon == full.epsilon


def test_dp_runner_stops_before_exceeding_budget(dp_objective):
    delta = default_delta(8)
    eps2 = compute_epsilon(0.5, 1.0, 2, delta, accountant="rdp-classic")
    eps3 = compute_epsilon(0.5, 1.0, 3, delta, accountant="rdp-classic")
    budget = (eps2 + eps3) / 2
    res = dp_runner(dp_objective, sample_rate=0.5, noise_multiplier=1.0, clip_norm=5.0, max_epsilon=budget).run()
    assert res.released == [True, True, False]
    assert max(res.epsilon) <= budget
    assert not res.used_server[:, 2].any()  # after the budget: local TS only


def test_dp_runner_local_threshold_and_ts(dp_objective):
    res = dp_runner(dp_objective, p_t="1-1/t", p1_equals_p2=False, local_threshold=0.4).run()
    # 1 - p_t = 1, 1/2, 1/3: the third round is below 0.4 -> no release, no server queries
    assert res.released == [True, True, False]
    assert res.used_server[:, 0].all() and not res.used_server[:, 2].any()
    ts = dp_runner(dp_objective, algorithm="ts").run()
    assert ts.released == [False] * 3 and not ts.used_server.any() and ts.parameters_per_agent == 0
    assert all(math.isnan(e) for e in ts.epsilon)


def test_settings_validation():
    with pytest.raises(ValueError, match="sample_rate"):
        DPFTSDESettings(sample_rate=0.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        DPFTSDESettings(noise_multiplier=-1.0)
    with pytest.raises(ValueError, match="clip_norm"):
        DPFTSDESettings(noise_multiplier=1.0, clip_norm=None)
    with pytest.raises(ValueError, match="clip_norm"):
        DPFTSDESettings(clip_norm=0.0)
    with pytest.raises(ValueError, match="num_regions"):
        DPFTSDESettings(num_regions=0)
    with pytest.raises(ValueError, match="algorithm"):
        FTSSettings(algorithm="rgpe-ish")
    with pytest.raises(ValueError, match="p_t"):
        FTSSettings(p_t=2.0)
