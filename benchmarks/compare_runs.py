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
subset of a full one. DP-FTS-DE runs pair by (repetition, agent). With ``prefix``
(``--prefix``) a run of fewer iterations pairs with the first iterations of the
recorded one; a DP-FTS-DE record whose per-agent curves were dropped
(``collect_results.py``) pairs as a whole, on its curve averaged over the repetitions,
when both ran the same repetitions (``"pairing": "aggregate"``).

Usage::

    python benchmarks/compare_runs.py BEFORE/results.json AFTER/results.json --out compare.json
    python benchmarks/compare_runs.py FULL/results.json SHORT/results.json --prefix
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learned_weights import summary
from paired_stats import paired_difference


def run_keys(method: dict) -> list[tuple[int, int]]:
    """The key of each row of a method's ``runs``: (target, initialization) of an FTS run, (repetition, agent) of a
    DP-FTS-DE one."""
    if "targets" in method:
        return list(zip(method["targets"], method["inits"], strict=True))
    return list(zip(method["repetitions"], method["agents"], strict=True))


def runs_by_key(method: dict, field: str = "runs") -> dict[tuple[int, int], list]:
    return dict(zip(run_keys(method), method[field], strict=True))


def difference(x: float | None, y: float | None) -> float:
    """``|x - y|``, 0 for two NaNs or two missing values (JSON's null), infinite for one of them."""
    if x is None or y is None:
        return 0.0 if x is None and y is None else math.inf
    if math.isnan(x) or math.isnan(y):
        return 0.0 if math.isnan(x) and math.isnan(y) else math.inf
    return abs(x - y)


def _paired_curves(new: list, old: list, prefix: bool) -> tuple[list, list]:
    """``new`` and ``old`` cut to the length they are compared on: ``new``'s with ``prefix`` (``old`` must be
    as long), otherwise both whole (they must be as long)."""
    if prefix:
        if len(new) > len(old):
            raise ValueError(f"a curve of {len(new)} points cannot pair with the prefix of one of {len(old)}.")
        return new, old[: len(new)]
    if len(new) != len(old):
        raise ValueError(f"curves of {len(new)} and {len(old)} points; pass prefix=True (--prefix) to pair a prefix.")
    return new, old


def _max_difference(pairs: list[tuple[list, list]]) -> float:
    return max((difference(x, y) for a, b in pairs for x, y in zip(a, b, strict=True)), default=0.0)


def first_difference(pairs: list[tuple[list, list]]) -> int | None:
    """The first iteration at which a paired curve differs (0: the initial points already), ``None`` if none does."""
    at = [next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if difference(x, y) != 0), None) for a, b in pairs]
    return min((i for i in at if i is not None), default=None)


def _per_run(m: dict, ref: dict, prefix: bool) -> dict:
    a, b = runs_by_key(m), runs_by_key(ref)
    keys = [k for k in a if k in b]
    curves = {k: _paired_curves(a[k], b[k], prefix) for k in keys}
    row: dict = {"pairing": "runs", "runs": len(keys), "same_sources": None}
    if "sources" in m and "sources" in ref:
        sa, sb = runs_by_key(m, "sources"), runs_by_key(ref, "sources")
        row["same_sources"] = sum(list(sa[k]) == list(sb[k][: len(sa[k])] if prefix else sb[k]) for k in keys)
    row["max_abs_difference"] = _max_difference(list(curves.values()))
    row["first_difference"] = first_difference(list(curves.values()))
    if not keys:
        return row
    row["before_mean_regret"] = sum(summary(curves[k][1], "mean") for k in keys) / len(keys)
    row["after_mean_regret"] = sum(summary(curves[k][0], "mean") for k in keys) / len(keys)
    for at in (-1, "mean"):
        row["final" if at == -1 else "mean"] = paired_difference(
            [summary(curves[k][0], at) - summary(curves[k][1], at) for k in keys]
        )
    return row


