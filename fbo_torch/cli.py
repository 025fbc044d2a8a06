r"""The ``fbo-torch`` command line.

Commands::

    run CONFIG --out DIR [--resume | --overwrite] [--inits K] [--plot-format png,pdf,svg] [--quiet]
                             run a YAML experiment (see ``configs/``)
    quickstart [--out DIR]   a small FTS vs TS run with a plot and a summary
    report DIR               redraw plots, summary and report.html from DIR/results.json
    privacy                  ε of a DP-FTS-DE setting under each accountant
    examples DIR             copy the example configs and programs (configs/, examples/) into DIR
    data emnist [--root DIR] download EMNIST for the EMNIST CNN objective

Each command imports what it runs when it runs (the experiment modules load
matplotlib and Opacus), so ``--help`` and ``--version`` answer without them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import shlex
import sys
import time
import warnings
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import fbo_torch  # light: the package imports torch only when a name of it is used


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _num_inits(text: str) -> int:
    """argparse type: ``runs.num_inits``, checked by its declaration (``RunsConfig.num_inits``)."""
    from fbo_torch.experiments.config import RunsConfig
    from fbo_torch.utils.schema import check_value

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    try:
        check_value(RunsConfig, "num_inits", value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def _memory_size(text: str) -> int:
    """argparse type: a memory size (bytes, or with a K/M/G/T suffix: ``4GiB``)."""
    from fbo_torch.utils.resources import memory_budget

    try:
        return memory_budget(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _float_in(low: float, high: float, closed_high: bool, what: str) -> Callable[[str], float]:
    """argparse type: a finite float in (low, high] or (low, high)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = math.isfinite(value) and value > low and (value <= high if closed_high else value < high)
        if not ok:
            raise argparse.ArgumentTypeError(f"{what}, got {text}")
        return value

    return parse


def _num_agents(value: int, flag: str) -> int:
    """``N >= 2``, as :func:`~fbo_torch.privacy.ledger.default_delta` requires (``N = 1`` would give δ = 1)."""
    from fbo_torch.utils.validation import check_int

    return check_int(flag, value, minimum=2)


def _privacy_flag(
    check: str | Callable[..., Any], flag: str, number: Callable[[str], Any] = float, **kw: Any
) -> Callable[[str], Any]:
    """argparse type: ``number(text)`` checked by the settings' own check (``"module:function"``, imported when
    used), the message naming ``flag``."""

    def parse(text: str) -> Any:
        try:
            value = number(text)
        except ValueError:
            kind = "an integer" if number is int else "a number"
            raise argparse.ArgumentTypeError(f"`{flag}` must be {kind}, got {text!r}.") from None
        try:
            if isinstance(check, str):
                module, name = check.split(":")
                return getattr(importlib.import_module(module), name)(value, flag, **kw)
            return check(value, flag, **kw)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def _user_path(text: str) -> Path:
    """A path as a shell would expand it: ``~`` is the user's home (a quoted ``'~'`` reaches us unexpanded)."""
    return Path(text).expanduser()


