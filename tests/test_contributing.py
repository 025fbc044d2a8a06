"""The rules of CONTRIBUTING.md that a test can check: a module's tests are named after it.

``fbo_torch/<package>/<module>.py`` is tested in ``tests/<package>/test_<module>.py`` (and
``fbo_torch/<module>.py`` in ``tests/test_<module>.py``), so the tests of a module are found where
its name says. A module added from now on has that file; :data:`TESTED_ELSEWHERE` lists the modules
that had none when the rule was written down, whose tests live in files named after what they test
together (``tests/federation/test_engine.py``, ``tests/flower/test_flower.py``, ...). A module leaves the
list when it gets its file.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fbo_torch"

#: Modules (``package.module`` under ``fbo_torch``) without a test file of their name.
TESTED_ELSEWHERE = frozenset(
    {
        "acquisition.fts",
        "acquisition.rff_thompson",
        "acquisition.rgpe",
        "acquisition.search",
        "acquisition.taf",
        "experiments.accounting",  # these five were written beside the rule: tests/report/ tests them together
        "experiments.config",
        "experiments.dp_fts_de",
        "experiments.fairness",
        "experiments.fts",
        "experiments.html_report",
        "experiments.kind",
        "experiments.outdir",
        "experiments.resources",  # tests/experiments/test_method_memory.py (tests/utils/test_resources.py has the name)
        "experiments.schema",
        "federation.aggregator",
        "federation.evaluation_failures",
        "federation.faults",
        "federation.server",
        "flower.agent_node",
        "flower.config",
        "flower.coordinator",
        "flower.floor",
        "flower.identity",
        "flower.records",
        "flower.roster",
        "flower.secagg",
        "flower.server_app",
        "flower.server_state",
        "integrations._ax_extra",
        "integrations.ax_messages",
        "integrations.ax_node",
        "integrations.ax_unit_cube",
        "kernels.shared_rff_kernel",
        "methods.base",
        "methods.draws",
        "methods.fts",
        "methods.fts_de",
        "methods.peer_prior",
        "methods.posteriors",
        "methods.rgpe",
        "methods.taf",
        "methods.ts",
        "models.agent_posteriors",
        "models.gp_export",
        "models.gp_posterior",
        "models.gp_spec",
        "models.rff_weight_model",
        "models.weight_posterior",
        "objectives.cnn",
        "objectives.cnn_model",
        "objectives.cnn_options",
        "objectives.emnist",
        "objectives.label_partition",
        "optim.batched",
        "optim.domain",
        "privacy.accountants",
        "privacy.analysis.ddg",
        "privacy.analysis.gdp",
        "privacy.analysis.rdp",
        "privacy.analysis.rdp_classic",
        "privacy.calibration",
        "privacy.ledger",
        "privacy.rdp_classic",
        "protocol.input_space",
        "protocol.keys",
        "protocol.message_average",
        "protocol.messages",
        "protocol.partition",
        "protocol.randomness",
        "protocol.weights",
        "report.flower",
        "report.page",
        "sampling.draws",
        "sampling.pathwise",
        "sampling.rff_paths",
        "simulate.common",
        "simulate.dp_fts_de",
        "simulate.fts",
        "utils.files",
        "utils.torchvision_compat",
        "utils.validation",
    }
)


def _test_file(module: Path) -> Path:
    relative = module.relative_to(PACKAGE)
    return ROOT / "tests" / relative.parent / f"test_{relative.stem}.py"


def _modules_without_a_test_file() -> set[str]:
    modules = [p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"]
    return {".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in modules if not _test_file(p).exists()}


def test_a_new_module_has_a_test_file_named_after_it():
    new = sorted(_modules_without_a_test_file() - TESTED_ELSEWHERE)
    assert not new, f"modules without tests/<package>/test_<module>.py: {new}"


def test_the_list_of_modules_tested_elsewhere_holds_only_such_modules():
    named = sorted(TESTED_ELSEWHERE - _modules_without_a_test_file())
    assert not named, f"these have their test file now (or are gone): remove them from TESTED_ELSEWHERE: {named}"