def mean_as_recorded(runs: list, length: int) -> list[float]:
    """The mean over ``runs`` (rows of curves) of a shorter run, computed as the recorded run computed its own:
    :func:`~fbo_torch.experiments.report.mean_stderr` of one ``R x length`` tensor (the columns past the shorter
    curves are zeros, which do not enter the others' sums). A mean over a tensor of another width may sum in
    another order, which differs in the last bits."""
    import torch

    from fbo_torch.experiments.report import mean_stderr

    curves = torch.tensor(runs, dtype=torch.float64)
    padded = torch.zeros(curves.shape[0], length, dtype=torch.float64)
    padded[:, : curves.shape[1]] = curves
    mean, _ = mean_stderr(padded)
    return mean[: curves.shape[1]]


def _aggregate(m: dict, ref: dict, prefix: bool) -> dict:
    """A DP-FTS-DE method compared on its curve averaged over the repetitions (both ran the same ones): with
    ``prefix`` and the shorter run's rows at hand, that average is taken as the recorded run took its own
    (:func:`mean_as_recorded`)."""
    same = m.get("num_repetitions") == ref.get("num_repetitions") and "loss_mean" in m and "loss_mean" in ref
    row: dict = {"pairing": "aggregate", "runs": 0, "same_sources": None, "max_abs_difference": math.inf}
    if not same:
        return row
    row["runs"] = m["num_repetitions"]
    mean = m["loss_mean"]
    if prefix and m.get("runs") and len(ref["loss_mean"]) > len(mean):
        mean = mean_as_recorded(m["runs"], len(ref["loss_mean"]))
    pair = _paired_curves(mean, ref["loss_mean"], prefix)
    row["max_abs_difference"] = _max_difference([pair])
    row["first_difference"] = first_difference([pair])
    if "fraction_queries_from_server" in m and "fraction_queries_from_server" in ref:
        new, old = m["fraction_queries_from_server"], ref["fraction_queries_from_server"]
        row["same_source_fractions"] = _max_difference([_paired_curves(new, old, prefix)]) == 0.0
    return row


def compare(before: dict, after: dict, prefix: bool = False) -> list[dict]:
    r"""One row per method of ``after`` that ``before`` has too (same scenario and method names): runs paired,
    runs whose every query came from the same source (``None`` where the records keep no sources), the largest
    absolute difference of the paired curves, the first iteration where one differs and, for runs paired one
    by one, the paired differences of the final and the averaged loss. ``prefix``: ``after`` may have run fewer
    iterations than ``before``."""
    old = {sc["name"]: {m["name"]: m for m in sc["methods"]} for sc in before["scenarios"]}
    rows = []
    for sc in after["scenarios"]:
        for m in sc["methods"]:
            ref = old.get(sc["name"], {}).get(m["name"])
            if ref is None:
                continue
            per_run = "runs" in m and "runs" in ref
            row = _per_run(m, ref, prefix) if per_run else _aggregate(m, ref, prefix)
            rows.append({"scenario": sc["name"], "method": m["name"], **row})
    return rows


def _cell(r: dict, key: str) -> str:
    if key not in r:
        return "—"
    d = r[key]
    return f"{d['diff']:+.1e} ± {d['se']:.1e}{' **' if d['distinguishable'] else ''}"


def table(rows: list[dict]) -> str:
    out = [
        "| scenario | method | runs | same sources | max abs. difference | first differing iteration "
        "| averaged regret before → after | after − before (averaged) | after − before (final) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        runs = f"{r['runs']}" + (" (aggregate)" if r["pairing"] == "aggregate" else "")
        same = "—" if r["same_sources"] is None else f"{r['same_sources']}"
        regret = f"{r['before_mean_regret']:.4f} → {r['after_mean_regret']:.4f}" if "before_mean_regret" in r else "—"
        out.append(
            f"| {r['scenario']} | {r['method']} | {runs} | {same} | {r['max_abs_difference']:.1e} | "
            f"{'—' if r.get('first_difference') is None else r['first_difference']} | "
            f"{regret} | {_cell(r, 'mean')} | {_cell(r, 'final')} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="write the comparison as JSON here")
    parser.add_argument(
        "--prefix", action="store_true", help="AFTER may have run fewer iterations: pair its curves with BEFORE's first"
    )
    args = parser.parse_args(argv)
    rows = compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()), prefix=args.prefix)
    print(table(rows))
    if args.out is not None:
        args.out.write_text(
            json.dumps({"before": str(args.before), "after": str(args.after), "rows": rows}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
