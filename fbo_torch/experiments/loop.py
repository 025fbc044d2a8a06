r"""Run a configured experiment end to end: the loop over scenarios and methods, with checkpoints and reports.

``run_experiment`` builds each scenario's objective and
:class:`~fbo_torch.optim.domain.Domain` once, checks them, then runs the
scenario's methods, writes ``config.resolved.yaml``, ``results.json``,
``results.csv``, ``summary.txt`` and the plots, and checkpoints every
``checkpoint_every`` iterations to ``OUT/checkpoints`` so an interrupted run
continues with ``resume=True`` exactly where it stopped (finished methods are
not re-run). ``OUT`` is locked while the run lasts, and ``resume`` continues only
a run of the same configuration (see :mod:`fbo_torch.experiments.outdir`).

What differs between the experiment kinds (``experiment: fts | dp_fts_de``) comes
from their :class:`~fbo_torch.experiments.kind.ExperimentKind`, looked up in
:data:`EXPERIMENTS`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from botorch.exceptions.warnings import InputDataWarning
from tqdm.auto import tqdm
from tqdm.autonotebook import tqdm as _tqdm_autonotebook

import fbo_torch
from fbo_torch.experiments import dp_fts_de, fts
from fbo_torch.experiments.accounting import accounting, all_posterior_gains
from fbo_torch.experiments.checkpoints import Checkpoints
from fbo_torch.experiments.config import ConfigError, ExperimentConfig, RunsConfig, check_device
from fbo_torch.experiments.html_report import write_html_report
from fbo_torch.experiments.kind import ExperimentKind, ScenarioContext
from fbo_torch.experiments.outdir import MANIFEST, OutputFolder, atomic_write_text, fingerprint
from fbo_torch.experiments.report import (
    PLOT_FORMATS,
    check_plot_formats,
    environment,
    loss_plot_stem,
    plot_curves,
    summary_table,
    write_json,
    write_tidy_csv,
)
from fbo_torch.federation.evaluation_failures import EvaluationFailures, recording
from fbo_torch.objectives import build_objective
from fbo_torch.utils.resources import memory_budget
from fbo_torch.utils.schema import check_value

#: The experiment kinds by their YAML name (``experiment:``).
EXPERIMENTS: dict[str, ExperimentKind] = {"fts": fts.KIND, "dp_fts_de": dp_fts_de.KIND}


def interactive() -> bool:
    """Whether progress bars can redraw in place: stderr is a terminal, or this is a notebook."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty()) or _tqdm_autonotebook.__module__ != "tqdm.std"