def _add_out_args(p: argparse.ArgumentParser, default: Path | None = None) -> None:
    if default is None:
        p.add_argument(
            "--out",
            required=True,
            type=_user_path,
            metavar="DIR",
            help="output folder (results.json, run.json, plots, summary.txt, checkpoints/); "
            "locked while the run lasts: a second run into it is refused",
        )
    else:
        p.add_argument(
            "--out", type=_user_path, default=default, metavar="DIR", help=f"output folder (default: {default})"
        )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its checkpoints; refused unless the config (objective, "
        "methods, seeds, repetitions, privacy, device) and the fbo_torch version are the ones "
        "that run used (the message names the keys that differ)",
    )
    mode.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the files earlier fbo-torch runs wrote in --out (listed in its run.json; "
        "other files are kept), then start over (without --resume or --overwrite a "
        "non-empty --out is refused)",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="hide progress bars (they are shown only when stderr is a terminal; in a log file "
        "each finished method is one line)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="print nothing but errors: no progress, status lines or summary (the files in --out "
        "are written as always)",
    )
    p.add_argument(
        "--plot-format",
        type=_plot_formats,
        default=("png",),
        metavar="FMT",
        help="format(s) of the plots, comma-separated: png, pdf, svg (default: png)",
    )


def _plot_formats(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated plot formats."""
    from fbo_torch.experiments.report import PLOT_FORMATS

    names = [t.strip().lower().lstrip(".") for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in PLOT_FORMATS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"expected one or more of {', '.join(PLOT_FORMATS)} (comma-separated), got {text!r}"
        )
    return tuple(dict.fromkeys(names))


def _add_run_args(p: argparse.ArgumentParser) -> None:
    _add_out_args(p)
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="run everything there: overrides the config's device and objective.device (CNN training)",
    )
    inits = p.add_mutually_exclusive_group()
    inits.add_argument(
        "--inits",
        type=_num_inits,
        default=None,
        metavar="K",
        help="override runs.num_inits: random initializations per target (FTS) or repetitions "
        "of the whole federation (DP-FTS-DE); the random seed is the config's `seed`",
    )
    inits.add_argument(
        "--seeds",
        type=_num_inits,
        default=None,
        metavar="K",
        help="old name of --inits (it sets runs.num_inits, not the seed)",
    )
    p.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        metavar="K",
        help="torch CPU threads (1 is often faster for these many small operations, "
        "and much faster when other processes share the cores)",
    )
    p.add_argument(
        "--max-memory",
        type=_memory_size,
        default=None,
        metavar="SIZE",
        help="working-memory budget of a round (e.g. 4GiB; overrides the config's max_memory; default: half "
        "the free memory): agents beyond it run in chunks, with the same results",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``fbo-torch`` command line: its sub-commands and their options."""
    parser = argparse.ArgumentParser(
        prog="fbo-torch",
        description="Federated Bayesian optimization (FTS, DP-FTS-DE) on PyTorch/BoTorch.",
    )
    parser.add_argument("--version", action="version", version=f"fbo_torch {fbo_torch.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run a YAML experiment",
        description="Run a YAML experiment config.",
        epilog="The config is validated completely before anything runs. --out is locked for the run; "
        "a non-empty --out needs --resume (same config only) or --overwrite.",
    )
    run.add_argument("config", type=Path, help="experiment YAML (see configs/)")
    _add_run_args(run)

    qs = sub.add_parser(
        "quickstart",
        help="a small federated run with a plot and a summary",
        description="A small FTS vs TS run with a plot and a summary.",
    )
    _add_out_args(qs, default=Path("runs/quickstart"))

    rp = sub.add_parser(
        "report",
        help="redraw plots, summary and the federation report of a finished run from its results.json",
        description="Redraw the plots, summary.txt, accounting.json and report.html (the federation report: "
        "who helped whom, fairness, privacy) of a run from its results.json.",
    )
    rp.add_argument("out", type=_user_path, help="a run's output folder")
    rp.add_argument(
        "--plot-format",
        type=_plot_formats,
        default=None,
        metavar="FMT",
        help="format(s) of the plots, comma-separated: png, pdf, svg (default: the run's)",
    )

    pv = sub.add_parser(
        "privacy",
        help="epsilon of a DP-FTS-DE setting under each accountant",
        description="The privacy loss epsilon of T releases of the subsampled Gaussian mechanism "
        "(DP-FTS-DE's server) under each accountant.",
    )
    pv.add_argument(
        "--sample-rate",
        "-q",
        type=_privacy_flag("fbo_torch.privacy.accountants:check_sample_rate", "--sample-rate"),
        required=True,
        metavar="Q",
        help="probability q that an agent's message is sampled in a round, 0 < q <= 1",
    )
    pv.add_argument(
        "--noise-multiplier",
        "-z",
        type=_privacy_flag("fbo_torch.privacy.accountants:check_noise_multiplier", "--noise-multiplier"),
        required=True,
        metavar="Z",
        help="noise multiplier z >= 0 (noise std / clipping norm); z = 0 adds no noise: epsilon = inf",
    )
    pv.add_argument(
        "--steps",
        "-T",
        type=_privacy_flag("fbo_torch.privacy.accountants:check_steps", "--steps", int, minimum=1),
        required=True,
        metavar="T",
        help="number of releases (rounds) T >= 1",
    )
    pv.add_argument(
        "--num-agents",
        "-N",
        type=_privacy_flag(_num_agents, "--num-agents", int),
        default=None,
        metavar="N",
        help="number of agents N >= 2; sets delta = 1/N^1.1 (the papers' choice)",
    )
    pv.add_argument(
        "--delta",
        type=_privacy_flag("fbo_torch.privacy.accountants:check_delta", "--delta"),
        default=None,
        metavar="DELTA",
        help="delta of (epsilon, delta)-DP, 0 < delta < 1 (instead of --num-agents)",
    )

    ex = sub.add_parser(
        "examples",
        help="copy the example configs and programs into a folder",
        description="Copy the example configs (configs/: every committed experiment) and programs (examples/: "
        "your own objective, Ax, the Flower app and its demo) that ship with fbo_torch into DIR, so they run "
        "outside the repository: cd DIR && fbo-torch run configs/fts_synthetic.yaml --out runs/fts. "
        "Nothing is overwritten.",
    )
    ex.add_argument("dir", type=_user_path, metavar="DIR", help="the folder to copy into (created)")

    dt = sub.add_parser(
        "data",
        help="download a dataset for the image objectives (EMNIST)",
        description="Download a dataset the objectives read from disk.",
    )
    datasets = dt.add_subparsers(dest="dataset", metavar="DATASET", help="the dataset: emnist")
    em = datasets.add_parser(
        "emnist",
        help="EMNIST (NIST's gzip.zip, ~540 MB) into DIR/EMNIST/raw",
        description="Download EMNIST through torchvision (also where `import torchvision` alone fails on a CPU "
        "torch) into DIR/EMNIST/raw, check its MD5, and say how to use it (FBO_EMNIST_ROOT=DIR).",
    )
    em.add_argument(
        "--root",
        type=_user_path,
        default=None,
        metavar="DIR",
        help="the folder to download into (default: the user data folder, $FBO_DATA_DIR or "
        "~/.local/share/fbo_torch, where the EMNIST objectives look when no root is given)",
    )
    em.add_argument("--url", default=None, help="a mirror of NIST's gzip.zip (the same file: its MD5 is checked)")
    return parser


def say(line: str) -> None:
    r"""Print ``line`` to stdout; once stdout is a closed pipe (``fbo-torch run ... | head``), print nothing more
    and go on: a reader that stopped reading ends the output, not the run."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        # Python's advice: point stdout at /dev/null, so later writes (and the flush at exit) do not fail
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _again(command: list[str], out: Path) -> str:
    """The shell command that resumes a run into ``out`` (``command``: the words before ``--out``)."""
    return shlex.join(["fbo-torch", *command, "--out", str(out), "--resume"])


def _user_modules_importable() -> None:
    r"""Let ``objective.type: "my_module:MyClass"`` find modules in the current folder, as
    ``python -m`` does (appended, so a file there never shadows an installed package)."""
    cwd = os.getcwd()
    if not any(os.path.abspath(p or ".") == cwd for p in sys.path):
        sys.path.append(cwd)


def _written(out: Path, names: list[str]) -> list[str]:
    """The lines that say where a run's files are: results, plots, configuration."""
    plots = [n for n in names if Path(n).suffix in (".png", ".pdf", ".svg")]
    lines = [
        f"results: {out / 'results.json'}",
        f"table:   {out / 'results.csv'} (one row per scenario, method, run, agent and iteration)",
    ]
    if plots:
        lines.append(f"plots:   {out / plots[0]}" + "".join(f", {n}" for n in plots[1:]))
    lines.append(f"config:  {out / 'config.resolved.yaml'}")
    if "report.html" in names:
        lines.append(f"report:  {out / 'report.html'} (who helped whom, fairness, privacy: open it in a browser)")
    return lines


def _cmd_run(
    config: Path,
    out: Path,
    device: str | None,
    num_inits: int | None,
    resume: bool,
    progress: bool,
    overwrite: bool = False,
    again: list[str] | None = None,
    quiet: bool = False,
    plot_formats: tuple[str, ...] = ("png",),
    max_memory: int | None = None,
    threads: int | None = None,
) -> int:
    r"""Run ``config`` into ``out``; returns the exit status. Errors are one line on stderr: 2 for a
    config or output-folder problem (nothing ran), 1 for a failure while running (a file that could
    not be written, ...), 130 for Ctrl-C; the last two say how to resume. Status lines go to stdout
    (one per scenario and per finished method) unless ``quiet``."""
    from fbo_torch.experiments.config import ConfigError, load_config  # no torch: a config error is quick
    from fbo_torch.experiments.outdir import MANIFEST, OutputError, WriteError

    if again is None:
        again = (
            ["run", str(config)]
            + (["--device", device] if device else [])
            + (["--inits", str(num_inits)] if num_inits is not None else [])
            + (["--max-memory", str(max_memory)] if max_memory is not None else [])
        )

    def resume_hint() -> str:
        if (out / MANIFEST).is_file():
            return f"resume with: {_again(again, out)}"
        return f"nothing was written to {out}; run the same command again to start"

    def log(line: str) -> None:
        if not quiet:
            say(line)

    _user_modules_importable()
    try:
        cfg = load_config(config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from fbo_torch.experiments.loop import run_experiment  # torch, BoTorch, matplotlib: after the config is checked
    from fbo_torch.experiments.report import summary_table

    if threads:
        import torch

        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            if quiet:  # nothing but errors
                warnings.simplefilter("ignore")
            results = run_experiment(
                cfg,
                out,
                device=device,
                num_inits=num_inits,
                resume=resume,
                progress=progress and not quiet,
                overwrite=overwrite,
                log=log,
                plot_formats=plot_formats,
                max_memory=max_memory,
            )
    except KeyboardInterrupt:
        print(f"interrupted; {resume_hint()}", file=sys.stderr)
        return 130
    except (ConfigError, OutputError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except WriteError as err:
        print(
            f"error: {err}; the checkpoints written so far are intact: fix that, then {resume_hint()}", file=sys.stderr
        )
        return 1
    except OSError as err:
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}", file=sys.stderr)
        return 1
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if not quiet:
        say("")
        say(summary_table(results))
        say(f"\nfinished in {time.perf_counter() - t0:.1f} s")
        say("\n".join(_written(out, results.get("reports", []))))
    return 0


def _cmd_privacy(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from fbo_torch.privacy import ACCOUNTANTS, compute_epsilon, default_delta

    if args.delta is None and args.num_agents is None:
        parser.error("give --delta or --num-agents")
    if args.delta is not None and args.num_agents is not None:
        parser.error("give --delta or --num-agents, not both")
    delta = args.delta if args.delta is not None else default_delta(args.num_agents)
    print(f"q={args.sample_rate} z={args.noise_multiplier} T={args.steps} delta={delta:.4g}")
    notes: dict[str, list[str]] = {}
    for name in ACCOUNTANTS:
        with warnings.catch_warnings(record=True) as caught:  # said after the table, not inside it
            warnings.simplefilter("always")
            eps = compute_epsilon(args.sample_rate, args.noise_multiplier, args.steps, delta, accountant=name)
        print(f"  {name:<12} epsilon = {eps:.3f}")
        for w in caught:
            text = " ".join(str(w.message).split())
            text = re.sub(r"\.(?=[A-Z])", ". ", text)  # Opacus' "expenditure.Proceed"
            notes.setdefault(text, []).append(name)
    for text, names in notes.items():
        print(f"note ({', '.join(dict.fromkeys(names))}): {text}")
    return 0


def _cmd_report(out: Path, plot_formats: tuple[str, ...] | None = None) -> int:
    """Redraw the plots, ``results.csv`` and summary of the run in ``out`` from its ``results.json``."""
    from fbo_torch.experiments.loop import EXPERIMENTS, render_reports
    from fbo_torch.experiments.outdir import OutputError, OutputFolder
    from fbo_torch.experiments.report import summary_table

    path = out / "results.json"
    if not path.is_file():
        print(f"error: {path} does not exist", file=sys.stderr)
        return 2
    try:
        with OutputFolder(out, resume=True):  # not while a run writes into the folder
            try:
                results = json.loads(path.read_text())
                results["scenarios"][0]["methods"][0]["loss_mean"]
                EXPERIMENTS[results.get("experiment", "fts")]
            except (ValueError, KeyError, IndexError, TypeError) as err:
                raise OutputError(
                    f"{path} is unreadable or incomplete ({type(err).__name__}: {err}); "
                    "rerun the experiment (or resume it) to rewrite it"
                ) from None
            render_reports(results, out, plot_formats)
    except OutputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a plot or summary.txt could not be written (WriteError names it)
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(summary_table(results))
    print(f"report: {out / 'report.html'} (who helped whom, fairness, privacy: open it in a browser)")
    return 0


def _cmd_data(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Download a dataset (EMNIST); errors are one line on stderr."""
    if args.dataset != "emnist":
        parser.error("give a DATASET: emnist")
    from fbo_torch.objectives.emnist import EMNIST_ROOT_ENV, download_emnist
    from fbo_torch.utils.paths import user_data_dir

    root = args.root if args.root is not None else user_data_dir()
    try:
        n_train, n_test = download_emnist(root, args.url)
    except (OSError, RuntimeError, ImportError, ValueError) as err:
        print(f"error: downloading EMNIST into {root} failed: {' '.join(str(err).split())}", file=sys.stderr)
        return 1
    use = (
        "the EMNIST objectives find them there"
        if args.root is None
        else f"use them with {EMNIST_ROOT_ENV}={root} (or objective.root)"
    )
    print(f"EMNIST digits in {root / 'EMNIST' / 'raw'}: {n_train} training and {n_test} test images; {use}")
    return 0


def _cmd_examples(dest: Path) -> int:
    """Copy the shipped example configs and programs into ``dest``; errors are one line on stderr."""
    from fbo_torch.utils.paths import copy_examples

    try:
        written = copy_examples(dest)
    except OSError as err:  # FileExistsError (nothing copied) included
        text = f"{err.filename}: {err.strerror}" if err.filename and err.strerror else str(err)
        print(f"error: fbo-torch examples {dest}: {text}", file=sys.stderr)
        return 2
    configs = sum(p.relative_to(dest).parts[0] == "configs" for p in written)
    print(
        f"copied {configs} example configs to {dest / 'configs'} and {len(written) - configs} example files to "
        f"{dest / 'examples'}. Next:\n"
        f"  cd {shlex.quote(str(dest))} && fbo-torch run configs/fts_synthetic.yaml --out runs/fts_synthetic\n"
        f"  cd {shlex.quote(str(dest / 'examples'))} && fbo-torch run custom_objective.yaml --out ../runs/custom\n"
        f"  {shlex.quote(str(dest / 'examples' / 'flower_app' / 'run_demo.sh'))}"
        "   (the Flower demo on this machine; needs the flower extra)"
    )
    return 0


def parser_for(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The sub-parser of ``command`` (so its errors read ``fbo-torch COMMAND: error: ...``)."""
    if parser._subparsers is not None:
        for action in parser._subparsers._group_actions:
            choices = getattr(action, "choices", None) or {}
            if command in choices:
                return choices[command]
    return parser


def check_options(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    r"""Refuse an option the command does not know before argparse looks for the required ones, so that
    ``--outt DIR`` says ``unrecognized option --outt (did you mean --out?)``, not that ``--out`` is missing
    (exits with status 2, as argparse does)."""
    import difflib

    chain, sub = [parser], parser  # the parsers of the command and its sub-commands (`data emnist`)
    for arg in argv:
        if arg == "--":
            break
        inner = parser_for(sub, arg) if not arg.startswith("-") else sub
        if inner is not sub:
            chain.append(inner)
            sub = inner
    known = [o for p in chain for action in p._actions for o in action.option_strings]
    for arg in argv:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if not name.startswith("--") or name in known or sum(o.startswith(name) for o in known) == 1:
            continue
        close = difflib.get_close_matches(name, [o for o in known if o.startswith("--")], n=1)
        sub.error(f"unrecognized option {name}" + (f" (did you mean {close[0]}?)" if close else ""))


def main(argv: list[str] | None = None) -> int:
    """Run ``fbo-torch`` with ``argv`` (default: ``sys.argv[1:]``); the exit status."""
    parser = build_parser()
    check_options(parser, list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        print("\nerror: give a COMMAND (run, quickstart, report, privacy, examples, data)", file=sys.stderr)
        return 2
    if args.command == "run":
        num_inits = args.inits
        if args.seeds is not None:
            print(
                "note: --seeds is now called --inits (it sets runs.num_inits, the random initializations per "
                "target or repetitions, not the random seed: that is the config's `seed`)",
                file=sys.stderr,
            )
            num_inits = args.seeds
        return _cmd_run(
            args.config,
            args.out,
            args.device,
            num_inits,
            args.resume,
            not args.no_progress,
            args.overwrite,
            quiet=args.quiet,
            plot_formats=args.plot_format,
            max_memory=args.max_memory,
            threads=args.threads,
        )
    if args.command == "quickstart":
        cfg = resources.files("fbo_torch.experiments").joinpath("quickstart.yaml")
        with resources.as_file(cfg) as path:
            code = _cmd_run(
                Path(path),
                args.out,
                None,
                None,
                args.resume,
                not args.no_progress,
                args.overwrite,
                again=["quickstart"],
                quiet=args.quiet,
                plot_formats=args.plot_format,
            )
        if code == 0 and not args.quiet:
            say("\nOpen the plot above to see simple regret per iteration (lower is better).")
        return code
    if args.command == "privacy":
        return _cmd_privacy(args, parser_for(parser, "privacy"))
    if args.command == "report":
        return _cmd_report(args.out, args.plot_format)
    if args.command == "data":
        return _cmd_data(args, parser_for(parser, "data"))
    if args.command == "examples":
        return _cmd_examples(args.dir)
    parser.error(f"unknown command {args.command!r}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
