r"""Landmine DP-FTS-DE in both setups (ours and the authors'), with paired differences to TS.

For each setup (:mod:`fbo_torch.simulate.presets`) and each method — TS, FTS,
FTS-DE and DP-FTS-DE (``q = 0.35, z ∈ {1, 2, 4}``; ``z = 1, q ∈ {0.1, 0.25}``)
— the 29 landmine fields optimize together for ``--rounds`` rounds, ``--reps``
repetitions. Every method of a setup uses the same seed, so repetition ``r``
starts from the same initial points for all methods: the difference to TS is
taken **per repetition** (agent-averaged ``1 − AUC``), and its mean, standard
error and a two-sided t-test (``df = reps − 1``, 95%) say whether the
difference is distinguishable from zero.

Also recorded per round for the private methods: the norms of the broadcast's
weighted data part, sampled-signal part and noise (the signal-to-noise of what
agents receive), and the fraction of clipped messages.

Paper settings (DP-FTS-DE Sec. 5.2, thesis App. C.2.2): M = 100, RFF lengthscale
0.01, σ² = 1e-6, P = 4, N_init = 10, 1 − p_t = 1/t, weights a = 16 held 10
rounds then decayed over 30, S = 22, δ = 1/N^1.1, accountant ``rdp-classic``
(the paper's). Results are written after every method (a killed study keeps
what finished); ``--resume`` skips methods already in the JSON.

Usage::

    python benchmarks/landmine_setups.py --reps 20 --n-jobs 2
    python benchmarks/landmine_setups.py --quick        # seconds; used by the tests
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

METHODS = {
    "TS": {"algorithm": "ts"},
    "FTS": {"algorithm": "fts_de", "num_regions": 1},
    "FTS-DE": {"algorithm": "fts_de", "num_regions": 4},
    "DP q=0.35 z=1": {
        "algorithm": "fts_de",
        "num_regions": 4,
        "sample_rate": 0.35,
        "noise_multiplier": 1.0,
        "clip_norm": 22.0,
    },
    "DP q=0.35 z=2": {
        "algorithm": "fts_de",
        "num_regions": 4,
        "sample_rate": 0.35,
        "noise_multiplier": 2.0,
        "clip_norm": 22.0,
    },
    "DP q=0.35 z=4": {
        "algorithm": "fts_de",
        "num_regions": 4,
        "sample_rate": 0.35,
        "noise_multiplier": 4.0,
        "clip_norm": 22.0,
    },
    "DP q=0.1 z=1": {
        "algorithm": "fts_de",
        "num_regions": 4,
        "sample_rate": 0.1,
        "noise_multiplier": 1.0,
        "clip_norm": 22.0,
    },
    "DP q=0.25 z=1": {
        "algorithm": "fts_de",
        "num_regions": 4,
        "sample_rate": 0.25,
        "noise_multiplier": 1.0,
        "clip_norm": 22.0,
    },
}
# The maximizer settings of the whole study (fixed here so that every method of a
# study searches alike even if the engine's defaults move; recorded in the JSON).
SEARCH = dict(raw_samples=1024, num_restarts=8, raw_samples_rff=4096, num_restarts_rff=32)
PAPER = dict(
    num_features=100,
    rff_lengthscale=0.01,
    rff_noise_variance=1e-6,
    p_t="1-1/t",
    num_init=10,
    const_rounds=10,
    decay_rounds=30,
    weight_a=16.0,
    weight_b=1.0,
    gp_refit_every=5,
)


def run_method(setup: str, label: str, rounds: int, reps: int, fields, n_jobs: int, device: str, seed: int) -> dict:
    import torch

    from fbo_torch.federation.settings import DPFTSDESettings
    from fbo_torch.objectives.landmine import LandmineSVM
    from fbo_torch.simulate.dp_fts_de import DPFTSDERunner
    from fbo_torch.simulate.presets import apply_setup, objective_setup

    objective = LandmineSVM(fields=fields, n_jobs=n_jobs, **objective_setup("landmine", setup))
    settings = apply_setup(DPFTSDESettings(num_iterations=rounds, **PAPER), setup, METHODS[label])
    from fbo_torch.optim.domain import Domain

    domain = Domain(objective.bounds, objective.candidates, **SEARCH)
    runner = DPFTSDERunner(
        objective, settings, reps, domain=domain, seed=seed, device=device, name=label, accountant="rdp-classic"
    )
    t0 = time.perf_counter()

    def progress(r) -> None:  # a line every 10 rounds: long studies show where they are
        if r.t % 10 == 0:
            print(
                f"  {setup} {label}: round {r.t}/{rounds}, {time.perf_counter() - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    res = runner.run(progress)
    N = objective.num_agents
    per_rep = res.loss.view(reps, N, -1).mean(1)  # reps x (T+1): agent-averaged curve of each repetition
    out = {
        "setup": setup,
        "method": label,
        "settings": res.settings,
        "num_agents": N,
        "reps": reps,
        "per_rep_curves": per_rep.tolist(),
        "search": SEARCH,
        "wall_time_s": time.perf_counter() - t0,
        "fraction_queries_from_server": res.used_server.double().mean(0).tolist(),
    }
    if res.accountant is not None and any(res.released):
        eps = [e for e in res.epsilon if math.isfinite(e)]
        out.update(
            {
                "epsilon_final": eps[-1] if eps else None,
                "delta": res.delta,
                "fraction_clipped": res.fraction_clipped,
                # round x region means over repetitions; summarized as the mean over regions
                "data_norm": [sum(r) / len(r) for r in res.data_norm],
                "sample_norm": [sum(r) / len(r) for r in res.sample_norm],
                "noise_norm": [sum(r) / len(r) for r in res.noise_norm],
                "signal_norm": [sum(r) / len(r) for r in res.signal_norm],
            }
        )
    del torch
    return out


def paired(records: list[dict], at: int | None = None) -> list[dict]:
    r"""Per-repetition differences to TS of the same setup (negative = better than TS)."""
    from paired_stats import paired_difference

    rows = []
    for setup in sorted({r["setup"] for r in records}):
        recs = {r["method"]: r for r in records if r["setup"] == setup}
        if "TS" not in recs:
            continue
        ts = recs["TS"]["per_rep_curves"]
        for name, r in recs.items():
            t_idx = len(ts[0]) - 1 if at is None else at
            vals = [c[t_idx] for c in r["per_rep_curves"]]
            d = paired_difference([c[t_idx] - b[t_idx] for c, b in zip(r["per_rep_curves"], ts, strict=False)])
            n = d["runs"]
            rows.append(
                {
                    "setup": setup,
                    "method": name,
                    "round": t_idx,
                    "reps": n,
                    "loss_mean": sum(vals) / n,
                    "loss_se": (sum((x - sum(vals) / n) ** 2 for x in vals) / (n - 1) / n) ** 0.5 if n > 1 else None,
                    "diff_to_ts": d["diff"],
                    "diff_se": d["se"],
                    "t_critical": d["t_critical"],
                    "distinguishable": name != "TS" and d["distinguishable"],
                    "epsilon_final": r.get("epsilon_final"),
                }
            )
    return rows


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = result["records"]
    setups = sorted({r["setup"] for r in recs})
    fig, axes = plt.subplots(1, len(setups) + 2, figsize=(6 * (len(setups) + 2), 4.5))
    from fbo_torch.experiments.report import series_styles

    names = list(METHODS)
    styles = series_styles(len(names))  # one look per method, the same in every panel
    for ax, setup in zip(axes, setups, strict=False):
        for r in (r for r in recs if r["setup"] == setup):
            style = styles[names.index(r["method"])]
            curves = r["per_rep_curves"]
            n, T = len(curves), len(curves[0])
            mean = [sum(c_[t] for c_ in curves) / n for t in range(T)]
            se = [(sum((c_[t] - mean[t]) ** 2 for c_ in curves) / max(n - 1, 1) / n) ** 0.5 for t in range(T)]
            ax.plot(range(T), mean, label=r["method"], **style)
            ax.fill_between(
                range(T),
                [m - s for m, s in zip(mean, se, strict=False)],
                [m + s for m, s in zip(mean, se, strict=False)],
                color=style["color"],
                alpha=0.12,
            )
        reps = sorted({len(r["per_rep_curves"]) for r in recs if r["setup"] == setup})
        ax.set_title(f"landmine, setup: {setup} (band: ±1 s.e. over {'/'.join(map(str, reps))} reps)")
        ax.set_xlabel("round")
        ax.set_ylabel("1 - AUC (agent average)")
        ax.legend(fontsize=7)
    ax = axes[-2]  # privacy-utility: paired difference to TS against epsilon, per setup
    for setup, marker in zip(setups, ("o", "s", "^"), strict=False):
        rows = sorted(
            (r for r in result["paired_final"] if r["setup"] == setup and r.get("epsilon_final")),
            key=lambda r: r["epsilon_final"],
        )
        if not rows:
            continue
        ax.errorbar(
            [r["epsilon_final"] for r in rows],
            [r["diff_to_ts"] for r in rows],
            yerr=[r["diff_se"] for r in rows],
            marker=marker,
            linestyle="none",
            capsize=3,
            label=setup,
        )
        for r in rows:
            ax.annotate(
                r["method"].replace("DP ", ""),
                (r["epsilon_final"], r["diff_to_ts"]),
                fontsize=6,
                xytext=(3, 3),
                textcoords="offset points",
            )
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xlabel("ε after the last round (rdp-classic, δ = 1/N^1.1)")
    ax.set_ylabel("final 1 - AUC minus TS's (paired, ±1 s.e.)")
    ax.set_title("privacy-utility (negative = better than TS)")
    ax.legend(fontsize=7)
    ax = axes[-1]  # signal-to-noise of the broadcast (z = 1 and z = 4, q = 0.35)
    for r in recs:
        if r["method"] in ("DP q=0.35 z=1", "DP q=0.35 z=4") and "noise_norm" in r:
            for key, ls in (("data_norm", "-"), ("sample_norm", "--"), ("noise_norm", ":")):
                ax.plot(r[key], linestyle=ls, label=f"{r['setup']} {r['method']}: {key.replace('_', ' ')}")
    ax.set_yscale("log")
    ax.set_title("broadcast parts per region (mean over reps)")
    ax.set_xlabel("round")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_result(records: list[dict], command: str, machine: dict, reps: int, rounds: int) -> dict:
    return {
        "benchmark": "landmine_setups",
        "command": command,
        "machine": machine,
        "reps": reps,
        "rounds": rounds,
        "records": records,
        "paired_final": paired(records),
        "paired_round_30": paired(records, min(30, rounds)),
    }


def merge(paths: list[Path], out: Path, argv: list[str] | None) -> int:
    parts = [json.loads(p.read_text()) for p in paths]
    if len({(p["rounds"]) for p in parts}) != 1:
        raise SystemExit("error: --merge: the studies differ in rounds")
    records, seen = [], set()
    for p in parts:
        for r in p["records"]:
            if (r["setup"], r["method"]) not in seen:
                seen.add((r["setup"], r["method"]))
                records.append({**r, "command": p["command"], "machine": p["machine"]})
    reps = max(p["reps"] for p in parts)
    result = build_result(
        records, "; ".join(p["command"] for p in parts), parts[0]["machine"], reps, parts[0]["rounds"]
    )
    result["merged_from"] = [{"command": p["command"], "machine": p["machine"]} for p in parts]
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "landmine_setups.png")
    for row in result["paired_final"]:
        print(
            f"{row['setup']:<8} {row['method']:<15} reps {row['reps']:>3}  final {row['loss_mean']:.4f}  "
            f"diff to TS {row['diff_to_ts']:+.4f} ± {row['diff_se']:.4f}{'  *' if row['distinguishable'] else ''}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setups", nargs="+", default=["modern", "authors"], choices=["modern", "authors"])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--fields", type=int, nargs="+", default=None, help="field indices (default: all 29)")
    ap.add_argument("--n-jobs", type=int, default=1, help="processes fitting the SVMs of a round")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "landmine_setups")
    ap.add_argument("--resume", action="store_true", help="keep methods already in the output JSON")
    ap.add_argument("--quick", action="store_true", help="2 fields, 2 reps, 2 rounds, TS and DP q=0.35 z=1")
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSON",
        help="merge the records of studies run apart (same seed, reps, rounds) into --out; runs nothing",
    )
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out, argv)
    if args.quick:
        args.fields, args.reps, args.rounds = args.fields or [0, 1], 2, 2
        args.methods = ["TS", "DP q=0.35 z=1"]
    if args.reps < 2:
        ap.error("--reps must be at least 2 (paired standard errors)")
    from round_time import machine_info

    from fbo_torch.experiments.outdir import atomic_write_text

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    records = []
    if args.resume and path.exists():
        records = json.loads(path.read_text())["records"]
    done = {(r["setup"], r["method"]) for r in records}
    result = {}
    for setup in args.setups:
        for label in args.methods:
            if (setup, label) in done:
                continue
            rec = run_method(setup, label, args.rounds, args.reps, args.fields, args.n_jobs, args.device, args.seed)
            records.append(rec)
            result = build_result(
                records,
                "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
                machine_info(args.device),
                args.reps,
                args.rounds,
            )
            atomic_write_text(path, json.dumps(result, indent=1))
            fin = (
                next(p for p in result["paired_final"] if p["setup"] == setup and p["method"] == label)
                if any(p["setup"] == setup for p in result["paired_final"])
                else None
            )
            msg = (
                ""
                if fin is None
                else (
                    f"final {fin['loss_mean']:.4f}  diff to TS {fin['diff_to_ts']:+.4f} "
                    f"± {fin['diff_se']:.4f}{'  *' if fin['distinguishable'] else ''}"
                )
            )
            print(f"{setup:<8} {label:<15} {rec['wall_time_s']:7.1f} s  {msg}", flush=True)
    if result:
        plot(result, args.out / "landmine_setups.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
