r"""DP-FTS-DE experiments: running scenarios, privacy records and privacy plots."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any


from fbo_torch.experiments.config import ExperimentConfig, Scenario
from fbo_torch.experiments.report import mean_stderr, summarize_curves
from fbo_torch.objectives import build_objective
from fbo_torch.runners.common import Domain


def _finite_or_none(values: list[float]) -> list[float | None]:
    return [v if (v is not None and math.isfinite(v)) else None for v in values]


def _other_epsilons(settings: Any, releases: int, delta: float | None, names: list[str]) -> dict[str, float | None]:
    """Final ε of the same mechanism under other accountants (side by side)."""
    if not settings.is_private or delta is None:
        return {}
    from fbo_torch.privacy import compute_epsilon

    out = {}
    for name in names:
        eps = compute_epsilon(settings.sample_rate, settings.noise_multiplier, releases, delta, accountant=name)
        out[name] = eps if math.isfinite(eps) else None
    return out


def run_dp_scenario(
    cfg: ExperimentConfig, si: int, sc: Scenario, device: str, num_inits: int, ckpt_dir: Path,
    resume: bool, progress: bool, log: Callable[[str], None],
) -> dict[str, Any]:
    from fbo_torch.experiments.run import run_methods
    from fbo_torch.runners.dp_fts_de import DPFTSDERunner

    objective = build_objective(sc.objective)
    domain = Domain(objective.bounds, objective.candidates, **cfg.optimizer.__dict__)
    seed = cfg.seed + 1000 * si
    privacy = cfg.privacy
    accountant = privacy.get("accountant", "rdp")
    extra = list(privacy.get("extra_accountants", []))
    delta = privacy.get("delta")

    def make_runner(label: str, settings: Any) -> DPFTSDERunner:
        return DPFTSDERunner(
            objective, settings, num_inits, domain=domain, seed=seed, device=device, name=label,
            accountant=accountant, delta=delta,
        )

    def make_record(label: str, settings: Any, runner: DPFTSDERunner) -> dict[str, Any]:
        res = runner.result()
        releases = int(sum(res.released))
        N = objective.num_agents
        per_run = res.loss.view(num_inits, N, -1).mean(1)  # agent-averaged curve of each repetition
        run_mean, run_se = mean_stderr(per_run)
        return summarize_curves(
            label,
            res.loss,
            objective.loss_name,
            extra={
                "settings": res.settings,
                "num_agents": N,
                "num_repetitions": num_inits,
                "stderr_over": "all (repetition, agent) curves",
                "repetition_mean": run_mean,
                "repetition_stderr": run_se,
                "accountant": res.accountant,
                "delta": res.delta,
                "epsilon": _finite_or_none(res.epsilon),
                "epsilon_final": res.epsilon[-1] if res.epsilon and math.isfinite(res.epsilon[-1]) else None,
                "epsilon_other_accountants": _other_epsilons(settings, releases, res.delta, extra),
                "releases": releases,
                "released": res.released,
                "fraction_clipped": _finite_or_none(res.fraction_clipped),
                "fraction_clipped_mean": _nanmean(res.fraction_clipped),
                "num_sampled": _finite_or_none(res.num_sampled),
                "fraction_queries_from_server": res.used_server.double().mean(0).tolist(),
                "wall_time_s": res.wall_time,
                "parameters_per_agent": res.parameters_per_agent,
            },
        )

    methods = run_methods(cfg, si, sc, ckpt_dir, resume, progress, make_runner, make_record, log)
    return {"name": sc.name, "objective": sc.objective, "num_runs": num_inits, "methods": methods}


def _nanmean(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def plot_privacy(results: dict[str, Any], out: Path) -> None:
    r"""``privacy_utility.png`` (ε vs final loss) and ``epsilon.png`` (ε per round)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = results["scenarios"]
    n = len(scenarios)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 3.9), squeeze=False)
    fig2, axes2 = plt.subplots(1, n, figsize=(5.2 * n, 3.6), squeeze=False)
    for ax, ax2, sc in zip(axes[0], axes2[0], scenarios):
        private = [m for m in sc["methods"] if m.get("epsilon_final") is not None]
        for m in sc["methods"]:
            if m.get("epsilon_final") is None:
                ax.axhline(m["loss_mean"][-1], ls="--", lw=1.2, label=f"{m['name']} (no DP)", color=None)
        if private:
            xs = [m["epsilon_final"] for m in private]
            ys = [m["loss_mean"][-1] for m in private]
            es = [m["loss_stderr"][-1] for m in private]
            ax.errorbar(xs, ys, yerr=es, fmt="o", capsize=3, label="DP-FTS-DE")
            for m, x, y in zip(private, xs, ys):
                ax.annotate(m["name"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
            for m in private:
                eps = [e if e is not None else float("nan") for e in m["epsilon"]]
                ax2.plot(range(1, len(eps) + 1), eps, label=m["name"])
        acc = private[0]["accountant"] if private else ""
        ax.set_xlabel(f"privacy loss ε ({acc})")
        ax.set_ylabel(f"final {sc['methods'][0]['loss_name']}")
        ax.set_title(sc["name"], fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax2.set_xlabel("round")
        ax2.set_ylabel(f"ε ({acc})")
        ax2.set_title(sc["name"], fontsize=10)
        ax2.grid(alpha=0.3)
        if private:
            ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(Path(out) / "privacy_utility.png", dpi=120)
    fig2.tight_layout()
    fig2.savefig(Path(out) / "epsilon.png", dpi=120)
    plt.close(fig)
    plt.close(fig2)
