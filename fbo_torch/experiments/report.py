r"""Results: JSON records, regret plots and text summaries."""

from __future__ import annotations

import io
import json
import math
import os
import platform
from pathlib import Path
from typing import Any

import botorch
import gpytorch
import opacus
import torch
from matplotlib.figure import Figure
from torch import Tensor

from fbo_torch.experiments.outdir import atomic_write_bytes, atomic_write_text


def environment(device: str | torch.device = "cpu") -> dict[str, Any]:
    """Machine and library versions, recorded with every result."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "botorch": botorch.__version__,
        "gpytorch": gpytorch.__version__,
        "device": str(device),
    }
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    info["opacus"] = opacus.__version__
    return info


def mean_stderr(curves: Tensor) -> tuple[list[float], list[float]]:
    r"""Mean and standard error over runs (dim 0) of ``R x T`` curves."""
    curves = curves.double()
    R = curves.shape[0]
    mean = curves.mean(0)
    se = curves.std(0, unbiased=True) / math.sqrt(R) if R > 1 else torch.zeros_like(mean)
    return mean.tolist(), se.tolist()


def _tolist(t: Tensor) -> list:
    return t.detach().cpu().tolist()


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
        {"color": _COLORS[i % len(_COLORS)], "linestyle": _LINESTYLES[(i // len(_COLORS)) % len(_LINESTYLES)],
         "marker": _MARKERS[(i // k) % len(_MARKERS)]}
        for i in range(n)
    ]


def _num_runs(sc: dict[str, Any]) -> int:
    return int(sc.get("num_runs") or len(sc["methods"][0].get("runs", [])) or 1)


def band_label(sc: dict[str, Any]) -> str:
    r"""What a scenario's bands and ± mean, e.g. ``"mean ± 1 s.e. over 6 runs"``."""
    R = _num_runs(sc)
    over = "repetitions (agent-averaged)" if any("stderr_over" in m for m in sc["methods"]) else "runs"
    if R < 2:
        return f"mean of 1 {over.split()[0][:-1]}, no band"
    return f"mean ± 1 s.e. over {R} {over}"


def _curves_figure(results: dict[str, Any], title: str | None = None, log_y: bool = False) -> Figure:
    scenarios = results["scenarios"]
    n = len(scenarios)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(5.2 * cols, 3.8 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, sc in zip(axes.flat, scenarios):
        styles = series_styles(len(sc["methods"]))
        for m, style in zip(sc["methods"], styles):
            x = m["iterations"]
            mu, se = m["loss_mean"], m["loss_stderr"]
            every = max(1, len(x) // 10)
            ax.plot(x, mu, label=m["name"], lw=1.6, markevery=every, markersize=4, **style)
            lo = [a - b for a, b in zip(mu, se)]
            hi = [a + b for a, b in zip(mu, se)]
            ax.fill_between(x, lo, hi, color=style["color"], alpha=0.15, lw=0)
        ax.set_title(sc["name"], fontsize=10)
        ax.set_xlabel("iteration")
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


def save_figure(fig: Figure, path: str | Path, dpi: int = 120) -> Path:
    """Save a figure atomically (PNG bytes to a temporary file, then ``os.replace``)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


def plot_curves(results: dict[str, Any], path: Path, title: str | None = None, log_y: bool = False) -> Path:
    r"""One panel per scenario; each method's mean loss with a ±1 standard-error band (the axis says over what)."""
    return save_figure(_curves_figure(results, title, log_y), path)


def plot_message_length(results: dict[str, Any], path: Path) -> Path:
    r"""FTS paper Fig. 2: final loss vs numbers sent per agent, one marker per method family,
    plus loss vs wall-clock time (Fig. 3)."""
    sc = results["scenarios"][0]
    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    fams: dict[str, list] = {}
    for m in sc["methods"]:
        fams.setdefault(m["settings"].get("algorithm", m["name"]).upper(), []).append(m)
    timed = [m for fam, ms in fams.items() for m in ms
             if m.get("elapsed_s") and ("M=100" in m["name"] or fam == "TS")]
    for (fam, ms), style in zip(fams.items(), series_styles(len(fams))):
        ms = sorted(ms, key=lambda m: m["parameters_per_agent"])
        x = [max(m["parameters_per_agent"], 1) for m in ms]
        axes[0].errorbar(x, [m["loss_mean"][-1] for m in ms], yerr=[m["loss_stderr"][-1] for m in ms],
                         capsize=3, label=fam, **{**style, "marker": style["marker"] or "o"})
    for m, style in zip(timed, series_styles(len(timed))):
        axes[1].plot(m["elapsed_s"], m["loss_mean"][1:], label=m["name"], **style)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("numbers sent per agent (message length; TS: none, drawn at 1)")
    axes[0].set_ylabel(f"final {sc['methods'][0]['loss_name']}\n(error bars: {band_label(sc)})", fontsize=9)
    axes[0].set_title(sc["name"], fontsize=10)
    axes[1].set_xlabel("wall-clock seconds (all runs of the batch together)")
    axes[1].set_ylabel(f"{sc['methods'][0]['loss_name']}\n({band_label(sc).split(',')[0].replace(' ± 1 s.e.', '')}, "
                       "no band)", fontsize=9)
    axes[1].set_xscale("log")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def summary_table(results: dict[str, Any]) -> str:
    r"""A plain-text table: final loss ± stderr, time and message size per method."""
    lines = []
    for sc in results["scenarios"]:
        lines.append(f"== {sc['name']}  (final value: {band_label(sc)})")
        lines.append(f"   {'method':<28} {'final ' + sc['methods'][0]['loss_name']:>26} {'time [s]':>9} {'params/agent':>13}")
        for m in sc["methods"]:
            mu, se = m["loss_mean"][-1], m["loss_stderr"][-1]
            extra = ""
            if m.get("epsilon_final") is not None:
                extra = f"  eps={m['epsilon_final']:.2f}"
            lines.append(
                f"   {m['name']:<28} {mu:>17.4f} ± {se:<6.4f} {m.get('wall_time_s', float('nan')):>9.1f} "
                f"{m.get('parameters_per_agent', 0):>13}{extra}"
            )
    return "\n".join(lines)
