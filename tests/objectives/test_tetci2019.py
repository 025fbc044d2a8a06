"""pyfmto's tetci2019 many-task problem, ported: the same values as pyfmto's, in fbo_torch's conventions."""

import math

import pytest
import torch

from fbo_torch.objectives import REGISTRY, build_objective
from fbo_torch.objectives.tetci2019 import Tetci2019, to_unit

# f (minimized) of pyfmto's tetci2019 tasks at the points of `_points(d)` (in that order), computed by
# pyfmto 0.3.4 with the problem of Xiaoxu-Zhang/fmto at commit 0ef9881f, `task.evaluate(lb + (ub - lb) * u)`,
# printed by `python benchmarks/peers/check_ports.py fixture --fmto PATH` in the pyfmto environment.
# Key: (d, agent). Both corners are in the list: the shifted argument is clipped to the box there.
PYFMTO = {
    (3, 0): [7172.234404536861, 10710.170281041354, 30000.0, 30000.0],
    (3, 1): [22685.94328922495, 14778.22058899643, 30000.0, 1200.0],
    (3, 2): [13150.638941398865, 18629.94669012991, 1200.0, 30000.0],
    (3, 3): [6.881875277769152, 8.356560582649767, 3.3819633323619693, 11.999994277954102],
    (3, 4): [7745860.780436044, 293361119.58993834, 1300505202.0, 1200504802.0],
    (3, 5): [20.12541507695362, 21.96115867406057, 19.99909200140475, 17.293294335267746],
    (3, 6): [6.0623123220253134, 7.867694655455588, 0.0, 8.618030945593173],
    (3, 7): [1462.949189715226, 494.6569722473903, 715.1812244058247, 1798.7161755941752],
    (3, 8): [4.173671378177348, 2.2973687835940844, 6.103801795248719, 3.7022447156824287],
    (3, 9): [5784.0, 7087.098834105076, 2700.0, 5100.0],
    (10, 0): [29787.221172022673, 26527.819471041876, 100000.0, 100000.0],
    (10, 1): [66163.93194706994, 56487.75943274157, 100000.0, 4000.0],
    (10, 2): [48903.22873345936, 57906.8164173697, 4000.0, 100000.0],
    (10, 3): [24.627586746696473, 28.003507165461375, 11.27321110787323, 39.99998092651367],
    (10, 4): [850898228.6475565, 678707613.0835431, 5852273409.0, 5402271609.0],
    (10, 5): [20.99514618150217, 21.47696809270606, 19.99909200140475, 17.293294335267746],
    (10, 6): [21.773909713310264, 24.462962939124022, 0.0, 28.72676981864391],
    (10, 7): [3902.1210903697147, 3774.845577758196, 2383.937414686082, 5995.720585313918],
    (10, 8): [15.283020541367922, 16.24960369479525, 13.999817397544527, 13.999667196442605],
    (10, 9): [14556.39439322476, 13430.26710701556, 13000.0, 13000.0],
}
# pyfmto's `task.y_global` at d = 3 (its value at the optimizer it records)
PYFMTO_Y_GLOBAL_D3 = [0.0, 0.0, 0.0, 0.0, 0.0, 4.440892098500626e-16, 0.0, 3.818351251538843e-05, 0.0, 0.0]
NAMES = [
    "sphere",
    "sphere",
    "sphere",
    "weierstrass",
    "rosenbrock",
    "ackley",
    "weierstrass",
    "schwefel",
    "griewank",
    "rastrigin",
]


def _points(d):
    return [
        [((3 * i + 1) % 11 + 0.37) / 11.5 for i in range(d)],
        [((5 * i + 2) % 13 + 0.71) / 13.9 for i in range(d)],
        [0.0] * d,
        [1.0] * d,
    ]


