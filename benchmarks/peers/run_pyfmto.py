r"""Run the peer library pyfmto's federated many-task BO algorithms and record every evaluation.

Runs inside a separate virtual environment that has ``pyfmto`` and the algorithms'
requirements (never fbo_torch's); the algorithms and problems come from a checkout
of the public repository Xiaoxu-Zhang/fmto given with ``--fmto`` (nothing of it is
copied here). See ``benchmarks/peers/README.md`` for the set-up.

One run = one problem (all its tasks, one client per task) solved by one algorithm
for one seed: pyfmto's server in a subprocess, its clients in threads of this
process (as pyfmto's own ``Launcher`` does), talking HTTP on ``--port``. Runs go one
at a time (the port is fixed). After each run the JSON file is rewritten with it
(atomically), so the script can be stopped and restarted: runs already in the file
are skipped.

Seeding. pyfmto does not seed its runs: the initial designs are Latin hypercubes
from ``pyDOE3.lhs`` with ``np.random.default_rng()`` (fresh OS entropy), and its
algorithms draw from NumPy's global ``RandomState``, ``torch``'s global generator
and scikit-learn's ``random_state=None`` — shared by all client threads, so even a
seeded global state would depend on thread scheduling. To make runs reproducible
this script, without changing any algorithm, gives every thread its own streams:

* NumPy's module-level random functions (``np.random.rand``, ``seed``,
  ``get_state``, ...) and the singleton scikit-learn falls back to
  (``np.random.mtrand._rand``) act on a per-thread ``RandomState``;
* ``torch.rand`` without a generator uses a per-thread ``torch.Generator``;
* ``lhs`` (pyfmto's initial designs and ``from pyDOE import lhs`` in the
  algorithms; ``pyDOE3.lhs``, classic LHS) draws its seed from the thread's ``RandomState``.

The main thread (which draws the initial designs) is seeded with
``SeedSequence([seed, 0])``, client ``c`` with ``SeedSequence([seed, c])``, and the
server process with ``seed``. The recorded initial designs are therefore a function
of the seed; the rest of a run is too as long as the server's answers do not depend
on timing (they do not for these algorithms' synchronous rounds, unless a client
waits longer than its pull limit).

Output (``--out``, default ``benchmarks/results/peers/pyfmto/<problem>_d<d>.json``)::

    {"problem", "dim", "fe_init", "fe_max", "pyfmto_version", "fmto_commit", "machine", "command",
     "tasks": [{"name", "lb", "ub", "y_global"}],
     "runs": {LABEL: [{"seed", "wall_time", "tasks": [{"X": fe_max x d, "y": fe_max}]}]}}

plus ``"problem_kwargs"`` when ``--problem-kwargs`` was given. ``X`` is in the task's
original units in evaluation order (the first ``fe_init`` rows are the initial design),
``y`` the minimized values pyfmto recorded; every ``y`` is checked against the task's
``evaluate(X)`` before the run is saved.
``wall_time`` is the seconds from building the problem (initial designs included)
to the last client's exit.

Usage (in the pyfmto environment)::

    python benchmarks/peers/run_pyfmto.py --fmto /path/to/fmto --problem tetci2019 --dim 3 \
        --fe-init 15 --fe-max 33 --seeds 0-9
    python benchmarks/peers/run_pyfmto.py merge --out ALL.json PART1.json PART2.json  # runs from several files
    python benchmarks/peers/run_pyfmto.py summary RESULTS.json  # markdown tables
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

# One BLAS/OpenMP thread per process: 10 client threads already share 2 cores.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

#: Label -> (fmto algorithm, client parameters overriding its defaults, server overrides).
CONFIGS: dict[str, tuple[str, dict, dict]] = {
    "FMTBO": ("FMTBO", {}, {}),
    # EI_w = γ EI_global + (1 − γ) EI_local: γ = 0 leaves the local Kriging + EI + GA search
    "FMTBO_gamma0": ("FMTBO", {"gamma": 0.0}, {}),
    "ADDFBO": ("ADDFBO", {}, {}),
    "IAFFBO": ("IAFFBO", {}, {}),
    "FDEMD": ("FDEMD", {}, {}),
    "BO": ("BO", {}, {}),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------- per-thread random streams
_TLS = threading.local()
_NP_GLOBAL = np.random.mtrand._rand  # the process-wide RandomState pyfmto's code would share


def _np_state() -> np.random.RandomState:
    return getattr(_TLS, "np", _NP_GLOBAL)


class _ThreadRandomState:
    """Stands in for ``np.random.mtrand._rand``: every attribute is the calling thread's."""

    def __getattr__(self, name):
        return getattr(_np_state(), name)


