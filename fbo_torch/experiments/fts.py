r"""FTS experiments (``experiment: fts``): targets, checks, runners and records.

Each scenario runs its methods for every (target agent, initialization) pair
(:class:`~fbo_torch.simulate.fts.FTSRunner`); the federated methods share one
:class:`~fbo_torch.simulate.fts.FederationHistory` of the other agents, built
when the scenario starts with seed ``seed + 17``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fbo_torch.experiments.config import ConfigError, Scenario
from fbo_torch.experiments.kind import ExperimentKind, ScenarioContext, ScenarioMethods
from fbo_torch.experiments.report import plot_message_length, summarize_curves, values_or_none
from fbo_torch.experiments.resources import check_scenario_memory
from fbo_torch.federation.evaluation_failures import recording
from fbo_torch.federation.free_riders import FreeRiders
from fbo_torch.methods.base import METHODS, method_names
from fbo_torch.objectives.base import Objective
from fbo_torch.simulate.fts import FederationHistory, FTSResult, FTSRunner


def targets(objective: Objective, sc: Scenario) -> torch.Tensor:
    r"""The target agents of a scenario (``runs.targets``, the objective's own, or the first
    ``runs.num_targets``); a :class:`ConfigError` naming the scenario for targets beyond its agents."""
    runs = sc.runs
    if runs.targets != "auto":
        t = torch.tensor(runs.targets, dtype=torch.long)
        if (t >= objective.num_agents).any():
            raise ConfigError(
                f"{sc.where}: runs.targets {runs.targets} exceed the objective's {objective.num_agents} agents."
            )
        return t
    if sc.history.mode == "together" and runs.num_targets is None:  # every agent, each other's peers
        return torch.arange(objective.num_agents)
    builtin = getattr(objective, "targets", None)
    if builtin is not None and runs.num_targets is None:
        return torch.as_tensor(builtin, dtype=torch.long)
    k = runs.num_targets or 1
    return torch.arange(min(k, objective.num_agents))


def check_scenario(ctx: ScenarioContext) -> None:
    r"""What an FTS scenario's runners would refuse once started, as a :class:`ConfigError`:
    ``runs.targets`` beyond the objective's agents, and a federated method (FTS, RGPE, TAF) whose
    target has no other agent to receive messages from (the other agents of its group, where the
    objective has groups, as :class:`~fbo_torch.simulate.fts.FTSRunner` picks them), ``reciprocity``
    outside ``history.mode: together`` and ``free_riders.agents`` beyond the objective's agents."""
    sc, objective = ctx.scenario, ctx.objective
    tg = targets(objective, sc)
    if sc.history.mode == "together" and not torch.equal(tg.cpu(), torch.arange(objective.num_agents)):
        raise ConfigError(
            f"{sc.where}: history.mode together makes every agent a target (the agents of one "
            f"initialization are each other's peers); runs.targets must be all "
            f"{objective.num_agents} agents (leave it out), got {tg.tolist()}."
        )
    for j, (label, settings) in enumerate(sc.methods):
        try:
            settings.method.check_history(settings, sc.history.mode)
            riders = FreeRiders.from_config(getattr(settings, "free_riders", None))
            if riders is not None:
                riders.mask(objective.num_agents)  # the agents it names exist
        except ValueError as err:
            raise ConfigError(f"{sc.where}: methods[{j}] ({label!r}): {err}") from None
    groups = getattr(objective, "group_of_agent", None)
    groups = torch.zeros(objective.num_agents, dtype=torch.long) if groups is None else groups.cpu()
    peers = (groups.unsqueeze(0) == groups[tg.cpu()].unsqueeze(-1)).sum(-1) - 1
    alone = tg[peers.cpu() < 1].tolist()
    for j, (label, settings) in enumerate(sc.methods):
        if settings.method.federated() and alone:
            kind = "of its group " if getattr(objective, "group_of_agent", None) is not None else ""
            raise ConfigError(
                f"{sc.where}: methods[{j}] ({label!r}, algorithm {settings.algorithm}): target agent(s) {alone} "
                f"have no other agent {kind}to receive messages from (the objective has {objective.num_agents} "
                "agent(s)); give the objective more agents, or use `algorithm: ts`."
            )
    runs = tg.numel() * ctx.num_inits  # the targets' runs, and the other agents' histories beside them
    check_scenario_memory(ctx, agents=runs + objective.num_agents, runs=runs, history=sc.history.t_n)


