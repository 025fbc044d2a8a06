r"""Paired differences to TS in an FTS experiment's ``results.json`` (``fbo-torch run``).

Every method of an FTS scenario runs with the same seed, so run ``r`` (target
field, initialization) starts every method from the same initial points; the
difference to TS is taken per run, and its mean, standard error and a two-sided
paired t-test (95%, ``df = runs − 1``) say whether it is distinguishable from
zero (:func:`landmine_setups.paired`). Writes ``paired.json`` beside the input.

Usage::

    python benchmarks/paired_to_ts.py runs/landmine_fts_two_setups/results.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def records_of(result: dict) -> list[dict]:
    r"""One record per (scenario, method) with its per-run curves, checked to pair run by run."""
    records = []
    for sc in result["scenarios"]:
        ts = next((m for m in sc["methods"] if m["name"] == "TS"), None)
        if ts is None:
            continue
        for m in sc["methods"]:
            if "runs" not in m:
                raise SystemExit(f"error: scenario {sc['name']!r}, method {m['name']!r} has no per-run curves")
            if (m.get("targets"), m.get("inits")) != (ts.get("targets"), ts.get("inits")):
                raise SystemExit(
                    f"error: scenario {sc['name']!r}: {m['name']!r} and TS ran different (target, init)"
                    " pairs; they cannot be paired"
                )
            records.append({"setup": sc["name"], "method": m["name"], "per_rep_curves": m["runs"]})
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="results.json of an FTS experiment with a method named TS")
    ap.add_argument("--at", type=int, default=None, help="iteration to compare (default: the last)")
    args = ap.parse_args(argv)
    if not args.results.is_file():
        ap.error(f"results: no such file {args.results}")
    result = json.loads(args.results.read_text())
    if result.get("experiment") != "fts":
        ap.error(f"results: expected an FTS experiment's results.json, got experiment {result.get('experiment')!r}")
    from landmine_setups import paired

    records = records_of(result)
    if not records:
        ap.error("results: no scenario has a method named TS")
    rows = paired(records, args.at)
    for row in rows:
        print(
            f"{row['setup']:<10} {row['method']:<14} runs {row['reps']:>3}  final {row['loss_mean']:.4f} "
            f"± {row['loss_se']:.4f}  diff to TS {row['diff_to_ts']:+.4f} ± {row['diff_se']:.4f}"
            f"{'  *' if row['distinguishable'] else ''}"
        )
    out = args.results.with_name("paired.json")
    out.write_text(
        json.dumps(
            {
                "source": str(args.results),
                "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
                "paired": rows,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