def _derived_seed(*entropy: int) -> int:
    return int(np.random.SeedSequence(list(entropy)).generate_state(1)[0])


def seed_thread(seed: int) -> None:
    """Give the calling thread its own NumPy ``RandomState`` and torch generator."""
    _TLS.np = np.random.RandomState(seed)
    if "torch" in sys.modules:
        _TLS.torch = sys.modules["torch"].Generator().manual_seed(seed)


def _lhs(n, samples=None, criterion=None, iterations=None, **kwargs):
    """``pyDOE3.lhs`` seeded from the calling thread's ``RandomState``."""
    import pyDOE3

    if kwargs.get("random_state") is None and kwargs.get("seed") is None:
        kwargs["seed"] = np.random.default_rng(_np_state().randint(2**31 - 1))
    return pyDOE3.lhs(n, samples=samples, criterion=criterion, iterations=iterations, **kwargs)


def install_thread_local_random() -> None:
    """Route NumPy's global random functions, ``torch.rand`` and ``lhs`` through per-thread streams."""
    import types

    for name in dir(np.random.RandomState):
        if name.startswith("_") or not callable(getattr(np.random, name, None)):
            continue
        fn = getattr(np.random, name)
        if getattr(fn, "__self__", None) is _NP_GLOBAL or name in ("seed", "get_state", "set_state"):
            setattr(np.random, name, (lambda n: lambda *a, **k: getattr(_np_state(), n)(*a, **k))(name))
    np.random.mtrand._rand = _ThreadRandomState()  # scikit-learn's check_random_state(None)

    shim = types.ModuleType("pyDOE")
    shim.lhs = _lhs
    sys.modules["pyDOE"] = shim  # fmto's algorithms: `from pyDOE import lhs` (pyDOE3 is its successor)

    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)
    orig_rand = torch.rand

    def rand(*size, generator=None, **kwargs):
        return orig_rand(
            *size, generator=generator if generator is not None else getattr(_TLS, "torch", None), **kwargs
        )

    torch.rand = rand


def patient_requests(min_repeat: int) -> None:
    """Let a client wait longer for its peers: pyfmto's ``request_server(repeat=R)`` polls ``R`` times
    (10 by default, 100 in the algorithms' pulls) and then returns ``None``, which IAFFBO silently
    takes as "no aggregate" and the others crash on; on a loaded machine that depends on timing.
    Polls meant to wait (``R > 1``) poll at least ``min_repeat`` times; nothing else changes."""
    from pyfmto.framework import Client

    orig = Client.request_server

    def request_server(self, package, repeat=10, interval=1.0, msg=None):
        return orig(self, package, max(repeat, min_repeat) if repeat > 1 else repeat, interval, msg)

    Client.request_server = request_server


# ----------------------------------------------------------------------------- the server
def serve(argv: list[str]) -> None:
    """Entry point of the server subprocess (``run_pyfmto.py _serve ...``)."""
    p = argparse.ArgumentParser(prog="run_pyfmto.py _serve")
    p.add_argument("--fmto", required=True)
    p.add_argument("--module", required=True)
    p.add_argument("--cls", required=True)
    p.add_argument("--kwargs", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--loglevel", default="WARNING")
    a = p.parse_args(argv)
    install_thread_local_random()
    seed_thread(a.seed)
    from importlib import import_module

    from pyfmto.utilities.loaders import add_sources
    from pyfmto.utilities.loggers import logger

    add_sources([a.fmto])
    logger.setLevel(a.loglevel)
    srv = getattr(import_module(a.module), a.cls)(**json.loads(a.kwargs))
    srv.set_addr(port=a.port)
    srv.start()


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_server(alg, fmto: Path, seed: int, port: int, loglevel: str, workdir: Path) -> subprocess.Popen:
    server = alg.server
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "_serve",
        "--fmto",
        str(fmto),
        "--module",
        server.__module__,
        "--cls",
        server.__name__,
        "--kwargs",
        json.dumps(alg.params.get("server", {})),
        "--seed",
        str(seed),
        "--port",
        str(port),
        "--loglevel",
        loglevel,
    ]
    proc = subprocess.Popen(cmd, cwd=workdir, stdin=subprocess.DEVNULL)
    t0 = time.time()
    while not _port_open(port):
        if proc.poll() is not None:
            raise RuntimeError(f"pyfmto's server exited with code {proc.returncode} before listening on {port}")
        if time.time() - t0 > 120:
            stop_server(proc)
            raise RuntimeError(f"pyfmto's server did not listen on port {port} within 120 s")
        time.sleep(0.2)
    return proc


