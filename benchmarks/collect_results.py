r"""Copy a finished run's report into ``benchmarks/results/NAME/`` in committable size.

Keeps the plots, the summary and ``results.json`` without the bulkiest raw
records (per-agent curves and broadcast flags of DP runs, queried points and their values); per-run curves of FTS
runs and per-repetition curves of DP runs stay.

    python benchmarks/collect_results.py runs/fts_synthetic fts_synthetic
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DROP = ("queries", "observations", "best_value_runs")


def compact(results: dict) -> dict:
    out = json.loads(json.dumps(results))
    for sc in out["scenarios"]:
        for m in sc["methods"]:
            for key in DROP:
                m.pop(key, None)
            if "repetition_mean" in m:  # DP: agents x repetitions curves -> repetition curves
                # the curves, the labels of their rows, and which of those rows' queries came from the broadcast
                # (its per-round share, fraction_queries_from_server, stays)
                for key in ("runs", "agents", "repetitions", "used_server"):
                    m.pop(key, None)
            if not (m.get("evaluation_failures") or {}).get("failed", 1):  # none failed: a flag per run and
                m.pop("failed", None)  # iteration says nothing evaluation_failures does not
    out["note"] = (
        f"compacted by benchmarks/collect_results.py (dropped: {', '.join(DROP)}, "
        "per-agent curves and broadcast flags of DP runs, "
        "the per-evaluation failure flags of methods with no failed evaluation)"
    )
    return out


def main(src: str, name: str) -> int:
    src_dir, dst = Path(src), ROOT / "benchmarks" / "results" / name
    dst.mkdir(parents=True, exist_ok=True)
    results = json.loads((src_dir / "results.json").read_text())
    (dst / "results.json").write_text(json.dumps(compact(results), indent=1))
    for f in sorted(src_dir.glob("*")):
        if f.suffix in (".png", ".pdf", ".svg"):
            shutil.copy(f, dst / f.name)
    for f in ("summary.txt", "config.resolved.yaml"):
        if (src_dir / f).exists():
            shutil.copy(src_dir / f, dst / f)
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
