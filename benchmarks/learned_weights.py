r"""Learned ``P_N`` studies: paired differences between methods, and the cost of scoring peers.

``analyze``: reads an FTS experiment's ``results.json`` (``fbo-torch run``; every
method of a scenario runs with the same seed, so run ``r`` starts every method
from the same initial points) and, per scenario, takes each method's final loss
minus a reference method's, run by run: mean, standard error and a two-sided
paired t-test at 95% (``df = runs - 1``). A DP-FTS-DE experiment is paired by
repetition (its runs are the agent-averaged curves of each repetition: the
agents of one repetition share every broadcast, so they are not independent). For objectives that say which peers
are helpful, useless or adversarial (``kind_of_agent``) it also counts which
kind of peer each FTS method followed. Writes ``paired.json`` and
``paired.png`` beside the input, and a Markdown table (``paired.md``, also printed).

``cost``: per-round wall time of FTS with uniform and with learned ``P_N``
(and peer trust) on the same federation, rounds interleaved so that the
machine's drift hits both alike. Writes JSON.

Usage::

    python benchmarks/learned_weights.py analyze benchmarks/results/learned_weights/mixtures/results.json \
        --reference "FTS" --reference TS
    python benchmarks/learned_weights.py cost --out benchmarks/results/learned_weights/cost_cpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from paired_stats import paired_difference


def summary(curve: list[float], at: int | str) -> float:
    """The loss of one run at iteration ``at``, or averaged over iterations 1..T (``at = "mean"``)."""
    return sum(curve[1:]) / (len(curve) - 1) if at == "mean" else curve[at]


def paired(curves: list[list[float]], reference: list[list[float]], at: int | str = -1) -> dict:
    r"""The paired comparison (:func:`paired_stats.paired_difference`) of
    ``summary(curves[r]) - summary(reference[r])``."""
    return paired_difference([summary(c, at) - summary(b, at) for c, b in zip(curves, reference, strict=True)])


def kinds_followed(method: dict, kind_of_agent: list[str] | None) -> dict[str, float] | None:
    """Per run on average: how many queries followed a peer of each kind (``"peer"`` when kinds are unknown)."""
    if "sources" not in method:
        return None
    counts: dict[str, float] = {}
    for row in method["sources"]:
        for s in row:
            if s >= 0:
                kind = "peer" if kind_of_agent is None else kind_of_agent[s]
                counts[kind] = counts.get(kind, 0) + 1
    runs = max(1, len(method["sources"]))
    return {k: v / runs for k, v in sorted(counts.items())}


def objective_kinds(spec: dict) -> list[str] | None:
    from fbo_torch.objectives import build_objective

    if spec.get("type") not in ("gp_grid", "gp_continuous"):
        return None
    from fbo_torch.objectives.synthetic import AGENT_KINDS

    kinds = getattr(build_objective(spec), "kind_of_agent", None)
    return None if kinds is None else [AGENT_KINDS[int(k)] for k in kinds]


def per_repetition(method: dict) -> dict:
    r"""A DP-FTS-DE record with ``runs`` replaced by the agent-averaged curve of each repetition (and
    ``inits`` by the repetitions, so that two methods pair only over the same ones)."""
    reps = sorted(set(method["repetitions"]))
    curves = []
    for r in reps:
        rows = [c for c, rep in zip(method["runs"], method["repetitions"], strict=False) if rep == r]
        curves.append([sum(col) / len(rows) for col in zip(*rows, strict=False)])
    return {**method, "runs": curves, "inits": reps, "targets": None}


def analyze(path: Path, references: list[str], at: int | str, by_target: bool = False) -> dict:
    result = json.loads(path.read_text())
    kind = result.get("experiment")
    if kind not in ("fts", "dp_fts_de") or (kind == "dp_fts_de" and by_target):
        raise SystemExit(
            f"error: {path}: expected an FTS or DP-FTS-DE experiment's results.json (no --by-target for DP-FTS-DE)"
        )
    scenarios = []
    resolved = {sc["name"]: sc for sc in result["config"]["scenarios"]}
    for sc in result["scenarios"]:
        methods = {m["name"]: per_repetition(m) if kind == "dp_fts_de" else m for m in sc["methods"]}
        kinds = objective_kinds(resolved[sc["name"]]["objective"]) if sc["name"] in resolved else None
        rows = []
        for name, m in methods.items():
            vals = [summary(c, at) for c in m["runs"]]
            row = {
                "method": name,
                "final_loss": sum(vals) / len(vals),
                "final_loss_se": statistics.stdev(vals) / math.sqrt(len(vals)),
                "followed": kinds_followed(m, kinds),
                "vs": {},
            }
            for ref in references:
                if ref in methods and ref != name:
                    if (m.get("targets"), m.get("inits")) != (methods[ref].get("targets"), methods[ref].get("inits")):
                        raise SystemExit(f"error: {sc['name']}: {name!r} and {ref!r} ran different runs")
                    row["vs"][ref] = paired(m["runs"], methods[ref]["runs"], at)
            rows.append(row)
        entry = {"scenario": sc["name"], "loss_name": sc["methods"][0].get("loss_name", "loss"), "rows": rows}
        if by_target:
            entry["by_target"] = per_target(methods, references, at)
            entry["mean_rank"] = mean_ranks(methods, at)
        scenarios.append(entry)
    pooled = []
    if len(result["scenarios"]) > 1:  # every scenario's runs together (each run is paired within its scenario)
        names = [m["name"] for m in result["scenarios"][0]["methods"]]
        for name in names:
            row = {"method": name, "vs": {}}
            for ref in references:
                pairs = [
                    (m["runs"], {x["name"]: x for x in sc["methods"]}[ref]["runs"])
                    for sc in result["scenarios"]
                    for m in sc["methods"]
                    if m["name"] == name and ref != name and ref in {x["name"] for x in sc["methods"]}
                ]
                if pairs:
                    row["vs"][ref] = paired([c for a, _ in pairs for c in a], [c for _, b in pairs for c in b], at)
            pooled.append(row)
    return {"source": str(path), "at": at, "references": references, "scenarios": scenarios, "pooled": pooled}


def per_target(methods: dict, references: list[str], at: int | str) -> list[dict]:
    """Per target agent: every method's paired difference to each reference over that target's runs."""
    first = next(iter(methods.values()))
    rows = []
    for target in sorted(set(first["targets"])):
        idx = [i for i, t in enumerate(first["targets"]) if t == target]
        for name, m in methods.items():
            row = {"target": target, "method": name, "vs": {}}
            for ref in references:
                if ref in methods and ref != name:
                    row["vs"][ref] = paired([m["runs"][i] for i in idx], [methods[ref]["runs"][i] for i in idx], at)
            rows.append(row)
    return rows


def mean_ranks(methods: dict, at: int | str) -> dict[str, float]:
    """Each method's rank (1 = lowest final loss, ties averaged) in every run, averaged over runs."""
    names = list(methods)
    runs = len(methods[names[0]]["runs"])
    totals = dict.fromkeys(names, 0.0)
    for i in range(runs):
        vals = {n: summary(methods[n]["runs"][i], at) for n in names}
        for n in names:
            below = sum(v < vals[n] for v in vals.values())
            ties = sum(v == vals[n] for v in vals.values())
            totals[n] += below + (ties + 1) / 2
    return {n: t / runs for n, t in totals.items()}


