r"""Compare two FTS runs of the same configuration run by run: the code before and after a change.

Pairs the runs of every method present in both ``results.json`` files by
scenario name, method name and (target, initialization) — a run started from
the same initial points with the same streams — and reports, per method, in how
many runs every query came from the same source (own GP or the same peer), the
largest difference of the curves, and the paired difference ``after - before`` of the
final loss and of the loss averaged over iterations 1..T
(:func:`paired_stats.paired_difference`). A smaller re-run (fewer
initializations, fewer scenarios with the first one's seed shifted so the
scenario seeds stay ``seed + 1000 i`` of the original) pairs with the matching
subset of a full one.

Usage::

    python benchmarks/compare_runs.py BEFORE/results.json AFTER/results.json --out compare.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learned_weights import summary
from paired_stats import paired_difference


def runs_by_key(method: dict, field: str = "runs") -> dict[tuple[int, int], list]:
    return {(t, i): run for t, i, run in zip(method["targets"], method["inits"], method[field], strict=True)}


def compare(before: dict, after: dict) -> list[dict]:
    old = {sc["name"]: {m["name"]: m for m in sc["methods"]} for sc in before["scenarios"]}
    rows = []
    for sc in after["scenarios"]:
        for m in sc["methods"]:
            ref = old.get(sc["name"], {}).get(m["name"])
            if ref is None:
                continue
            a, b = runs_by_key(m), runs_by_key(ref)
            keys = [k for k in a if k in b]
            sa, sb = runs_by_key(m, "sources"), runs_by_key(ref, "sources")
            row = {
                "scenario": sc["name"],
                "method": m["name"],
                "runs": len(keys),
                "same_sources": sum(sa[k] == sb[k] for k in keys),
                "max_abs_difference": max(abs(x - y) for k in keys for x, y in zip(a[k], b[k], strict=True)),
                "before_mean_regret": sum(summary(b[k], "mean") for k in keys) / len(keys),
                "after_mean_regret": sum(summary(a[k], "mean") for k in keys) / len(keys),
            }
            for at in (-1, "mean"):
                row["final" if at == -1 else "mean"] = paired_difference(
                    [summary(a[k], at) - summary(b[k], at) for k in keys]
                )
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    out = [
        "| scenario | method | runs | same sources | max abs. difference | averaged regret before → after "
        "| after − before (averaged) | after − before (final) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cell = {
            k: f"{r[k]['diff']:+.1e} ± {r[k]['se']:.1e}{' **' if r[k]['distinguishable'] else ''}"
            for k in ("mean", "final")
        }
        out.append(
            f"| {r['scenario']} | {r['method']} | {r['runs']} | {r['same_sources']} | "
            f"{r['max_abs_difference']:.1e} | "
            f"{r['before_mean_regret']:.4f} → {r['after_mean_regret']:.4f} | {cell['mean']} | {cell['final']} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="write the comparison as JSON here")
    args = parser.parse_args(argv)
    rows = compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()))
    print(table(rows))
    if args.out is not None:
        args.out.write_text(
            json.dumps({"before": str(args.before), "after": str(args.after), "rows": rows}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
