"""Every query is evaluated once: its observation and its noiseless value come from one evaluation.

The objective's evaluations are counted (query points passed to ``_evaluate``)
on tiny FTS and DP-FTS-DE runs: the count equals the number of queries
(initial points included).
"""

import json
from collections import Counter

import pytest
import torch

from fbo_torch.federation.domain import Domain
from fbo_torch.federation.settings import DPFTSDESettings
from fbo_torch.objectives.synthetic import GPSampleGridFederation
from fbo_torch.runners.dp_fts_de import DPFTSDERunner
from fbo_torch.runners.fts import FederationHistory, FTSRunner, FTSSettings
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
    s = FTSSettings(algorithm="fts", num_iterations=T, num_init=2, num_features=20, p_t=0.5,
                    communication="every-round", gp_sample_features=32, gp_fit_maxiter=10)
    runner = FTSRunner(obj, s, obj.targets, num_inits=num_inits, history=hist, seed=3)
    res = runner.run()
    R = obj.targets.numel() * num_inits
    others = runner.others.num_agents
    # the targets' queries, and the other agents' TS iterations (every-round communication)
    assert obj.evaluations == R * (s.num_init + T) + others * T
    assert torch.isfinite(res.loss).all()


@pytest.mark.parametrize("faults", [None, {"eval_failure_rate": 0.4}])
def test_dp_fts_de_run_evaluates_each_query_once(faults):
    obj = CountedGrid(num_groups=1, agents_per_group=6, perturbation=0.02, perturb_first=True, grid_size=100,
                      seed=2)
    T, n0, num_inits = 3, 2, 2
    s = DPFTSDESettings(num_iterations=T, num_init=n0, num_features=20, num_regions=2, gp_sample_features=32,
                        gp_fit_maxiter=10, faults=faults)
    res = DPFTSDERunner(obj, s, num_inits=num_inits, seed=1).run()
    assert obj.points == Counter({a: num_inits * (n0 + T) for a in range(obj.num_agents)})
    if faults is not None:
        assert res.failed.any() and not res.failed.all()  # failures are injected, still one evaluation each
