r"""Rank fbo_torch's and pyfmto's configurations on one problem, paired by seed.

Reads any number of results files in ``run_pyfmto.py``'s schema (pyfmto's and
``run_ours.py``'s), keeps the seeds every configuration has (run ``seed`` of
every configuration started from the same initial design), and reports per
task the final simple regret ``min(y) − y_global`` (``min(y)`` where the
optimum is unknown, e.g. ``1 − AUC``):

* **mean rank**: per task, configurations ranked by their mean final regret over
  the seeds (1 = best, ties averaged), then averaged over the tasks — the
  issue's and pyfmto's own measure;
* **paired differences** of every configuration against each ``--reference``
  (per task: mean difference, its standard error, a two-sided paired t-test at
  95 %; ``**`` marks a distinguishable difference; "better/worse" counts tasks
  where it is distinguishable);
* the same ranks and paired tests for the **anytime** quality of a run: the area
  under its log-regret curve after the initial design, per evaluation
  (:func:`log_regret_area`: the mean over evaluations ``fe_init … fe_max`` of
  ``log`` of the best-so-far regret), which credits reaching a good value early
  as the final regret does not.

``svm_landmine``: pyfmto's recorded values are random (Platt scaling's internal
cross-validation is seeded from NumPy's global state; README), so its runs'
points are re-evaluated with our deterministic ``LandmineSVM`` first (``--reevaluate``),
and each field's ``y_global`` is the best ``1 − AUC`` of a dense search
(``benchmarks/results/peers/landmine_optima.json``, ``landmine_optima.py``) or of any
run compared, whichever is lower.

Usage::

    python benchmarks/peers/compare.py benchmarks/results/peers/pyfmto/tetci2019_d3.json \
        benchmarks/results/peers/ours/tetci2019_d3.json --reference local --reference FMTBO_gamma0 \
        --md benchmarks/results/peers/tetci2019_d3.md --plot benchmarks/results/peers/tetci2019_d3.png
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paired_stats import paired_difference


def load(paths: list[Path]) -> tuple[dict, dict[str, dict[int, np.ndarray]], dict[str, dict[int, np.ndarray]]]:
    """``(meta, finals, curves)``: per configuration and seed, ``A`` final regrets and ``A x fe_max`` best-so-far."""
    meta, finals, curves = None, {}, {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        if meta is None:
            meta = data
        elif (data["problem"], data["dim"], data["fe_max"]) != (meta["problem"], meta["dim"], meta["fe_max"]):
            raise SystemExit(f"{path}: another problem or budget than {paths[0]}")
        y_global = np.array([t["y_global"] if t.get("y_global") is not None else 0.0 for t in data["tasks"]])
        for label, runs in data["runs"].items():
            if label in finals:
                raise SystemExit(f"configuration {label!r} appears twice")
            finals[label], curves[label] = {}, {}
            for run in runs:
                y = np.array([task["y"] for task in run["tasks"]], dtype=float)  # A x fe_max
                best = np.minimum.accumulate(y, axis=1) - y_global[:, None]
                finals[label][int(run["seed"])] = best[:, -1]
                curves[label][int(run["seed"])] = best
    return meta, finals, curves


#: Each landmine field's best ``1 − AUC`` found by a dense search (``landmine_optima.py``): ``y_global``.
LANDMINE_OPTIMA = Path(__file__).resolve().parents[1] / "results" / "peers" / "landmine_optima.json"


def _landmine_scorer(data: dict) -> tuple:
    """``svm_landmine``: ``1 − AUC`` of the deterministic ``LandmineSVM`` on pyfmto's linear box, and each
    field's best value found by ``landmine_optima.py`` as ``y_global`` (an upper bound on its minimum:
    :func:`reevaluate` lowers it to any better value a run recorded)."""
    import torch

    from fbo_torch.objectives.landmine import LandmineSVM
    from fbo_torch.objectives.search_space import Real, SearchSpace

    obj = LandmineSVM(search_space=SearchSpace([Real("C", 1e-4, 10.0), Real("gamma", 1e-2, 10.0)]), scoring="platt")
    lo = torch.tensor([1e-4, 1e-2], dtype=torch.float64)
    hi = torch.tensor([10.0, 10.0], dtype=torch.float64)

    def score(X):  # A x n x 2 (original units) -> A x n
        return 1.0 - obj.evaluate_true(((X - lo) / (hi - lo)).clamp(0, 1), agents=torch.arange(X.shape[0]))

    fields = json.loads(LANDMINE_OPTIMA.read_text())["fields"]
    return score, [f["y_global"] for f in sorted(fields, key=lambda f: f["field"])]


def _gecco_scorer(data: dict) -> tuple:
    """``gecco2020``: the port's noiseless value, and its computed optimum as ``y_global``."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run_ours import build_objective

    objective = build_objective(data)
    lo, hi = objective.bounds

    def score(X):  # A x n x d (original units) -> A x n
        return -objective.evaluate_true((X - lo) / (hi - lo), agents=torch.arange(X.shape[0]))

    return score, [-opt for opt in objective.optimum.tolist()]


