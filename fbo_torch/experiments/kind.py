r"""What an experiment kind (the YAML's ``experiment:``) gives the shared loop.

:func:`~fbo_torch.experiments.loop.run_experiment` builds every scenario's
objective and :class:`~fbo_torch.optim.domain.Domain` once, derives its
seed, and runs its methods with checkpoints and progress; an
:class:`ExperimentKind` supplies only what differs between kinds: the checks of
a scenario before anything runs, the runner and JSON record of each method, and
the plots beyond the loss curves. The kinds are registered in
:data:`fbo_torch.experiments.loop.EXPERIMENTS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fbo_torch.experiments.config import ExperimentConfig, Scenario
from fbo_torch.federation.evaluation_failures import EvaluationFailures
from fbo_torch.objectives.base import Objective
from fbo_torch.optim.domain import Domain


@dataclass
class ScenarioContext:
    r"""One scenario of a run, as the loop prepared it.

    Attributes:
        cfg: The parsed configuration.
        index: The scenario's position in ``cfg.scenarios``.
        scenario: The resolved scenario.
        objective: Its objective (built once, shared by its methods).
        domain: Its search domain (the objective's bounds and candidates, the config's ``domain:`` options).
        seed: Its seed, ``cfg.seed + 1000 * index`` (shared by its methods).
        device: The device the run uses.
        num_inits: Initializations per target (``runs.num_inits`` or the run's ``num_inits`` override).
        max_memory: :attr:`~fbo_torch.experiments.config.RunOptions.max_memory`, in bytes.
        log: Where status lines go.
        reported_failures: The kinds of failed evaluations the run has reported (each once per run; shared by
            its scenarios).
    """

    cfg: ExperimentConfig
    index: int
    scenario: Scenario
    objective: Objective
    domain: Domain
    seed: int
    device: str
    num_inits: int
    log: Callable[[str], None]
    max_memory: int | None = None
    reported_failures: set[str] = field(default_factory=set)

    def evaluation_failures(self, what: str) -> EvaluationFailures:
        r"""A log of the failed evaluations of ``what`` (a method, the other agents' histories) in this
        scenario: bounded by the config's ``max_failed_fraction``, the first failure of each kind logged."""
        return EvaluationFailures(
            f"objective {self.scenario.objective['type']}",
            max_failed_fraction=self.cfg.max_failed_fraction,
            report=self.log,
            what=f"{what}, scenario {self.scenario.name!r}",
            reported=self.reported_failures,
        )


@dataclass(frozen=True)
class ScenarioMethods:
    r"""How the loop runs a scenario's methods.

    Attributes:
        make_runner: ``(label, settings) -> runner``: a runner with ``run(callback)``, ``t``, ``done``,
            ``name``, ``state_dict`` and ``load_state_dict``.
        make_record: ``(label, settings, runner) -> record``: a finished runner's JSON record
            (:func:`~fbo_torch.experiments.report.summarize_curves` and the kind's fields).
        num_runs: Independent runs behind each method's curves (the scenario record's ``num_runs``).
        record: Further entries of the scenario's JSON record (e.g. ``history_evaluation_failures``).
    """

    make_runner: Callable[[str, Any], Any]
    make_record: Callable[[str, Any, Any], dict[str, Any]]
    num_runs: int
    record: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExperimentKind:
    r"""The parts of an experiment kind that the shared loop calls.

    Attributes:
        check: ``(context) -> None``: raises a :class:`~fbo_torch.experiments.config.ConfigError`
            naming the YAML key for what the scenario's runners would refuse once started; called
            for every scenario before the output folder is created.
        methods: ``(context) -> ScenarioMethods``: called when the scenario starts (it may log, and
            build what its methods share).
        plot: ``(results, out, formats) -> files``: the kind's plots beyond the loss curves, written to
            ``out`` in each of ``formats`` (:data:`~fbo_torch.experiments.report.PLOT_FORMATS`); returns the
            files written.
        plot_names: The names (without suffix) ``plot`` may give its files, so that ``--overwrite`` can
            refuse a folder holding a file of such a name that it would keep (one you edited).
    """

    check: Callable[[ScenarioContext], None]
    methods: Callable[[ScenarioContext], ScenarioMethods]
    plot: Callable[[dict[str, Any], Path, Sequence[str]], list[Path]]
    plot_names: tuple[str, ...] = ()
