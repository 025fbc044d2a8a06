"""Own proposals for the agents that use them only (``Agents.own_proposals(which=...)``): the
used rows and every agent's GP state are the same numbers as when every row is computed, and
the maximizer really sees fewer problems."""

import pytest
import torch

from fbo_torch.federation.agents import Agents, needed_rows
from fbo_torch.federation.settings import DPFTSDESettings, FTSSettings
from fbo_torch.objectives.synthetic import GPSampleContinuousFederation
from fbo_torch.optim.domain import Domain
from fbo_torch.protocol.keys import federation_agent_keys
from fbo_torch.simulate.dp_fts_de import DPFTSDERunner
from fbo_torch.simulate.fts import FederationHistory, FTSRunner
from fbo_torch.utils import keyed_random as kr

f64 = torch.float64
N = 9
# none, one (padded with another agent of its chunk), one per chunk of 2-3 agents (each padded),
# several, all but one, all
MASKS = [[], [4], [0, 3, 5, 8], [1, 2, 4, 6, 7], [0, 1, 2, 3, 4, 5, 6, 8], list(range(N))]


@pytest.fixture
def maximized(monkeypatch):
    """The batch sizes ``Domain.maximize`` is called with."""
    sizes: list[int] = []
    original = Domain.maximize

    def counting(self, fn, batch, *args, **kwargs):
        sizes.append(batch)
        return original(self, fn, batch, *args, **kwargs)

    monkeypatch.setattr(Domain, "maximize", counting)
    return sizes


def _agents(acq, warp, max_memory):
    s = DPFTSDESettings(
        gp_warp=warp,
        own_acquisition=acq,
        gp_kernel="fbo",
        gp_refit_every=2,
        gp_fit_maxiter=15,
        gp_sample_features=64,
        num_features=20,
    )
    dom = Domain(torch.tensor([[0.0] * 2, [1.0] * 2], dtype=f64), raw_samples=32, num_restarts=2, maxiter=5)
    keys = federation_agent_keys(0, torch.zeros(N, dtype=torch.long), torch.arange(N))
    X0 = dom.random(N, 6, keys=kr.fold(keys, "init"))
    return Agents(keys, X0, torch.sin(6 * X0).sum(-1, keepdim=True), dom, s, max_memory=max_memory)


def _state(agents):
    return (
        agents.gp_params.clone(),
        None if agents.warp_choice is None else agents.warp_choice.clone(),
        agents.gp_updates,
    )


@pytest.mark.parametrize(
    "acq,warp,max_memory", [("ts", "none", 1), ("ts", "auto", "64GiB"), ("logei", "auto", 1), ("ucb", "none", "64GiB")]
)
def test_the_needed_rows_and_every_gp_state_equal_computing_all_rows(acq, warp, max_memory, maximized):
    rounds = (1, 2)  # a refit, then kept hyperparameters
    whole = _agents(acq, warp, max_memory)
    sizes = [c.stop - c.start for c in (range(N)[c] for c in whole.chunks())]
    assert sizes == ([N] if max_memory == "64GiB" else [3, 2, 2, 2])
    reference = []
    for t in rounds:
        X, v = whole.own_proposals(t)
        reference.append((X, v, _state(whole)))
        whole.observe(X, torch.sin(6 * X).sum(-1))
    assert torch.isfinite(torch.stack([X for X, _, _ in reference])).all()
    for rows in MASKS:
        which = torch.zeros(N, dtype=torch.bool)
        which[rows] = True
        part = _agents(acq, warp, max_memory)
        maximized.clear()
        for t, (X, v, state) in zip(rounds, reference, strict=True):
            Xs, vs = part.own_proposals(t, which=which)
            assert Xs.shape == X.shape and vs.shape == v.shape and Xs.dtype == X.dtype and vs.dtype == v.dtype
            assert torch.equal(Xs[which], X[which]) and torch.equal(vs[which], v[which])
            assert Xs[~which].isnan().all() and vs[~which].isnan().all()
            new, old = _state(part), state
            assert torch.equal(new[0], old[0]) and new[2] == old[2]
            assert (new[1] is None) == (old[1] is None) and (new[1] is None or torch.equal(new[1], old[1]))
            part.observe(X, torch.sin(6 * X).sum(-1))  # the same data as the reference agents
        # the maximizer saw the needed agents (a lone one padded by a neighbour), never a batch of one
        expected = sum(0 if k == 0 else max(k, 2) for k in (int(which[c].sum()) for c in whole.chunks())) * len(rounds)
        assert sum(maximized) == expected and all(b >= 2 for b in maximized)


