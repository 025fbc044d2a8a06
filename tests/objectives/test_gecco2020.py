"""pyfmto's gecco2020 many-task problem, ported: pyfmto's tasks and values, per-agent noise, computed optima."""

import math
import sys
from pathlib import Path

import pytest
import torch

from fbo_torch.objectives import REGISTRY, build_objective
from fbo_torch.objectives.gecco2020 import Gecco2020, geometric_median_value, mean_distance

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "peers"))
from check_ports import fixture_points  # the points the reference below was printed at

EPS = torch.finfo(torch.float64).eps
# pyfmto's noiseless f (the mean distance, minimized) of gecco2020 at d = 5, task_num = 20, seed 123, at the
# points of `fixture_points(5)` (in that order): pyfmto 0.3.4 with the problems of Xiaoxu-Zhang/fmto (the checkout
# benchmarks/peers/README.md names), each task's noise sigma set to 0 on its task object, `task.evaluate(u)`;
# printed by `python benchmarks/peers/check_ports.py fixture --fmto PATH` in the pyfmto environment.
# Key: agent (pyfmto's task agent + 1); these tasks are in groups 3, 2, 0, 1, 2, 2.
PYFMTO = {
    0: [1.4490622566097806, 1.3864308101514369, 1.393768307512564, 1.3774904714728191],
    1: [1.2600825093309993, 1.6551824417421777, 1.8473434487432838, 1.398546906674299],
    2: [1.4148217537348273, 1.0337641919927227, 1.6849058453186092, 1.6587360965492588],
    3: [1.1940720335832538, 1.7555078596660227, 0.7706006030035034, 1.1087162455477582],
    7: [1.4534332508594907, 1.5776425186234533, 1.4005176971186792, 1.4915573460468483],
    13: [1.2176630550089704, 1.4998826018881928, 1.4334864967110388, 1.2926221185026023],
}
# their noise standard deviations, as pyfmto draws them
PYFMTO_SIGMA = {
    0: 0.038342451450952046,
    1: 0.0026044745426310385,
    2: 0.0007982517360338244,
    3: 0.01105526009913588,
    7: 0.00012744249437832977,
    13: 0.013491872825531725,
}
PYFMTO_GROUPS = [3, 2, 0, 1, 3, 0, 3, 2, 1, 3, 0, 3, 1, 2, 1, 0, 1, 2, 0, 2]


