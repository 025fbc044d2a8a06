r"""Seeded Latin-hypercube initial designs for a peer problem that has no pyfmto runs here.

``run_ours.py`` starts every configuration from the initial designs recorded in a
results file (pyfmto's, so both libraries are paired). For the suites pyfmto did not
run on this machine — ``tevc2024`` and ``arxiv2017`` (their ports read fmto's
matrices, ``ports.py``) — this script writes a file in the same schema whose one
configuration, ``design``, holds only the initial design of every task: a classic
Latin hypercube per task and seed (SciPy's ``LatinHypercube`` with ``scramble=True``:
one point uniformly inside each of ``fe_init`` strata per coordinate, the kind of
pyfmto's ``pyDOE3.lhs``), drawn from ``SeedSequence([seed, task])``, in each task's own
box, with its values. ``run_ours.py FILE`` then runs our configurations from those
designs with the budget ``fe_max``; compare our results file alone (the ``design``
entry has only ``fe_init`` evaluations, so it is not a configuration to rank).

Each task's ``y_global`` is the port's right minimum (``optimum``), not pyfmto's
(``ports.py``: pyfmto's is wrong for rotated Rosenbrocks and Schwefels).

Usage::

    python benchmarks/peers/lhs_designs.py tevc2024 --dim 5 --fmto /path/to/fmto --seeds 0-4 \
        --fe-init 25 --fe-max 55 --out /tmp/tevc2024_d5.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.stats import qmc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ports import build_objective
from run_ours import parse_seeds


def lhs(n: int, d: int, seed: int, task: int) -> np.ndarray:
    """``n x d`` classic Latin-hypercube points in ``[0, 1]^d`` from ``SeedSequence([seed, task])``."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, task]))
    return qmc.LatinHypercube(d=d, scramble=True, rng=rng).random(n)


def design_file(meta: dict, seeds: list[int], fe_init: int, fe_max: int, fmto: Path | None) -> dict:
    """The results-schema file (module docstring) of ``meta``'s problem: header, tasks and the designs."""
    if not 1 <= fe_init <= fe_max:
        raise ValueError(f"--fe-init and --fe-max must satisfy 1 <= fe_init <= fe_max, got {fe_init}, {fe_max}.")
    objective = build_objective(meta, fmto)
    d = int(meta["dim"])
    A = objective.num_agents
    lb, ub = objective.lb.to(torch.float64), objective.ub.to(torch.float64)  # A x d
    # the ports' labels are "<n>: <name>"; compare.py numbers the tasks itself
    names = [str(x).split(": ", 1)[-1] for x in getattr(objective, "labels", None) or ["task"] * A]
    tasks = [
        {"name": names[a], "lb": lb[a].tolist(), "ub": ub[a].tolist(), "y_global": -float(objective.optimum[a])}
        for a in range(A)
    ]
    runs = []
    for s in seeds:
        U = torch.from_numpy(np.stack([lhs(fe_init, d, s, a) for a in range(A)]))  # A x fe_init x d
        X = lb[:, None, :] + (ub - lb)[:, None, :] * U
        y = objective.evaluate_original(X, torch.arange(A))  # A x fe_init
        runs.append({"seed": s, "tasks": [{"X": X[a].tolist(), "y": y[a].tolist()} for a in range(A)]})
    head = {k: meta[k] for k in ("problem", "dim", "problem_kwargs") if k in meta}
    return {
        **head,
        "fe_init": fe_init,
        "fe_max": fe_max,
        "designs_only": True,
        "machine": f"{platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}",
        "command": " ".join(sys.argv),
        "tasks": tasks,
        "runs": {"design": runs},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problem", help="a problem of ports.build_objective (tevc2024, arxiv2017, ...)")
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--problem-kwargs", type=json.loads, default=None, help='JSON, e.g. {"src_problem": "Ackley"}')
    ap.add_argument("--fmto", type=Path, default=None, help="a checkout of Xiaoxu-Zhang/fmto")
    ap.add_argument("--seeds", default="0-4", help="e.g. 0-9")
    ap.add_argument("--fe-init", type=int, required=True)
    ap.add_argument("--fe-max", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    meta = {"problem": args.problem, "dim": args.dim}
    if args.problem_kwargs:
        meta["problem_kwargs"] = args.problem_kwargs
    try:
        data = design_file(meta, seeds, args.fe_init, args.fe_max, args.fmto)
    except (ValueError, FileNotFoundError) as err:
        ap.error(str(err))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
