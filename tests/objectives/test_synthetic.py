"""Useless and adversarial peers in the GP-sampled federations."""

import pytest
import torch

from fbo_torch.experiments.config import ConfigError, parse_config
from fbo_torch.objectives import build_objective
from fbo_torch.objectives.synthetic import AGENT_KINDS, GPSampleContinuousFederation, GPSampleGridFederation

HELPFUL, USELESS, ADVERSARIAL = (AGENT_KINDS.index(k) for k in ("helpful", "useless", "adversarial"))


def grid(**kw):
    args = dict(num_groups=3, agents_per_group=11, perturbation=0.02, grid_size=200, seed=3)
    return GPSampleGridFederation(**{**args, **kw})


def test_defaults_make_every_agent_helpful():
    obj = grid()
    assert AGENT_KINDS == ("helpful", "useless", "adversarial")
    assert torch.equal(obj.kind_of_agent, torch.zeros(33, dtype=torch.long))
    assert obj.agents_of_kind("useless").numel() == 0


@pytest.mark.parametrize(
    "fu, fa, n_u, n_a",
    [(0.3, 0.2, 3, 2), (0.25, 0.0, 3, 0), (0.05, 0.04, 1, 0), (0.55, 0.45, 6, 4), (1.0, 0.0, 10, 0), (0.0, 1.0, 0, 10)],
    ids=["plain", "half-up", "small", "capped", "all-useless", "all-adversarial"],
)
def test_every_group_has_the_same_counts_and_its_target_stays_helpful(fu, fa, n_u, n_a):
    # the pool is the 10 non-target agents of a group; counts are round-half-up, adversarial capped
    kinds = grid(useless_fraction=fu, adversarial_fraction=fa).kind_of_agent.view(3, 11)
    assert (kinds[:, 0] == HELPFUL).all()
    assert ((kinds == USELESS).sum(-1) == n_u).all() and ((kinds == ADVERSARIAL).sum(-1) == n_a).all()


def test_which_agents_follow_the_seed_differ_by_group_and_nest():
    obj = grid(useless_fraction=0.3, adversarial_fraction=0.2)
    kinds = obj.kind_of_agent.view(3, 11)
    assert torch.equal(grid(useless_fraction=0.3, adversarial_fraction=0.2).kind_of_agent, obj.kind_of_agent)
    assert not torch.equal(
        grid(useless_fraction=0.3, adversarial_fraction=0.2, seed=4).kind_of_agent, obj.kind_of_agent
    )
    assert not (torch.equal(kinds[0], kinds[1]) and torch.equal(kinds[1], kinds[2]))  # a ranking per group
    # raising a fraction only adds agents to its kind
    small, large = grid(useless_fraction=0.2), grid(useless_fraction=0.5, adversarial_fraction=0.3)
    assert set(small.agents_of_kind("useless").tolist()) < set(large.agents_of_kind("useless").tolist())
    a1, a3 = grid(adversarial_fraction=0.1), grid(adversarial_fraction=0.3)
    assert set(a1.agents_of_kind("adversarial").tolist()) < set(a3.agents_of_kind("adversarial").tolist())
    with pytest.raises(ValueError, match="`kind` must be one of"):
        obj.agents_of_kind("harmful")


def test_perturb_first_draws_among_all_agents():
    fts = grid(useless_fraction=1.0)
    dp = grid(useless_fraction=1.0, perturb_first=True)
    kinds = fts.kind_of_agent.view(3, 11)
    assert (kinds[:, 0] == HELPFUL).all() and (kinds[:, 1:] == USELESS).all()
    assert (dp.kind_of_agent == USELESS).all()
    # 0.5 of 11 agents rounds half up to 6 per group
    kinds = grid(adversarial_fraction=0.5, perturb_first=True).kind_of_agent.view(3, 11)
    assert ((kinds == ADVERSARIAL).sum(-1) == 6).all()


