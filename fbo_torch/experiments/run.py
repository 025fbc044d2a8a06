r"""Run a configured experiment end to end, with checkpoints and reports.

``run_experiment`` builds each scenario's objective, runs its methods, writes
``results.json`` and the plots, and checkpoints every ``checkpoint_every``
iterations to ``OUT/checkpoints`` so an interrupted run continues with
``resume=True`` exactly where it stopped (finished methods are not re-run).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from fbo_torch.experiments.config import ExperimentConfig, Scenario
from fbo_torch.experiments.report import (
    environment,
    plot_curves,
    plot_message_length,
    summarize_curves,
    summary_table,
    write_json,
)
from fbo_torch.objectives import build_objective
from fbo_torch.objectives.base import Objective
from fbo_torch.runners.common import Domain

CHECKPOINT_VERSION = 1


def _targets(objective: Objective, runs: Any) -> torch.Tensor:
    if runs.targets != "auto":
        t = torch.tensor(runs.targets, dtype=torch.long)
        if (t >= objective.num_agents).any():
            raise ValueError(f"runs.targets {runs.targets} exceed the objective's {objective.num_agents} agents.")
        return t
    builtin = getattr(objective, "targets", None)
    if builtin is not None and runs.num_targets is None:
        return torch.as_tensor(builtin, dtype=torch.long)
    k = runs.num_targets or 1
    return torch.arange(min(k, objective.num_agents))


class _Progress:
    """tqdm when available and wanted, else silent."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, leave=True, dynamic_ncols=True, file=sys.stderr)

    def update(self, n: int = 1, **postfix: Any) -> None:
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _load_checkpoint(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("version") != CHECKPOINT_VERSION:
        return None
    return state


def _save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"version": CHECKPOINT_VERSION, **state}, tmp)
    tmp.replace(path)


