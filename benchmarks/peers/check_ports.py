r"""Check that fbo_torch's ports of pyfmto's problems evaluate the same functions as pyfmto.

Two steps in two environments (pyfmto is never imported next to fbo_torch):

1. ``reference`` (in the pyfmto environment): pyfmto's values at seeded random
   points, written to an ``.npz`` file —

   * ``tetci2019`` at each ``--dims``: per task, ``--points`` unit-box points ``u``
     (``numpy.random.default_rng(seed)``), mapped as fbo_torch maps them,
     ``x = lb + (ub - lb) u`` (the same IEEE operations, so the same ``x``), and
     ``task.evaluate(x)``; plus ``y_global``;
   * ``svm_landmine``: a few points on a few fields, ``1 - AUC`` with NumPy's
     global state seeded to 0 before each fit (so scikit-learn's Platt scaling,
     ``random_state=None`` in pyfmto, draws what ``random_state=0`` draws), and
     the same points under other global seeds (how much pyfmto's own values move);
   * ``gecco2020`` at each ``--gecco`` ``d:task_num`` (pyfmto's seed 123): every
     task's generated parameters (link lengths, angular factor, noise σ, targets)
     and its *noiseless* values at ``--points`` points (the reference sets each
     task's σ to 0 on its own task objects; fmto is not edited);
   * ``tevc2024`` at each ``--tevc-dims`` and ``--tevc-sources`` base function,
     and ``arxiv2017`` at each ``--arxiv-dims``: values at ``--points`` points per
     task and ``y_global``. fmto's ``tevc2024`` looks for its matrices under
     ``problems/datasets/tevc2024/``, where the checkout does not have them (so pyfmto
     cannot load it): the reference builds pyfmto's own ``Tevc2024`` with its
     ``loadmat`` pointed at the file where fmto ships it.

2. ``compare`` (in fbo_torch's environment): fbo_torch's values at the same
   points — ``Tetci2019(dim)``, ``LandmineSVM(search_space=linear, scoring="platt")``,
   ``Gecco2020(dim, task_num)`` (noiseless: ``evaluate_true``) and the benchmark
   ports of ``benchmarks/peers/ports.py`` (``--fmto`` for their matrices) — and
   the largest differences; exits non-zero when a relative error of
   ``tetci2019``, ``gecco2020``, ``tevc2024`` or ``arxiv2017`` exceeds ``--rtol``
   (1e-12), or a generated ``gecco2020`` parameter differs at all.

``fixture`` (pyfmto environment) prints the few-point references the unit tests
``tests/objectives/test_tetci2019.py`` and ``tests/objectives/test_gecco2020.py`` hold.

Usage::

    /path/to/pyfmto-venv/bin/python benchmarks/peers/check_ports.py reference --fmto /path/to/fmto --out /tmp/ref.npz
    python benchmarks/peers/check_ports.py compare /tmp/ref.npz --fmto /path/to/fmto
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
#: Unit-box points of the SVM check: corners, the centre, and points near the small-C / small-γ edges.
SVM_POINTS = np.array(
    [[0.5, 0.5], [0.01, 0.5], [0.5, 0.01], [0.2, 0.8], [0.9, 0.1], [0.001, 0.001], [1.0, 1.0], [0.05, 0.3]]
)
SVM_FIELDS = [0, 1, 5, 14, 28]
#: gecco2020's unit-test fixture: d, task_num and the tasks printed by ``fixture``.
GECCO_FIXTURE = (5, 20, [0, 1, 2, 3, 7, 13])
#: Where fmto ships tevc2024's matrices (fmto's own code looks under problems/datasets/tevc2024/).
TEVC2024_FILE = "problems/tevc2024/composition_func_M_D10.mat"


def _points(key: list[int], n: int, d: int) -> np.ndarray:
    """``n x d`` unit-box points of one task, the same in both environments."""
    return np.random.default_rng(key).random((n, d))


def _pyfmto(fmto: Path):
    os.chdir(tempfile.mkdtemp(prefix="pyfmto-check-"))  # pyfmto writes out/logs/ here
    from pyfmto import list_problems, load_problem

    names = dict(
        zip(
            [Path(s).name for s in list_problems([str(fmto)])["source"]],
            list_problems([str(fmto)])["name"],
            strict=True,
        )
    )

    def problem(name, **kw):
        return load_problem(names[name], [str(fmto)], **kw).initialize()

    return problem


def _pyfmto_tevc2024(fmto: Path, dim: int, src: str) -> list:
    """pyfmto's own ``Tevc2024`` tasks, its ``loadmat`` pointed at the file where fmto ships it."""
    import importlib

    module = importlib.import_module(f"{fmto.name}.problems.tevc2024.tevc2024")  # on sys.path after _pyfmto
    real = module.loadmat

    def loadmat(path, *a, **kw):
        return real(path if Path(path).is_file() else str(fmto / TEVC2024_FILE), *a, **kw)

    module.loadmat = loadmat
    try:
        return list(module.Tevc2024(dim=dim, src_problem=src, fe_init=5 * dim, fe_max=11 * dim))
    finally:
        module.loadmat = real