#: Problems whose recorded values are re-scored before comparing (:func:`reevaluate`), and how.
RESCORED = {"svm_landmine": _landmine_scorer, "gecco2020": _gecco_scorer}


def reevaluate(paths: list[Path]) -> list[Path]:
    """The runs of the :data:`RESCORED` problems with every recorded point re-scored the same way for both
    libraries: ``svm_landmine`` by the deterministic ``LandmineSVM`` (pyfmto's SVM is randomized), and
    ``gecco2020`` by the port's noiseless value against its computed optimum (pyfmto records the noisy values
    it observed, whose running minimum is biased low by the noise, and no optimum: ``y_global`` null). Other
    files, and files already re-scored, are returned as they are."""
    import tempfile

    import torch

    out: list[Path | dict] = []
    scorers: dict[str, tuple] = {}
    best: dict[str, list[float]] = {}  # per problem, the best value any run recorded per task
    for path in paths:
        data = json.loads(Path(path).read_text())
        problem = data["problem"]
        if problem not in RESCORED or data.get("reevaluated"):
            out.append(path)
            continue
        if problem not in scorers:
            scorers[problem] = RESCORED[problem](data)
        score, _ = scorers[problem]
        for runs in data["runs"].values():
            for run in runs:
                X = torch.tensor([t["X"] for t in run["tasks"]], dtype=torch.float64)  # A x n x d
                for a, (t, row) in enumerate(zip(run["tasks"], score(X).tolist(), strict=True)):
                    t["y"] = row
                    low = best.setdefault(problem, [math.inf] * len(run["tasks"]))
                    low[a] = min(low[a], min(row))
        data["reevaluated"] = True
        out.append(data)
    written: list[Path] = []
    for item in out:
        if not isinstance(item, dict):
            written.append(item)
            continue
        y_global = scorers[item["problem"]][1]
        if y_global is not None:
            # an optimum found by search is an upper bound: a better recorded value is the best known
            for t, value, low in zip(item["tasks"], y_global, best[item["problem"]], strict=True):
                t["y_global"] = min(value, low)
        tmp = Path(tempfile.mkstemp(suffix=".json")[1])
        tmp.write_text(json.dumps(item))
        written.append(tmp)
    return written


#: In the paired tests on log regret, a task's regrets below this fraction of its mean regret after the
#: initial design count as that floor (a regret of 0, an optimum hit exactly — common on a finite
#: domain — would otherwise be ``-inf``, and its log distance to a tiny regret arbitrary).
LOG_FLOOR = 1e-6


def log_floor(initial: dict[str, dict[int, np.ndarray]], labels: list[str], seeds: list[int]) -> np.ndarray:
    """Each task's floor of the log scale (:data:`LOG_FLOOR` times its mean regret after the initial design
    over ``labels`` and ``seeds``), shape ``A``."""
    return LOG_FLOOR * np.mean([initial[lab][s] for lab in labels for s in seeds], axis=0)