def _cells(row: dict, refs: list[str]) -> list[str]:
    """A table row's comparisons, one cell per reference: ``diff ± se [**] (better/worse)``."""
    cells = []
    for r in refs:
        v = row["vs"].get(r)
        cells.append(
            ""
            if v is None
            else f"{v['diff']:+.4g} ± {v['se']:.2g}{' **' if v['distinguishable'] else ''} ({v['better']}/{v['worse']})"
        )
    return cells


def markdown(report: dict) -> str:
    refs = report["references"]
    lines = [
        "| scenario | method | loss | "
        + " | ".join(f"vs {r} (mean ± s.e., better/worse)" for r in refs)
        + " | peers followed per run |",
        "|" + "---|" * (4 + len(refs)),
    ]
    for sc in report["scenarios"]:
        for row in sc["rows"]:
            followed = row["followed"]
            fol = "" if not followed else ", ".join(f"{k} {v:.1f}" for k, v in followed.items())
            lines.append(
                f"| {sc['scenario']} | {row['method']} | {row['final_loss']:.4g} ± {row['final_loss_se']:.2g} | "
                + " | ".join(_cells(row, refs))
                + f" | {fol} |"
            )
    for row in report.get("pooled", []):  # still the main table
        lines.append(f"| all scenarios pooled | {row['method']} | | " + " | ".join(_cells(row, refs)) + " | |")
    for sc in report["scenarios"]:
        if "mean_rank" in sc:
            lines.append("")
            if len(report["scenarios"]) > 1:
                lines.append(f"**{sc['scenario']}**")
                lines.append("")
            lines.append(
                "Mean rank per run (1 = best): " + ", ".join(f"{k} {v:.2f}" for k, v in sc["mean_rank"].items())
            )
            lines.append("")
            lines.append("| target | method | " + " | ".join(f"vs {r}" for r in refs) + " |")
            lines.append("|" + "---|" * (2 + len(refs)))
            for row in sc["by_target"]:
                lines.append(f"| {row['target']} | {row['method']} | " + " | ".join(_cells(row, refs)) + " |")
    return "\n".join(lines)


