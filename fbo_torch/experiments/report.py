r"""Results: JSON records, a tidy CSV table, loss plots and text summaries.

A finished run's folder holds ``results.json`` (the nested records),
``results.csv`` (the same curves as one row per scenario x method x run x agent x
iteration, :data:`TIDY_COLUMNS`), ``summary.txt`` and the plots, each in the
formats asked for (:data:`PLOT_FORMATS`) and named after what they show: the loss
curves after the objective's loss (``simple_regret.png``, ``validation_error.png``,
``1_minus_auc.png``; :func:`loss_plot_stem`).
"""

from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import math
import os
import platform
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import botorch
import gpytorch
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from torch import Tensor

from fbo_torch.experiments.outdir import atomic_write_bytes, atomic_write_text
from fbo_torch.protocol.schedules import BROADCAST, OWN
from fbo_torch.utils.batch_invariant import blas_mode

if TYPE_CHECKING:
    from fbo_torch.experiments.posterior_gain import PosteriorGains


def environment(device: str | torch.device = "cpu") -> dict[str, Any]:
    """Machine and library versions, recorded with every result."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "botorch": botorch.__version__,  # type: ignore[attr-defined]  # botorch imports __version__ without re-exporting it
        "gpytorch": gpytorch.__version__,
        "device": str(device),
        "mkl_cbwr": blas_mode(),
    }
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    info["opacus"] = importlib.metadata.version("opacus")  # without importing it (seconds, for a version)
    return info


def mean_stderr(curves: Tensor) -> tuple[list[float], list[float]]:
    r"""Mean and standard error over runs (dim 0) of ``R x T`` curves."""
    curves = curves.double()
    R = curves.shape[0]
    mean = curves.mean(0)
    se = curves.std(0, unbiased=True) / math.sqrt(R) if R > 1 else torch.zeros_like(mean)
    return mean.tolist(), se.tolist()


def _tolist(t: Tensor) -> list[Any]:
    return t.detach().cpu().tolist()


def none_if_nan(values: Any) -> Any:
    """``values`` (a float or nested lists) with NaN and infinities replaced by ``None`` (JSON has no NaN)."""
    if isinstance(values, list):
        return [none_if_nan(v) for v in values]
    if isinstance(values, float) and not math.isfinite(values):
        return None
    return values


def nan_for_none(rows: list[list[Any]]) -> list[list[float]]:
    """Rows of a JSON record as floats, ``None`` (what :func:`none_if_nan` wrote for NaN) read back as NaN."""
    return [[math.nan if v is None else float(v) for v in row] for row in rows]


def values_or_none(t: Tensor) -> list[Any]:
    r"""``t`` as nested lists with ``None`` for a non-finite entry (a failed evaluation's value), as JSON records it."""
    return list(none_if_nan(t.detach().cpu().tolist()))


def summarize_curves(
    name: str,
    loss: Tensor,
    loss_name: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    r"""The JSON record of one method: mean/stderr per iteration plus raw curves."""
    mean, se = mean_stderr(loss)
    rec: dict[str, Any] = {
        "name": name,
        "loss_name": loss_name,
        "iterations": list(range(loss.shape[1])),
        "loss_mean": mean,
        "loss_stderr": se,
    }
    if loss_name == "simple regret":
        rec["simple_regret_mean"] = mean
        rec["simple_regret_stderr"] = se
    rec["runs"] = _tolist(loss)
    rec.update(extra or {})
    return rec


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON atomically (temporary file, fsync, ``os.replace``)."""
    atomic_write_text(path, json.dumps(data, indent=1, default=_json_default))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Tensor):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


#: Line styles combined with the 10 colours, so up to 40 series (240 with markers) never share a look.
_COLORS = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9")
_LINESTYLES = ("-", "--", ":", "-.")
_MARKERS = ("", "o", "s", "^", "v", "D")


def series_styles(n: int) -> list[dict[str, Any]]:
    r"""``n`` matplotlib styles (``color``, ``linestyle``, ``marker``), pairwise different for ``n <= 240``:
    the 10 colours first, then again with each further line style, then with markers."""
    k = len(_COLORS) * len(_LINESTYLES)
    return [
        {
            "color": _COLORS[i % len(_COLORS)],
            "linestyle": _LINESTYLES[(i // len(_COLORS)) % len(_LINESTYLES)],
            "marker": _MARKERS[(i // k) % len(_MARKERS)],
        }
        for i in range(n)
    ]


def num_runs(sc: dict[str, Any]) -> int:
    """Independent runs behind a scenario's curves (its ``num_runs``, else the rows of its first method's ``runs``)."""
    return int(sc.get("num_runs") or len(sc["methods"][0].get("runs", [])) or 1)


def band_label(sc: dict[str, Any]) -> str:
    r"""What a scenario's bands and ± mean, e.g. ``"mean ± 1 s.e. over 6 runs"``."""
    R = num_runs(sc)
    over = "repetitions (agent-averaged)" if any("stderr_over" in m for m in sc["methods"]) else "runs"
    if R < 2:
        return f"mean of 1 {over.split()[0][:-1]}, no band"
    return f"mean ± 1 s.e. over {R} {over}"


def integer_ticks(ax: Axes) -> None:
    """Ticks of ``ax``'s x axis (iterations, rounds) at integers only."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _curves_figure(results: dict[str, Any], title: str | None = None, log_y: bool = False) -> Figure:
    scenarios = results["scenarios"]
    n = len(scenarios)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(5.2 * cols, 3.8 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, sc in zip(axes.flat, scenarios, strict=False):
        styles = series_styles(len(sc["methods"]))
        band = num_runs(sc) > 1
        for m, style in zip(sc["methods"], styles, strict=False):
            x = m["iterations"]
            mu, se = m["loss_mean"], m["loss_stderr"]
            every = max(1, len(x) // 10)
            ax.plot(x, mu, label=m["name"], lw=1.6, markevery=every, markersize=4, **style)
            if band:
                lo = [a - b for a, b in zip(mu, se, strict=True)]
                hi = [a + b for a, b in zip(mu, se, strict=True)]
                ax.fill_between(x, lo, hi, color=style["color"], alpha=0.15, lw=0)
        ax.set_title(sc["name"], fontsize=10)
        ax.set_xlabel("iteration")
        integer_ticks(ax)
        ax.set_ylabel(f"{sc['methods'][0]['loss_name']}\n({band_label(sc)})", fontsize=9)
        if log_y:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8 if len(sc["methods"]) <= 8 else 6, ncol=1 if len(sc["methods"]) <= 8 else 2)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    if title and not (n == 1 and scenarios[0]["name"] == title):  # a lone panel named like the run: title once
        fig.suptitle(title)
    fig.tight_layout()
    return fig


#: Formats the plots can be written in (``--plot-format``).
PLOT_FORMATS = ("png", "pdf", "svg")


def check_plot_formats(formats: str | Sequence[str] | None, where: str = "plot formats") -> tuple[str, ...]:
    r"""``formats`` (a name, a comma-separated list or a sequence of names) as a tuple of distinct
    :data:`PLOT_FORMATS` in the order given; ``None`` gives ``("png",)``. Others raise ``ValueError``."""
    if formats is None:
        return ("png",)
    names = formats.split(",") if isinstance(formats, str) else list(formats)
    out: list[str] = []
    for name in names:
        fmt = str(name).strip().lower().lstrip(".")
        if fmt not in PLOT_FORMATS:
            raise ValueError(f"{where}: {name!r} is not a plot format; expected one or more of {list(PLOT_FORMATS)}.")
        if fmt not in out:
            out.append(fmt)
    if not out:
        raise ValueError(f"{where}: give at least one of {list(PLOT_FORMATS)}.")
    return tuple(out)


def save_figure(fig: Figure, path: str | Path, dpi: int = 120, formats: Sequence[str] | None = None) -> list[Path]:
    r"""Save a figure atomically in each of ``formats`` (bytes to a temporary file, then ``os.replace``).

    Args:
        fig: The figure.
        path: The file; its suffix is replaced by each format's (``OUT/simple_regret`` or
            ``OUT/simple_regret.png`` give ``OUT/simple_regret.pdf`` for ``"pdf"``).
        dpi: Resolution of raster formats.
        formats: Some of :data:`PLOT_FORMATS`; default: ``path``'s suffix, else PNG.

    Returns:
        The files written, one per format.
    """
    path = Path(path)
    if formats is None:
        formats = (path.suffix.lstrip(".").lower() or "png",)
    written = []
    for fmt in check_plot_formats(formats):
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=dpi)
        target = path.with_suffix(f".{fmt}")
        atomic_write_bytes(target, buf.getvalue())
        written.append(target)
    return written


def loss_plot_stem(results: dict[str, Any]) -> str:
    r"""The file name (without suffix) of the loss-curve plot: the loss's name as a file name
    (``"simple regret"`` -> ``simple_regret``, ``"1 - AUC"`` -> ``1_minus_auc``, ``"-f"`` -> ``negative_f``),
    or ``loss`` when the scenarios' losses differ."""
    names = {m.get("loss_name", "loss") for sc in results["scenarios"] for m in sc["methods"]}
    if len(names) != 1:
        return "loss"
    name = str(names.pop()).strip().lower()
    name = re.sub(r"^-\s*", "negative ", name)
    name = name.replace(" - ", " minus ").replace("-", " minus ")
    return re.sub(r"[^a-z0-9]+", "_", name).strip("_") or "loss"


