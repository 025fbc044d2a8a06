"""benchmarks/peers/ports.py: pyfmto's rotated suites (tevc2024, arxiv2017) and build_objective.

fmto's matrices are not part of the repository: these tests write stand-ins in fmto's layout (random
orthogonal, non-symmetric matrices and shifts) and check the transform as pyfmto applies it, written
out again here in NumPy; the agreement with pyfmto itself on fmto's real files is
``benchmarks/peers/check_ports.py``'s job.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.io import savemat

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
from ports import ARXIV2017, TransformedTasks, arxiv2017, build_objective, tevc2024

EPS = np.finfo(np.float64).eps
FILES = {
    "CI_H": ("Rotation_Task1", "GO_Task1", "Rotation_Task2", "GO_Task2"),
    "CI_M": ("Rotation_Task1", "GO_Task1", "Rotation_Task2", "GO_Task2"),
    "CI_L": ("Rotation_Task1", "GO_Task1"),
    "PI_H": ("Rotation_Task1", "GO_Task1", "GO_Task2"),
    "PI_M": ("Rotation_Task1", "GO_Task1"),
    "PI_L": ("Rotation_Task1", "GO_Task1", "Rotation_Task2", "GO_Task2"),
    "NI_H": ("Rotation_Task2", "GO_Task2"),
    "NI_M": ("Rotation_Task1", "GO_Task1", "Rotation_Task2", "GO_Task2"),
    "NI_L": ("Rotation_Task1", "GO_Task1"),
}


def _orthogonal(rng, n):
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))


@pytest.fixture(scope="module")
def fmto(tmp_path_factory):
    """A stand-in for fmto's checkout: its .mat files, with random contents of the same shapes."""
    root = tmp_path_factory.mktemp("fmto")
    rng = np.random.default_rng(0)
    (root / "problems" / "tevc2024").mkdir(parents=True)
    savemat(
        root / "problems/tevc2024/composition_func_M_D10.mat", {f"M{i}": _orthogonal(rng, 10) for i in range(1, 11)}
    )
    datasets = root / "problems" / "arxiv2017" / "datasets"
    datasets.mkdir(parents=True)
    for name, keys in FILES.items():
        n = 25 if name == "PI_L" else 50
        content = {}
        for key in keys:
            size = n if key.endswith("2") else 50
            if key.startswith("Rotation"):
                content[key] = _orthogonal(rng, size)
            else:  # shifts inside every task's box: |s| <= 0.2 (Weierstrass's box is [-0.5, 0.5])
                content[key] = rng.uniform(-0.2, 0.2, (1, size))
        savemat(datasets / f"{name}.mat", content)
    return root


def _rastrigin(z):
    return np.sum(z**2 - 10 * np.cos(2 * np.pi * z) + 10, axis=-1)


def _rosenbrock(z):
    return 100 * np.sum((z[..., 1:] ** 2 - z[..., :-1]) ** 2, -1) + np.sum((z[..., :-1] - 1) ** 2, -1)


