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
     the same points under other global seeds (how much pyfmto's own values move).

2. ``compare`` (in fbo_torch's environment): fbo_torch's values at the same
   points — ``Tetci2019(dim)`` and ``LandmineSVM(search_space=linear, scoring="platt")``
   — and the largest differences; exits non-zero when a ``tetci2019`` relative
   error exceeds ``--rtol`` (1e-12).

``fixture`` (pyfmto environment) prints the few-point reference the unit test
``tests/objectives/test_tetci2019.py`` holds.

Usage::

    /path/to/pyfmto-venv/bin/python benchmarks/peers/check_ports.py reference --fmto /path/to/fmto --out /tmp/ref.npz
    python benchmarks/peers/check_ports.py compare /tmp/ref.npz
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


def reference(args) -> None:
    problem = _pyfmto(args.fmto.resolve())
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
    np.savez(args.out, **out)
    print(f"wrote {args.out}")


def fixture_points(d: int) -> list[list[float]]:
    """The unit test's points (written out the same way there): two spread points and the box's corners."""
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
        print(f"# d = {d}")
        for n, t in enumerate(tasks):
            U = np.array(fixture_points(d))
            X = t.lb + (t.ub - t.lb) * U
            y = np.asarray(t.evaluate(X), dtype=np.float64).reshape(-1)
            print(f"    ({d}, {n}): [{', '.join(repr(float(v)) for v in y)}],")


def compare(args) -> None:
    import torch

    sys.path.insert(0, str(ROOT))
    from fbo_torch.objectives.landmine import LandmineSVM
    from fbo_torch.objectives.search_space import Real, SearchSpace
    from fbo_torch.objectives.tetci2019 import Tetci2019

    ref = np.load(args.reference)
    dims = sorted({int(k.split("_")[1][1:]) for k in ref.files if k.startswith("tetci_")})
    worst = 0.0
    for d in dims:
        obj = Tetci2019(dim=d)
        for n in range(obj.num_agents):
            y_ref = ref[f"tetci_d{d}_t{n}_y"]
            U = torch.from_numpy(np.random.default_rng([d, n]).random((len(y_ref), d)))
            y = -obj(U.unsqueeze(0), agents=torch.tensor([n]))[0].numpy()
            rel = float(np.max(np.abs(y - y_ref) / np.maximum(np.abs(y_ref), 1e-300)))
            yg_ref = float(ref[f"tetci_d{d}_t{n}_yglobal"][0])
            yg = float(obj.y_global[n])
            worst = max(worst, rel)
            print(
                f"tetci2019 d={d:2d} task {n + 1:2d} {obj.names[n]:11s}: {len(y_ref)} points, max rel. error "
                f"{rel:.2e}; y_global pyfmto {yg_ref!r}, ours {yg!r}{'' if yg == yg_ref else '  (DIFFERENT)'}"
            )
    print(f"tetci2019: largest relative error {worst:.2e} (tolerance {args.rtol:g})")

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
    if worst > args.rtol:
        sys.exit(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference", help="pyfmto's values (run in the pyfmto environment)")
    r.add_argument("--fmto", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--dims", type=int, nargs="+", default=[3, 10])
    r.add_argument("--points", type=int, default=1000)
    r.add_argument("--svm-seeds", type=int, default=5)
    fx = sub.add_parser("fixture", help="print the unit test's reference values (pyfmto environment)")
    fx.add_argument("--fmto", type=Path, required=True)
    c = sub.add_parser("compare", help="fbo_torch's values against the reference (fbo_torch environment)")
    c.add_argument("reference", type=Path)
    c.add_argument("--rtol", type=float, default=1e-12)
    args = p.parse_args()
    if getattr(args, "out", None) is not None:
        args.out = args.out.resolve()
    if getattr(args, "reference", None) is not None:
        args.reference = args.reference.resolve()
    {"reference": reference, "fixture": fixture, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    main()