def _values(task, U: np.ndarray) -> np.ndarray:
    X = task.lb + (task.ub - task.lb) * U  # as fbo_torch maps the unit box
    return np.asarray(task.evaluate(X), dtype=np.float64).reshape(-1)


def _arguments(task, U: np.ndarray) -> np.ndarray:
    """pyfmto's transformed and clipped arguments of the base function (``before_eval``) at ``U``."""
    return np.asarray(task.before_eval(task.lb + (task.ub - task.lb) * U), dtype=np.float64)


def _y_global(task) -> np.ndarray:
    return np.asarray(task.y_global, dtype=np.float64).reshape(-1)


def _gecco_tasks(problem, d: int, n: int) -> tuple[list, dict[str, np.ndarray]]:
    """pyfmto's gecco2020 tasks with their noise switched off, and the parameters they were generated with."""
    tasks = list(problem("gecco2020", dim=d, task_num=n))
    targets = np.zeros((n, 5, 2))
    for k, t in enumerate(tasks):
        targets[k, : len(t._targets)] = t._targets
    params = {
        "lengths": np.stack([t._lengths for t in tasks]),
        "angular_factor": np.array([t._angular_factor for t in tasks]),
        "noise_sigma": np.array([t._noise_sigma for t in tasks]),
        "targets": targets,
    }
    for t in tasks:
        t._noise_sigma = 0.0  # noiseless values (on these task objects only)
    return tasks, params


def reference(args) -> None:
    fmto = args.fmto.resolve()
    problem = _pyfmto(fmto)
    out: dict[str, np.ndarray] = {}
    for d in args.dims:
        tasks = list(problem("tetci2019", dim=d))
        for n, t in enumerate(tasks):
            U = np.random.default_rng([d, n]).random((args.points, d))
            X = t.lb + (t.ub - t.lb) * U
            out[f"tetci_d{d}_t{n}_y"] = np.asarray(t.evaluate(X), dtype=np.float64).reshape(-1)
            out[f"tetci_d{d}_t{n}_yglobal"] = np.asarray(t.y_global, dtype=np.float64).reshape(-1)
    tasks = list(problem("svm_landmine"))
    for f in SVM_FIELDS:
        t = tasks[f]
        X = t.lb + (t.ub - t.lb) * SVM_POINTS
        vals = []
        for seed in range(args.svm_seeds):
            row = []
            for x in X:
                np.random.seed(seed)  # noqa: NPY002  (pyfmto's SVC reads NumPy's global state)
                row.append(float(np.asarray(t.evaluate(x.reshape(1, -1))).reshape(-1)[0]))
            vals.append(row)
        out[f"svm_f{f}_y"] = np.array(vals)  # seeds x points, row 0: NumPy's global seed 0
    for spec in args.gecco:
        d, n = (int(v) for v in spec.split(":"))
        tasks, params = _gecco_tasks(problem, d, n)
        for key, value in params.items():
            out[f"gecco_d{d}_n{n}_{key}"] = value
        out[f"gecco_d{d}_n{n}_y"] = np.stack(
            [_values(t, _points([2020, d, k], args.points, d)) for k, t in enumerate(tasks)]
        )
    suites = [
        (f"tevc_{src}_d{d}", 2024, d, lambda d=d, src=src: _pyfmto_tevc2024(fmto, d, src))
        for src in args.tevc_sources
        for d in args.tevc_dims
    ]
    suites += [(f"arxiv_d{d}", 2017, d, lambda d=d: list(problem("arxiv2017", dim=d))) for d in args.arxiv_dims]
    for key, seed, d, tasks_of in suites:
        tasks = tasks_of()
        U = [_points([seed, d, k], args.points, d) for k in range(len(tasks))]
        out[f"{key}_y"] = np.stack([_values(t, u) for t, u in zip(tasks, U, strict=True)])
        out[f"{key}_z"] = np.stack([_arguments(t, u) for t, u in zip(tasks, U, strict=True)])
        out[f"{key}_yglobal"] = np.concatenate([_y_global(t) for t in tasks])
    np.savez(args.out, **out)
    print(f"wrote {args.out}")