def plot_curves(
    results: dict[str, Any],
    path: Path,
    title: str | None = None,
    log_y: bool = False,
    formats: Sequence[str] | None = None,
) -> list[Path]:
    r"""One panel per scenario; each method's mean loss with a ±1 standard-error band (the axis says over
    what; no band for a single run). Returns the files written (see :func:`save_figure`)."""
    return save_figure(_curves_figure(results, title, log_y), path, formats=formats)


def plot_message_length(results: dict[str, Any], path: Path, formats: Sequence[str] | None = None) -> list[Path]:
    r"""FTS paper Fig. 2: final loss vs numbers sent per agent, one marker per method family,
    plus loss vs wall-clock time (Fig. 3)."""
    sc = results["scenarios"][0]
    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    fams: dict[str, list[dict[str, Any]]] = {}
    for m in sc["methods"]:
        fams.setdefault(m["settings"].get("algorithm", m["name"]).upper(), []).append(m)
    timed = [m for fam, ms in fams.items() for m in ms if m.get("elapsed_s") and ("M=100" in m["name"] or fam == "TS")]
    for (fam, ms), style in zip(fams.items(), series_styles(len(fams)), strict=True):
        ms = sorted(ms, key=lambda m: m["parameters_per_agent"])
        x = [max(m["parameters_per_agent"], 1) for m in ms]
        yerr = [m["loss_stderr"][-1] for m in ms] if num_runs(sc) > 1 else None
        axes[0].errorbar(
            x,
            [m["loss_mean"][-1] for m in ms],
            yerr=yerr,
            capsize=3,
            label=fam,
            **{**style, "marker": style["marker"] or "o"},
        )
    for m, style in zip(timed, series_styles(len(timed)), strict=True):
        axes[1].plot(m["elapsed_s"], m["loss_mean"][1:], label=m["name"], **style)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("numbers sent per agent (message length; TS: none, drawn at 1)")
    axes[0].set_ylabel(f"final {sc['methods'][0]['loss_name']}\n(error bars: {band_label(sc)})", fontsize=9)
    axes[0].set_title(sc["name"], fontsize=10)
    axes[1].set_xlabel("wall-clock seconds (all runs of the batch together)")
    axes[1].set_ylabel(
        f"{sc['methods'][0]['loss_name']}\n({band_label(sc).split(',')[0].replace(' ± 1 s.e.', '')}, no band)",
        fontsize=9,
    )
    axes[1].set_xscale("log")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path, formats=formats)