def test_needed_rows():
    def rows(bits):
        out = needed_rows(torch.tensor(bits, dtype=torch.bool))
        return None if out is None else out.tolist()

    assert rows([True, True, True]) is None  # all: the whole chunk as without a selection
    assert rows([True]) is None and rows([False]) == []  # a federation of one: computed or skipped
    assert rows([False, False]) == []
    assert rows([False, True, False]) == [0, 1] and rows([True, False, False]) == [0, 1]  # padded
    assert rows([False, True, True, False]) == [1, 2]


def test_a_bad_selection_names_the_argument():
    agents = _agents("ts", "none", "64GiB")
    with pytest.raises(ValueError, match="`which`"):
        agents.own_proposals(1, which=torch.ones(N - 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="`which`"):
        agents.own_proposals(1, which=torch.ones(N))


def test_the_gpu_path_computes_every_row(monkeypatch, maximized):
    monkeypatch.setenv("FBO_SYNC_FREE", "1")  # a CPU on the GPU's path: fixed shapes, no host read
    agents = _agents("ts", "none", "64GiB")
    which = torch.zeros(N, dtype=torch.bool)
    which[[2, 5]] = True
    X, _ = agents.own_proposals(1, which=which)
    assert maximized == [N] and torch.isfinite(X).all()


def _all_rows(monkeypatch):
    """Make ``own_proposals`` ignore ``which`` (today's round: every row computed)."""
    original = Agents.own_proposals

    def every_row(self, round, which=None):
        return original(self, round)

    monkeypatch.setattr(Agents, "own_proposals", every_row)


def test_a_dp_fts_de_run_is_the_same_with_own_proposals_for_the_coin_s_agents_only(
    monkeypatch, maximized, small_dp_federation
):
    obj, s, dom = small_dp_federation

    def run():
        maximized.clear()
        r = DPFTSDERunner(obj, s, num_inits=2, domain=dom, seed=5, accountant="rdp", max_memory=1)
        res = r.run()
        own = int((~res.used_server).sum())
        return r, res, sum(maximized), own

    subset, a, rows_a, own = run()
    with monkeypatch.context() as m:
        _all_rows(m)
        whole, b, rows_b, _ = run()
    assert torch.equal(subset.X, whole.X) and torch.equal(subset.Y.nan_to_num(), whole.Y.nan_to_num())
    assert torch.equal(a.loss, b.loss) and torch.equal(a.used_server, b.used_server) and torch.equal(a.failed, b.failed)
    assert a.epsilon == b.epsilon
    assert torch.equal(subset.agents.gp_params, whole.agents.gp_params)
    assert subset.agents.gp_updates == whole.agents.gp_updates
    # the broadcast was followed in some rounds and the maximizer saw fewer own problems for it
    assert bool(a.used_server.any()) and rows_a < rows_b and rows_a >= own


def test_an_fts_run_is_the_same_with_own_proposals_for_the_own_sources_only(monkeypatch, maximized):
    obj = GPSampleContinuousFederation(dim=2, num_groups=1, agents_per_group=4, num_basis=128, lengthscale=0.2)
    dom = Domain(obj.bounds, raw_samples=64, num_restarts=2, maxiter=8)
    s = FTSSettings(algorithm="fts", num_iterations=4, num_features=30, rff_lengthscale=0.2, p_t=0.5)
    hist = FederationHistory(obj, dom, t_n=8, seed=0)

    def run():
        maximized.clear()
        r = FTSRunner(obj, s, obj.targets, num_inits=2, history=hist, domain=dom, seed=0)
        res = r.run()
        return r, res, sum(maximized)

    subset, a, rows_a = run()
    with monkeypatch.context() as m:
        _all_rows(m)
        whole, b, rows_b = run()
    assert torch.equal(a.queries, b.queries) and torch.equal(a.sources, b.sources)
    assert torch.equal(a.loss, b.loss) and torch.equal(a.best_value, b.best_value)
    assert torch.equal(subset.agents.gp_params, whole.agents.gp_params)
    assert bool((a.sources >= 0).any()) and rows_a < rows_b