def run_methods(
    cfg: ExperimentConfig,
    si: int,
    sc: Scenario,
    ckpt_dir: Path,
    resume: bool,
    progress: bool,
    make_runner: Callable[[str, Any], Any],
    make_record: Callable[[str, Any, Any], dict[str, Any]],
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    r"""Run a scenario's methods with progress, checkpoints and resume.

    ``make_runner(label, settings)`` builds a runner (``step``/``run``/``t``/``done``,
    ``state_dict``/``load_state_dict``); ``make_record(label, settings, runner)``
    turns a finished runner into its JSON record. Finished methods are stored
    in their checkpoint and not re-run on resume; unfinished ones continue from
    their last checkpoint.
    """
    total = sum(m.num_iterations for _, m in sc.methods)
    bar = _Progress(total, f"[{si + 1}/{len(cfg.scenarios)}] {sc.name}", progress)
    records = []
    for mi, (label, settings) in enumerate(sc.methods):
        ckpt = ckpt_dir / f"scenario{si}_method{mi}.pt"
        state = _load_checkpoint(ckpt) if resume else None
        if state is not None and "record" in state:
            records.append(state["record"])
            bar.update(settings.num_iterations)
            continue
        runner = make_runner(label, settings)
        if state is not None and "runner" in state:
            runner.load_state_dict(state["runner"])
            bar.update(runner.t)

        def callback(r: Any, ckpt: Path = ckpt) -> None:
            postfix = {"method": r.name}
            eps = getattr(r, "epsilons", None)
            if eps and eps[-1] == eps[-1] and eps[-1] != float("inf"):
                postfix["eps"] = f"{eps[-1]:.2f}"
            bar.update(1, **postfix)
            if cfg.checkpoint_every and r.t % cfg.checkpoint_every == 0 and not r.done:
                _save_checkpoint(ckpt, {"runner": r.state_dict()})

        runner.run(callback)
        record = make_record(label, settings, runner)
        log(f"  {label}: final {record['loss_name']} {record['loss_mean'][-1]:.4f}, {record['wall_time_s']:.1f} s")
        _save_checkpoint(ckpt, {"record": record})
        records.append(record)
    bar.close()
    return records


def _run_fts_scenario(
    cfg: ExperimentConfig, si: int, sc: Scenario, device: str, num_inits: int, ckpt_dir: Path,
    resume: bool, progress: bool, log: Callable[[str], None],
) -> dict[str, Any]:
    from fbo_torch.runners.fts import FEDERATED, FederationHistory, FTSRunner

    objective = build_objective(sc.objective)
    domain = Domain(objective.bounds, objective.candidates, **cfg.optimizer.__dict__)
    targets = _targets(objective, sc.runs)
    seed = cfg.seed + 1000 * si
    history = None
    if any(m.algorithm in FEDERATED for _, m in sc.methods):
        h = sc.history
        t0 = time.perf_counter()
        history = FederationHistory(
            objective, domain, t_n=h.t_n, mode=h.mode, num_init=h.num_init, gp_kernel=h.gp_kernel,
            seed=seed + 17, device=device,
        )
        log(f"  other agents' histories ({h.mode}, t_n={h.t_n}) built in {time.perf_counter() - t0:.1f} s")

    def make_runner(label: str, settings: Any) -> FTSRunner:
        return FTSRunner(
            objective, settings, targets, num_inits, history=history, domain=domain, seed=seed,
            device=device, name=label,
        )

    def make_record(label: str, settings: Any, runner: FTSRunner) -> dict[str, Any]:
        res = runner.result()
        return summarize_curves(
            label,
            res.loss,
            objective.loss_name,
            extra={
                "settings": res.settings,
                "sources": res.sources.tolist(),
                "fraction_from_agents": float((res.sources >= 0).double().mean()) if res.sources.numel() else 0.0,
                "targets": res.targets.tolist(),
                "inits": res.inits.tolist(),
                "queries": res.queries.tolist(),
                "best_value_runs": res.best_value.tolist(),
                "wall_time_s": res.wall_time,
                "elapsed_s": res.elapsed,
                "parameters_per_agent": res.parameters_per_agent,
            },
        )

    methods = run_methods(cfg, si, sc, ckpt_dir, resume, progress, make_runner, make_record, log)
    return {"name": sc.name, "objective": sc.objective, "num_runs": int(targets.numel() * num_inits), "methods": methods}


def run_experiment(
    cfg: ExperimentConfig,
    out_dir: str | Path,
    device: str | None = None,
    seeds: int | None = None,
    resume: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    r"""Run every scenario and method of ``cfg``; write results and plots to ``out_dir``.

    Args:
        cfg: A parsed configuration (:func:`~fbo_torch.experiments.config.load_config`).
        out_dir: Output folder (created).
        device: Overrides ``cfg.device``.
        seeds: Overrides the number of initializations (``runs.num_inits``).
        resume: Continue from checkpoints in ``out_dir/checkpoints``.
        progress: Show progress bars.
        log: Where status lines go.

    Returns:
        The results dictionary also written to ``out_dir/results.json``.
    """
    out = Path(out_dir)
    ckpt_dir = out / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    device = device or cfg.device
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was requested but no CUDA device is available.")
    resolved = cfg.resolved()
    resolved["device"] = device
    if seeds is not None:
        for sc in resolved["scenarios"]:
            sc["runs"]["num_inits"] = seeds
    (out / "config.resolved.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    results: dict[str, Any] = {
        "experiment": cfg.experiment,
        "name": cfg.name,
        "command": " ".join(sys.argv),
        "environment": environment(device),
        "config": resolved,
        "scenarios": [],
    }
    t_start = time.perf_counter()
    for si, sc in enumerate(cfg.scenarios):
        num_inits = seeds if seeds is not None else sc.runs.num_inits
        log(f"scenario {si + 1}/{len(cfg.scenarios)}: {sc.name}")
        if cfg.experiment == "fts":
            rec = _run_fts_scenario(cfg, si, sc, device, num_inits, ckpt_dir, resume, progress, log)
        else:
            from fbo_torch.experiments.dp_run import run_dp_scenario

            rec = run_dp_scenario(cfg, si, sc, device, num_inits, ckpt_dir, resume, progress, log)
        results["scenarios"].append(rec)
        write_json(out / "results.json", results)
    results["wall_time_s"] = time.perf_counter() - t_start
    write_json(out / "results.json", results)
    render_reports(results, out)
    return results


def render_reports(results: dict[str, Any], out: str | Path) -> None:
    """(Re)draw the plots and the text summary of a finished ``results.json``."""
    out = Path(out)
    plot_curves(results, out / "regret.png", title=results.get("name"))
    if results.get("experiment") == "dp_fts_de":
        from fbo_torch.experiments.dp_run import plot_privacy

        plot_privacy(results, out)
    elif any(m["settings"].get("algorithm") in ("rgpe", "taf") for sc in results["scenarios"] for m in sc["methods"]):
        plot_message_length(results, out / "message_length.png")
    (out / "summary.txt").write_text(summary_table(results) + "\n")