def _final(m: dict[str, Any], band: bool) -> str:
    """A method's final loss, with ``± s.e.`` only when there is more than one run."""
    mu = m["loss_mean"][-1]
    return f"{mu:>17.4f} ± {m['loss_stderr'][-1]:<6.4f}" if band else f"{mu:>17.4f}" + " " * 9


def privacy_label(m: dict[str, Any]) -> str:
    r"""A private method's guarantee in full, e.g. ``"eps=4.36 (delta=1e-05, rdp; prv: 3.98)"``: ε with its δ
    and the accountant that computed it, then the ε of the same releases under each other accountant the run
    asked for (``privacy.extra_accountants``; ``n/a`` where one gives none); ``""`` for a non-private method."""
    if m.get("epsilon_final") is None:
        return ""
    delta = m.get("delta")
    parts = [f"delta={delta:.3g}" if delta is not None else "delta=?", str(m.get("accountant") or "?")]
    others = m.get("epsilon_other_accountants") or {}
    extra = "".join(f"; {name}: {'n/a' if eps is None else f'{eps:.2f}'}" for name, eps in others.items())
    if m.get("epsilon_server_final") is not None:  # secure aggregation: ε against others, and the server
        return (
            f"eps(others)={m['epsilon_final']:.2f} eps(server)={m['epsilon_server_final']:.2f} "
            f"({', '.join(parts)}{extra})"
        )
    return f"eps={m['epsilon_final']:.2f} ({', '.join(parts)}{extra})"