class _Progress:
    """A tqdm bar when ``enabled`` and :func:`interactive` (in a log file a bar is only noise: the
    loop's one line per finished method says how far the run is), else silent."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.bar = None
        if enabled and interactive():
            self.bar = tqdm(total=total, desc=desc, leave=True, dynamic_ncols=True, file=sys.stderr, mininterval=0)

    def update(self, n: int = 1, **postfix: Any) -> None:
        if self.bar is not None:
            if postfix:  # before the count moves, so the line drawn for the new count shows it
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_methods(
    ctx: ScenarioContext,
    checkpoints: Checkpoints,
    progress: bool,
    make_runner: Callable[[str, Any], Any],
    make_record: Callable[[str, Any, Any], dict[str, Any]],
) -> list[dict[str, Any]]:
    r"""Run a scenario's methods with progress, checkpoints and resume.

    ``make_runner(label, settings)`` builds a runner (``run``/``t``/``done``/``name``,
    ``state_dict``/``load_state_dict``); ``make_record(label, settings, runner)``
    turns a finished runner into its JSON record. Finished methods are stored
    in their checkpoint and not re-run on resume; unfinished ones continue from
    their last checkpoint.

    Each method's evaluations are noted in its own
    :class:`~fbo_torch.federation.evaluation_failures.EvaluationFailures` log
    (:meth:`ScenarioContext.evaluation_failures
    <fbo_torch.experiments.kind.ScenarioContext.evaluation_failures>`), flushed after the initial
    points and after every round (where the run stops, with an
    :class:`~fbo_torch.federation.evaluation_failures.EvaluationError`, if too many failed) and
    kept in the method's checkpoints and in its record (``evaluation_failures``).
    """
    cfg, si, sc, log = ctx.cfg, ctx.index, ctx.scenario, ctx.log
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
            failures = ctx.evaluation_failures(f"method {label!r}")
            with recording(failures):
                runner = make_runner(label, settings)  # evaluates the initial points (round 0)
                failures.flush()
                if state is not None and "runner" in state:
                    runner.load_state_dict(state["runner"])
                    if "evaluation_failures" in state:
                        failures.load_state_dict(state["evaluation_failures"])
                    bar.update(runner.t)
                failures.round = runner.t + 1

                def callback(r: Any, ckpt: Path = ckpt, failures: EvaluationFailures = failures) -> None:
                    failures.flush()  # after the round: its values are read on the host here, not inside it
                    failures.round = r.t + 1
                    postfix = {"method": r.name}
                    eps = getattr(r, "epsilons", None)
                    if eps and eps[-1] == eps[-1] and eps[-1] != float("inf"):
                        delta = getattr(r, "delta", None)  # an ε is shown with its δ
                        postfix["eps"] = f"{eps[-1]:.2f}" + (f" (δ={delta:.2g})" if delta is not None else "")
                    bar.update(1, **postfix)  # the postfix shown with round r.t is the state after round r.t
                    if cfg.checkpoint_every and r.t % cfg.checkpoint_every == 0 and not r.done:
                        checkpoints.save(ckpt, {"runner": r.state_dict(), "evaluation_failures": failures.state_dict()})

                runner.run(callback)
                failures.flush()
            record = make_record(label, settings, runner)
            record["evaluation_failures"] = failures.summary()
            log(f"  {label}: final {record['loss_name']} {record['loss_mean'][-1]:.4f}, {record['wall_time_s']:.1f} s")
            checkpoints.save(ckpt, {"record": record})
            records.append(record)
        return records
    finally:
        bar.close()


def _one_line(err: BaseException) -> str:
    """An error's message on one line (a multi-line one's lines joined; list bullets dropped)."""
    lines = [line.strip().removeprefix("- ") for line in str(err).splitlines() if line.strip()]
    text = " ".join(line if line[-1] in ".:;,!?" or line is lines[-1] else line + ";" for line in lines)
    return text or type(err).__name__


def prepare_scenarios(
    cfg: ExperimentConfig,
    device: str,
    num_inits: int | None = None,
    log: Callable[[str], None] = print,
) -> list[ScenarioContext]:
    r"""Build every scenario's objective and domain and check them, before the output folder is created.

    Refuses, with a one-line :class:`ConfigError` naming the YAML key, an objective that cannot be
    built (missing data files, bad arguments) and the settings its methods' runners would refuse
    only once started (too few agents, ``runs.targets``, too many sub-regions; the kind's
    :attr:`~fbo_torch.experiments.kind.ExperimentKind.check`). Returns one context per scenario
    for the run to use (each objective is built once): scenario ``i`` has seed ``cfg.seed + 1000 i``
    and ``num_inits`` (else its ``runs.num_inits``) initializations.
    """
    kind = EXPERIMENTS[cfg.experiment]
    contexts = []
    reported: set[str] = set()  # kinds of failed evaluations shown: each once per run
    for si, sc in enumerate(cfg.scenarios):
        try:
            objective = build_objective(sc.objective, device=device)
        except (ValueError, TypeError, OSError, ImportError, RuntimeError) as err:
            raise ConfigError(f"{sc.where}: objective ({sc.objective['type']}): {_one_line(err)}") from None
        ctx = ScenarioContext(
            cfg=cfg,
            index=si,
            scenario=sc,
            objective=objective,
            domain=cfg.build_domain(objective),
            seed=cfg.seed + 1000 * si,
            device=device,
            num_inits=num_inits if num_inits is not None else sc.runs.num_inits,
            log=log,
            max_memory=cfg.max_memory,
            reported_failures=reported,
        )
        kind.check(ctx)
        note = unit_cube_note(ctx)
        if note:
            log(note)
        contexts.append(ctx)
    return contexts


#: BoTorch's ``InputDataWarning`` for a shared map fed inputs outside the unit cube; its advice is for Python
#: users (``Normalize``, ``fit_shared_features``), so a YAML run says it in YAML words (:func:`unit_cube_note`).
_RFF_INPUTS_WARNING = r"The training inputs of RFFBayesianLinear are not contained in the unit cube"
#: The privacy ledger's warning for a δ ≥ 1/N, which a YAML run gives naming `privacy.delta`
#: (:func:`fbo_torch.experiments.dp_fts_de.check_scenario`).
_LARGE_DELTA_WARNING = r"delta = .* is >= 1/N"


def unit_cube_note(ctx: ScenarioContext) -> str | None:
    r"""One line for a scenario whose objective's box is not the unit cube while a method shares the random-feature
    map: ``rff_lengthscale`` is then in the objective's units (``None`` otherwise)."""
    bounds = ctx.objective.bounds.detach().cpu()
    if bool(((bounds[0] >= -1e-9) & (bounds[1] <= 1 + 1e-9)).all()):
        return None
    scales = sorted({float(s.rff_lengthscale) for _, s in ctx.scenario.methods if s.method.federated()})
    if not scales:
        return None
    box = " x ".join(f"[{lo:g}, {hi:g}]" for lo, hi in zip(bounds[0].tolist(), bounds[1].tolist(), strict=True))
    return (
        f"note: {ctx.scenario.where}: the objective's inputs span {box}, not the unit cube; the shared "
        f"feature map sees them as they are, so `rff_lengthscale` ({', '.join(f'{v:g}' for v in scales)}) is in "
        "those units: scale it with the box, or give the objective unit-cube bounds (docs/experiments.md, "
        "Units of rff_lengthscale)"
    )