def plot(report: dict, path: Path, reference: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scen = report["scenarios"]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(scen)), 4.2))
    names = sorted({row["method"] for sc in scen for row in sc["rows"] if reference in row["vs"]})
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        xs, ys, es = [], [], []
        for i, sc in enumerate(scen):
            row = next((r for r in sc["rows"] if r["method"] == name and reference in r["vs"]), None)
            if row is not None:
                v = row["vs"][reference]
                xs.append(i + (j - (len(names) - 1) / 2) * width)
                ys.append(v["diff"])
                es.append(v["t_critical"] * v["se"])
        ax.bar(xs, ys, width, yerr=es, capsize=3, label=name)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(scen)), [sc["scenario"] for sc in scen], rotation=20, ha="right", fontsize=8)
    what = {-1: "final", "mean": "mean over iterations of"}.get(report["at"], f"iteration {report['at']}")
    ax.set_ylabel(f"{what} {scen[0]['loss_name']}\nminus {reference}'s (paired; 95% CI; < 0 is better)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cost(out: Path, rounds: int, repeats: int) -> dict:
    from fbo_torch.federation.settings import FTSSettings
    from fbo_torch.objectives import GPSampleGridFederation
    from fbo_torch.optim.domain import Domain
    from fbo_torch.simulate.fts import FederationHistory, FTSRunner
    from fbo_torch.simulate.presets import PAPER

    obj = GPSampleGridFederation(num_groups=5, agents_per_group=51, perturbation=0.02, seed=0)
    dom = Domain(obj.bounds, obj.candidates)
    hist = FederationHistory(obj, dom, t_n=40, seed=0)
    variants = {
        "uniform": {},
        "learned": {"agent_weights": "learned"},
        "learned + trust": {"agent_weights": "learned", "peer_trust": True},
    }
    runners = {
        k: FTSRunner(
            obj,
            FTSSettings(num_iterations=rounds * repeats, p_t="1-1/sqrt(t)", **PAPER, **v),
            obj.targets,
            5,
            history=hist,
            seed=0,
        )
        for k, v in variants.items()
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds * repeats):  # interleaved: one round of each variant in turn
        for k, r in runners.items():
            t0 = time.perf_counter()
            r.step()
            times[k].append(time.perf_counter() - t0)
    summary = {
        k: {
            "median_s": statistics.median(v),
            "mean_s": statistics.fmean(v),
            "se_s": statistics.stdev(v) / math.sqrt(len(v)),
        }
        for k, v in times.items()
    }
    # the scoring and re-weighting alone, at the last round's size (R x K x n x n comparisons)
    r = runners["learned"]
    t0 = time.perf_counter()
    for _ in range(20):
        r._p_t(r.t)
    scoring = (time.perf_counter() - t0) / 20
    report = {
        "command": "python " + " ".join(sys.argv),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "federation": "gp_grid: 5 groups x 51 agents, grid 1000, t_n = 40; 25 runs (5 targets x 5 inits), M = 100",
        "rounds": rounds * repeats,
        "per_round": summary,
        "scoring_alone_s": scoring,
        "runs": r.num_runs,
        "peers_per_run": r.peer_index.shape[1],
        "observations_at_end": r.X.shape[1],
        "overhead_learned": summary["learned"]["median_s"] / summary["uniform"]["median_s"] - 1,
        "overhead_learned_trust": summary["learned + trust"]["median_s"] / summary["uniform"]["median_s"] - 1,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("analyze", help="paired differences in a results.json")
    a.add_argument("results", type=Path)
    a.add_argument(
        "--reference", action="append", default=None, help="method(s) to pair against (default: FTS and TS); repeatable"
    )
    a.add_argument(
        "--at",
        default="-1",
        help="iteration index to compare (default: the last), or 'mean': "
        "the loss averaged over iterations 1..T (the area under the curve)",
    )
    a.add_argument("--by-target", action="store_true", help="also pair per target agent and rank the methods")
    c = sub.add_parser("cost", help="per-round time of uniform vs learned P_N")
    c.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/learned_weights/cost_cpu.json")
    c.add_argument("--rounds", type=int, default=10)
    c.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if args.cmd == "analyze":
        if not args.results.is_file():
            ap.error(f"results: no such file {args.results}")
        refs = args.reference or ["FTS", "TS"]
        at = "mean" if args.at == "mean" else int(args.at)
        report = analyze(args.results, refs, at, args.by_target)
        suffix = "" if at == -1 else f"_at_{at}"
        report["command"] = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
        args.results.with_name(f"paired{suffix}.json").write_text(json.dumps(report, indent=1))
        plot(report, args.results.with_name(f"paired{suffix}.png"), refs[0])
        table = markdown(report)
        args.results.with_name(f"paired{suffix}.md").write_text(f"`{report['command']}`\n\n{table}\n")
        print(table)
    else:
        report = cost(args.out, args.rounds, args.repeats)
        print(
            json.dumps(
                {k: report[k] for k in ("per_round", "scoring_alone_s", "overhead_learned", "overhead_learned_trust")},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