def stop_server(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------------- one run
def problem_kwargs(args) -> dict:
    kw = {}
    for key in ("dim", "fe_init", "fe_max"):
        if getattr(args, key) is not None:
            kw[key] = getattr(args, key)
    kw.update(args.problem_kwargs)
    return kw


def build_problem(args, seed: int):
    """pyfmto's problem (its tasks with their initial designs), drawn in the main thread."""
    from pyfmto import load_problem

    seed_thread(_derived_seed(seed, 0))
    return load_problem(problem_class_name(args), [str(args.fmto)], **problem_kwargs(args)).initialize()


def problem_class_name(args) -> str:
    """fmto registers a problem by its class name (``Tetci2019``); accept its folder name (``tetci2019``) too."""
    from pyfmto import list_problems

    found = list_problems([str(args.fmto)])
    for name, source in zip(found.get("name", []), found.get("source", []), strict=False):
        if args.problem in (name, Path(source).name):
            return name
    raise SystemExit(
        f"--problem: {args.problem!r} is not a problem of {args.fmto} "
        f"(found: {[Path(s).name for s in found.get('source', [])]})"
    )


def run_once(args, label: str, seed: int) -> dict:
    from pyfmto import load_algorithm

    name, client_kw, server_kw = CONFIGS[label]
    alg = load_algorithm(name, [str(args.fmto)], client=client_kw, server=server_kw)
    if not alg.available:
        raise RuntimeError(f"fmto algorithm {name} is not available: {'; '.join(alg.issues)}")
    t0 = time.time()
    problem = build_problem(args, seed)
    tasks = list(problem)
    x_init = [np.array(t.solutions.x, copy=True) for t in tasks]
    clt_params = alg.params.get("client", {})
    clients = [alg.client(t, **clt_params) for t in tasks]
    for c in clients:
        c.conn_retry = args.conn_retry
        c.set_addr(port=args.port)
    proc = start_server(alg, args.fmto, seed, args.port, args.loglevel, args.workdir)
    errors: list[str] = []

    def client_main(c):
        seed_thread(_derived_seed(seed, c.id))
        try:
            c.start()
        except BaseException:
            errors.append(f"client {c.id}: {traceback.format_exc(limit=3)}")

    threads = [threading.Thread(target=client_main, args=(c,), name=f"client-{c.id}") for c in clients]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        stop_server(proc)
    wall = time.time() - t0
    if errors:
        raise RuntimeError(f"{label} seed {seed}: {len(errors)} client(s) failed; first: {errors[0]}")
    return {"seed": seed, "wall_time": wall, "tasks": record_tasks(args, label, seed, tasks, x_init)}


def record_tasks(args, label, seed, tasks, x_init) -> list[dict]:
    """Each task's ``X`` and ``y``, checked: budget spent, initial design kept, ``y == evaluate(X)``."""
    out = []
    worst = 0.0
    for t, X0 in zip(tasks, x_init, strict=False):
        X = np.asarray(t.solutions.x, dtype=np.float64)
        y = np.asarray(t.solutions.y, dtype=np.float64).reshape(-1)
        if X.shape != (t.fe_max, t.dim) or y.shape != (t.fe_max,):
            raise RuntimeError(
                f"{label} seed {seed} task {t.id}: recorded X {X.shape}, y {y.shape}; "
                f"expected ({t.fe_max}, {t.dim}) and ({t.fe_max},)"
            )
        if not np.array_equal(X[: t.fe_init], X0):
            raise RuntimeError(f"{label} seed {seed} task {t.id}: the first fe_init rows are not the initial design")
        outside = int(np.sum(np.any((X < t.lb) | (X > t.ub), axis=1)))
        if outside:
            log(f"  note: {label} seed {seed} task {t.id}: {outside} point(s) outside [lb, ub] (pyfmto clips them)")
        if not args.no_verify:
            t.auto_update_solutions = False
            y_check = np.asarray(t.evaluate(X), dtype=np.float64).reshape(-1)
            diff = float(np.max(np.abs(y_check - y)))
            worst = max(worst, diff)
            if diff > args.verify_atol:
                raise RuntimeError(f"{label} seed {seed} task {t.id}: recorded y differs from evaluate(X) by {diff:g}")
        out.append({"X": X.tolist(), "y": y.tolist()})
    if not args.no_verify:
        log(f"  verified y == evaluate(X): max |difference| {worst:.3g}")
    return out


# ------------------------------------------------------------------------------ bookkeeping
def machine() -> str:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from round_time import machine_info  # stdlib-only module level; torch and numpy are here too

    m = machine_info("cpu")
    return (
        f"{platform.system()} {platform.machine()}, {m['cpu']}, {m['cpu_count']} logical CPUs (shared), "
        f"Python {m['python']}, numpy {m['numpy']}, torch {m['torch']} ({m['torch_threads']} thread)"
    )


def fmto_commit(args) -> str:
    if args.fmto_commit:
        return args.fmto_commit
    try:
        return subprocess.run(
            ["git", "-C", str(args.fmto), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        log("warning: --fmto is not a git checkout and --fmto-commit was not given; fmto_commit = 'unknown'")
        return "unknown"


def header(args, problem) -> dict:
    import pyfmto

    t0 = problem[0]
    tasks = []
    for t in problem:
        yg = np.asarray(t.y_global, dtype=np.float64).reshape(-1)
        tasks.append(
            {
                "name": t.name,
                "lb": np.asarray(t.lb, dtype=float).tolist(),
                "ub": np.asarray(t.ub, dtype=float).tolist(),
                "y_global": float(yg[0]) if yg.size else None,
            }
        )
    extra = {"problem_kwargs": args.problem_kwargs} if args.problem_kwargs else {}
    return {
        "problem": args.problem,
        **extra,
        "dim": int(t0.dim),
        "fe_init": int(t0.fe_init),
        "fe_max": int(t0.fe_max),
        "pyfmto_version": pyfmto.__version__,
        "fmto_commit": fmto_commit(args),
        "machine": machine(),
        "command": args.command,
        "tasks": tasks,
        "runs": {},
    }


def check_results(data: dict) -> None:
    """Raise ``ValueError`` naming the first place where ``data`` departs from the results schema
    (module docstring): types, ``d`` bounds per task, ``fe_max x d`` designs, ``fe_max`` values."""
    keys = [
        "problem",
        "dim",
        "fe_init",
        "fe_max",
        "pyfmto_version",
        "fmto_commit",
        "machine",
        "command",
        "tasks",
        "runs",
    ]
    if sorted(k for k in data if k != "problem_kwargs") != sorted(keys):
        raise ValueError(f"results keys {sorted(data)}, expected {sorted(keys)} (and optionally problem_kwargs)")
    d, n0, n = data["dim"], data["fe_init"], data["fe_max"]
    if not all(isinstance(v, int) for v in (d, n0, n)) or not 1 <= n0 <= n:
        raise ValueError(f"dim, fe_init, fe_max must be integers with 1 <= fe_init <= fe_max, got {d}, {n0}, {n}")

    def floats(name, v, length):
        if not isinstance(v, list) or len(v) != length or not all(isinstance(x, float) for x in v):
            raise ValueError(f"{name}: expected {length} floats")

    for i, t in enumerate(data["tasks"]):
        if sorted(t) != ["lb", "name", "ub", "y_global"] or not isinstance(t["name"], str):
            raise ValueError(f"tasks[{i}]: expected name, lb, ub, y_global")
        floats(f"tasks[{i}].lb", t["lb"], d)
        floats(f"tasks[{i}].ub", t["ub"], d)
        if t["y_global"] is not None and not isinstance(t["y_global"], float):
            raise ValueError(f"tasks[{i}].y_global: expected a float or null")
    for label, runs in data["runs"].items():
        for j, r in enumerate(runs):
            where = f"runs[{label!r}][{j}]"
            if (
                sorted(r) != ["seed", "tasks", "wall_time"]
                or not isinstance(r["seed"], int)
                or not isinstance(r["wall_time"], float)
                or len(r["tasks"]) != len(data["tasks"])
            ):
                raise ValueError(f"{where}: expected seed (int), wall_time (float), one entry per task")
            for i, t in enumerate(r["tasks"]):
                if sorted(t) != ["X", "y"] or not isinstance(t["X"], list) or len(t["X"]) != n:
                    raise ValueError(f"{where}.tasks[{i}]: expected X ({n} x {d}) and y ({n})")
                for k, x in enumerate(t["X"]):
                    floats(f"{where}.tasks[{i}].X[{k}]", x, d)
                floats(f"{where}.tasks[{i}].y", t["y"], n)


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-")
            seeds.extend(range(int(lo), int(hi) + 1))
        elif part:
            seeds.append(int(part))
    if not seeds or any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"--seeds: expected non-negative integers like '0-9' or '0,3,5', got {text!r}")
    return seeds


def merge(argv: list[str]) -> None:
    """``run_pyfmto.py merge --out OUT IN [IN ...]``: one file from runs recorded in several (e.g. by
    processes on different ports), after checking they hold the same setting."""
    p = argparse.ArgumentParser(prog="run_pyfmto.py merge")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("inputs", type=Path, nargs="+")
    a = p.parse_args(argv)
    parts = [json.loads(f.read_text()) for f in a.inputs]
    if a.out.exists() and a.out.resolve() not in [f.resolve() for f in a.inputs]:
        parts.insert(0, json.loads(a.out.read_text()))
    data = {k: v for k, v in parts[0].items() if k != "runs"}
    data["runs"] = {}
    for part in parts:
        for key in ("problem", "dim", "fe_init", "fe_max", "tasks", "pyfmto_version", "fmto_commit"):
            if part[key] != data[key] or part.get("problem_kwargs") != data.get("problem_kwargs"):
                p.error(f"the inputs differ in {key!r}: {part[key]!r} vs {data[key]!r}")
        for key in ("machine", "command"):
            if part[key] not in data[key].split("; "):
                data[key] = f"{data[key]}; {part[key]}"
        for label, runs in part["runs"].items():
            have = data["runs"].setdefault(label, [])
            for run in runs:
                if any(r["seed"] == run["seed"] for r in have):
                    log(f"{label} seed {run['seed']} is in several inputs; keeping the first")
                    continue
                have.append(run)
            have.sort(key=lambda r: r["seed"])
    data["runs"] = {label: data["runs"][label] for label in [*CONFIGS, *data["runs"]] if label in data["runs"]}
    check_results(data)
    write_json(a.out, data)
    log(f"wrote {a.out}: " + ", ".join(f"{k} {len(v)} runs" for k, v in data["runs"].items()))


def summary(argv: list[str]) -> None:
    """``run_pyfmto.py summary FILE``: markdown tables of a results file — mean final best ``f`` per task
    (± one standard error over seeds) and the wall time of every run."""
    p = argparse.ArgumentParser(prog="run_pyfmto.py summary")
    p.add_argument("file", type=Path)
    a = p.parse_args(argv)
    data = json.loads(a.file.read_text())
    names = [f"T{n + 1} {t['name'].strip('_')}" for n, t in enumerate(data["tasks"])]
    print(
        f"{data['problem']}, d = {data['dim']}, {data['fe_init']} + {data['fe_max'] - data['fe_init']} "
        f"evaluations: mean final best f over seeds (± s.e.), seeds in parentheses\n"
    )
    print("| task | y_global | " + " | ".join(f"{k} ({len(v)})" for k, v in data["runs"].items()) + " |")
    print("|---|---|" + "---|" * len(data["runs"]))
    for n, name in enumerate(names):
        cells = []
        for runs in data["runs"].values():
            best = np.array([min(r["tasks"][n]["y"]) for r in runs])
            se = best.std(ddof=1) / np.sqrt(len(best)) if len(best) > 1 else float("nan")
            cells.append(f"{best.mean():.4g} ± {se:.2g}")
        yg = data["tasks"][n]["y_global"]
        print(f"| {name} | {'—' if yg is None else f'{yg:.3g}'} | " + " | ".join(cells) + " |")
    print("\n| configuration | wall time per run, s (seed: time) | mean s per agent-iteration |")
    print("|---|---|---|")
    iters = len(data["tasks"]) * (data["fe_max"] - data["fe_init"])
    for label, runs in data["runs"].items():
        times = ", ".join(f"{r['seed']}: {r['wall_time']:.0f}" for r in runs)
        print(f"| {label} | {times} | {np.mean([r['wall_time'] for r in runs]) / iters:.3f} |")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["summary"]:
        return summary(argv[1:])
    if argv[:1] == ["_serve"]:
        return serve(argv[1:])
    if argv[:1] == ["merge"]:
        return merge(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--fmto",
        type=Path,
        required=True,
        help="checkout of Xiaoxu-Zhang/fmto (its folder name must be an importable package name, e.g. fmto)",
    )
    p.add_argument("--fmto-commit", default=None, help="the checkout's commit (read with git when omitted)")
    p.add_argument("--problem", required=True, help="fmto problem, e.g. tetci2019, svm_landmine")
    p.add_argument("--dim", type=int, default=None, help="problem dimension (omit for fixed-dimension problems)")
    p.add_argument(
        "--problem-kwargs",
        type=json.loads,
        default={},
        help="further arguments of the problem as JSON, e.g. '{\"task_num\": 20}' (gecco2020)",
    )
    p.add_argument("--fe-init", dest="fe_init", type=int, default=None, help="initial design size (pyfmto: 5d)")
    p.add_argument("--fe-max", dest="fe_max", type=int, default=None, help="total evaluations (pyfmto: 11d)")
    p.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-9"), help="e.g. 0-9 or 0,2,5")
    p.add_argument("--algorithms", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--port", type=int, default=18510, help="pyfmto's server port (its default 18510)")
    p.add_argument(
        "--conn-retry",
        type=int,
        default=100,
        help="connection retries per request (pyfmto: 5; too few on a loaded machine)",
    )
    p.add_argument(
        "--pull-repeat",
        type=int,
        default=3600,
        help="waiting requests (pyfmto: 10 or 100 polls, then a silent None) poll at least this often",
    )
    p.add_argument("--attempts", type=int, default=2, help="tries per run before giving up on it")
    p.add_argument("--loglevel", default="WARNING", help="pyfmto's file log (out/logs under --workdir)")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "pyfmto-work")
    p.add_argument("--no-verify", action="store_true", help="skip re-evaluating the recorded designs")
    p.add_argument(
        "--verify-atol",
        type=float,
        default=0.0,
        help="largest |y - evaluate(X)| accepted (0: identical; the SVM tasks' Platt scaling is random)",
    )
    args = p.parse_args(argv)
    args.command = shlex.join(["python", os.path.relpath(Path(__file__).resolve(), ROOT), *argv])
    args.fmto = args.fmto.resolve()
    if not (args.fmto / "algorithms").is_dir() or not (args.fmto / "problems").is_dir():
        p.error(f"--fmto: {args.fmto} has no algorithms/ and problems/ folders (a checkout of Xiaoxu-Zhang/fmto)")
    if _port_open(args.port):
        p.error(f"--port: something already listens on {args.port} (another pyfmto run?); pick a free port")
    args.workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(args.workdir)  # pyfmto writes out/logs/ into the working directory on import

    install_thread_local_random()
    from pyfmto.utilities.loggers import logger

    logger.setLevel(args.loglevel)
    import pyfmto.problem.problem as pyfmto_problem

    pyfmto_problem.lhs = _lhs  # the initial designs
    patient_requests(args.pull_repeat)

    probe = build_problem(args, 0)
    dim = int(probe[0].dim)
    out = args.out or ROOT / "benchmarks" / "results" / "peers" / "pyfmto" / f"{args.problem}_d{dim}.json"
    out = out if out.is_absolute() else (ROOT / out)
    data = header(args, probe)
    if out.exists():
        old = json.loads(out.read_text())
        for key in ("problem", "dim", "fe_init", "fe_max", "tasks"):
            if old[key] != data[key]:
                p.error(f"--out: {out} holds a different setting ({key}: {old[key]!r} vs {data[key]!r})")
        data["runs"] = old["runs"]
        if old.get("command") != data["command"]:
            data["command"] = (
                old["command"]
                if old.get("command", "").endswith(" (resumed)")
                else f"{old.get('command')}; {data['command']} (resumed)"
            )
    log(f"{args.problem} d={dim} fe_init={data['fe_init']} fe_max={data['fe_max']}: {len(probe)} tasks -> {out}")

    failed = []
    for seed in args.seeds:
        for label in args.algorithms:
            runs = data["runs"].setdefault(label, [])
            if any(r["seed"] == seed for r in runs):
                continue
            for attempt in range(1, args.attempts + 1):
                log(f"{label} seed {seed} (attempt {attempt}) ...")
                try:
                    run = run_once(args, label, seed)
                except Exception as err:
                    log(f"  failed: {err}")
                    continue
                best = [min(t["y"]) for t in run["tasks"]]
                log(f"  done in {run['wall_time']:.1f} s; best y per task: " + " ".join(f"{b:.3g}" for b in best))
                runs.append(run)
                runs.sort(key=lambda r: r["seed"])
                check_results(data)
                write_json(out, data)
                break
            else:
                failed.append((label, seed))
    if failed:
        log(f"gave up on {len(failed)} run(s): {failed}")
        sys.exit(1)


if __name__ == "__main__":
    main()
