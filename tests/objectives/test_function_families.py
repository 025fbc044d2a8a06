"""The heterogeneous many-task federation of shifted classic functions."""

import json
import math

import pytest
import torch
from botorch.test_functions import synthetic as bt

from fbo_torch.cli import main
from fbo_torch.experiments import fts
from fbo_torch.experiments.config import load_config
from fbo_torch.objectives import REGISTRY, build_objective
from fbo_torch.objectives.function_families import (
    DEFAULT_FAMILIES,
    FAMILIES,
    OPTIMIZER_RANGE,
    FunctionFamilyFederation,
)

ALL = tuple(FAMILIES)  # the default seven and Levy


def _rand(*shape, seed=0):
    return torch.rand(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dim", [1, 3])
def test_each_family_peaks_at_its_shifted_optimizer(dim):
    families = [f for f in ALL if dim > 1 or f != "rosenbrock"]
    obj = FunctionFamilyFederation(num_agents=2 * len(families), dim=dim, families=families, seed=5)
    A = obj.num_agents
    assert obj.family_names == families * 2
    # the optimizers are inside their family's range, and the shifts differ between agents of a family
    lo, hi = torch.tensor([OPTIMIZER_RANGE.get(n, OPTIMIZER_RANGE[None]) for n in obj.family_names]).T
    assert ((obj.optimizers >= lo.unsqueeze(-1)) & (obj.optimizers <= hi.unsqueeze(-1))).all()
    assert (obj.optimizers[: len(families)] != obj.optimizers[len(families) :]).all()
    # the maximum: 0 (minus the family's minimum), Schwefel's standard form 1.2728e-5 d above it
    expected = torch.tensor(
        [-1.2728e-5 * dim if n == "schwefel" else 0.0 for n in obj.family_names], dtype=torch.float64
    )
    assert torch.allclose(obj.optimum, expected, atol=1e-12, rtol=1e-4)
    at_opt = obj(obj.optimizers.unsqueeze(1))
    assert torch.equal(at_opt.squeeze(-1), obj.optimum)
    # no value anywhere is higher: random points, and points close to the optimizer
    far = obj(_rand(A, 4096, dim))
    near = obj((obj.optimizers.unsqueeze(1) + 1e-3 * (2 * _rand(A, 256, dim, seed=1) - 1)).clamp(0, 1))
    assert (far < obj.optimum.unsqueeze(-1)).all() and (near <= obj.optimum.unsqueeze(-1)).all()


def test_schwefels_optimizer_range_keeps_its_minimum_global():
    # Schwefel is separable: per coordinate, with optimizer u*, the box spans z* - 1000 u* .. z* + 1000 (1 - u*)
    fn = FAMILIES["schwefel"](dim=1)
    z = fn.optimizers[0, 0]
    at_opt = fn._evaluate_true(z.view(1, 1))

    def lowest(u):
        x = torch.linspace(float(z) - 1000 * u, float(z) + 1000 * (1 - u), 200_001, dtype=torch.float64)
        return fn._evaluate_true(x.unsqueeze(-1)).min()

    lo, hi = OPTIMIZER_RANGE["schwefel"]
    assert lowest(lo) >= at_opt - 1e-9 and lowest(hi) >= at_opt - 1e-9
    assert lowest(lo - 0.02) < at_opt - 1.0 and lowest(hi + 0.01) < at_opt - 1.0  # the range is not loose


def test_the_shift_maps_the_box_onto_the_family_domain():
    obj = FunctionFamilyFederation(num_agents=8, dim=3, families=ALL, seed=2)
    U = _rand(8, 64, 3)
    values = obj(U)
    for n, name in enumerate(obj.family_names):
        fn = FAMILIES[name](dim=3)
        lo, hi = fn.bounds
        z = fn.optimizers[0] + (hi - lo) * (U[n] - obj.optimizers[n])  # the family's own argument
        if name in ("ackley", "rastrigin", "rosenbrock", "griewank", "levy"):  # BoTorch's code, public entry
            wide = getattr(bt, type(fn).__name__)(dim=3, bounds=[(-2e3, 2e3)] * 3)
            ref = -wide.evaluate_true(z)
        elif name == "sphere":
            ref = -(z**2).sum(-1)
        elif name == "schwefel":
            ref = torch.tensor(
                [-(418.9829 * 3 - sum(x * math.sin(math.sqrt(abs(x))) for x in row)) for row in z.tolist()],
                dtype=torch.float64,
            )
        else:  # weierstrass, term by term

            def w(x):
                return sum(0.5**k * math.cos(2 * math.pi * 3**k * (x + 0.5)) for k in range(21))

            ref = torch.tensor([-(sum(w(x) for x in row) - 3 * w(0.0)) for row in z.tolist()], dtype=torch.float64)
        assert torch.allclose(values[n], ref, rtol=1e-10, atol=1e-10), name


def test_batched_evaluation_equals_per_agent_evaluation():
    obj = FunctionFamilyFederation(num_agents=10, seed=1)  # families cycle: agents 7, 8, 9 repeat 0, 1, 2
    assert obj.family_names == list(DEFAULT_FAMILIES) + list(DEFAULT_FAMILIES[:3])
    X = _rand(10, 5, 3)
    batched = obj(X)
    alone = torch.cat([obj(X[n : n + 1], agents=torch.tensor([n])) for n in range(10)])
    assert torch.equal(batched, alone)
    perm = torch.tensor([9, 3, 3, 0, 6])  # any subset, in any order, with repeats
    assert torch.equal(obj(X[perm], agents=perm), batched[perm])


def test_values_follow_the_inputs_device_and_dtype(device):
    obj = FunctionFamilyFederation(num_agents=8, families=ALL, normalize=True)
    X = _rand(8, 5, 3)
    on_device = obj(X.to(device))
    assert on_device.device.type == device.type and on_device.dtype == torch.float64
    assert torch.allclose(on_device.cpu(), obj(X), rtol=1e-9, atol=1e-12)
    assert obj(X.float().to(device)).dtype == torch.float32


def test_default_federation_has_wildly_different_scales():
    obj = build_objective({"type": "function_families"})
    assert REGISTRY["function_families"].endswith(":FunctionFamilyFederation")
    assert obj.num_agents == 7 and obj.dim == 3 and obj.family_names == list(DEFAULT_FAMILIES)
    assert torch.equal(obj.bounds, torch.tensor([[0.0] * 3, [1.0] * 3], dtype=torch.float64))
    v = obj(_rand(7, 2048, 3))
    spread = v.amax(-1) - v.amin(-1)
    assert spread.max() / spread.min() > 1e3
    assert spread[DEFAULT_FAMILIES.index("rosenbrock")] > 1e5 and spread[DEFAULT_FAMILIES.index("weierstrass")] < 20


def test_normalize_divides_by_each_agents_range():
    raw = FunctionFamilyFederation(seed=3)
    obj = FunctionFamilyFederation(seed=3, normalize=True)
    X = _rand(7, 2048, 3)
    assert torch.allclose(obj(X), raw(X) / obj.scale.unsqueeze(-1), rtol=1e-14, atol=0)
    v = obj(X)
    assert (v.amin(-1) > -1.5).all() and (v.amin(-1) < -0.8).all() and (obj.optimum.abs() < 1e-6).all()
    assert torch.equal(FunctionFamilyFederation(seed=3).scale, torch.ones(7, dtype=torch.float64))


def test_observation_noise():
    X = _rand(7, 1000, 3)
    noiseless = FunctionFamilyFederation()
    assert torch.equal(noiseless(X), noiseless.evaluate_true(X))
    obj = FunctionFamilyFederation(noise_variance=0.25)
    Y, F = obj.observe(X, torch.arange(7, dtype=torch.long))
    assert torch.equal(F, noiseless.evaluate_true(X))
    # 7000 draws: the sample std is within 5% of 0.5 (its s.e. is 0.85%)
    assert abs(float((Y - F).std()) - 0.5) < 0.025
    assert abs(float((obj(X) - F).std()) - 0.5) < 0.025


@pytest.mark.parametrize(
    "kw, error, says",
    [
        ({"families": ["sphere", "rosenbrok"]}, ValueError, "`families` must be a non-empty list of names from"),
        ({"families": []}, ValueError, "`families` must be a non-empty list"),
        ({"families": "sphere"}, ValueError, "`families` must be a non-empty list"),
        ({"dim": 1}, ValueError, "`families`: rosenbrock needs `dim` >= 2"),
        ({"dim": 0}, ValueError, "`dim` must be >= 1"),
        ({"num_agents": 0}, ValueError, "`num_agents` must be >= 1"),
        ({"noise_variance": -1.0}, ValueError, "`noise_variance` must be finite and >= 0"),
        ({"normalize": 1}, TypeError, "`normalize` must be true or false"),
    ],
)
def test_bad_arguments_are_refused_by_name(kw, error, says):
    with pytest.raises(error, match=says):
        FunctionFamilyFederation(**kw)


FTS_YAML = """\
experiment: fts
name: tiny-families
objective: {type: function_families, num_agents: 3, dim: 2, families: [sphere, rosenbrock, weierstrass]}
runs: {num_inits: 1}
history: {t_n: 4}
defaults: {num_iterations: 2, num_features: 10, gp_refit_every: 0}
methods:
  - {name: TS, algorithm: ts}
  - {name: FTS, algorithm: fts}
"""


def test_every_agent_is_a_target_of_an_fts_run(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(FTS_YAML)
    sc = load_config(cfg).scenarios[0]
    obj = build_objective(sc.objective)
    assert torch.equal(fts.targets(obj, sc), torch.arange(3)) and getattr(obj, "group_of_agent", None) is None
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-progress"]) == 0
    methods = json.loads((out / "results.json").read_text())["scenarios"][0]["methods"]
    assert [m["name"] for m in methods] == ["TS", "FTS"]
    for m in methods:
        assert m["targets"] == [0, 1, 2] and len(m["loss_mean"]) == 3  # the initial point and 2 iterations
        loss = torch.tensor(m["loss_mean"])
        assert torch.isfinite(loss).all() and (loss >= 0).all() and (loss.diff() <= 0).all()


def test_normalization_in_chunks_of_agents_changes_no_scale(monkeypatch):
    import fbo_torch.objectives.function_families as module

    whole = module.FunctionFamilyFederation(num_agents=9, dim=2, normalize=True, seed=4)
    monkeypatch.setattr(module, "_NORMALIZE_CHUNK", 2)
    chunked = module.FunctionFamilyFederation(num_agents=9, dim=2, normalize=True, seed=4)
    assert torch.equal(whole.scale, chunked.scale) and torch.equal(whole.optimum, chunked.optimum)