def run_scenario(ctx: ScenarioContext, checkpoints: Checkpoints, progress: bool) -> dict[str, Any]:
    r"""Run one scenario's methods (:func:`run_methods`); returns its JSON record."""
    sc = ctx.scenario
    methods = EXPERIMENTS[ctx.cfg.experiment].methods(ctx)
    records = run_methods(ctx, checkpoints, progress, methods.make_runner, methods.make_record)
    return {
        "name": sc.name,
        "objective": sc.objective,
        "num_runs": methods.num_runs,
        # the search box (2 x d): the accounting's posterior-gain GP normalizes the recorded queries by it
        "domain_bounds": ctx.domain.bounds.detach().cpu().double().tolist(),
        **methods.record,
        "methods": records,
    }


def on_device(cfg: ExperimentConfig, device: str) -> ExperimentConfig:
    r"""``cfg`` with its ``device`` and every scenario's ``objective.device`` set to ``device``."""
    scenarios = [
        dataclasses.replace(sc, objective={**sc.objective, "device": device}) if "device" in sc.objective else sc
        for sc in cfg.scenarios
    ]
    return dataclasses.replace(cfg, device=device, scenarios=scenarios)


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
    plot_formats: str | Sequence[str] = ("png",),
    num_inits: int | None = None,
    max_memory: int | str | None = None,
) -> dict[str, Any]:
    r"""Run every scenario and method of ``cfg``; write results and plots to ``out_dir``.

    Every scenario's objective is built and checked (:func:`prepare_scenarios`) before
    ``out_dir`` is created or anything in it deleted. The output folder is locked for
    the run (:class:`~fbo_torch.experiments.outdir.OutputFolder`): a second run into it
    is refused while this one runs, and a folder that already holds files is refused
    unless ``resume`` (continue the run in it, only if its configuration fingerprint
    equals this one's) or ``overwrite`` (first delete the files its ``run.json`` lists
    as written by fbo-torch runs; other files are kept).

    Args:
        cfg: A parsed configuration (:func:`~fbo_torch.experiments.config.load_config`).
        out_dir: Output folder (created).
        device: Overrides ``cfg.device`` and every ``objective.device`` (``--device``: the whole run,
            the CNN objectives' training included, moves).
        seeds: Deprecated name of ``num_inits``.
        resume: Continue from checkpoints in ``out_dir/checkpoints``.
        progress: Show progress bars (only where they can redraw in place: a terminal or a notebook).
        log: Where status lines go (one per scenario and per finished method).
        overwrite: Delete what earlier runs wrote in ``out_dir`` first (and nothing else).
        echo_config: Also log the resolved configuration (YAML); it is always written to
            ``out_dir/config.resolved.yaml``, and its path logged.
        plot_formats: Formats of the plots, some of
            :data:`~fbo_torch.experiments.report.PLOT_FORMATS` (a list, or one comma-separated string).
        num_inits: Overrides every scenario's ``runs.num_inits``: random initializations per target
            (FTS) or repetitions of the whole federation (DP-FTS-DE). Not a seed: ``cfg.seed`` sets those.
        max_memory: Overrides ``cfg.max_memory`` (``--max-memory``;
            :attr:`~fbo_torch.experiments.config.RunOptions.max_memory`); not part of the configuration a
            resumed run must match.

    Returns:
        The results dictionary also written to ``out_dir/results.json``; its ``reports`` names the
        plots and tables drawn from it (:func:`render_reports`).

    Raises:
        OutputError: ``out_dir`` is unusable, locked by another run, or not empty.
        ResumeError: ``resume`` into a run of a different configuration, or an unreadable checkpoint.
        ConfigError: ``device`` (or the config's) is ``cuda`` but no CUDA device is available, or an
            objective cannot be built or does not fit the methods (see :func:`prepare_scenarios`).
        WriteError: A file could not be written (disk full, no permission); it names the file.
        KeyboardInterrupt: Passed on; the checkpoints written so far stay valid (``resume=True``).
    """
    if seeds is not None:
        if num_inits is not None:
            raise ValueError("give `num_inits` only (`seeds` is its deprecated name), not both.")
        warnings.warn(
            "run_experiment(seeds=K) is deprecated: it sets runs.num_inits, not a seed; pass num_inits=K.",
            DeprecationWarning,
            stacklevel=2,
        )
        num_inits = seeds
    if num_inits is not None:
        check_value(RunsConfig, "num_inits", num_inits)
    plot_formats = check_plot_formats(plot_formats, "`plot_formats`")
    if max_memory is not None:
        cfg = dataclasses.replace(cfg, max_memory=memory_budget(max_memory))
    if device is not None:
        cfg = on_device(cfg, device)
    check_device(cfg, device)
    device = device or cfg.device
    resolved = cfg.resolved()
    resolved["device"] = device
    if num_inits is not None:
        for sc in resolved["scenarios"]:
            sc["runs"]["num_inits"] = num_inits
    out = Path(out_dir).expanduser()
    folder = OutputFolder(out, resume=resume, overwrite=overwrite)
    try:
        # An existing folder is locked and checked first (a resumed run's fingerprint and checkpoints);
        # nothing is created or deleted before the objectives are built and checked.
        folder.open(create=False)
        folder.check_resume(resolved)
        checkpoints = Checkpoints(out / "checkpoints", fingerprint(resolved), resume)
        checkpoints.verify_all()
        contexts = prepare_scenarios(cfg, device, num_inits, log)
        folder.refuse_overwriting(output_names(cfg, contexts, checkpoints))
        folder.open()
        if overwrite and (folder.deleted or folder.kept):
            kept = folder.kept
            log(
                f"--overwrite: deleted the {len(folder.deleted)} file(s) and folder(s) an earlier run wrote in "
                f"{out}"
                + (
                    f"; kept {len(kept)} it did not write: {', '.join(kept[:5])}{', ...' if len(kept) > 5 else ''}"
                    if kept
                    else ""
                )
            )
        if echo_config:
            log("# resolved config")
            log(yaml.safe_dump(resolved, sort_keys=False).rstrip())
        folder.write_manifest(resolved)
        folder.make_dir("checkpoints")
        atomic_write_text(out / "config.resolved.yaml", yaml.safe_dump(resolved, sort_keys=False))
        log(f"resolved config: {out / 'config.resolved.yaml'}")
        results: dict[str, Any] = {
            "experiment": cfg.experiment,
            "name": cfg.name,
            "fingerprint": checkpoints.fingerprint,
            "fbo_torch_version": fbo_torch.__version__,
            "command": " ".join(sys.argv),
            "environment": environment(device),
            "config": resolved,
            "plot_formats": list(plot_formats),
            "scenarios": [],
        }
        t_start = time.perf_counter()
        for si, sc in enumerate(cfg.scenarios):
            log(f"scenario {si + 1}/{len(cfg.scenarios)}: {sc.name}")
            ctx = contexts.pop(0)  # handed over: its objective is held no longer than the scenario runs
            with warnings.catch_warnings():  # said once in YAML words by prepare_scenarios (and the kind's check)
                warnings.filterwarnings("ignore", message=_RFF_INPUTS_WARNING, category=InputDataWarning)
                warnings.filterwarnings("ignore", message=_LARGE_DELTA_WARNING, category=UserWarning)
                rec = run_scenario(ctx, checkpoints, progress)
            del ctx
            results["scenarios"].append(rec)
            write_json(out / "results.json", results)
        results["wall_time_s"] = time.perf_counter() - t_start
        write_json(out / "results.json", results)
        results["reports"] = [p.name for p in render_reports(results, out)]
        write_json(out / "results.json", results)
    finally:
        folder.close()
    return results