def summary_table(results: dict[str, Any]) -> str:
    r"""A plain-text table: final loss (± standard error when there are several runs), time and
    message size per method, and each private method's ε with its δ and accountant
    (:func:`privacy_label`); then the run's notes (``results["notes"]``, e.g. a δ ≥ 1/N)."""
    lines = []
    for sc in results["scenarios"]:
        band = num_runs(sc) > 1
        lines.append(f"== {sc['name']}  (final value: {band_label(sc)})")
        lines.append(
            f"   {'method':<28} {'final ' + sc['methods'][0]['loss_name']:>26} {'time [s]':>9} {'params/agent':>13}"
        )
        for m in sc["methods"]:
            privacy = privacy_label(m)
            lines.append(
                f"   {m['name']:<28} {_final(m, band)} {m.get('wall_time_s', float('nan')):>9.1f} "
                f"{m.get('parameters_per_agent', 0):>13}{'  ' + privacy if privacy else ''}"
            )
    lines.extend(f"note: {note}" for note in privacy_notes(results) + failure_notes(results))
    return "\n".join(lines)


def failure_notes(results: dict[str, Any]) -> list[str]:
    r"""One line per method (and per FTS scenario's other agents' histories) whose objective evaluations failed:
    how many of how many, by kind, and the first one (``evaluation_failures`` in ``results.json``)."""
    notes = []
    for sc in results["scenarios"]:
        records = [("the other agents' histories", sc.get("history_evaluation_failures"))]
        records += [(m["name"], m.get("evaluation_failures")) for m in sc["methods"]]
        for name, rec in records:
            if not rec or not rec.get("failed"):
                continue
            kinds = ", ".join(f"{k} {v['count']}" for k, v in rec["kinds"].items())
            first = next(iter(rec["kinds"].values()))["first"]
            rnd = "round unknown" if first.get("round") is None else f"round {first['round']}"
            notes.append(
                f"{sc['name']}, {name}: {rec['failed']} of {rec['evaluations']} evaluations failed ({kinds}); "
                f"the first: {first['message']} (agent {first['agent']}, {rnd}); per agent and round in "
                "results.json (evaluation_failures) and results.csv (failed)"
            )
    return notes


def privacy_notes(results: dict[str, Any]) -> list[str]:
    r"""What a reader of the ε values must know about their δ: a δ ≥ 1/N (a guarantee that allows
    releasing one agent's data in full), and the papers' default ``δ = 1/N^1.1`` (for reproduction only)."""
    private = [m for sc in results["scenarios"] for m in sc["methods"] if m.get("epsilon_final") is not None]
    notes = []
    weak = sorted(
        {
            (int(m["num_agents"]), float(m["delta"]))
            for m in private
            if m.get("delta") is not None and m.get("num_agents") and m["delta"] * m["num_agents"] >= 1
        }
    )
    notes += [
        f"delta={d:.3g} >= 1/N = {1 / n:.3g} ({n} agents): such a guarantee allows releasing one agent's data "
        "in full; set privacy.delta well below 1/N"
        for n, d in weak
    ]
    if private and ((results.get("config") or {}).get("privacy") or {}).get("delta", 0) is None:
        notes.append(
            "delta = 1/N^1.1 (privacy.delta: null) is the papers' choice, kept to reproduce their epsilons; "
            "for a guarantee, set privacy.delta to 1e-5 or less (docs/experiments.md, Privacy)"
        )
    return notes


# ----------------------------------------------------------------- the tidy table

#: Columns of ``results.csv``, one row per scenario x method x run x agent x iteration:
#: ``run`` is the curve's row in ``results.json`` (FTS: one (target, initialization) pair;
#: DP-FTS-DE: one repetition of the whole federation), ``agent`` the agent whose best value it
#: follows (FTS: the target), ``init`` the initialization (DP-FTS-DE: the repetition),
#: ``iteration`` 0 for the initial points, then each iteration (round); ``loss`` is the
#: ``loss_name`` of the best value so far (``best_value``, empty where not recorded) and
#: ``epsilon`` the privacy loss after that round, an (ε, ``delta``)-DP guarantee under
#: ``accountant`` (all three empty for non-private methods); ``failed`` is 1 where that iteration's
#: evaluation failed (the objective raised or returned a non-finite value, or ``faults.eval_failure_rate``
#: injected a failure), else 0 (empty for iteration 0 and where not recorded). The last three are the
#: accounting's (:mod:`~fbo_torch.experiments.accounting`): ``source`` whose proposal the agent queried in that
#: iteration (``own``, ``broadcast`` or the peer's index), ``belief_gain`` and ``information`` its posterior gain
#: (:mod:`~fbo_torch.experiments.posterior_gain`; empty where the run's queries were not recorded); all three
#: empty for iteration 0.
TIDY_COLUMNS = (
    "scenario",
    "method",
    "run",
    "agent",
    "init",
    "iteration",
    "loss_name",
    "loss",
    "best_value",
    "epsilon",
    "delta",
    "accountant",
    "failed",
    "source",
    "belief_gain",
    "information",
)


