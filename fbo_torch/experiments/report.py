r"""Results: JSON records, regret plots and text summaries."""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path
from typing import Any

import torch
from torch import Tensor


def environment(device: str | torch.device = "cpu") -> dict[str, Any]:
    """Machine and library versions, recorded with every result."""
    import botorch
    import gpytorch

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
    try:
        import opacus

        info["opacus"] = opacus.__version__
    except ImportError:
        info["opacus"] = None
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
    from fbo_torch.experiments.outdir import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=1, default=_json_default))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Tensor):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def plot_curves(results: dict[str, Any], path: Path, title: str | None = None, log_y: bool = False) -> Path:
    r"""One panel per scenario; each method's mean loss with a ±1 stderr band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = results["scenarios"]
    n = len(scenarios)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax, sc in zip(axes.flat, scenarios):
        for m in sc["methods"]:
            x = m["iterations"]
            mu, se = m["loss_mean"], m["loss_stderr"]
            (line,) = ax.plot(x, mu, label=m["name"], lw=1.6)
            lo = [a - b for a, b in zip(mu, se)]
            hi = [a + b for a, b in zip(mu, se)]
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
        ax.set_title(sc["name"], fontsize=10)
        ax.set_xlabel("iteration")
        ax.set_ylabel(sc["methods"][0]["loss_name"])
        if log_y:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_message_length(results: dict[str, Any], path: Path) -> Path:
    r"""FTS paper Fig. 2: final loss vs numbers sent per agent, one marker per method family,
    plus loss vs wall-clock time (Fig. 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sc = results["scenarios"][0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    fams: dict[str, list] = {}
    for m in sc["methods"]:
        fams.setdefault(m["settings"].get("algorithm", m["name"]).upper(), []).append(m)
    for fam, ms in fams.items():
        ms = sorted(ms, key=lambda m: m["parameters_per_agent"])
        x = [max(m["parameters_per_agent"], 1) for m in ms]
        axes[0].errorbar(x, [m["loss_mean"][-1] for m in ms], yerr=[m["loss_stderr"][-1] for m in ms],
                         fmt="o-", capsize=3, label=fam)
        for m in ms:
            t = m.get("elapsed_s") or []
            if t and "M=100" in m["name"] or (t and fam == "TS"):
                axes[1].plot(t, m["loss_mean"][1:], label=m["name"])
    axes[0].set_xscale("log")
    axes[0].set_xlabel("numbers sent per agent (message length; TS: none, drawn at 1)")
    axes[0].set_ylabel(f"final {sc['methods'][0]['loss_name']}")
    axes[0].set_title(sc["name"], fontsize=10)
    axes[1].set_xlabel("wall-clock seconds (all runs of the batch together)")
    axes[1].set_ylabel(sc["methods"][0]["loss_name"])
    axes[1].set_xscale("log")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def summary_table(results: dict[str, Any]) -> str:
    r"""A plain-text table: final loss ± stderr, time and message size per method."""
    lines = []
    for sc in results["scenarios"]:
        lines.append(f"== {sc['name']}")
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
