r"""Where DP-FTS-DE helps: its gain over TS as agent heterogeneity, N, z and M vary.

The DP-FTS-DE paper's synthetic setting (Sec. 5.1, ``configs/dp_fts_de_synthetic.yaml``):
one GP sample ``f`` on a 1-D grid of 1000 points, every agent a perturbed copy
``f(x) ± h`` (a coin flip per input), noise 0.01, ``1 − p_t = 1/√t``, P = 2
regions, ``q = 0.25``, ``S = 11``, T = 40 rounds. One factor varies at a time
around the base cell ``h = 0.02, N = 200, z = 1, M = 50``:

* heterogeneity ``h ∈ {0.02, 0.1, 0.3}`` (the paper uses 0.02; ``f`` spans [0, 1]);
* number of agents ``N ∈ {50, 100, 200}``;
* noise multiplier ``z ∈ {0.5, 1, 2, 4}`` (ε falls as ``z`` grows);
* random features ``M ∈ {25, 50, 100}``.

In every cell TS and DP-FTS-DE run with the same seed, so repetition ``r``
starts both from the same functions and initial points; the result is the
**paired** per-repetition difference of the agent-averaged simple regret
(negative = DP-FTS-DE better), its standard error and a two-sided t-test. In
the heterogeneity cells FTS-DE without noise runs too: the difference between
it and DP-FTS-DE separates what the agents' information gives from what the
noise does (on landmine the noise-driven exploration was the whole gain).
ε (``rdp-classic``, δ = 1/N^1.1) is the same in every cell with ``z = 1``
except through δ in the N cells.

Usage::

    python benchmarks/dp_regime.py --reps 10           # ~1 CPU-hour
    python benchmarks/dp_regime.py --quick             # seconds; used by the tests
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

BASE = dict(h=0.02, N=200, z=1.0, M=50)
#: (cell name, factor values); TS does not depend on z or M, so those cells share the base cell's TS
CELLS = (
    [("base", {})]
    + [(f"h={h}", {"h": h}) for h in (0.1, 0.3)]
    + [(f"N={n}", {"N": n}) for n in (50, 100)]
    + [(f"z={z}", {"z": z}) for z in (0.5, 2.0, 4.0)]
    + [(f"M={m}", {"M": m}) for m in (25, 100)]
)
from fbo_torch.simulate.presets import PAPER

SETTINGS = dict(
    **PAPER,  # the paper's agents (Thompson samples of BoTorch's GP), as when the results were committed
    num_init=10,
    rff_lengthscale=0.03,
    rff_noise_variance=0.01,
    p_t="1-1/sqrt(t)",
    p1_equals_p2=False,
    weights="adaptive",
    weight_a=16.0,
    weight_b=1.0,
    const_rounds=5,
    decay_rounds=5,
    gp_refit_every=5,
    gp_sample_features=256,
)
DP = dict(algorithm="fts_de", num_regions=2, sample_rate=0.25, clip_norm=11.0)


def run_one(method: str, cell: dict, rounds: int, reps: int, grid: int, seed: int) -> dict:
    from fbo_torch.federation.settings import DPFTSDESettings
    from fbo_torch.objectives.synthetic import GPSampleGridFederation
    from fbo_torch.optim.domain import Domain
    from fbo_torch.simulate.dp_fts_de import DPFTSDERunner

    objective = GPSampleGridFederation(
        num_groups=1,
        agents_per_group=cell["N"],
        perturbation=cell["h"],
        perturb_first=True,
        grid_size=grid,
        lengthscale=0.03,
        noise_variance=0.01,
        seed=seed,
    )
    kind = {
        "TS": dict(algorithm="ts"),
        "FTS-DE": {**DP, "noise_multiplier": 0.0, "clip_norm": None},
        "DP-FTS-DE": {**DP, "noise_multiplier": cell["z"]},
    }[method]
    settings = DPFTSDESettings(num_iterations=rounds, num_features=cell["M"], **SETTINGS, **kind)
    runner = DPFTSDERunner(
        objective,
        settings,
        reps,
        domain=Domain(objective.bounds, objective.candidates),
        seed=seed,
        name=method,
        accountant="rdp-classic",
    )
    t0 = time.perf_counter()
    res = runner.run()
    N = objective.num_agents
    rec = {
        "method": method,
        "cell": cell,
        "reps": reps,
        "wall_time_s": time.perf_counter() - t0,
        "per_rep_curves": res.loss.view(reps, N, -1).mean(1).tolist(),
    }
    if res.accountant is not None and any(res.released):
        eps = [e for e in res.epsilon if math.isfinite(e)]
        rec.update(epsilon_final=eps[-1] if eps else None, delta=res.delta, fraction_clipped=res.fraction_clipped)
    return rec


def analyse(records: list[dict]) -> list[dict]:
    r"""Paired differences to TS per cell (:func:`landmine_setups.paired` on records labelled by cell)."""
    from landmine_setups import paired

    rows = []
    for name, _ in CELLS:
        cell_recs = [r for r in records if r["cell_name"] == name]
        if not cell_recs:
            continue
        rows += paired([{**r, "setup": name} for r in cell_recs])
    return rows


def cells_for(factor_cells: list[tuple[str, dict]], base: dict) -> list[tuple[str, dict, list[str]]]:
    """(name, full cell, methods) with the TS runs a cell needs."""
    out = []
    for name, change in factor_cells:
        cell = {**base, **change}
        methods = ["DP-FTS-DE"]
        if name == "base" or "h" in change or "N" in change:
            methods = ["TS", *methods]
        if name == "base" or "h" in change:
            methods.append("FTS-DE")
        out.append((name, cell, methods))
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["paired_final"] if r["method"] != "TS"]
    # every cell has a DP-FTS-DE record carrying its full cell (TS records of z/M cells are the base's)
    cell_of = {r["cell_name"]: r["cell"] for r in result["records"] if r["method"] == "DP-FTS-DE"}
    base = result["base"]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2), sharey=True)
    for ax, factor in zip(axes, ("h", "N", "z", "M"), strict=False):
        names = ["base"] + [n for n, ch in CELLS if factor in ch]
        xs = sorted({base[factor], *[ch[factor] for n, ch in CELLS if factor in ch]})
        for method, marker in (("DP-FTS-DE", "o"), ("FTS-DE", "s")):
            pts = [(cell_of[r["setup"]][factor], r) for r in rows if r["method"] == method and r["setup"] in names]
            if not pts:
                continue
            pts.sort(key=lambda p: p[0])
            ax.errorbar(
                [p[0] for p in pts],
                [p[1]["diff_to_ts"] for p in pts],
                yerr=[p[1]["diff_se"] for p in pts],
                marker=marker,
                capsize=3,
                label=method,
            )
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:g}" for x in xs])
        ax.set_xlabel({"h": "heterogeneity h", "N": "agents N", "z": "noise multiplier z", "M": "features M"}[factor])
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"final regret − TS (paired, ± 1 s.e., {result['reps']} reps)")
    fig.suptitle("DP-FTS-DE vs TS on the synthetic federation (negative = better than TS)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--grid", type=int, default=1000)
    ap.add_argument("--cells", nargs="+", default=[n for n, _ in CELLS], choices=[n for n, _ in CELLS])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "dp_regime")
    ap.add_argument("--resume", action="store_true", help="keep runs already in the output JSON")
    ap.add_argument("--quick", action="store_true", help="base and z=2 cells, N=8, 2 reps, 3 rounds, 100 grid points")
    args = ap.parse_args(argv)
    if args.reps < 2:
        ap.error("--reps must be at least 2 (paired standard errors)")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    factor_cells = [(n, ch) for n, ch in CELLS if n in args.cells]
    base = dict(BASE)
    if args.quick:
        base["N"] = 8
        args.reps, args.rounds, args.grid = 2, 3, 100
        factor_cells = [(n, ch) for n, ch in CELLS if n in ("base", "z=2.0")]
    from round_time import machine_info

    from fbo_torch.experiments.outdir import atomic_write_text

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    records = json.loads(path.read_text())["records"] if args.resume and path.exists() else []
    cache = {(r["method"], json.dumps(r["cell"], sort_keys=True)): r for r in records}
    command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])

    def save() -> dict:  # after every run: a killed study keeps what finished
        out = {
            "benchmark": "dp_regime",
            "command": command,
            "machine": machine_info("cpu"),
            "reps": args.reps,
            "rounds": args.rounds,
            "grid": args.grid,
            "base": base,
            "dp": DP,
            "settings": SETTINGS,
            "records": records,
            "paired_final": analyse(records),
        }
        atomic_write_text(path, json.dumps(out, indent=1))
        return out

    for name, cell, methods in cells_for(factor_cells, base):
        for method in methods:
            key = (method, json.dumps(cell, sort_keys=True))
            if key not in cache:
                cache[key] = run_one(method, cell, args.rounds, args.reps, args.grid, args.seed)
                print(f"{name:<8} {method:<10} {cache[key]['wall_time_s']:7.1f} s", flush=True)
            if not any(r["cell_name"] == name and r["method"] == method for r in records):
                records.append({**cache[key], "cell_name": name})
                save()
        if "TS" not in methods:  # z and M cells: the base cell's TS (TS uses neither)
            ts = next((r for r in records if r["cell_name"] == "base" and r["method"] == "TS"), None)
            if ts is None:
                raise SystemExit(f"cell {name} pairs with the base cell's TS: run --cells base too")
            if not any(r["cell_name"] == name and r["method"] == "TS" for r in records):
                records.append({**ts, "cell_name": name})
    result = save() if records else {}
    for row in result.get("paired_final", []):
        if row["method"] != "TS":
            eps = f"  ε {row['epsilon_final']:.2f}" if row.get("epsilon_final") else ""
            print(
                f"{row['setup']:<8} {row['method']:<10} final regret {row['loss_mean']:.4f}  diff to TS "
                f"{row['diff_to_ts']:+.4f} ± {row['diff_se']:.4f}{'  *' if row['distinguishable'] else ''}{eps}"
            )
    if result:
        plot(result, args.out / "dp_regime.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