#: The files every run writes into its folder (besides its plots and checkpoints).
RUN_FILES = (
    MANIFEST,
    "config.resolved.yaml",
    "results.json",
    "results.csv",
    "summary.txt",
    "accounting.json",
    "report.html",
)


def output_names(cfg: ExperimentConfig, contexts: list[ScenarioContext], checkpoints: Checkpoints) -> set[str]:
    r"""The names (relative to the output folder) of the files a run of ``cfg`` may write: :data:`RUN_FILES`,
    its checkpoints, and its plots in every format (the loss curves' and the kind's ``plot_names``)."""
    losses = {"scenarios": [{"methods": [{"loss_name": ctx.objective.loss_name}]} for ctx in contexts]}
    stems = {loss_plot_stem(losses), "loss", *EXPERIMENTS[cfg.experiment].plot_names}
    names = set(RUN_FILES) | {f"{stem}.{fmt}" for stem in stems for fmt in PLOT_FORMATS}
    for si, sc in enumerate(cfg.scenarios):
        for mi in range(len(sc.methods)):
            names.add(checkpoints.path(si, mi).relative_to(checkpoints.folder.parent).as_posix())
    return names


def render_reports(
    results: dict[str, Any],
    out: str | Path,
    formats: str | Sequence[str] | None = None,
) -> list[Path]:
    r"""(Re)draw the plots, ``results.csv``, ``summary.txt``, the per-agent accounting (``accounting.json``,
    :func:`~fbo_torch.experiments.accounting.accounting`) and the federation report (``report.html``,
    :func:`~fbo_torch.experiments.html_report.html_report`) of a finished ``results.json``.

    Args:
        results: The results dictionary.
        out: The run's folder.
        formats: Plot formats (:data:`~fbo_torch.experiments.report.PLOT_FORMATS`); default: the
            run's (``results["plot_formats"]``), else PNG.

    Returns:
        The files written: the plots (the loss curves first, named after the loss, e.g.
        ``simple_regret.png``), then ``results.csv``, ``summary.txt``, ``accounting.json`` and ``report.html``.
    """
    out = Path(out)
    formats = check_plot_formats(formats if formats is not None else results.get("plot_formats"))
    written = plot_curves(results, out / loss_plot_stem(results), title=results.get("name"), formats=formats)
    written += EXPERIMENTS[results.get("experiment", "fts")].plot(results, out, formats)
    gains = all_posterior_gains(results)
    written.append(write_tidy_csv(results, out / "results.csv", gains))
    atomic_write_text(out / "summary.txt", summary_table(results) + "\n")
    acc = accounting(results, gains)
    write_json(out / "accounting.json", acc)
    return written + [
        out / "summary.txt",
        out / "accounting.json",
        write_html_report(results, out / "report.html", acc),
    ]
