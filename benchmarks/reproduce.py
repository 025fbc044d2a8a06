r"""Re-run a small part of a committed ``fbo-torch run`` result with today's code and check it bit for bit.

A results folder (``benchmarks/results/NAME/`` with ``config.resolved.yaml`` and
``results.json``) records its whole configuration. This script writes a runnable
copy of that configuration cut down to a subset — a range of its scenarios (the
seed shifted by ``1000 i`` when the range does not start at the first, so every
scenario keeps its seed), its first initializations (FTS) or repetitions
(DP-FTS-DE), optionally its first target agents, every method, and the recorded
number of iterations unless ``--iterations`` asks for fewer; a scenario recorded
before setups existed runs with ``setup: paper``, the behaviour then, and an
option of the search domain added since takes the value that kept the behaviour
before it (:data:`BEFORE_OPTIONS`) — runs it with
``fbo-torch run`` into a temporary folder, and pairs the new runs with the
recorded ones (:func:`compare_runs.compare`: by scenario, method and (target,
initialization) or (repetition, agent); a shortened run pairs with the first
iterations of the recorded curves). Per method it prints the runs paired, the
runs whose every query came from the same source (own GP or the same peer), the
largest absolute difference of the curves and the first iteration that differs,
then what today's resolution of the configuration adds that the record does not
name (:func:`unrecorded`: settings added since, at today's defaults). The exit status is 0 when every
method of the subset is bit-identical, 1 when one is not, and 2 when the subset
cannot be run.

A subset reproduces its runs only where a run's result does not depend on the
other runs of its batch: true of today's code on a CPU with MKL's strict mode
(:mod:`fbo_torch.utils.batch_invariant`; every result records the mode as
``environment.mkl_cbwr``). A record made without it (no ``mkl_cbwr``, or another
mode) can differ from its subset by rounding that the runs grow; the check says
so in its notes.

A DP-FTS-DE result compacted by ``collect_results.py`` keeps only each method's
curve averaged over its repetitions: such a folder is re-run with every
repetition (fewer iterations make it affordable) and compared on that average,
and on the fraction of queries taken from the server in every round.

``--record FILE`` adds (or replaces) the folder's entry in a JSON file of such
checks, with the command, the subset, the per-method rows, the machine and
torch's version; other keys of that file are kept (``benchmarks/results/reproduction.json``).

Usage::

    python benchmarks/reproduce.py benchmarks/results/learned_weights/mixtures --targets 1
    python benchmarks/reproduce.py benchmarks/results/landmine_fts_two_setups --scenarios 1 --targets 1
    python benchmarks/reproduce.py benchmarks/results/landmine_dp_fts_de --iterations 2 \
        --record benchmarks/results/reproduction.json
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from compare_runs import compare, table

from fbo_torch.experiments.config import load_yaml
from fbo_torch.experiments.report import environment

#: Options added since some results were recorded, with the value that keeps the behaviour from before them
#: (where a record does not name one, the run takes it, not today's default): the search domain's raw-point
#: ``screen`` (the product set for ``d = 2, 3`` came later) and ``refine_dtype`` (the float32 climb came later).
BEFORE_OPTIONS: dict[str, dict[str, Any]] = {"domain": {"screen": "sobol", "refine_dtype": None}}


class SubsetError(ValueError):
    """The subset asked for cannot be taken from this folder's configuration."""


def scenario_range(text: str) -> range:
    """``"I"`` or ``"I-J"`` (inclusive, 0-based) as a range of scenario indices."""
    first, _, last = text.partition("-")
    start, stop = int(first), int(last or first) + 1
    if start < 0 or stop <= start:
        raise argparse.ArgumentTypeError(f"expected I or I-J with 0 <= I <= J, got {text!r}")
    return range(start, stop)


def compacted(results: dict[str, Any]) -> bool:
    """Whether a method of ``results`` kept no per-run curves (a DP-FTS-DE record compacted by
    ``collect_results.py``): it can only be compared on its average over every repetition."""
    return any("runs" not in m for sc in results["scenarios"] for m in sc["methods"])


