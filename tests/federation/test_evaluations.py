"""Every query is evaluated once: its observation and its noiseless value come from one evaluation.

The objective's evaluations are counted (query points passed to ``_evaluate``)
on tiny FTS, DP-FTS-DE and Flower runs: the count equals the number of
queries (initial points included), and a Flower node evaluates its initial
points once per run, whether its process keeps the node between messages or
rebuilds it from the node's stored state.
"""

import json
from collections import Counter

import pytest
import torch

from fbo_torch.federation.settings import DPFTSDESettings, FTSSettings
from fbo_torch.objectives.synthetic import GPSampleGridFederation
from fbo_torch.optim.domain import Domain
from fbo_torch.simulate.dp_fts_de import DPFTSDERunner
from fbo_torch.simulate.fts import FederationHistory, FTSRunner
from fbo_torch.utils import keyed_random as kr

f64 = torch.float64


class CountedGrid(GPSampleGridFederation):
    """A grid federation that counts the points it evaluates, per agent."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.points = Counter()

    def _evaluate(self, X, agents, noise):
        self.points.update(agents.repeat_interleave(X.shape[1]).tolist())
        return super()._evaluate(X, agents, noise)

    @property
    def evaluations(self) -> int:
        return sum(self.points.values())


def test_observe_is_the_keyed_call_and_evaluate_true_from_one_evaluation():
    obj = CountedGrid(num_groups=1, agents_per_group=3, grid_size=50, seed=0)
    X = torch.rand(3, 4, 1, dtype=f64, generator=torch.Generator().manual_seed(0))
    keys = kr.fold(kr.root_key(5, "test"), torch.arange(3))
    Y, F = obj.observe(X, keys)
    assert obj.evaluations == 12  # one evaluation of each of the 3 x 4 points
    assert torch.equal(Y, obj(X, keys=keys)) and torch.equal(F, obj.evaluate_true(X))
    # the noise is the keyed N(0, σ²) draw, added to the noiseless value
    torch.testing.assert_close(Y - F, 0.1 * kr.normal(keys, 4, dtype=f64), rtol=0, atol=1e-15)
    noiseless = CountedGrid(num_groups=1, agents_per_group=3, grid_size=50, noise_variance=0.0, seed=0)
    Y0, F0 = noiseless.observe(X, keys)
    assert torch.equal(Y0, F0) and torch.equal(F0, F)  # a deterministic objective: both are the value
    with pytest.raises(ValueError, match="`X` must have shape"):
        obj.observe(X[:2], keys)


def test_fts_run_evaluates_each_query_once():
    obj = CountedGrid(num_groups=2, agents_per_group=4, perturbation=0.02, grid_size=100, seed=0)
    dom = Domain(obj.bounds, obj.candidates)
    t_n = 6
    hist = FederationHistory(obj, dom, t_n=t_n, mode="ts", num_init=2, seed=1)
    assert obj.evaluations == obj.num_agents * t_n
    obj.points.clear()
    T, num_inits = 3, 2
    s = FTSSettings(
        algorithm="fts",
        num_iterations=T,
        num_init=2,
        num_features=20,
        p_t=0.5,
        communication="every-round",
        gp_sample_features=32,
        gp_fit_maxiter=10,
    )
    runner = FTSRunner(obj, s, obj.targets, num_inits=num_inits, history=hist, seed=3)
    res = runner.run()
    R = obj.targets.numel() * num_inits
    others = runner.others.num_agents
    # the targets' queries, and the other agents' TS iterations (every-round communication)
    assert obj.evaluations == R * (s.num_init + T) + others * T
    assert torch.isfinite(res.loss).all()


@pytest.mark.parametrize("faults", [None, {"eval_failure_rate": 0.4}])
def test_dp_fts_de_run_evaluates_each_query_once(faults):
    obj = CountedGrid(num_groups=1, agents_per_group=6, perturbation=0.02, perturb_first=True, grid_size=100, seed=2)
    T, n0, num_inits = 3, 2, 2
    s = DPFTSDESettings(
        num_iterations=T,
        num_init=n0,
        num_features=20,
        num_regions=2,
        gp_sample_features=32,
        gp_fit_maxiter=10,
        faults=faults,
    )
    res = DPFTSDERunner(obj, s, num_inits=num_inits, seed=1).run()
    assert obj.points == Counter({a: num_inits * (n0 + T) for a in range(obj.num_agents)})
    if faults is not None:
        assert res.failed.any() and not res.failed.all()  # failures are injected, still one evaluation each


flwr = pytest.importorskip("flwr")
_EVALUATE = GPSampleGridFederation._evaluate


def _run_config(**kw):
    base = {
        "method": "dp-fts-de",
        "num-agents": 3,
        "num-rounds": 4,
        "sample-rate": 1.0,
        "noise-multiplier": 1.0,
        "clip-norm": 1.0,
        "num-regions": 2,
        "seed": 3,
        "num-init": 2,
        "num-features": 16,
        "rff-lengthscale": 0.05,
        "objective": json.dumps({"type": "gp_grid", "grid_size": 100, "perturbation": 0.05, "perturb_first": True}),
        "gp-sample-features": 32,
        "gp-fit-maxiter": 10,
        "round-timeout": 5.0,
        "min-nodes-timeout": 0.0,
        "report-best": True,
    }
    base.update(kw)
    return base


def _deploy(run_config, monkeypatch, live_nodes):
    """Run a federation on the in-process grid, counting evaluations per agent."""
    from flower_grid import InProcessGrid

    from fbo_torch.flower import client_app, client_round, server_app
    from fbo_torch.flower.config import FlowerRunConfig
    from fbo_torch.flower.records import AGENT_STATE, record_to_state

    points = Counter()

    def counted(self, X, agents, noise):
        points.update(agents.repeat_interleave(X.shape[1]).tolist())
        return _EVALUATE(self, X, agents, noise)

    monkeypatch.setattr(GPSampleGridFederation, "_evaluate", counted)
    monkeypatch.setattr(client_round, "live_nodes", live_nodes)
    cfg = FlowerRunConfig.from_run_config(run_config)
    grid = InProcessGrid(client_app.app, run_config, cfg.num_agents)
    coord = server_app.run_federation(grid, cfg, echo=lambda line: None, poll_interval=0.0, secret=bytes(range(32)))
    states = [record_to_state(ctx.state.array_records[AGENT_STATE]) for ctx in grid.contexts.values()]
    return coord, states, points


def _forgetful():
    """Live nodes of a process that forgets its nodes after every message (a fresh process per message)."""
    from fbo_torch.flower.agent_node import LiveNodes

    class Forgetful(LiveNodes):
        def get(self, *args, **kwargs):
            self._nodes.clear()
            return super().get(*args, **kwargs)

    return Forgetful()


@pytest.mark.parametrize("faults", [None, {"eval_failure_rate": 0.3}])
def test_a_flower_node_evaluates_its_initial_points_once_per_run(monkeypatch, faults):
    from fbo_torch.flower.agent_node import LiveNodes

    run_config = _run_config() if faults is None else _run_config(faults=json.dumps(faults))
    N, T, n0 = run_config["num-agents"], run_config["num-rounds"], run_config["num-init"]
    live = LiveNodes()
    coord, states, points = _deploy(run_config, monkeypatch, live)
    assert [r.num_reported for r in coord.logs] == [N] * T
    # a set-up message and T rounds per node: n0 initial points and one query a round, each evaluated once
    assert points == Counter({n: n0 + T for n in range(N)})
    assert len(live) == N  # the process kept every node between messages
    # a process that rebuilds each node from its stored state evaluates nothing more, and computes the same
    coord2, states2, points2 = _deploy(run_config, monkeypatch, _forgetful())
    assert points2 == points
    for s, s2 in zip(states, states2, strict=True):
        assert s.keys() == s2.keys()
        for k in s:
            assert torch.equal(s[k].nan_to_num(), s2[k].nan_to_num()) and torch.equal(s[k].isnan(), s2[k].isnan()), k
    assert [r.epsilon for r in coord2.logs] == [r.epsilon for r in coord.logs]
    if faults is not None:
        assert any(bool((~s["valid"][0, : int(s["n"])]).any()) for s in states)  # failures happened


def test_live_nodes_reuse_a_node_only_when_it_is_the_stored_one():
    from fbo_torch.flower.agent_node import AgentNode, LiveNodes
    from fbo_torch.flower.config import FlowerRunConfig

    cfg = FlowerRunConfig.from_run_config(_run_config())
    live = LiveNodes()
    node = live.get(1, 100, cfg, 0, None)
    node.step(0, 1.0, None, None, 1)
    saved = {k: v.clone() for k, v in node.state_dict().items()}
    assert live.get(1, 100, cfg, 0, saved) is node  # the process's node is the stored one
    node.step(1, 1.0, None, None, 0)  # the node moves on but its state is not stored (e.g. the reply failed)
    rebuilt = live.get(1, 100, cfg, 0, saved)
    assert rebuilt is not node and rebuilt.round == 0 and rebuilt.objective is node.objective
    assert live.get(1, 100, cfg, 0, None) is not rebuilt  # nothing stored: a fresh node
    other = FlowerRunConfig.from_run_config(_run_config(seed=4))
    with pytest.raises(ValueError, match="other keys"):  # another run config: the stored agent is not its agent
        live.get(1, 100, other, 0, saved)
    assert live.get(2, 100, cfg, 0, saved).objective is not node.objective  # a new run builds its own
    assert len(live) == 1
    with pytest.raises(ValueError, match="holds agent 0, not agent 1"):
        AgentNode(cfg, 1, saved)