def log_regret_area(
    curves: dict[str, dict[int, np.ndarray]], fe_init: int, floor: np.ndarray
) -> dict[str, dict[int, np.ndarray]]:
    r"""Per configuration and seed, each task's area under the log-regret curve per evaluation, shape ``A``.

    For a best-so-far regret curve ``r_1, …, r_{fe_max}`` (``A x fe_max``) the area is
    ``mean_{t = fe_init}^{fe_max} log max(r_t, floor)``: the regret after the initial design and after every
    later evaluation weigh alike, so a run that reaches a regret early scores better than one that reaches it
    at the last evaluation, and an area difference of ``δ`` means regrets ``e^δ`` times as large on average
    (geometric mean over the evaluations). ``floor`` (``A``) keeps a regret of 0 finite, as in the paired tests
    of final regret.
    """
    return {
        lab: {s: np.log(np.maximum(c[:, fe_init - 1 :], floor[:, None])).mean(1) for s, c in runs.items()}
        for lab, runs in curves.items()
    }


def summarize(
    finals: dict[str, dict[int, np.ndarray]],
    references: list[str],
    scale: str = "log",
    initial: dict[str, dict[int, np.ndarray]] | None = None,
) -> dict:
    r"""Mean ranks and paired differences (module docstring); ``initial`` (the regrets after the initial
    design, per configuration and seed) sets each task's floor of the log scale (:data:`LOG_FLOOR`)."""
    initial = initial if initial is not None else finals
    labels = list(finals)
    seeds = sorted(set.intersection(*(set(v) for v in finals.values())))
    if not seeds:
        raise SystemExit("no seed is shared by every configuration")
    F = {lab: np.stack([finals[lab][s] for s in seeds]) for lab in labels}  # S x A
    A = next(iter(F.values())).shape[1]
    means = np.stack([F[lab].mean(0) for lab in labels])  # C x A
    ranks = stats.rankdata(means, axis=0)  # C x A
    out = {
        "seeds": seeds,
        "labels": labels,
        "mean_final": {lab: means[i].tolist() for i, lab in enumerate(labels)},
        "mean_rank": {lab: float(ranks[i].mean()) for i, lab in enumerate(labels)},
        "ranks": {lab: ranks[i].tolist() for i, lab in enumerate(labels)},
        "paired": {},
        "scale": scale,
    }
    floor = log_floor(initial, labels, seeds)  # A
    for ref in references:
        if ref not in F:
            raise SystemExit(f"--reference {ref!r} is not a configuration ({labels})")
        out["paired"][ref] = {}
        for lab in labels:
            if lab == ref:
                continue
            cells = []
            for a in range(A):
                x, r = F[lab][:, a], F[ref][:, a]
                if scale == "log":
                    x, r = np.log(np.maximum(x, floor[a])), np.log(np.maximum(r, floor[a]))
                cells.append(paired_difference((x - r).tolist()))
            better = sum(1 for c in cells if c["distinguishable"] and c["diff"] < 0)
            worse = sum(1 for c in cells if c["distinguishable"] and c["diff"] > 0)
            out["paired"][ref][lab] = {"per_task": cells, "better": better, "worse": worse}
    return out


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.2e}"


def task_names(meta: dict) -> list[str]:
    """The tasks' names, or a generic one where they are all alike (svm_landmine's fields, gecco2020's arms)."""
    names = [t["name"] for t in meta["tasks"]]
    generic = {"svm_landmine": "field", "gecco2020": "arm"}.get(meta["problem"], "task")
    return names if len(set(names)) > 1 else [generic] * len(names)


def markdown(meta: dict, summary: dict) -> str:
    names = task_names(meta)
    head = f"{meta['problem']}, d = {meta['dim']}, {meta['fe_init']} + {meta['fe_max'] - meta['fe_init']} evaluations, "
    head += f"seeds {summary['seeds'][0]}–{summary['seeds'][-1]} ({len(summary['seeds'])}, paired)"
    what = "log " if summary.get("scale") == "log" else ""
    lines = [f"**{head}**", ""]
    lines += _tables(names, summary, "Mean final simple regret", f"{what}final regret")
    if "anytime" in summary:
        lines += ["", "**Anytime**: the area under the log-regret curve after the initial design, per evaluation", ""]
        title = "Mean area (log best-so-far regret averaged over evaluations)"
        lines += _tables(names, summary["anytime"], title, "area")
    return "\n".join(lines) + "\n"


