"""Agents that optimize together and are each other's peers (``FTSRunner(together=True)``)."""

import pytest
import torch

from fbo_torch.federation.settings import FTSSettings
from fbo_torch.objectives.function_families import FunctionFamilyFederation
from fbo_torch.optim.domain import Domain
from fbo_torch.simulate.fts import FTSRunner

f64 = torch.float64
A, INITS = 4, 2


@pytest.fixture(scope="module")
def objective():
    return FunctionFamilyFederation(num_agents=A, dim=2, families=["sphere", "ackley"], seed=0)


def settings(**kw):
    base = dict(
        algorithm="fts",
        communication="every-round",
        num_init=4,
        num_iterations=3,
        num_features=20,
        rff_lengthscale=0.2,
        p_t=0.0,
    )
    return FTSSettings(**{**base, **kw})


def runner(objective, **kw):
    return FTSRunner(objective, settings(**kw), torch.arange(A), INITS, seed=2, together=True)


def test_peers_are_the_runs_of_the_same_initialization(objective):
    r = runner(objective)
    # run order: target-major, INITS runs per target
    assert r.peer_runs.shape == (A * INITS, A)
    for run in range(A * INITS):
        init = run % INITS
        assert r.peer_runs[run].tolist() == [b * INITS + init for b in range(A)]
    # every run receives exactly the message its peer's run sends this round
    sent = r.agents.message(0)
    torch.testing.assert_close(r.method.omegas, sent[r.peer_runs], rtol=0, atol=0)


def test_messages_follow_the_peers_data(objective):
    r = runner(objective)
    before = r.method.omegas.clone()
    r.step()
    # after one iteration every agent has a new observation and sends a fresh draw
    torch.testing.assert_close(r.method.omegas, r.agents.message(1)[r.peer_runs], rtol=0, atol=0)
    assert not torch.equal(before, r.method.omegas)
    # p_t = 0: every run followed a peer of its own initialization, never itself
    src = r.sources[:, 0]
    assert (src >= 0).all() and (src != r.targets).all()


def test_resume_is_exact(objective):
    full = runner(objective)
    full.run()
    half = runner(objective)
    half.step()
    state = half.state_dict()
    resumed = runner(objective)
    resumed.load_state_dict(state)
    resumed.run()
    assert torch.equal(resumed.X, full.X) and torch.equal(resumed.sources, full.sources)


def test_ts_is_unchanged_by_together(objective):
    s = settings(algorithm="ts")
    a = FTSRunner(objective, s, torch.arange(A), INITS, seed=2, together=True).run()
    b = FTSRunner(objective, s, torch.arange(A), INITS, seed=2).run()
    assert torch.equal(a.queries, b.queries)


def test_initial_points_are_used_as_given(objective):
    g = torch.Generator().manual_seed(0)
    X0 = torch.rand(A * INITS, 5, 2, generator=g, dtype=f64)
    r = FTSRunner(objective, settings(algorithm="ts"), torch.arange(A), INITS, seed=2, initial_points=X0)
    assert torch.equal(r.X[:, :5], X0)
    # the best initial value is the objective's at those points
    f0 = objective._evaluate(X0, r.targets, noise=False).max(-1).values
    torch.testing.assert_close(r.best[:, 0], f0)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(targets=torch.tensor([0, 1])), "every agent as a target"),
        (dict(settings_kw=dict(communication="one-shot")), "every-round"),
        (dict(settings_kw=dict(algorithm="rgpe")), r"algorithm 'rgpe' does not run with `history.mode: together`"),
    ],
)
def test_together_refuses_what_it_cannot_run(objective, kw, match):
    targets = kw.get("targets", torch.arange(A))
    with pytest.raises(ValueError, match=match):
        FTSRunner(objective, settings(**kw.get("settings_kw", {})), targets, INITS, together=True)


@pytest.mark.parametrize(
    "X0,match",
    [
        (torch.rand(3, 5, 2, dtype=f64), "one design per run"),
        (torch.rand(A * INITS, 5, 3, dtype=f64), "one design per run"),
        (torch.full((A * INITS, 5, 2), 1.5, dtype=f64), "inside the domain"),
        (torch.full((A * INITS, 5, 2), float("nan"), dtype=f64), "finite"),
    ],
)
def test_initial_points_are_checked(objective, X0, match):
    with pytest.raises(ValueError, match=match):
        FTSRunner(objective, settings(algorithm="ts"), torch.arange(A), INITS, initial_points=X0)


def test_domain_of_the_objective_is_the_default(objective):
    r = runner(objective)
    assert torch.equal(r.domain.bounds, Domain(objective.bounds).bounds)