def test_grid_functions_of_each_kind():
    obj, ref = grid(useless_fraction=0.3, adversarial_fraction=0.2), grid()
    kind, f, d = obj.kind_of_agent, obj.functions[obj.group_of_agent], obj.perturbation.unsqueeze(-1)
    helpful, useless, adversarial = (kind == k for k in (HELPFUL, USELESS, ADVERSARIAL))
    # helpful agents, the group functions and the coin flips do not change
    assert torch.equal(obj.functions, ref.functions) and torch.equal(obj.values[helpful], ref.values[helpful])
    flips = ref.values - f  # s_n(x) d_n, the same coins in both objectives
    # adversarial: 1 - f ± d_n exactly, so the peak sits where f is lowest (to within 2 d_n)
    assert torch.allclose(obj.values[adversarial], 1.0 - f[adversarial] + flips[adversarial], atol=1e-12, rtol=0)
    at_peak = f[adversarial].gather(-1, obj.values[adversarial].argmax(-1, keepdim=True)).squeeze(-1)
    assert (at_peak <= f[adversarial].amin(-1) + 2 * d[adversarial].squeeze(-1) + 1e-12).all()
    # useless: their own sample u_n normalized to [0, 1] like f, and unrelated to f
    u = obj.values[useless] - flips[useless]
    assert torch.allclose(u.amin(-1), torch.zeros(9, dtype=u.dtype), atol=1e-12)
    assert torch.allclose(u.amax(-1), torch.ones(9, dtype=u.dtype), atol=1e-12)
    assert ((u - f[useless]).abs().amax(-1) > 0.3).all()
    corr = torch.stack([torch.corrcoef(torch.stack([a, b]))[0, 1] for a, b in zip(u, f[useless], strict=True)])
    assert corr.abs().mean() < 0.5
    # an agent's own sample does not depend on the fractions
    more = grid(useless_fraction=0.6)
    both = torch.tensor([i for i in obj.agents_of_kind("useless").tolist() if more.kind_of_agent[i] == USELESS])
    assert both.numel() >= 5 and torch.equal(more.values[both], obj.values[both])
    assert torch.equal(obj.optimum, obj.values.amax(-1))  # each agent's own maximum


def test_continuous_functions_of_each_kind():
    kw = dict(dim=1, num_groups=1, agents_per_group=5, perturbation=0.05, num_basis=64, lengthscale=0.2, seed=0)
    obj = GPSampleContinuousFederation(useless_fraction=0.25, adversarial_fraction=0.25, **kw)
    ref = GPSampleContinuousFederation(**kw)
    kind = obj.kind_of_agent
    assert (kind == USELESS).sum() == 1 and (kind == ADVERSARIAL).sum() == 1 and kind[0] == HELPFUL
    X = torch.linspace(0, 1, 4001, dtype=torch.float64).view(1, -1, 1).expand(5, -1, -1)
    values = obj.evaluate_true(X)
    helpful = kind == HELPFUL
    assert torch.equal(values[helpful], ref.evaluate_true(X)[helpful])
    assert torch.equal(obj.optimum[helpful], ref.optimum[helpful])
    agents = torch.arange(5)
    base, f = obj.base(X, agents), obj.f(X, torch.zeros(5, dtype=torch.long))
    adversarial, useless = kind == ADVERSARIAL, kind == USELESS
    assert torch.allclose(base[adversarial], 1.0 - f[adversarial], atol=1e-12, rtol=0)
    u = base[useless]  # normalized like f: range [0, 1] up to the numerical range estimate
    assert u.amin().abs() < 1e-3 and (u.amax() - 1).abs() < 1e-3
    assert (u - f[useless]).abs().amax() > 0.3
    # the optimum is each agent's own maximum (a numerical estimate: >= the dense grid's, barely above)
    assert (obj.optimum >= values.amax(-1) - 1e-9).all() and (obj.optimum <= values.amax(-1) + 1e-4).all()


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"useless_fraction": -0.1}, r"`useless_fraction` must lie in \[0, 1\], got -0.1"),
        ({"adversarial_fraction": 1.5}, r"`adversarial_fraction` must lie in \[0, 1\], got 1.5"),
        (
            {"useless_fraction": 0.6, "adversarial_fraction": 0.5},
            r"`useless_fraction` \+ `adversarial_fraction` must be <= 1, got 0.6 \+ 0.5",
        ),
    ],
)
def test_bad_fractions_are_refused_by_name(kw, says):
    with pytest.raises(ValueError, match=says):
        grid(**kw)
    with pytest.raises(ValueError, match=says):
        GPSampleContinuousFederation(dim=1, agents_per_group=3, num_basis=16, **kw)


def test_yaml_passes_the_fractions_to_the_objective():
    raw = {
        "experiment": "fts",
        "methods": [{"name": "TS", "algorithm": "ts"}],
        "objective": {
            "type": "gp_grid",
            "num_groups": 2,
            "agents_per_group": 5,
            "grid_size": 50,
            "useless_fraction": 0.5,
            "adversarial_fraction": 0.25,
        },
    }
    obj = build_objective(parse_config(raw).scenarios[0].objective)
    kinds = obj.kind_of_agent.view(2, 5)
    assert ((kinds == USELESS).sum(-1) == 2).all() and ((kinds == ADVERSARIAL).sum(-1) == 1).all()
    raw["objective"]["useless_fraction"] = "half"
    with pytest.raises(ConfigError, match="`useless_fraction` must be a number"):
        parse_config(raw)