def _tables(names: list[str], summary: dict, mean_title: str, paired_title: str) -> list[str]:
    labels = sorted(summary["labels"], key=lambda lab: summary["mean_rank"][lab])
    lines = [
        f"{mean_title} per task (lower is better) and mean rank over the tasks:",
        "",
        "| configuration | mean rank | " + " | ".join(f"{i + 1} {n}" for i, n in enumerate(names)) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for lab in labels:
        cells = " | ".join(_fmt(v) for v in summary["mean_final"][lab])
        lines.append(f"| {lab} | {summary['mean_rank'][lab]:.2f} | {cells} |")
    for ref, rows in summary["paired"].items():
        lines += [
            "",
            f"Paired difference of {paired_title} to **{ref}** "
            f"(configuration − {ref}; negative = better; ** distinguishable, two-sided paired t-test 95 %):",
            "",
            "| configuration | better | worse | " + " | ".join(str(i + 1) for i in range(len(names))) + " |",
            "|---|---|---|" + "---|" * len(names),
        ]
        for lab in labels:
            if lab not in rows:
                continue
            r = rows[lab]
            cells = " | ".join(_fmt(c["diff"]) + ("**" if c["distinguishable"] else "") for c in r["per_task"])
            lines.append(f"| {lab} | {r['better']} | {r['worse']} | {cells} |")
    return lines


def plot(meta: dict, curves: dict, summary: dict, path: Path, labels: list[str] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = task_names(meta)
    A = len(names)
    labels = labels or sorted(summary["labels"], key=lambda lab: summary["mean_rank"][lab])
    seeds = summary["seeds"]
    cols = 5
    rows = math.ceil(A / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    fe_init = int(meta["fe_init"])
    for a in range(A):
        ax = axes[a // cols][a % cols]
        for lab in labels:
            c = np.stack([curves[lab][s][a] for s in seeds])[:, fe_init - 1 :]
            ax.plot(np.arange(fe_init, fe_init + c.shape[1]), np.maximum(c.mean(0), 1e-12), label=lab)
        ax.set_yscale("log")
        ax.set_title(f"{a + 1} {names[a]}", fontsize=9)
        ax.grid(alpha=0.3)
    for a in range(A, rows * cols):
        axes[a // cols][a % cols].axis("off")
    axes[0][0].set_ylabel("mean simple regret")
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center", ncol=min(len(labels), 5), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--reference", action="append", default=[])
    ap.add_argument(
        "--scale",
        choices=("log", "raw"),
        default="log",
        help="paired tests on log final regret (default) or on the regret itself",
    )
    ap.add_argument("--only", default=None, help="comma-separated configurations to keep (default: all)")
    ap.add_argument("--md", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--plot-configs", default=None, help="comma-separated configurations to draw")
    args = ap.parse_args(argv)
    files = reevaluate(args.files)
    meta, finals, curves = load(files)
    if args.only:
        keep = [c.strip() for c in args.only.split(",")]
        finals = {k: finals[k] for k in keep}
    fe_init = int(meta["fe_init"])
    curves = {k: v for k, v in curves.items() if k in finals}
    initial = {k: {s: c[:, fe_init - 1] for s, c in v.items()} for k, v in curves.items()}
    summary = summarize(finals, args.reference, args.scale, initial)
    floor = log_floor(initial, summary["labels"], summary["seeds"])
    summary["anytime"] = summarize(log_regret_area(curves, fe_init, floor), args.reference, "raw")
    text = markdown(meta, summary)
    print(text)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    if args.plot:
        chosen = [c.strip() for c in args.plot_configs.split(",")] if args.plot_configs else None
        plot(meta, curves, summary, args.plot, chosen)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