def first_targets(results: dict[str, Any], scenario: int, k: int) -> list[int]:
    """The first ``k`` target agents of a recorded FTS scenario, in the order its runs were recorded."""
    order: list[int] = []
    for t in results["scenarios"][scenario]["methods"][0]["targets"]:
        if t not in order:
            order.append(t)
    return order[:k]


def subset_config(
    resolved: dict[str, Any],
    results: dict[str, Any],
    scenarios: range,
    inits: int | None,
    targets: int | None,
    iterations: int | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    r"""A runnable configuration for a subset of a recorded one, and the subset in words.

    Args:
        resolved: The folder's ``config.resolved.yaml``, read.
        results: Its ``results.json``, read (the order of its targets, whether it was compacted).
        scenarios: The scenarios to keep, a contiguous range; the seed moves by ``1000 * scenarios.start``.
        inits: Initializations (FTS) or repetitions (DP-FTS-DE) per target; ``None``: as recorded. A compacted
            record needs every repetition.
        targets: The first this many target agents of every scenario (FTS, not ``history.mode: together``);
            ``None``: as recorded.
        iterations: Iterations of every method, at most the recorded ones; ``None``: as recorded.

    Returns:
        The configuration (a mapping for ``fbo-torch run``) and a JSON-ready description of the subset.
    """
    cfg = copy.deepcopy(resolved)
    every = cfg["scenarios"]
    if scenarios.stop > len(every):
        raise SubsetError(f"scenarios {scenarios.start}-{scenarios.stop - 1} asked for; the folder has {len(every)}.")
    notes = []
    if "optimizer" in cfg:  # the section's old name (same keys); today's loader refuses it
        cfg["domain"] = cfg.pop("optimizer")
        notes.append("`optimizer` read as `domain` (renamed, same keys)")
    for section, options in BEFORE_OPTIONS.items():
        for key, value in options.items():
            if key not in cfg.setdefault(section, {}):
                cfg[section][key] = value
                notes.append(f"{section}.{key} not recorded: {value!r}, the behaviour before the option")
    mode = (results.get("environment") or {}).get("mkl_cbwr")
    if mode is None or not str(mode).endswith(",STRICT"):
        notes.append(
            f"recorded with MKL mode {mode or 'not recorded'}: its runs may depend on the others of their batch"
        )
    if cfg["experiment"] == "fts":
        cfg.pop("privacy", None)  # older resolutions wrote its defaults; an FTS config may not name it
    cfg["scenarios"] = [every[i] for i in scenarios]
    recorded_iterations = sorted({int(m["num_iterations"]) for sc in cfg["scenarios"] for m in sc["methods"]})
    cfg["seed"] = int(cfg.get("seed", 0)) + 1000 * scenarios.start
    whole = compacted({"scenarios": [results["scenarios"][i] for i in scenarios]})
    for i, sc in zip(scenarios, cfg["scenarios"], strict=True):
        if "setup" not in sc:  # recorded before setups: what is now `paper` (`modern`) was the only behaviour
            sc["setup"] = "paper"
            notes.append(f"scenario {sc['name']!r}: no setup recorded, run with `setup: paper` (the default before)")
        recorded = int(sc["runs"]["num_inits"])
        if inits is not None and whole and inits != recorded:
            raise SubsetError(
                f"scenario {sc['name']!r}: the record kept only the curves averaged over its {recorded} "
                "repetitions; re-run every one (leave --inits out) and shorten with --iterations."
            )
        if inits is not None:
            sc["runs"]["num_inits"] = min(inits, recorded)
        if targets is not None:
            if cfg["experiment"] != "fts" or (sc.get("history") or {}).get("mode") == "together":
                raise SubsetError(f"scenario {sc['name']!r}: --targets applies to FTS scenarios outside `together`.")
            sc["runs"]["targets"] = first_targets(results, i, targets)
            sc["runs"]["num_targets"] = None
        for m in sc["methods"]:
            if iterations is not None:
                m["num_iterations"] = min(iterations, int(m["num_iterations"]))
    subset = {
        "scenarios": [sc["name"] for sc in cfg["scenarios"]],
        "inits": [sc["runs"]["num_inits"] for sc in cfg["scenarios"]],
        "targets": [sc["runs"].get("targets", "auto") for sc in cfg["scenarios"]],
        "iterations": sorted({int(m["num_iterations"]) for sc in cfg["scenarios"] for m in sc["methods"]}),
        "recorded_iterations": recorded_iterations,
        "pairing": "aggregate over every repetition" if whole else "runs",
        "notes": notes,
    }
    return cfg, subset


def unrecorded(sent: Any, today: Any, where: str = "") -> list[str]:
    r"""What today's resolution of a configuration adds to or changes in it: a setting the record does not
    name (added since, with today's default) or a value read differently, as ``"where.key: value"`` lines, the
    items of a list (scenarios, methods) written ``[*]`` and each line once."""
    if isinstance(today, dict) and isinstance(sent, dict):
        out = []
        for key, value in today.items():
            if key not in sent:
                out.append(f"{where}{key}: {value!r} (not recorded)")
            else:
                out += unrecorded(sent[key], value, f"{where}{key}" + ("" if isinstance(value, list) else "."))
        return out
    if isinstance(today, list) and isinstance(sent, list) and len(today) == len(sent):
        lines = [line for a, b in zip(sent, today, strict=True) for line in unrecorded(a, b, f"{where}[*].")]
        return list(dict.fromkeys(lines))
    return [] if sent == today else [f"{where.rstrip('.')}: recorded {sent!r}, today {today!r}"]


def run_subset(cfg: dict[str, Any], work: Path, threads: int) -> dict[str, Any]:
    """Run ``cfg`` with ``fbo-torch run`` (this checkout's package, ``threads`` torch threads) in ``work``;
    return its ``results.json``, read, with today's resolution of ``cfg`` (its ``config.resolved.yaml``) under
    ``"resolved"``."""
    import yaml

    path, out = work / "subset.yaml", work / "out"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = [sys.executable, "-m", "fbo_torch.cli", "run", str(path), "--out", str(out), "--quiet"]
    cmd += ["--threads", str(threads)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.setdefault("MPLBACKEND", "Agg")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SubsetError(f"`fbo-torch run` of the subset failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    results["resolved"] = load_yaml((out / "config.resolved.yaml").read_text())
    return results


def identical(row: dict[str, Any]) -> bool:
    """A compared method is bit-identical: runs paired, every curve equal, every query from the same source."""
    return (
        row["runs"] > 0
        and row["max_abs_difference"] == 0.0
        and row["same_sources"] in (None, row["runs"])
        and row.get("same_source_fractions", True) is True
    )


#: The largest difference :func:`check` calls rounding (``rounding_only``): the repetition-averaged curve of a
#: compacted DP-FTS-DE record is a mean over a tensor as long as the run, so a shorter re-run can average the
#: same values in another order.
ROUNDING = 1e-12


def check(
    folder: Path,
    scenarios: range = range(1),
    inits: int | None = 2,
    targets: int | None = None,
    iterations: int | None = None,
    threads: int = 1,
) -> dict[str, Any]:
    r"""Re-run a subset of ``folder``'s configuration and compare it with ``folder/results.json``.

    Args:
        folder: A results folder with ``config.resolved.yaml`` and ``results.json``.
        scenarios: See :func:`subset_config`.
        inits: See :func:`subset_config` (ignored, with every repetition run, for a compacted record).
        targets: See :func:`subset_config`.
        iterations: See :func:`subset_config`; fewer than recorded pair with the recorded curves' prefix.
        threads: Torch threads of the run.

    Returns:
        ``subset``, ``rows`` (:func:`compare_runs.compare`'s, each with ``identical`` and ``rounding_only``: not
        identical, but by at most :data:`ROUNDING`), ``missing`` (methods of
        the subset without a row), ``unrecorded_settings`` (:func:`unrecorded`: what today's code resolved that
        the record does not say, the first place to look when a folder differs), ``reproduces`` and the re-run's
        ``wall_time_s``.
    """
    resolved = load_yaml((folder / "config.resolved.yaml").read_text())
    recorded = json.loads((folder / "results.json").read_text())
    if compacted({"scenarios": [recorded["scenarios"][i] for i in scenarios if i < len(recorded["scenarios"])]}):
        inits = None
    cfg, subset = subset_config(resolved, recorded, scenarios, inits, targets, iterations)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="reproduce-") as tmp:
        rerun = run_subset(cfg, Path(tmp), threads)
    wall = time.perf_counter() - t0
    subset["threads"] = threads
    changes = unrecorded(cfg, rerun.get("resolved", cfg))
    prefix = subset["iterations"] != subset["recorded_iterations"]
    rows = compare(recorded, rerun, prefix=prefix)
    for row in rows:
        row["identical"] = identical(row)
        row["rounding_only"] = (
            not row["identical"]
            and identical({**row, "max_abs_difference": 0.0})
            and (row["max_abs_difference"] <= ROUNDING)
        )
    paired = {(r["scenario"], r["method"]) for r in rows}
    ran = [(sc["name"], m["name"]) for sc in rerun["scenarios"] for m in sc["methods"]]
    missing = [f"{scenario}: {method}" for scenario, method in ran if (scenario, method) not in paired]
    return {
        "subset": subset,
        "rows": rows,
        "missing": missing,
        "unrecorded_settings": changes,
        "reproduces": bool(rows) and not missing and all(r["identical"] for r in rows),
        "wall_time_s": wall,
    }


def record(path: Path, folder: Path, command: str, outcome: dict[str, Any]) -> None:
    """Add or replace ``folder``'s entry in the JSON file of checks at ``path``."""
    data = json.loads(path.read_text()) if path.exists() else {"folders": {}}
    try:
        key = str(folder.resolve().relative_to(ROOT))
    except ValueError:
        key = str(folder)
    recorded = json.loads((folder / "results.json").read_text())
    data["folders"][key] = {
        "command": command,
        "recorded_command": recorded.get("command"),
        "recorded_torch": (recorded.get("environment") or {}).get("torch"),
        "recorded_threads": (recorded.get("environment") or {}).get("torch_threads"),
        "checked": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "machine": environment(),  # what every result records: platform, cores, threads, versions
        **outcome,
    }
    data["folders"] = dict(sorted(data["folders"].items()))
    path.write_text(json.dumps(data, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a results folder (config.resolved.yaml, results.json)")
    parser.add_argument(
        "--scenarios", type=scenario_range, default=range(1), help="I or I-J: the scenarios to re-run (default: 0)"
    )
    parser.add_argument(
        "--inits",
        type=int,
        default=2,
        help="initializations (FTS) or repetitions (DP-FTS-DE) per target (default: 2; a compacted DP-FTS-DE "
        "record re-runs every repetition)",
    )
    parser.add_argument("--targets", type=int, default=None, help="only the first K target agents (FTS)")
    parser.add_argument(
        "--iterations", type=int, default=None, help="fewer iterations than recorded (paired with the prefix)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the re-run (default: 1)")
    parser.add_argument("--record", type=Path, default=None, help="add the outcome to this JSON file")
    parser.add_argument("--out", type=Path, default=None, help="write the comparison as JSON here")
    args = parser.parse_args(argv)
    try:
        outcome = check(args.folder, args.scenarios, args.inits, args.targets, args.iterations, args.threads)
    except (SubsetError, KeyError, IndexError) as err:
        print(f"{args.folder}: cannot re-run a subset: {err}", file=sys.stderr)
        return 2
    print(f"{args.folder}: {json.dumps(outcome['subset'])}")
    print(table(outcome["rows"]))
    for name in outcome["missing"]:
        print(f"not in the recorded results: {name}")
    for line in outcome["unrecorded_settings"]:
        print(f"resolved today, not in the record: {line}")
    rounding = all(r["identical"] or r["rounding_only"] for r in outcome["rows"])
    verdict = "bit-identical" if outcome["reproduces"] else ("DIFFERS by rounding only" if rounding else "DIFFERS")
    print(f"{verdict} (re-run {outcome['wall_time_s']:.0f} s)")
    command = shlex.join(["python", "benchmarks/reproduce.py", *(sys.argv[1:] if argv is None else argv)])
    if args.out is not None:
        args.out.write_text(json.dumps({"folder": str(args.folder), "command": command, **outcome}, indent=1) + "\n")
    if args.record is not None:
        record(args.record, args.folder, command, outcome)
    return 0 if outcome["reproduces"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