def fixture_points(d: int) -> list[list[float]]:
    """The unit tests' points (written out the same way there): two spread points and the box's corners."""
    return [
        [((3 * i + 1) % 11 + 0.37) / 11.5 for i in range(d)],
        [((5 * i + 2) % 13 + 0.71) / 13.9 for i in range(d)],
        [0.0] * d,
        [1.0] * d,
    ]


def fixture(args) -> None:
    problem = _pyfmto(args.fmto.resolve())
    for d in (3, 10):
        tasks = list(problem("tetci2019", dim=d))
        print(f"# tetci2019, d = {d}")
        for n, t in enumerate(tasks):
            U = np.array(fixture_points(d))
            X = t.lb + (t.ub - t.lb) * U
            y = np.asarray(t.evaluate(X), dtype=np.float64).reshape(-1)
            print(f"    ({d}, {n}): [{', '.join(repr(float(v)) for v in y)}],")
    d, n, which = GECCO_FIXTURE
    tasks, params = _gecco_tasks(problem, d, n)
    print(f"# gecco2020, d = {d}, task_num = {n}, noiseless f")
    for k in which:
        y = _values(tasks[k], np.array(fixture_points(d)))
        print(f"    {k}: [{', '.join(repr(float(v)) for v in y)}],")
    print("# their noise sigma")
    print("    " + ", ".join(f"{k}: {float(params['noise_sigma'][k])!r}" for k in which))


def _rel(y: np.ndarray, y_ref: np.ndarray) -> float:
    return float(np.max(np.abs(y - y_ref) / np.maximum(np.abs(y_ref), 1e-300)))