def test_values_are_the_base_function_at_the_rotated_clipped_argument(fmto):
    obj = tevc2024(4, fmto, src_problem="Rastrigin")
    assert obj.num_agents == 10 and obj.dim == 4 and obj.names == ["rastrigin"] * 10
    U = torch.rand(10, 50, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    values = obj(U)
    R = obj.rotation_t.numpy().transpose(0, 2, 1)  # the matrices as given to pyfmto's set_transform
    X = -5.0 + 10.0 * U.numpy()  # Rastrigin's default box [-5, 5]
    Z = np.clip(np.einsum("kqj,kij->kqi", X, R), -5.0, 5.0)  # pyfmto: (x - s) @ R.T, then clipped
    # two matrix products round z differently, by at most 2 d ε Σ_j |x_j| |R_ij| <= 2 d ε · 5 √d each
    # (orthogonal rows: Σ_j |R_ij| <= √d); Rastrigin's slope is at most 2 · 5 + 20π per coordinate; and the
    # d terms (each <= 25 + 20) summed in another order differ by at most 2 d ε · 45 d
    d = 4
    atol = d * (10 + 20 * np.pi) * 2 * d * EPS * 5 * np.sqrt(d) + 2 * d * EPS * 45 * d
    np.testing.assert_allclose(-values.numpy(), _rastrigin(Z), rtol=0, atol=atol)
    assert torch.equal(obj.rotation_t[0].T, torch.from_numpy(R[0]))
    # batched over agents, any subset in any order
    perm = torch.tensor([9, 2, 2, 5])
    assert torch.equal(obj(U[perm], agents=perm), values[perm])
    assert obj(U.float()).dtype == torch.float32


def test_y_global_pyfmtos_and_right(fmto):
    obj = tevc2024(4, fmto, src_problem="Rosenbrock")
    # pyfmto's x_global is z* @ inv(R) (+ s): the inverse of the transform only for a symmetric R
    for n in range(10):
        R = obj.rotation_t[n].T.numpy()
        x_pyfmto = np.ones(4) @ np.linalg.inv(R)
        z = np.clip(x_pyfmto @ R.T, -2.048, 2.048)
        assert obj.y_global_pyfmto[n].item() == pytest.approx(_rosenbrock(z), rel=1e-12)
    assert (obj.y_global_pyfmto > 1e-6).all()  # random rotations: never the minimum
    # the right value: φ(z*) = 0, attained at inv(R) z* where that lies in the box
    attained = []
    for d in (4, 10):  # below 10 the leading block of an orthogonal matrix is not orthogonal
        obj = tevc2024(d, fmto, src_problem="Rosenbrock")
        assert obj.y_global.eq(0).all() and torch.equal(obj.optimum, -obj.y_global)
        inside = [
            bool(np.all(np.abs(np.linalg.solve(obj.rotation_t[n].T.numpy(), np.ones(d))) <= 2.048)) for n in range(10)
        ]
        assert obj.optimum_attained.tolist() == inside
        u = torch.stack([obj.to_unit(obj.optimizer_original[n], n) for n in range(10)]).unsqueeze(1)
        at = -obj(u.clamp(0, 1)).squeeze(1)
        assert (at[obj.optimum_attained] < 1e-20).all() and (at[~obj.optimum_attained] > 0).all()
        attained += inside
    assert any(attained) and not all(attained)
    # Ackley's minimizer is 0: pyfmto's y_global is right whatever R
    ackley = tevc2024(4, fmto)
    torch.testing.assert_close(ackley.y_global_pyfmto, ackley.y_global, rtol=0, atol=1e-15)
    assert ackley.optimum_attained.all()


def test_arxiv2017_tasks(fmto):
    obj = arxiv2017(10, fmto)
    assert obj.num_agents == 18 and obj.names == [t[0] for t in ARXIV2017]
    assert torch.equal(obj.ub[:, 0], torch.tensor([t[1] for t in ARXIV2017], dtype=torch.float64))
    # task 17 (NI_L's rotation) takes NI_M's first shift, as fmto's code does; tasks 6 and 18 are one function
    from scipy.io import loadmat

    ni_m = loadmat(fmto / "problems/arxiv2017/datasets/NI_M.mat")
    ni_l = loadmat(fmto / "problems/arxiv2017/datasets/NI_L.mat")
    assert np.array_equal(obj.shift[16].numpy(), ni_m["GO_Task1"].reshape(-1)[:10])
    assert np.array_equal(obj.rotation_t[16].numpy(), ni_l["Rotation_Task1"][:10, :10].T)
    U = torch.rand(18, 20, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    v = obj(U)
    assert torch.equal(v[5], obj(U[5:6], agents=torch.tensor([17]))[0])
    assert torch.equal(v[9], obj(U[9:10], agents=torch.tensor([12]))[0])
    assert not obj.rotated[[5, 7, 9, 12, 17]].any() and obj.rotated[[0, 1, 2, 15, 16]].all()
    # every minimizer's preimage lies in its box here: the optimum is attained; pyfmto's y_global is right
    assert obj.optimum_attained.all()
    torch.testing.assert_close(obj.y_global_pyfmto, obj.y_global, rtol=0, atol=1e-9)
    # above 25 dimensions the Weierstrass task 12 is left out (fmto's matrix for it is 25 x 25)
    big = arxiv2017(30, fmto)
    assert big.num_agents == 17 and big.labels[11].startswith("13:") and "weierstrass" in big.names


def test_transformed_tasks_refuse_bad_input():
    with pytest.raises(ValueError, match="names"):
        TransformedTasks(["nope"], [1.0], [None], [np.zeros(2)])
    with pytest.raises(ValueError, match="same"):
        TransformedTasks(["sphere"], [1.0, 2.0], [None], [np.zeros(2)])
    with pytest.raises(ValueError, match="2 x 2"):
        TransformedTasks(["sphere", "sphere"], [1.0, 1.0], [np.eye(3), None], [np.zeros(2), None])


def test_build_objective_for_every_problem(fmto):
    from fbo_torch.objectives.gecco2020 import Gecco2020
    from fbo_torch.objectives.tetci2019 import Tetci2019

    assert isinstance(build_objective({"problem": "tetci2019", "dim": 3}, None), Tetci2019)
    assert build_objective({"problem": "Tetci2019", "dim": 10}, None).dim == 10  # fmto's class name
    g = build_objective({"problem": "gecco2020", "dim": 3, "problem_kwargs": {"task_num": 6}}, None)
    assert isinstance(g, Gecco2020) and g.num_agents == 6 and g.seed == 123
    assert build_objective({"problem": "gecco2020", "dim": 4}, None).num_agents == 50  # pyfmto's default
    t = build_objective({"problem": "tevc2024", "dim": 5, "problem_kwargs": {"src_problem": "Griewank"}}, fmto)
    assert t.num_agents == 10 and t.names == ["griewank"] * 10 and t.ub[0, 0].item() == 600.0
    assert build_objective({"problem": "arxiv2017", "dim": 26}, fmto).num_agents == 17
    with pytest.raises(ValueError, match="fmto"):
        build_objective({"problem": "arxiv2017", "dim": 3}, None)
    with pytest.raises(ValueError, match="problem_kwargs"):
        build_objective({"problem": "tetci2019", "dim": 3, "problem_kwargs": {"task_num": 3}}, None)
    with pytest.raises(ValueError, match="unknown problem"):
        build_objective({"problem": "cec2022", "dim": 10}, fmto)
    with pytest.raises(ValueError, match="dim"):
        build_objective({"problem": "tevc2024", "dim": 11}, fmto)
    with pytest.raises(ValueError, match="dim"):
        build_objective({"problem": "svm_landmine", "dim": 3}, None)
    with pytest.raises(ValueError, match="src_problem"):
        build_objective({"problem": "tevc2024", "dim": 2, "problem_kwargs": {"src_problem": "Nope"}}, fmto)


def test_build_objective_landmine_is_pyfmtos_configuration():
    from fbo_torch.objectives.landmine import resolve_landmine_path

    try:
        resolve_landmine_path()
    except FileNotFoundError:
        pytest.skip("LandmineData.mat not found")
    obj = build_objective({"problem": "SvmLandmine", "dim": 2}, None)
    assert obj.num_agents == 29 and obj.scoring == "platt"
    assert [(p.low, p.high, p.log) for p in obj.search_space.parameters] == [(1e-4, 10.0, False), (1e-2, 10.0, False)]