def _rand(*shape, seed=0):
    return torch.rand(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def obj():
    return Gecco2020(dim=5, task_num=20)


def test_values_and_noise_levels_are_pyfmtos(obj):
    agents = torch.tensor(list(PYFMTO))
    U = torch.tensor(fixture_points(5), dtype=torch.float64).expand(len(agents), -1, -1)
    values = obj.evaluate_true(U, agents=agents)  # one batched call
    ref = torch.tensor([PYFMTO[n] for n in PYFMTO], dtype=torch.float64)
    # each value: d cumulative angles, cos/sin (within an ulp in either library), d-term sums of links <= 1.6 and
    # a mean of <= 5 distances <= 4: both libraries' roundings stay within 8 (d + 5) eps * 4 of the exact value
    torch.testing.assert_close(-values, ref, rtol=0, atol=8 * (5 + 5) * EPS * 4)
    assert obj.noise_sigma[agents].tolist() == [PYFMTO_SIGMA[n] for n in PYFMTO]  # bit for bit
    assert obj.group_of_agent.tolist() == PYFMTO_GROUPS
    assert obj.num_targets.tolist() == [5 if g == 3 else 3 for g in PYFMTO_GROUPS]


def test_tasks_follow_their_groups_recipe(obj):
    g = obj.group_of_agent
    assert torch.bincount(g, minlength=4).tolist() == [5, 5, 5, 5]
    assert torch.bincount(Gecco2020(dim=3, task_num=7).group_of_agent, minlength=4).tolist() == [2, 2, 2, 1]
    a, s = obj.angular_factor, obj.noise_sigma
    angular = [(0.4, 0.9), (0.9, 1.5), (0.3, 1.3), (0.5, 1.6)]
    sigma = [(0, 0.003), (0.01, 0.025), (0, 0.015), (0.02, 0.04)]
    for group, (lo, hi), (slo, shi) in zip(range(4), angular, sigma, strict=True):
        assert ((a[g == group] >= lo) & (a[g == group] <= hi)).all()
        assert ((s[g == group] >= slo) & (s[g == group] <= shi)).all()
    total = obj.lengths.sum(-1)
    assert ((total >= 0.6 - 1e-12) & (total <= 1.6 + 1e-12)).all()
    # group 0 (front-far targets only): every target in [1.1, 1.8] x [-0.4, 0.4]
    t0 = obj.arm_targets[g == 0, :3]
    assert ((t0[..., 0] >= 1.1) & (t0[..., 0] <= 1.8) & (t0[..., 1].abs() <= 0.4)).all()
    assert obj.arm_targets[g != 3, 3:].eq(0).all()  # padding
    other = Gecco2020(dim=5, task_num=20, seed=5)
    assert not torch.equal(other.lengths, obj.lengths)


def test_the_arm_by_hand():
    # two links, θ_i = 2π a (x_i - 1/2), angles summed along the arm; two targets and one padded row
    lengths = torch.tensor([[0.5, 0.25]], dtype=torch.float64)
    a = torch.tensor([0.25], dtype=torch.float64)
    targets = torch.tensor([[[0.0, 0.75], [1.0, 0.0], [0.0, 0.0]]], dtype=torch.float64)
    weights = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    # x = (1, 1/2): θ1 = 2π · 0.25 · 0.5 = π/4, θ2 = 0: both links along 45°
    X = torch.tensor([[[1.0, 0.5]]], dtype=torch.float64)
    e = 0.75 * torch.tensor([math.cos(math.pi / 4), math.sin(math.pi / 4)], dtype=torch.float64)
    expected = 0.5 * ((targets[0, 0] - e).norm() + (targets[0, 1] - e).norm())
    torch.testing.assert_close(mean_distance(X, lengths, a, targets, weights)[0, 0], expected, rtol=4 * EPS, atol=0)


def test_shapes_dtypes_and_batching(obj):
    X = _rand(20, 7, 5)
    v = obj(X)
    assert v.shape == (20, 7) and v.dtype == torch.float64
    assert obj(X.float()).dtype == torch.float32
    truth = obj.evaluate_true(X)
    alone = torch.cat([obj.evaluate_true(X[n : n + 1], agents=torch.tensor([n])) for n in range(20)])
    assert torch.equal(truth, alone)
    perm = torch.tensor([19, 4, 4, 0])
    assert torch.equal(obj.evaluate_true(X[perm], agents=perm), truth[perm])
    assert (truth < 0).all() and obj.dim == 5 and obj.targets.tolist() == list(range(20))


def test_values_follow_the_inputs_device(obj, device):
    X = _rand(20, 5, 5)
    on_device = obj.evaluate_true(X.to(device))
    assert on_device.device.type == device.type and on_device.dtype == torch.float64
    # cos/sin of the device's library: within an ulp or two of each term, as against pyfmto above
    torch.testing.assert_close(on_device.cpu(), obj.evaluate_true(X), rtol=0, atol=8 * (5 + 5) * EPS * 4)
    Y, F = obj.observe(X.to(device), keys=torch.arange(20, device=device))
    assert Y.device.type == device.type and torch.equal(F, on_device)


def test_noise_is_per_agent_and_keyed(obj):
    q = 4000
    X = _rand(20, q, 5, seed=1)
    keys = torch.arange(100, 120)
    Y, F = obj.observe(X, keys)
    assert torch.equal(F, obj.evaluate_true(X))
    eps = (Y - F) / obj.noise_sigma.unsqueeze(-1)  # N(0, 1) draws if the noise is sigma_n N(0, 1)
    # 80,000 standard normals: the mean's standard error is 1/sqrt(80000), the variance's sqrt(2/80000)
    n = eps.numel()
    assert abs(eps.mean().item()) < 5 / math.sqrt(n)
    assert abs(eps.var().item() - 1) < 5 * math.sqrt(2 / n)
    # each agent's own sample standard deviation: standard error ~ sigma_n / sqrt(2 q)
    per_agent = (Y - F).std(-1) / obj.noise_sigma
    assert ((per_agent - 1).abs() < 5 / math.sqrt(2 * q)).all()
    # an agent's observation depends on its key and point only, not on the batch
    Y2, _ = obj.observe(X[[3, 11]], keys[[3, 11]], agents=torch.tensor([3, 11]))
    assert torch.equal(Y2, Y[[3, 11]])
    assert torch.equal(obj(X, keys=keys), Y)
    # without keys: the noise generator, restarted by reseed
    obj.reseed(7)
    a = obj(X[:, :10])
    obj.reseed(7)
    assert torch.equal(obj(X[:, :10]), a) and not torch.equal(a, obj.evaluate_true(X[:, :10]))


def test_optimum_bounds_and_is_attained():
    o = Gecco2020(dim=3, task_num=8, seed=1)
    opt, x_opt, certified = o.optimum, o.optimizer, o.optimum_certified
    assert opt.shape == (8,) and opt.dtype == torch.float64 and x_opt.shape == (8, 3)
    assert ((x_opt >= 0) & (x_opt <= 1)).all()
    torch.testing.assert_close(o.evaluate_true(x_opt.unsqueeze(1)).squeeze(1), opt, rtol=0, atol=0)
    # no arm gets closer than the geometric median's mean distance (convex in the end-effector's position)
    bound = geometric_median_value(o.arm_targets, o._weights)
    assert (-opt >= bound - 1e-12).all()
    torch.testing.assert_close(-opt[certified], bound[certified], rtol=0, atol=1e-9)
    # nothing sampled is better; the loss is the simple regret
    v = o.evaluate_true(_rand(8, 4096, 3, seed=2))
    assert (v <= opt.unsqueeze(-1)).all()
    best = v.amax(-1)
    assert torch.equal(o.loss(best), opt - best) and o.loss_name == "simple regret"


def test_optimum_against_a_dense_grid():
    # d = 2: the optimum is at least the best of a dense grid, and at most that plus what the grid can miss.
    # f moves at most as fast as the end-effector, |∂e/∂x_l| <= 2π a ΣL, so |f(x) - f(y)| <= 2π a ΣL ‖x - y‖₁;
    # the grid point nearest the optimizer is within h/2 per coordinate: within 2π a ΣL h of the optimum
    o = Gecco2020(dim=2, task_num=8, seed=3)
    n = 801
    axis = torch.linspace(0, 1, n, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(axis, axis, indexing="ij"), -1).reshape(1, -1, 2)
    best = torch.stack([o.evaluate_true(grid, agents=torch.tensor([k])).max() for k in range(8)])
    slack = 2 * math.pi * o.angular_factor * o.lengths.sum(-1) / (n - 1)
    assert (best <= o.optimum + 1e-15).all()
    assert (best >= o.optimum - slack).all()


def test_registered_and_built_from_yaml_arguments():
    assert REGISTRY["gecco2020"].endswith(":Gecco2020")
    o = build_objective({"type": "gecco2020", "dim": 3, "task_num": 6, "seed": 123})
    assert isinstance(o, Gecco2020) and o.num_agents == 6 and o.dim == 3
    assert torch.equal(o.lengths, Gecco2020(dim=3, task_num=6).lengths)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"dim": 1}, "dim"), ({"dim": 2.5}, "dim"), ({"task_num": 0}, "task_num"), ({"seed": -1}, "seed")],
)
def test_bad_arguments_are_refused(kwargs, name):
    with pytest.raises((TypeError, ValueError), match=name):
        Gecco2020(**{"dim": 3, "task_num": 4, **kwargs})