def compare(args) -> None:
    import torch

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
    from ports import arxiv2017, tevc2024

    from fbo_torch.objectives.gecco2020 import Gecco2020
    from fbo_torch.objectives.landmine import LandmineSVM
    from fbo_torch.objectives.search_space import Real, SearchSpace
    from fbo_torch.objectives.tetci2019 import Tetci2019

    ref = np.load(args.reference)
    worst: dict[str, float] = {}  # the relative errors checked against --rtol
    value_worst: dict[str, float] = {}  # tevc2024/arxiv2017: values (rotation's rounding included)
    failed: list[str] = []
    dims = sorted({int(k.split("_")[1][1:]) for k in ref.files if k.startswith("tetci_")})
    for d in dims:
        obj = Tetci2019(dim=d)
        for n in range(obj.num_agents):
            y_ref = ref[f"tetci_d{d}_t{n}_y"]
            U = torch.from_numpy(np.random.default_rng([d, n]).random((len(y_ref), d)))
            y = -obj(U.unsqueeze(0), agents=torch.tensor([n]))[0].numpy()
            rel = _rel(y, y_ref)
            yg_ref = float(ref[f"tetci_d{d}_t{n}_yglobal"][0])
            yg = float(obj.y_global[n])
            worst["tetci2019"] = max(worst.get("tetci2019", 0.0), rel)
            print(
                f"tetci2019 d={d:2d} task {n + 1:2d} {obj.names[n]:11s}: {len(y_ref)} points, max rel. error "
                f"{rel:.2e}; y_global pyfmto {yg_ref!r}, ours {yg!r}{'' if yg == yg_ref else '  (DIFFERENT)'}"
            )

    linear = SearchSpace([Real("C", 1e-4, 10.0), Real("gamma", 1e-2, 10.0)])
    svm_keys = sorted((k for k in ref.files if k.startswith("svm_")), key=lambda k: int(k.split("_")[1][1:]))
    if svm_keys:
        fields = [int(k.split("_")[1][1:]) for k in svm_keys]
        obj = LandmineSVM(fields=fields, search_space=linear, scoring="platt")
        U = torch.from_numpy(SVM_POINTS).expand(len(fields), -1, -1).contiguous()
        ours = 1 - obj(U).numpy()  # pyfmto minimizes 1 - AUC
        for i, (f, k) in enumerate(zip(fields, svm_keys, strict=False)):
            y_ref = ref[k]
            diff = np.max(np.abs(ours[i] - y_ref[0]))
            spread = y_ref.max(0) - y_ref.min(0)
            print(
                f"svm_landmine field {f:2d}: max |ours - pyfmto (global seed 0)| {diff:.2e}; pyfmto over "
                f"{len(y_ref)} global seeds: largest spread {spread.max():.3f}, {int(np.sum(spread > 0.05))} of "
                f"{spread.size} points move by more than 0.05"
            )

    for key in sorted(k for k in ref.files if k.startswith("gecco_") and k.endswith("_y")):
        d, n = int(key.split("_")[1][1:]), int(key.split("_")[2][1:])
        obj = Gecco2020(dim=d, task_num=n)
        mine = {
            "lengths": obj.lengths,
            "angular_factor": obj.angular_factor,
            "noise_sigma": obj.noise_sigma,
            "targets": obj.arm_targets,
        }
        same = {p: bool(np.array_equal(mine[p].numpy(), ref[f"gecco_d{d}_n{n}_{p}"])) for p in mine}
        if not all(same.values()):
            failed.append(f"gecco2020 d={d} task_num={n}: generated parameters differ ({same})")
        y_ref = ref[key]  # task_num x points
        U = torch.from_numpy(np.stack([_points([2020, d, k], y_ref.shape[1], d) for k in range(n)]))
        y = -obj.evaluate_true(U).numpy()
        rel = _rel(y, y_ref)
        worst["gecco2020"] = max(worst.get("gecco2020", 0.0), rel)
        print(
            f"gecco2020 d={d:2d} task_num={n:3d}: parameters identical: {all(same.values())}; {y_ref.size} points, "
            f"max rel. error {rel:.2e}, max abs. error {np.max(np.abs(y - y_ref)):.2e}"
        )

    rotated_keys = sorted(k for k in ref.files if k.startswith(("tevc_", "arxiv_")) and k.endswith("_y"))
    if rotated_keys and args.fmto is None:
        raise SystemExit("the reference holds tevc2024/arxiv2017 values: pass --fmto (their matrices)")
    eps = np.finfo(np.float64).eps
    for key in rotated_keys:
        parts = key.split("_")
        if parts[0] == "tevc":
            src, d = parts[1], int(parts[2][1:])
            obj, name = tevc2024(d, args.fmto, src_problem=src), f"tevc2024 {src}"
        else:
            d = int(parts[1][1:])
            obj, name = arxiv2017(d, args.fmto), "arxiv2017"
        stem = key[:-2]
        y_ref, z_ref, yg_ref = ref[key], ref[f"{stem}_z"], ref[f"{stem}_yglobal"]
        seed = 2024 if parts[0] == "tevc" else 2017
        U = torch.from_numpy(np.stack([_points([seed, d, k], y_ref.shape[1], d) for k in range(obj.num_agents)]))
        X = obj.to_original(U)
        y = obj.evaluate_original(X).numpy()
        per_task = [_rel(y[k], y_ref[k]) for k in range(obj.num_agents)]
        # the base functions on pyfmto's own arguments: the port of φ alone
        rel_phi = _rel(obj.evaluate_base(torch.from_numpy(z_ref)).numpy(), y_ref)
        # the arguments: R (x - s) rounds differently in two BLAS; each computed dot product is within
        # d ε Σ_j |x_j - s_j| |R_ij| of the exact one (Higham, Thm. 3.5 to first order), so two within twice that
        z = obj.transform(X).numpy()
        bound = 2 * d * eps * ((X - obj.shift.unsqueeze(1)).abs() @ obj.rotation_t.abs()).numpy()
        diff = np.abs(z - z_ref)
        dz = np.where(diff > 0, diff / np.maximum(bound, 1e-300), 0.0).max((1, 2))
        rel = max(per_task)
        suite = name.split()[0]
        worst[suite] = max(worst.get(suite, 0.0), rel_phi)
        value_worst[suite] = max(value_worst.get(suite, 0.0), rel)
        if dz.max() > 1:
            failed.append(f"{name} d={d}: arguments differ beyond rounding ({dz.max():.2f} of the bound)")
        # Schwefel's y_global is 418.9829 d minus a sum of that size: compared to that size
        yg_pyfmto = obj.y_global_pyfmto.numpy()
        yg_match = np.allclose(yg_pyfmto, yg_ref, rtol=args.rtol, atol=args.rtol * 418.9829 * d)
        if not yg_match:
            failed.append(f"{name} d={d}: pyfmto's y_global not reproduced")
        wrong = [k + 1 for k in range(obj.num_agents) if yg_ref[k] > float(obj.y_global[k]) + 1e-9]
        print(
            f"{name:20s} d={d:2d}: {obj.num_agents} tasks x {y_ref.shape[1]} points, max rel. error {rel:.2e} "
            f"(task {int(np.argmax(per_task)) + 1}), of φ at pyfmto's arguments {rel_phi:.2e}, arguments within "
            f"{dz.max():.3f} of the rounding bound; pyfmto's y_global reproduced: {yg_match}; "
            f"tasks whose pyfmto y_global exceeds the minimum: {wrong or 'none'}"
            + (f" (by up to {np.max(yg_ref - obj.y_global.numpy()):.4g})" if wrong else "")
            + f"; optimum attained in the box: {int(obj.optimum_attained.sum())} of {obj.num_agents}"
        )

    for suite, value in worst.items():
        what = "of φ at pyfmto's arguments" if suite in value_worst else ""
        print(f"{suite}: largest relative error {what} {value:.2e} (tolerance {args.rtol:g})".replace("  ", " "))
        if suite in value_worst:
            rel = value_worst[suite]
            print(f"{suite}: largest relative error of the values {rel:.2e} (the rotation's rounding included)")
        if value > args.rtol:
            failed.append(f"{suite}: relative error {value:.2e} > {args.rtol:g}")
    for line in failed:
        print(f"FAILED: {line}")
    if failed:
        sys.exit(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference", help="pyfmto's values (run in the pyfmto environment)")
    r.add_argument("--fmto", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--dims", type=int, nargs="*", default=[3, 10], help="tetci2019's dimensions")
    r.add_argument("--points", type=int, default=1000)
    r.add_argument("--svm-seeds", type=int, default=5)
    r.add_argument("--gecco", nargs="*", default=["5:20", "10:50", "2:3"], help="gecco2020's d:task_num")
    r.add_argument("--tevc-dims", type=int, nargs="*", default=[1, 5, 10])
    r.add_argument(
        "--tevc-sources",
        nargs="*",
        default=["Ackley", "Griewank", "Rastrigin", "Rosenbrock", "Schwefel", "Sphere", "Weierstrass", "Ellipsoid"],
    )
    r.add_argument("--arxiv-dims", type=int, nargs="*", default=[1, 10, 25, 30, 50])
    fx = sub.add_parser("fixture", help="print the unit tests' reference values (pyfmto environment)")
    fx.add_argument("--fmto", type=Path, required=True)
    c = sub.add_parser("compare", help="fbo_torch's values against the reference (fbo_torch environment)")
    c.add_argument("reference", type=Path)
    c.add_argument("--fmto", type=Path, default=None, help="fmto's checkout (tevc2024's and arxiv2017's matrices)")
    c.add_argument("--rtol", type=float, default=1e-12)
    args = p.parse_args()
    if getattr(args, "out", None) is not None:
        args.out = args.out.resolve()
    if getattr(args, "reference", None) is not None:
        args.reference = args.reference.resolve()
    {"reference": reference, "fixture": fixture, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    main()
