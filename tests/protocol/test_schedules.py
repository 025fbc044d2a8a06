import math

import pytest
import torch

from fbo_torch.protocol.schedules import OWN, AgentDistribution, PtSchedule, draw_sources


def test_named_schedules_and_p1_equals_p2():
    s = PtSchedule("1-1/sqrt(t)")
    assert s(1) == s(2) == pytest.approx(1 - 1 / math.sqrt(2))
    assert s(9) == pytest.approx(1 - 1 / 3)
    s2 = PtSchedule("1-1/t^2")
    assert s2(1) == s2(2) == pytest.approx(0.75) and s2(10) == pytest.approx(0.99)
    s3 = PtSchedule("1-1/t")
    assert s3(1) == pytest.approx(0.5) and s3(4) == pytest.approx(0.75)
    assert PtSchedule("1-1/t", p1_equals_p2=False)(1) == 0.0
    assert PtSchedule(0.3)(17) == 0.3
    assert PtSchedule(lambda t: 1 - 0.5**t)(1) == 0.5
    # the papers' schedules increase to 1
    for name in ["1-1/sqrt(t)", "1-1/t^2", "1-1/t"]:
        vals = [PtSchedule(name)(t) for t in range(1, 200)]
        assert all(a <= b for a, b in zip(vals, vals[1:], strict=False)) and vals[-1] > 0.9


@pytest.mark.parametrize("spec", ["nope", 1.5, -0.1])
def test_schedule_validation(spec):
    with pytest.raises(ValueError):
        PtSchedule(spec)
    with pytest.raises(ValueError, match="p_t"):
        PtSchedule(lambda t: 2.0)(3)
    with pytest.raises(ValueError, match="t"):
        PtSchedule(0.5)(0)


def test_source_frequencies_match_p_t_and_P_N():
    # 20000 independent runs: own fraction ~ p_t, agent choices ~ (1-p_t) P_N
    R, N, p = 20000, 4, 0.3
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64).expand(R, N)
    dist = AgentDistribution(N, probs=probs)
    src = draw_sources(p, dist, generator=torch.Generator().manual_seed(0))
    own = (src == OWN).double().mean().item()
    assert abs(own - p) < 4 * math.sqrt(p * (1 - p) / R)
    counts = torch.bincount(src[src >= 0], minlength=N).double()
    n = counts.sum()
    expected = n * probs[0]
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 16.27  # chi-square, 3 dof, p = 0.001


def test_stragglers_never_chosen_and_one_shot_removal():
    N = 6
    dist = AgentDistribution(N, batch_shape=torch.Size([500]))
    dist.mark_missing([1, 4])
    gen = torch.Generator().manual_seed(1)
    src = draw_sources(0.0, dist, generator=gen)
    assert not ((src == 1) | (src == 4)).any() and (src >= 0).all()
    # one-shot: draw 4 times per run with removal -> never the same message twice
    used = []
    for _ in range(4):
        s = draw_sources(0.0, dist, generator=gen)
        used.append(s)
        dist.remove(s)
    used = torch.stack(used, -1)
    assert all(len(set(row.tolist())) == 4 for row in used)
    assert dist.is_empty.all()
    # empty runs fall back to the own GP
    assert (draw_sources(0.0, dist, generator=gen) == OWN).all()


def test_distribution_validation():
    with pytest.raises(ValueError, match="sum to 1"):
        AgentDistribution(3, probs=torch.tensor([0.2, 0.2, 0.2]))
    with pytest.raises(ValueError, match="non-negative"):
        AgentDistribution(2, probs=torch.tensor([1.5, -0.5]))
    with pytest.raises(ValueError, match="3 entries"):
        AgentDistribution(3, probs=torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="p_t"):
        draw_sources(1.2, AgentDistribution(3))
    d = AgentDistribution(3)
    d2 = AgentDistribution(3)
    d.mark_missing([0])
    d2.load_state_dict(d.state_dict())
    assert torch.equal(d2.probs, d.probs)


def test_keyed_sources_are_the_coin_and_the_keyed_P_N_draw():
    # the simulator's form: u from fold(keys, "p_t") against u < p, the agent from fold(keys, "P_N")
    from fbo_torch.utils import keyed_random as kr

    R, N, p = 4000, 5, 0.4
    keys = kr.fold(kr.root_key(3, "runs"), torch.arange(R))
    dist = AgentDistribution(N, batch_shape=torch.Size([R]))
    src = draw_sources(p, dist, keys=keys)
    u = kr.uniform(kr.fold(keys, "p_t"), 1, dtype=torch.float64).squeeze(-1)
    agents = dist.sample(keys=kr.fold(keys, "P_N"))
    assert torch.equal(src, torch.where(u < p, torch.full_like(agents, OWN), agents))
    own = (src == OWN).double().mean().item()
    assert abs(own - p) < 4 * math.sqrt(p * (1 - p) / R)
    # one received function (a broadcast): source 0 unless the coin says own; p = 0 never own, p = 1 always
    one = draw_sources(p, None, keys=keys)
    assert torch.equal(one == OWN, u < p) and bool((one[one != OWN] == 0).all())
    assert bool((draw_sources(0.0, None, keys=keys) == 0).all())
    assert bool((draw_sources(1.0, None, keys=keys) == OWN).all())
    with pytest.raises(ValueError, match="keys"):
        draw_sources(p, None)
