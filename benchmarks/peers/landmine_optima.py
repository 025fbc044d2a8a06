r"""The best ``1 − AUC`` of every landmine field, on pyfmto's box: ``y_global`` for ``svm_landmine``.

pyfmto's ``svm_landmine`` has no known optimum. This script searches fbo_torch's
deterministic version of the same function (``benchmarks/peers/README.md``,
"svm_landmine: the same function in fbo_torch")::

    LandmineSVM(search_space=SearchSpace([Real("C", 1e-4, 10.0), Real("gamma", 1e-2, 10.0)]),
                scoring="platt")

over pyfmto's box (``C``, ``γ`` on a linear scale). Most fields' best settings
lie at small ``C`` or small ``γ`` (the box's low edges, where ``1 − AUC``
changes fastest; at ``C = 1e-4`` every training point is a bounded support
vector and the ranking depends on ``γ`` alone), so the search is dense there:

1. a ``G_log x G_log`` grid, log-spaced in ``C`` and ``γ`` (``--log-grid``; the
   box's corners included);
2. a ``G_lin x G_lin`` grid, linear (``--linear-grid``), for the interior;
3. ``E`` points log-spaced in ``γ`` along the edge ``C = 1e-4`` (``--edge``),
   where ``1 − AUC`` is a rugged function of ``γ`` alone;
4. local refinement around each field's ``--top`` best points of all three:
   an ``L x L`` grid (``--local``) spanning ``± h`` in log coordinates around the
   incumbent (clipped to the box), the best point becomes the incumbent, ``h``
   halves; ``--levels`` times, from ``h`` = the log grid's spacing.

The function is piecewise smooth with jumps (libsvm's solver, Platt's fit), so the
refinement is a pattern search, not a gradient method. Writes ``--out`` (JSON):
per field the best ``1 − AUC`` found and where (unit box, ``C``, ``γ``), the best
of the two grids alone (what the refinement gained), and the settings. The values
are upper bounds on each field's minimum: a denser search could only lower them.

Usage::

    python benchmarks/peers/landmine_optima.py --out benchmarks/results/peers/landmine_optima.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
#: pyfmto's box: C in [1e-4, 10], gamma in [1e-2, 10], linear.
LOWER, UPPER = (1e-4, 1e-2), (10.0, 10.0)


def build(n_jobs: int):
    from fbo_torch.objectives.landmine import LandmineSVM
    from fbo_torch.objectives.search_space import Real, SearchSpace

    space = SearchSpace([Real("C", LOWER[0], UPPER[0]), Real("gamma", LOWER[1], UPPER[1])])
    return LandmineSVM(search_space=space, scoring="platt", n_jobs=n_jobs)


def minimized(obj, U: torch.Tensor, chunk: int, label: str) -> torch.Tensor:
    """``1 − AUC`` at ``U`` (``N x q x 2``, one row per field), evaluated ``chunk`` points per field at a time."""
    out = []
    t0 = time.perf_counter()
    for start in range(0, U.shape[1], chunk):
        out.append(1.0 - obj(U[:, start : start + chunk].contiguous()))
        done = min(start + chunk, U.shape[1])
        print(f"{label}: {done}/{U.shape[1]} points per field, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return torch.cat(out, dim=1)


def to_unit(V: torch.Tensor) -> torch.Tensor:
    """Normalized log coordinates ``V`` (``... x 2`` in ``[0, 1]``) as points of pyfmto's linear unit box."""
    lo = torch.tensor(LOWER, dtype=V.dtype).log()
    hi = torch.tensor(UPPER, dtype=V.dtype).log()
    native = (lo + (hi - lo) * V).exp()
    low, high = torch.tensor(LOWER, dtype=V.dtype), torch.tensor(UPPER, dtype=V.dtype)
    U = ((native - low) / (high - low)).clamp(0.0, 1.0)
    return torch.where(V == 0, 0.0, torch.where(V == 1, 1.0, U))  # the box's edges exactly (exp∘log rounds)


