r"""Run a configured experiment end to end, with checkpoints and reports.

``run_experiment`` builds each scenario's objective, runs its methods, writes
``results.json`` and the plots, and checkpoints every ``checkpoint_every``
iterations to ``OUT/checkpoints`` so an interrupted run continues with
``resume=True`` exactly where it stopped (finished methods are not re-run).
``OUT`` is locked while the run lasts, and ``resume`` continues only a run of
the same configuration (see :mod:`fbo_torch.experiments.outdir`).
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from fbo_torch.experiments.config import ConfigError, ExperimentConfig, Scenario, check_device
from fbo_torch.experiments.outdir import (
    OutputFolder,
    ResumeError,
    atomic_write_bytes,
    atomic_write_text,
    fingerprint,
)
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

CHECKPOINT_VERSION = 2


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

            self.bar = tqdm(total=total, desc=desc, leave=True, dynamic_ncols=True, file=sys.stderr, mininterval=0)

    def update(self, n: int = 1, **postfix: Any) -> None:
        if self.bar is not None:
            if postfix:  # before the count moves, so the line drawn for the new count shows it
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Checkpoints:
    r"""The checkpoints of one run in ``OUT/checkpoints``, each stamped with the run's fingerprint.

    ``load`` (only when resuming) refuses a checkpoint of another configuration
    or package version and names an unreadable (truncated, corrupt) one; ``save``
    writes atomically (temporary file, fsync, ``os.replace``), so a run killed
    mid-write leaves the previous checkpoint intact.
    """

    def __init__(self, folder: Path, fingerprint: str, resume: bool) -> None:
        self.folder = Path(folder)
        self.fingerprint = fingerprint
        self.resume = resume
        self._verified: dict[Path, dict[str, Any]] = {}  # read by verify_all, handed out once by load

    def path(self, si: int, mi: int) -> Path:
        return self.folder / f"scenario{si}_method{mi}.pt"

    def load(self, path: Path) -> dict[str, Any] | None:
        if path in self._verified:
            return self._verified.pop(path)
        if not self.resume or not path.exists():
            return None
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as err:  # truncated zip, bad pickle, ...: torch raises many kinds
            text = str(err).strip()
            reason = text.splitlines()[0].split(". ")[0][:160] if text else type(err).__name__
            raise ResumeError(
                f"checkpoint {path} is unreadable (truncated or corrupt: {reason}); delete that file to rerun "
                "its method from the start, or rerun with --overwrite to start the whole run over."
            ) from None
        if not isinstance(state, dict) or state.get("version") != CHECKPOINT_VERSION \
                or state.get("fingerprint") != self.fingerprint:
            raise ResumeError(
                f"checkpoint {path} was written by a different configuration or fbo_torch version "
                "(its fingerprint differs from this run's); delete it, or rerun with --overwrite to start over."
            )
        return state

    def verify_all(self) -> None:
        """Read every checkpoint now, so a corrupt one is named before any method runs (resume only),
        and keep what was read for :meth:`load` (each file is read once); temporary files of writes cut
        short by a kill are removed."""
        if not self.resume:
            return
        for tmp in self.folder.glob(".*.tmp"):
            tmp.unlink()
        for path in sorted(self.folder.glob("*.pt")):
            self._verified[path] = self.load(path)

    def save(self, path: Path, state: dict[str, Any]) -> None:
        buf = io.BytesIO()
        torch.save({"version": CHECKPOINT_VERSION, "fingerprint": self.fingerprint, **state}, buf)
        atomic_write_bytes(path, buf.getvalue())


def run_methods(
    cfg: ExperimentConfig,
    si: int,
    sc: Scenario,
    checkpoints: Checkpoints,
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
    try:  # the bar ends its line however the loop ends (Ctrl-C, a failed write)
        records = []
        for mi, (label, settings) in enumerate(sc.methods):
            ckpt = checkpoints.path(si, mi)
            state = checkpoints.load(ckpt)
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
                bar.update(1, **postfix)  # the postfix shown with round r.t is the state after round r.t
                if cfg.checkpoint_every and r.t % cfg.checkpoint_every == 0 and not r.done:
                    checkpoints.save(ckpt, {"runner": r.state_dict()})

            runner.run(callback)
            record = make_record(label, settings, runner)
            log(f"  {label}: final {record['loss_name']} {record['loss_mean'][-1]:.4f}, "
                f"{record['wall_time_s']:.1f} s")
            checkpoints.save(ckpt, {"record": record})
            records.append(record)
        return records
    finally:
        bar.close()


def _targets_checked(objective: Objective, sc: Scenario) -> torch.Tensor:
    try:
        return _targets(objective, sc.runs)
    except ValueError as err:
        raise ConfigError(f"{sc.where}: {err}") from None


def check_fts_scenario(sc: Scenario, objective: Objective) -> None:
    r"""What an FTS scenario's runners would refuse once started, as a :class:`ConfigError`:
    ``runs.targets`` beyond the objective's agents, and a federated method (FTS, RGPE, TAF) whose
    target has no other agent to receive messages from (the other agents of its group, where the
    objective has groups, as :class:`~fbo_torch.runners.fts.FTSRunner` picks them)."""
    from fbo_torch.runners.fts import FEDERATED

    targets = _targets_checked(objective, sc)
    groups = getattr(objective, "group_of_agent", None)
    groups = torch.zeros(objective.num_agents, dtype=torch.long) if groups is None else groups.cpu()
    peers = (groups.unsqueeze(0) == groups[targets.cpu()].unsqueeze(-1)).sum(-1) - 1
    alone = targets[peers.cpu() < 1].tolist()
    for j, (label, settings) in enumerate(sc.methods):
        if settings.algorithm in FEDERATED and alone:
            kind = "of its group " if getattr(objective, "group_of_agent", None) is not None else ""
            raise ConfigError(
                f"{sc.where}: methods[{j}] ({label!r}, algorithm {settings.algorithm}): target agent(s) {alone} "
                f"have no other agent {kind}to receive messages from (the objective has {objective.num_agents} "
                "agent(s)); give the objective more agents, or use `algorithm: ts`."
            )


def _one_line(err: BaseException) -> str:
    """An error's message on one line (a multi-line one's lines joined; list bullets dropped)."""
    lines = [line.strip().removeprefix("- ") for line in str(err).splitlines() if line.strip()]
    text = " ".join(line if line[-1] in ".:;,!?" or line is lines[-1] else line + ";" for line in lines)
    return text or type(err).__name__


def prepare_objectives(cfg: ExperimentConfig, device: str) -> list[Objective]:
    r"""Build every scenario's objective and check what needs it, before the output folder is created.

    Refuses, with a one-line :class:`ConfigError` naming the YAML key, an objective that cannot be
    built (missing data files, bad arguments) and the settings its methods' runners would refuse
    only once started (too few agents, ``runs.targets``, too many sub-regions; see
    :func:`check_fts_scenario` and :func:`~fbo_torch.experiments.dp_run.check_dp_scenario`).
    Returns the objectives, one per scenario, for the run to use (each is built once).
    """
    objectives = []
    for sc in cfg.scenarios:
        try:
            objective = build_objective(sc.objective, device=device)
        except (ValueError, TypeError, OSError, ImportError, RuntimeError) as err:
            raise ConfigError(f"{sc.where}: objective ({sc.objective['type']}): {_one_line(err)}") from None
        if cfg.experiment == "fts":
            check_fts_scenario(sc, objective)
        else:
            from fbo_torch.experiments.dp_run import check_dp_scenario

            check_dp_scenario(cfg, sc, objective)
        objectives.append(objective)
    return objectives


def _run_fts_scenario(
    cfg: ExperimentConfig, si: int, sc: Scenario, device: str, num_inits: int, checkpoints: Checkpoints,
    progress: bool, log: Callable[[str], None], objective: Objective | None = None,
) -> dict[str, Any]:
    from fbo_torch.runners.fts import FEDERATED, FederationHistory, FTSRunner

    if objective is None:
        objective = build_objective(sc.objective, device=device)
    domain = cfg.build_domain(objective)
    targets = _targets(objective, sc.runs)
    seed = cfg.seed + 1000 * si
    history = None
    if any(m.algorithm in FEDERATED for _, m in sc.methods):
        h = sc.history
        t0 = time.perf_counter()
        history = FederationHistory(
            objective, domain, t_n=h.t_n, mode=h.mode, num_init=h.num_init, gp_kernel=h.gp_kernel,
            seed=seed + 17, device=device, setup=sc.setup,
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

    methods = run_methods(cfg, si, sc, checkpoints, progress, make_runner, make_record, log)
    return {"name": sc.name, "objective": sc.objective, "num_runs": int(targets.numel() * num_inits), "methods": methods}


def run_experiment(
    cfg: ExperimentConfig,
    out_dir: str | Path,
    device: str | None = None,
    seeds: int | None = None,
    resume: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
    overwrite: bool = False,
    echo_config: bool = False,
) -> dict[str, Any]:
    r"""Run every scenario and method of ``cfg``; write results and plots to ``out_dir``.

    Every scenario's objective is built and checked (:func:`prepare_objectives`) before
    ``out_dir`` is created or anything in it deleted. The output folder is locked for
    the run (:class:`~fbo_torch.experiments.outdir.OutputFolder`): a second run into it
    is refused while this one runs, and a folder that already holds files is refused
    unless ``resume`` (continue the run in it, only if its configuration fingerprint
    equals this one's) or ``overwrite`` (first delete the files its ``run.json`` lists
    as written by fbo-torch runs; other files are kept).

    Args:
        cfg: A parsed configuration (:func:`~fbo_torch.experiments.config.load_config`).
        out_dir: Output folder (created).
        device: Overrides ``cfg.device``.
        seeds: Overrides the number of initializations (``runs.num_inits``).
        resume: Continue from checkpoints in ``out_dir/checkpoints``.
        progress: Show progress bars.
        log: Where status lines go.
        overwrite: Delete what earlier runs wrote in ``out_dir`` first (and nothing else).
        echo_config: Log the resolved configuration (YAML) once the folder is checked.

    Returns:
        The results dictionary also written to ``out_dir/results.json``.

    Raises:
        OutputError: ``out_dir`` is unusable, locked by another run, or not empty.
        ResumeError: ``resume`` into a run of a different configuration, or an unreadable checkpoint.
        ConfigError: ``device`` (or the config's) is ``cuda`` but no CUDA device is available, or an
            objective cannot be built or does not fit the methods (see :func:`prepare_objectives`).
        WriteError: A file could not be written (disk full, no permission); it names the file.
        KeyboardInterrupt: Passed on; the checkpoints written so far stay valid (``resume=True``).
    """
    import fbo_torch

    if seeds is not None and (isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1):
        raise ValueError(f"`seeds` must be an integer >= 1, got {seeds!r}.")
    check_device(cfg, device)
    device = device or cfg.device
    resolved = cfg.resolved()
    resolved["device"] = device
    if seeds is not None:
        for sc in resolved["scenarios"]:
            sc["runs"]["num_inits"] = seeds
    out = Path(out_dir)
    folder = OutputFolder(out, resume=resume, overwrite=overwrite)
    try:
        # An existing folder is locked and checked first (a resumed run's fingerprint and checkpoints);
        # nothing is created or deleted before the objectives are built and checked.
        folder.open(create=False)
        folder.check_resume(resolved)
        checkpoints = Checkpoints(out / "checkpoints", fingerprint(resolved), resume)
        checkpoints.verify_all()
        objectives = prepare_objectives(cfg, device)
        folder.open()
        if overwrite and (folder.deleted or folder.kept):
            kept = folder.kept
            log(f"--overwrite: deleted the {len(folder.deleted)} file(s) and folder(s) an earlier run wrote in "
                f"{out}" + (f"; kept {len(kept)} it did not write: {', '.join(kept[:5])}"
                            f"{', ...' if len(kept) > 5 else ''}" if kept else ""))
        if echo_config:
            log("# resolved config")
            log(yaml.safe_dump(resolved, sort_keys=False).rstrip())
        folder.write_manifest(resolved)
        folder.make_dir("checkpoints")
        atomic_write_text(out / "config.resolved.yaml", yaml.safe_dump(resolved, sort_keys=False))
        results: dict[str, Any] = {
            "experiment": cfg.experiment,
            "name": cfg.name,
            "fingerprint": checkpoints.fingerprint,
            "fbo_torch_version": fbo_torch.__version__,
            "command": " ".join(sys.argv),
            "environment": environment(device),
            "config": resolved,
            "scenarios": [],
        }
        t_start = time.perf_counter()
        for si, sc in enumerate(cfg.scenarios):
            num_inits = seeds if seeds is not None else sc.runs.num_inits
            log(f"scenario {si + 1}/{len(cfg.scenarios)}: {sc.name}")
            objective, objectives[si] = objectives[si], None  # held no longer than its scenario runs
            if cfg.experiment == "fts":
                rec = _run_fts_scenario(cfg, si, sc, device, num_inits, checkpoints, progress, log, objective)
            else:
                from fbo_torch.experiments.dp_run import run_dp_scenario

                rec = run_dp_scenario(cfg, si, sc, device, num_inits, checkpoints, progress, log, objective)
            del objective
            results["scenarios"].append(rec)
            write_json(out / "results.json", results)
        results["wall_time_s"] = time.perf_counter() - t_start
        write_json(out / "results.json", results)
        render_reports(results, out)
    finally:
        folder.close()
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
    atomic_write_text(out / "summary.txt", summary_table(results) + "\n")