def scenario_methods(ctx: ScenarioContext) -> ScenarioMethods:
    r"""The scenario's :class:`~fbo_torch.simulate.fts.FTSRunner` factory and records; builds the
    other agents' history first when a method is federated."""
    sc, objective, domain, seed, device = ctx.scenario, ctx.objective, ctx.domain, ctx.seed, ctx.device
    num_inits = ctx.num_inits
    tg = targets(objective, sc)
    history = None
    together = sc.history.mode == "together"
    scenario_record: dict[str, Any] = {}
    if any(m.method.federated() for _, m in sc.methods) and not together:
        h = sc.history
        t0 = time.perf_counter()
        failures = ctx.evaluation_failures("the other agents' histories")
        failures.round = None  # the history's rounds are not told apart
        with recording(failures):
            history = FederationHistory(
                objective,
                domain,
                t_n=h.t_n,
                mode=h.mode,
                num_init=h.num_init,
                gp_kernel=h.gp_kernel,
                seed=seed + 17,
                device=device,
                setup=sc.setup,
            )
            failures.flush()
        scenario_record["history_evaluation_failures"] = failures.summary()
        ctx.log(f"  other agents' histories ({h.mode}, t_n={h.t_n}) built in {time.perf_counter() - t0:.1f} s")

    def make_runner(label: str, settings: Any) -> FTSRunner:
        return FTSRunner(
            objective,
            settings,
            tg,
            num_inits,
            history=history,
            domain=domain,
            seed=seed,
            device=device,
            name=label,
            together=together,
            max_memory=ctx.max_memory,
        )

    def make_record(label: str, settings: Any, runner: FTSRunner) -> dict[str, Any]:
        return result_record(label, runner.result(), objective.loss_name)

    return ScenarioMethods(make_runner, make_record, int(tg.numel() * num_inits), scenario_record)


def result_record(label: str, res: FTSResult, loss_name: str) -> dict[str, Any]:
    r"""The ``results.json`` record of one FTS-kind method: its curves
    (:func:`~fbo_torch.experiments.report.summarize_curves`) and what the accounting reads
    (sources, targets, initializations, best values; :mod:`~fbo_torch.experiments.accounting`).

    Args:
        label: The method's name.
        res: Its runner's result.
        loss_name: The objective's loss (``"simple regret"``, ...).

    Returns:
        The record, JSON-ready.
    """
    return summarize_curves(
        label,
        res.loss,
        loss_name,
        extra={
            "settings": res.settings,
            "sources": res.sources.tolist(),
            "fraction_from_agents": float((res.sources >= 0).double().mean()) if res.sources.numel() else 0.0,
            "targets": res.targets.tolist(),
            "inits": res.inits.tolist(),
            "queries": res.queries.tolist(),
            "observations": values_or_none(res.observations) if res.observations is not None else None,
            "best_value_runs": res.best_value.tolist(),
            "failed": res.failed.tolist() if res.failed is not None else None,
            "wall_time_s": res.wall_time,
            "elapsed_s": res.elapsed,
            "parameters_per_agent": res.parameters_per_agent,
        },
    )


def _sends_posteriors(algorithm: Any) -> bool:
    """Whether a recorded method's peers sent whole posteriors (an algorithm no longer registered: no)."""
    return algorithm in method_names() and METHODS[algorithm].message == "posterior"


def plot(results: dict[str, Any], out: Path, formats: Sequence[str] | None = None) -> list[Path]:
    r"""``message_length`` when a method's peers send whole posteriors (RGPE, TAF) (see
    :func:`~fbo_torch.experiments.report.plot_message_length`), in each of ``formats``; returns the files."""
    if any(_sends_posteriors(m["settings"].get("algorithm")) for sc in results["scenarios"] for m in sc["methods"]):
        return plot_message_length(results, Path(out) / "message_length", formats=formats or ("png",))
    return []


KIND = ExperimentKind(check=check_scenario, methods=scenario_methods, plot=plot, plot_names=("message_length",))