def to_log(U: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`to_unit`."""
    low, high = torch.tensor(LOWER, dtype=U.dtype), torch.tensor(UPPER, dtype=U.dtype)
    native = low + (high - low) * U
    lo, hi = torch.tensor(LOWER, dtype=U.dtype).log(), torch.tensor(UPPER, dtype=U.dtype).log()
    return ((native.log() - lo) / (hi - lo)).clamp(0.0, 1.0)


def square(n: int) -> torch.Tensor:
    """``n² x 2`` points of an ``n x n`` grid on ``[0, 1]^2`` (edges included)."""
    axis = torch.linspace(0.0, 1.0, n, dtype=torch.float64)
    return torch.stack(torch.meshgrid(axis, axis, indexing="ij"), dim=-1).reshape(-1, 2)


def local_grid(center: torch.Tensor, h: float, L: int) -> torch.Tensor:
    """``N x L² x 2`` points of an ``L x L`` grid spanning ``± h`` around each ``center`` (``N x 2``), clipped."""
    offsets = torch.linspace(-h, h, L, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(offsets, offsets, indexing="ij"), dim=-1).reshape(-1, 2)
    return (center.unsqueeze(1) + grid).clamp(0.0, 1.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--log-grid", type=int, default=20, help="G_log: points per axis of the log-spaced grid")
    ap.add_argument("--linear-grid", type=int, default=11, help="G_lin: points per axis of the linear grid")
    ap.add_argument("--edge", type=int, default=160, help="E: points along the edge C = 1e-4 (log-spaced gamma)")
    ap.add_argument("--top", type=int, default=3, help="refine around this many best grid points per field")
    ap.add_argument("--local", type=int, default=5, help="L: points per axis of each local grid")
    ap.add_argument("--levels", type=int, default=3, help="refinement levels (h halves at each)")
    ap.add_argument("--n-jobs", type=int, default=2, help="processes fitting SVMs")
    ap.add_argument("--chunk", type=int, default=40, help="points per field per call (progress granularity)")
    args = ap.parse_args(argv)
    for name in ("log_grid", "linear_grid", "local", "edge"):
        if getattr(args, name) < 2:
            ap.error(f"--{name.replace('_', '-')} must be at least 2")
    obj = build(args.n_jobs)
    N = obj.num_agents
    t0 = time.perf_counter()

    edge = torch.linspace(0.0, 1.0, args.edge, dtype=torch.float64)
    edge = to_unit(torch.stack([torch.zeros_like(edge), edge], dim=-1))
    grid = torch.cat([to_unit(square(args.log_grid)), square(args.linear_grid), edge])  # unit box
    y_grid = minimized(obj, grid.expand(N, -1, -1), args.chunk, "grids")  # N x (G_log² + G_lin² + E)
    grid_best, grid_arg = y_grid.min(-1)

    best_y, best_u = grid_best.clone(), grid[grid_arg].clone()
    starts = y_grid.argsort(-1)[:, : args.top]  # N x top
    for s in range(starts.shape[1]):
        center = to_log(grid[starts[:, s]])  # N x 2, log coordinates
        center_y = y_grid.gather(-1, starts[:, s : s + 1]).squeeze(-1)
        h = 1.0 / (args.log_grid - 1)
        for level in range(args.levels):
            V = local_grid(center, h, args.local)
            y = minimized(
                obj, to_unit(V), V.shape[1], f"refine start {s + 1}/{args.top} level {level + 1}/{args.levels}"
            )
            y_min, arg = y.min(-1)
            better = y_min < center_y
            center = torch.where(better.unsqueeze(-1), V[torch.arange(N), arg], center)
            center_y = torch.where(better, y_min, center_y)
            h /= 2
        improved = center_y < best_y
        best_y = torch.where(improved, center_y, best_y)
        best_u = torch.where(improved.unsqueeze(-1), to_unit(center), best_u)

    native = obj.search_space.to_native(best_u.unsqueeze(1)).squeeze(1)
    evaluations = args.log_grid**2 + args.linear_grid**2 + args.edge + args.top * args.levels * args.local**2
    result = {
        "description": (
            "Best 1 - AUC found per landmine field (pyfmto's svm_landmine: y_global) for fbo_torch's "
            "LandmineSVM(search_space=SearchSpace([Real('C', 1e-4, 10.0), Real('gamma', 1e-2, 10.0)]), "
            "scoring='platt'); upper bounds on each field's minimum."
        ),
        "method": {
            "log_grid": args.log_grid,
            "linear_grid": args.linear_grid,
            "top": args.top,
            "local": args.local,
            "levels": args.levels,
            "edge": args.edge,
            "evaluations_per_field": evaluations,
            "what": (
                f"a {args.log_grid} x {args.log_grid} grid log-spaced in C and gamma and a {args.linear_grid} x "
                f"{args.linear_grid} linear grid (edges included), {args.edge} points log-spaced in gamma along "
                f"C = 1e-4, then around each field's {args.top} best grid "
                f"points {args.levels} levels of a {args.local} x {args.local} local grid spanning +-h in log "
                "coordinates (h from the log grid's spacing, halved per level), moving to the best point"
            ),
        },
        "split_seed": obj.split_seed,
        "fields": [
            {
                "field": obj.fields[n],
                "y_global": float(best_y[n]),
                "auc": float(1.0 - best_y[n]),
                "u": best_u[n].tolist(),
                "C": float(native[n, 0]),
                "gamma": float(native[n, 1]),
                "grid_best": float(grid_best[n]),
            }
            for n in range(N)
        ],
        "command": "python benchmarks/peers/landmine_optima.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    gain = (grid_best - best_y).max().item()
    print(
        f"wrote {args.out}: best 1 - AUC {best_y.min().item():.4f}-{best_y.max().item():.4f} over {N} fields "
        f"(refinement gained up to {gain:.4f}); {evaluations} evaluations per field, "
        f"{time.perf_counter() - t0:.0f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