def _cell(value: Any) -> Any:
    """A CSV cell: empty for a missing value (``None``, NaN), floats at full precision."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return repr(value) if isinstance(value, float) else value


def _source_name(value: Any) -> Any:
    """A ``sources`` entry as ``results.csv`` writes it: ``own``, ``broadcast`` or the peer's index."""
    return {OWN: "own", BROADCAST: "broadcast"}.get(value, value)


def tidy_rows(
    results: dict[str, Any], gains: Mapping[tuple[int, int], PosteriorGains | None] | None = None
) -> Iterator[tuple[Any, ...]]:
    r"""The rows of ``results.csv`` (:data:`TIDY_COLUMNS`) from a ``results.json`` dictionary and its methods'
    posterior gains keyed by (scenario, method) position
    (:func:`~fbo_torch.experiments.accounting.all_posterior_gains`; none: those columns are empty).

    Methods without per-run curves (``runs``; e.g. a compacted DP record) give no rows.
    """
    for i, sc in enumerate(results["scenarios"]):
        for j, m in enumerate(sc["methods"]):
            curves = m.get("runs") or []
            if not curves:
                continue
            best = m.get("best_value_runs") or []
            failed = m.get("failed") or []
            B = len(curves)
            if "num_agents" in m:  # DP-FTS-DE: row r·N + n is agent n of repetition r
                N = int(m["num_agents"])
                agents = m.get("agents") or [b % N for b in range(B)]
                inits = m.get("repetitions") or [b // N for b in range(B)]
                runs = inits
            else:  # FTS: row r is (targets[r], inits[r])
                agents = m.get("targets") or [None] * B
                inits = m.get("inits") or [None] * B
                runs = list(range(B))
            eps = m.get("epsilon") or []
            private = m.get("epsilon_final") is not None
            accountant = m.get("accountant") if private else None
            delta = m.get("delta") if private else None
            if "used_server" in m:
                sources = [[BROADCAST if u else OWN for u in row] for row in m.get("used_server") or []]
            else:
                sources = m.get("sources") or []
            pg = gains.get((i, j)) if gains is not None else None
            belief = pg.belief_gain.tolist() if pg is not None else []
            info = pg.information.tolist() if pg is not None else []
            for b, curve in enumerate(curves):
                row_best = best[b] if b < len(best) else []
                row_failed = failed[b] if b < len(failed) else []
                row_src = sources[b] if b < len(sources) else []
                row_belief = belief[b] if b < len(belief) else []
                row_info = info[b] if b < len(info) else []
                for t, loss in enumerate(curve):
                    e = eps[t - 1] if private and 1 <= t <= len(eps) else None
                    yield (
                        sc["name"],
                        m["name"],
                        runs[b],
                        agents[b],
                        inits[b],
                        t,
                        m["loss_name"],
                        _cell(loss),
                        _cell(row_best[t] if t < len(row_best) else None),
                        _cell(e),
                        _cell(delta if e is not None else None),
                        accountant or "",
                        int(row_failed[t - 1]) if 1 <= t <= len(row_failed) else "",
                        _source_name(row_src[t - 1]) if 1 <= t <= len(row_src) else "",
                        _cell(row_belief[t - 1]) if 1 <= t <= len(row_belief) else "",
                        _cell(row_info[t - 1]) if 1 <= t <= len(row_info) else "",
                    )


def write_tidy_csv(
    results: dict[str, Any], path: str | Path, gains: Mapping[tuple[int, int], PosteriorGains | None] | None = None
) -> Path:
    r"""Write ``results.csv`` (:data:`TIDY_COLUMNS`, see :func:`tidy_rows`; ``gains``: the methods' posterior
    gains) atomically; returns its path."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(TIDY_COLUMNS)
    writer.writerows(tidy_rows(results, gains))
    atomic_write_text(path, buf.getvalue())
    return Path(path)