def _rand(*shape, seed=0):
    return torch.rand(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dim", [3, 10])
def test_values_are_pyfmtos(dim):
    obj = Tetci2019(dim=dim)
    U = torch.tensor(_points(dim), dtype=torch.float64).expand(obj.num_agents, -1, -1)
    values = obj(U)  # one batched call for all ten agents
    ref = torch.tensor([PYFMTO[(dim, n)] for n in range(10)], dtype=torch.float64)
    assert torch.allclose(-values, ref, rtol=1e-12, atol=0)
    assert torch.equal(obj.evaluate_original(obj.to_original(U)), -values)


def test_optimum_is_minus_pyfmtos_y_global_and_is_attained():
    obj = Tetci2019(dim=3)
    assert obj.names == NAMES and obj.tasks == list(range(1, 11))
    assert torch.equal(obj.y_global, torch.tensor(PYFMTO_Y_GLOBAL_D3, dtype=torch.float64))
    assert torch.equal(obj.optimum, -obj.y_global)
    # pyfmto's optimizers, x* = shift + z* (z* = 1 for Rosenbrock, 420.9687 for Schwefel, else 0), in the unit box
    z_star = torch.tensor([1.0 if n == "rosenbrock" else 420.9687 if n == "schwefel" else 0.0 for n in NAMES])
    x_star = obj.shift + z_star.unsqueeze(-1)
    u_star = torch.stack([obj.to_unit(x_star[n], n) for n in range(10)])
    assert ((u_star >= 0) & (u_star <= 1)).all()
    assert u_star[6].eq(0).all()  # task 7's optimizer is its box's corner
    assert torch.allclose(obj(u_star.unsqueeze(1)).squeeze(-1), obj.optimum, rtol=0, atol=1e-9)
    # nothing sampled is better, and the loss is the simple regret f(best) - y_global
    v = obj(_rand(10, 4096, 3))
    assert (v < obj.optimum.unsqueeze(-1)).all()
    best = v.amax(-1)
    assert torch.equal(obj.loss(best), -best - obj.y_global)
    assert obj.loss_name == "simple regret"


def test_pyfmtos_rosenbrock_and_the_clipped_shift():
    obj = Tetci2019(dim=2)
    rosenbrock, sphere80 = NAMES.index("rosenbrock"), 1
    # pyfmto squares the next coordinate: 100 (z2^2 - z1)^2 + (z1 - 1)^2; the textbook form gives 101 here
    z = torch.tensor([[[2.0, 3.0]]], dtype=torch.float64)
    assert obj.evaluate_original(z, torch.tensor([rosenbrock])).item() == 4901.0
    # task 2 (Sphere shifted by 80 on [-100, 100]): x - 80 is clipped at -100, so f is flat for x < -20
    X = torch.tensor([[[-20.0, 0.0], [-50.0, 0.0], [-100.0, 0.0]]], dtype=torch.float64)
    f = obj.evaluate_original(X, torch.tensor([sphere80]))
    assert torch.equal(f, torch.full((1, 3), 100.0**2 + 80.0**2, dtype=torch.float64))


def test_more_than_25_dimensions_drop_the_weierstrass_tasks():
    obj = Tetci2019(dim=26)
    assert obj.num_agents == 8 and obj.tasks == [1, 2, 3, 5, 6, 8, 9, 10]
    assert "weierstrass" not in obj.names and obj(_rand(8, 3, 26)).shape == (8, 3)
    assert Tetci2019(dim=25).num_agents == 10
    # the split shifts: -80 on the first d // 2 coordinates, 80 on the rest (Griewank)
    assert obj.shift[obj.names.index("griewank")].tolist() == [-80.0] * 13 + [80.0] * 13


@pytest.mark.parametrize("bad", [0, 51, 2.5, "3"])
def test_bad_dim_is_refused(bad):
    with pytest.raises((TypeError, ValueError), match="dim"):
        Tetci2019(dim=bad)


def test_batched_evaluation_equals_per_agent_evaluation():
    obj = Tetci2019(dim=4)
    X = _rand(10, 6, 4)
    batched = obj(X)
    alone = torch.cat([obj(X[n : n + 1], agents=torch.tensor([n])) for n in range(10)])
    assert torch.equal(batched, alone)
    perm = torch.tensor([9, 3, 3, 0, 6])
    assert torch.equal(obj(X[perm], agents=perm), batched[perm])


def test_values_follow_the_inputs_device_and_dtype(device):
    obj = Tetci2019(dim=3)
    X = _rand(10, 5, 3)
    on_device = obj(X.to(device))
    assert on_device.device.type == device.type and on_device.dtype == torch.float64
    assert torch.allclose(on_device.cpu(), obj(X), rtol=1e-12, atol=0)
    assert obj(X.float().to(device)).dtype == torch.float32


def test_to_unit_maps_recorded_designs_onto_the_unit_box():
    obj = Tetci2019(dim=3)
    U = _rand(10, 15, 3)
    X = obj.to_original(U)  # what pyfmto records, in original units
    back = torch.stack([obj.to_unit(X[n], n) for n in range(10)])
    assert torch.allclose(back, U, rtol=0, atol=1e-15)
    assert torch.allclose(obj(back), obj(U), rtol=1e-12, atol=0)
    # the module-level helper takes any box, from lists (as read from pyfmto's JSON)
    assert torch.equal(to_unit([[0.0, 5.0]], [-1.0, 0.0], [1.0, 10.0]), torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    with pytest.raises(ValueError, match="ub"):
        to_unit([[0.0]], [1.0], [1.0])
    with pytest.raises(ValueError, match="agent"):
        obj.to_unit(X[0], 10)


def test_registered_and_noise():
    assert REGISTRY["tetci2019"].endswith(":Tetci2019")
    obj = build_objective({"type": "tetci2019", "dim": 3, "noise_variance": 4.0, "seed": 1})
    X = _rand(10, 2000, 3)
    Y, F = obj.observe(X, keys=torch.arange(10))
    assert torch.equal(F, obj.evaluate_true(X))
    noise = Y - F
    # sample variance of 20000 N(0, 4) draws: standard error 4 sqrt(2 / 20000) = 0.04
    assert abs(noise.var().item() - 4.0) < 5 * 0.04 and abs(noise.mean().item()) < 5 * math.sqrt(4.0 / 20000)
