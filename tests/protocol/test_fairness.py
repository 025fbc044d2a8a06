"""Fair help (``fairness: λ``): ranks of the incumbents, the follow probability and ``P_N`` they tilt,
``λ = 0`` as FTS was bit for bit, and help moved to the agents behind in a run."""

import pytest
import torch

from fbo_torch.federation.settings import FTSSettings
from fbo_torch.objectives.synthetic import GPSampleGridFederation
from fbo_torch.protocol.fairness import behind_ranks, fair_follow_probability, fair_peer_weights
from fbo_torch.simulate.fts import FTSRunner

MAP = dict(num_features=100, rff_lengthscale=0.03, rff_noise_variance=0.01, communication="every-round")


def _runner(agents: int = 4, inits: int = 2, **kw) -> FTSRunner:
    objective = GPSampleGridFederation(
        num_groups=1, agents_per_group=agents, perturb_first=True, grid_size=200, perturbation=0.02, seed=0
    )
    s = FTSSettings(algorithm="fts", **{"num_init": 2, "num_iterations": 3, **MAP, **kw})
    return FTSRunner(objective, s, torch.arange(agents), inits, seed=0, together=True)


def test_ranks_are_zero_for_the_best_one_for_the_worst_and_ties_share():
    got = behind_ranks(torch.tensor([[3.0, 1.0, 2.0, 0.0], [1.0, 1.0, 0.0, 2.0]]))
    want = torch.tensor([[0.0, 2 / 3, 1 / 3, 1.0], [0.5, 0.5, 1.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=0, atol=1e-15)
    assert torch.equal(behind_ranks(torch.tensor([[5.0]])), torch.zeros(1, 1, dtype=torch.float64))


def test_the_follow_probability_moves_from_the_leaders_to_the_agents_behind():
    behind = torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=torch.float64)
    p = fair_follow_probability(0.6, behind, 1.0)
    # 1 - p' = 0.4 (1 + (2b - 1)) = 0.8 b
    assert torch.allclose(1 - p, 0.8 * behind, rtol=0, atol=1e-15)
    assert torch.allclose(fair_follow_probability(0.6, behind, 0.0), torch.full((4,), 0.6, dtype=torch.float64))
    # a large λ saturates: the worst always follows, the best never
    p = fair_follow_probability(0.3, behind, 10.0)
    assert p[0].item() == 1.0 and p[-1].item() == 0.0


def test_p_n_is_tilted_towards_the_leaders_and_keeps_its_support():
    probs = torch.tensor([[0.0, 0.5, 0.25, 0.25]], dtype=torch.float64)
    behind = torch.tensor([[0.0, 1.0, 0.0, 0.5]], dtype=torch.float64)
    w = fair_peer_weights(probs, behind, 1.0)
    raw = probs * torch.exp(-2 * behind)
    assert torch.allclose(w, raw / raw.sum(), rtol=1e-15, atol=0) and w[0, 0].item() == 0.0
    assert torch.allclose(fair_peer_weights(probs, behind, 0.0), probs, rtol=1e-15, atol=0)


def test_fairness_zero_is_fts_as_it_was_bit_for_bit():
    plain, zero = _runner(p_t=0.5), _runner(p_t=0.5, fairness=0.0)
    a, b = plain.run(), zero.run()
    assert torch.equal(a.sources, b.sources) and torch.equal(a.best_value, b.best_value)
    assert torch.equal(a.queries, b.queries) and b.behind is None


def test_fairness_moves_help_to_the_agents_behind():
    # λ = 1 with p_t = 0.5: 1 - p' = b, so the leader of each federation never follows and the last always
    res = _runner(agents=4, inits=3, p_t=0.5, fairness=1.0, num_iterations=4).run()
    assert res.behind is not None and res.behind.shape == res.sources.shape
    follows = res.sources >= 0
    assert not follows[res.behind == 0.0].any()
    assert follows[res.behind == 1.0].all() and (res.behind == 1.0).any()
    # the peers followed rank ahead of the follower's federation's average (towards the leaders)
    inits = res.inits.unsqueeze(-1).expand_as(res.sources)
    ranks = res.behind.view(4, 3, -1)  # agent, federation, round
    t = torch.arange(res.sources.shape[1]).expand_as(res.sources)
    followed = ranks[res.sources.clamp_min(0), inits, t][follows]
    assert followed.mean().item() < 0.5 - 1e-9


@pytest.mark.parametrize("value", [-0.1, float("inf"), float("nan"), "strong", True])
def test_a_bad_fairness_is_refused_in_one_line_naming_the_key(value):
    with pytest.raises(ValueError, match="`fairness` must be a finite number >= 0") as info:
        FTSSettings(fairness=value)
    assert "\n" not in str(info.value)


def test_fairness_needs_fts_with_agents_together():
    with pytest.raises(ValueError, match="`fairness` > 0 works with `algorithm: fts`; algorithm 'ts'"):
        FTSSettings(algorithm="ts", fairness=1.0)
    objective = GPSampleGridFederation(num_groups=1, agents_per_group=3, perturb_first=True, grid_size=50, seed=0)
    from fbo_torch.simulate.fts import FederationHistory

    history = FederationHistory(objective, _domain(objective), 3)
    with pytest.raises(ValueError, match="`fairness` ranks the incumbents.*`history.mode: together`"):
        FTSRunner(objective, FTSSettings(algorithm="fts", fairness=1.0, **MAP), torch.arange(1), 1, history=history)


def _domain(objective):
    from fbo_torch.optim.domain import Domain

    return Domain(objective.bounds, objective.candidates)
