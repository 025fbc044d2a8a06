#!/usr/bin/env python
r"""Benchmark: all agents' RFF posteriors and ω draws, batched vs. the per-agent reference loop.

What is timed, for ``N`` agents with ``n`` observations each, ``M`` shared random
Fourier features and inputs in ``[0, 1]^d`` (``d = 2``):

* **fit**    - every agent's weight posterior from its data (features included);
* **sample** - one ``ω`` per agent from that posterior;
* **update** - every agent appends one observation and its posterior is brought
  up to date (ours: ``RFFBayesianLinear.update``, a rank-one update; the
  reference has no incremental form and recomputes from all ``n + 1`` points,
  which is what it does every round). Ours is timed in steady state: the
  storage for the new point is reserved (``reserve``) before the clock
  starts, as the runners reserve their ``T`` rounds at construction.

"Ours" is one :class:`fbo_torch.models.rff_blr.RFFBayesianLinear` holding all
agents (both representations, ``weight`` and ``dual``, when the constructor has
a ``representation=`` argument; otherwise the default). The reference is the
per-agent NumPy loop of ``benchmarks/reference_impl.py`` done the authors' way:
``Σ = ΦᵀΦ + σ²I``, ``np.linalg.inv(Σ)``, ``ν = Σ⁻¹Φᵀy`` and
``rng.multivariate_normal(ν, σ²Σ⁻¹)``. Both sides get the same data and the
same feature map (the library's ``spectral``/``phase`` via
``ReferenceRFF.from_arrays``), run in this one process, and use the same number
of threads (``torch.set_num_threads`` and, through ``threadpoolctl``, NumPy's BLAS).

Large cells:

* The reference loop is timed on a random subset of agents (at most
  ``--reference-agents`` agents or ``--reference-seconds`` per cell) and its
  per-agent mean is extrapolated linearly to ``N``; the JSON says per cell
  whether it was measured on all agents or extrapolated, and from how many.
* Ours is planned against ``--budget-gb``: a cell whose estimated peak memory is
  larger is run over the agents in chunks (every agent is still processed and
  timed; the chunks' times are summed; the ``N`` posteriors then never exist in
  memory together), or is marked infeasible with the reason (``--no-chunk``, or
  a single agent over the budget). The estimate is checked against the peak
  measured during the warm-up and the chunk shrunk if needed.

Peak memory: on CPU the process's peak resident set (``VmHWM``, reset per cell
through ``/proc/self/clear_refs``; falls back to ``getrusage`` max RSS, which
cannot be reset); on CUDA ``torch.cuda.max_memory_allocated``.

Outputs ``DIR/posterior_sampling.json`` and ``DIR/posterior_sampling.png`` and
prints a table. ``--quick`` runs tiny sizes in a few seconds (used by the tests).

Usage::

    python benchmarks/posterior_sampling.py                     # full grid, CPU
    python benchmarks/posterior_sampling.py --threads 1         # both sides single-threaded
    python benchmarks/posterior_sampling.py --device all        # CPU, and CUDA when present
    python benchmarks/posterior_sampling.py --N 10 100 1000 --M 100 --out /tmp/bench
    python benchmarks/posterior_sampling.py --quick --out /tmp/bench
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import importlib.util
import inspect
import json
import math
import os
import platform
import re
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.models.rff_blr import RFFBayesianLinear

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_PATH = ROOT / "benchmarks" / "reference_impl.py"
SCHEMA_VERSION = 1
GOAL_RATIO = 50.0
GOAL_N = 1000
PHASES = ("fit", "update", "sample")


# ----------------------------------------------------------------- reference
def load_reference() -> Any:
    """Import ``benchmarks/reference_impl.py`` by path (it is not part of the package)."""
    name = "reference_impl"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REFERENCE_PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


# -------------------------------------------------------------- capabilities
def constructor_representations() -> list[str] | None:
    """Representations ``RFFBayesianLinear`` accepts, or ``None`` if it has no ``representation=``."""
    params = inspect.signature(RFFBayesianLinear.__init__).parameters
    if "representation" not in params:
        return None
    return ["auto", "weight", "dual"]


def default_representations() -> list[str]:
    """What the benchmark measures by default: weight and dual when they exist, else the default."""
    return ["default"] if constructor_representations() is None else ["weight", "dual"]


# -------------------------------------------------------------------- memory
def _read_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            m = re.search(rf"^{field}:\s+(\d+)\s+kB", fh.read(), re.MULTILINE)
        return int(m.group(1)) if m else None
    except OSError:
        return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (``VmHWM``) of this process; False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Peak memory of a block of work: device memory on CUDA, resident set on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.method = ""
        self.baseline = 0
        self._resettable = False

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
            self.method = "torch.cuda.max_memory_allocated (reset per cell)"
            return
        gc.collect()
        rss = _read_status_kib("VmRSS")
        self._resettable = rss is not None and _reset_peak_rss() and _read_status_kib("VmHWM") is not None
        if self._resettable:
            self.baseline = (_read_status_kib("VmRSS") or 0) * 1024
            self.method = "VmHWM of /proc/self/status, reset per cell via /proc/self/clear_refs (process RSS)"
        else:
            self.baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.method = "getrusage ru_maxrss (process-lifetime peak, cannot be reset)"

    def peak(self) -> int:
        """Peak bytes (absolute) since :meth:`start`."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device))
        if self._resettable:
            return int((_read_status_kib("VmHWM") or 0) * 1024)
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)

    def delta(self) -> int:
        """Peak bytes above what was in use at :meth:`start`."""
        return max(0, self.peak() - self.baseline)


def estimate_bytes_per_agent(representation: str, M: int, n: int, itemsize: int) -> int:
    r"""Conservative peak bytes per agent of fit + sample + update (before calibration).

    ``weight``: the ``M x M`` Cholesky factor and up to ~7 same-sized
    temporaries in the rank-one update (``L``, ``L·p``, reverse cumsum, tail and
    the products), so ``8 M²`` numbers; plus ``Φ`` and small vectors.
    ``dual``: ``(n+1) x M`` feature blocks counted 4 times (stored ``Φ``, its
    copy when a row is appended, feature temporaries; about 2 measured) and
    ``(n+1) x (n+1)`` Gram/Cholesky blocks 8 times. ``auto`` takes the larger
    of the two (it may pick either). The estimate is checked against the
    warm-up's measured peak and raised (with a smaller chunk) when it was low.
    """
    n1 = n + 1
    weight = itemsize * (8 * M * M + 4 * n1 * M + 8 * M + 4 * n1)
    dual = itemsize * (8 * n1 * n1 + 4 * n1 * M + 8 * M + 4 * n1)
    if representation in ("weight", "default"):
        return weight
    if representation == "dual":
        return dual
    return max(weight, dual)


def state_bytes(representation: str, N: int, M: int, n: int, itemsize: int) -> int:
    """Bytes of the posterior state of all ``N`` agents after the update (no temporaries).

    ``weight``: the ``N x M x M`` Cholesky factor; ``dual``: ``Φ`` (``N x (n+1) x M``)
    and the ``N x (n+1) x (n+1)`` factor; ``auto``/``default``: as the constructor
    would choose (dual when ``n < M``).
    """
    n1 = n + 1
    if representation in ("auto", "default"):
        if constructor_representations() is None:
            representation = "weight"
        else:
            representation = "dual" if n < M else "weight"
    if representation == "weight":
        return N * itemsize * (M * M + 2 * M)
    return N * itemsize * (n1 * M + n1 * n1 + 2 * M)


def _fmt_bytes(b: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


# -------------------------------------------------------------------- timing
def _sync_fn(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _timed(fn: Callable[[], Any], sync: Callable[[], None]) -> tuple[Any, float, float]:
    sync()
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    sync()
    return out, time.perf_counter() - w0, time.process_time() - c0


def smooth_function(X: np.ndarray) -> np.ndarray:
    """A smooth test function of ``X`` (``... x 2``)."""
    x0, x1 = X[..., 0], X[..., 1]
    return np.sin(3.0 * x0) * np.cos(2.0 * x1) + 0.5 * x0 - (x1 - 0.3) ** 2


def make_data(N: int, n: int, d: int, obs_noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``N x (n+1) x d`` inputs in ``[0,1]^d`` and ``N x (n+1)`` noisy observations.

    The first ``n`` rows of each agent are its data; row ``n`` is the observation it appends.
    """
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(N, n + 1, d))
    Xf = X[..., :2] if d >= 2 else np.concatenate([X, np.zeros_like(X)], axis=-1)  # f uses 2 coordinates
    y = smooth_function(Xf) + obs_noise * rng.standard_normal(size=(N, n + 1))
    return X, y


class OurSide:
    """Runs fit / sample / update of ``RFFBayesianLinear`` over all agents (optionally in chunks)."""

    def __init__(
        self,
        feats: RandomFourierFeatures,
        X: torch.Tensor,
        y: torch.Tensor,
        n: int,
        noise: float,
        representation: str,
        device: torch.device,
        seed: int,
    ) -> None:
        self.feats = feats
        self.Xfit, self.Yfit = X[:, :n].contiguous(), y[:, :n].unsqueeze(-1).contiguous()
        self.Xnew, self.Ynew = X[:, n:].contiguous(), y[:, n:].unsqueeze(-1).contiguous()
        self.noise = noise
        self.kwargs = {} if representation == "default" else {"representation": representation}
        self.sync = _sync_fn(device)
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.resolved: str | None = None
        self.all_finite = True

    def run(self, N: int, chunk: int, max_agents: int | None = None) -> dict[str, float]:
        """One pass over agents ``0..N-1`` (or the first ``max_agents``) in chunks; summed times."""
        out = {f"{p}_{k}": 0.0 for p in PHASES for k in ("wall_s", "cpu_s")}
        stop = N if max_agents is None else min(N, max_agents)
        for a in range(0, stop, chunk):
            b = min(a + chunk, stop)
            Xf, Yf, Xn, Yn = self.Xfit[a:b], self.Yfit[a:b], self.Xnew[a:b], self.Ynew[a:b]
            model, w, c = _timed(
                lambda Xf=Xf, Yf=Yf: RFFBayesianLinear(self.feats, Xf, Yf, self.noise, **self.kwargs), self.sync
            )
            out["fit_wall_s"] += w
            out["fit_cpu_s"] += c
            omega, w, c = _timed(lambda model=model: model.sample_weights(generator=self.gen), self.sync)
            out["sample_wall_s"] += w
            out["sample_cpu_s"] += c
            ok = omega.shape == (b - a, self.feats.num_features) and bool(torch.isfinite(omega).all())
            self.all_finite = self.all_finite and ok
            del omega

            if hasattr(model, "reserve"):  # steady state: runners reserve their T rounds up front
                model.reserve(Xn.shape[1])

            def update(model=model, Xn=Xn, Yn=Yn) -> None:  # returns nothing: no reference outlives the chunk
                model.update(Xn, Yn)

            _, w, c = _timed(update, self.sync)
            out["update_wall_s"] += w
            out["update_cpu_s"] += c
            rep = getattr(model, "representation", None)
            self.resolved = rep if isinstance(rep, str) else self.resolved
            del model, update
        return out


def time_ours(
    feats: RandomFourierFeatures,
    X: torch.Tensor,
    y: torch.Tensor,
    n: int,
    noise: float,
    representation: str,
    device: torch.device,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Time our batched model for one cell; returns the cell's ``ours`` record."""
    N, M = X.shape[0], feats.num_features
    itemsize = X.element_size()
    budget = int(args.budget_gb * 1024**3)
    per_agent = estimate_bytes_per_agent(representation, M, n, itemsize)
    rec: dict[str, Any] = {
        "representation_requested": representation,
        "representation_resolved": None,
        "memory_budget_bytes": budget,
        "estimated_bytes_per_agent": per_agent,
        "estimated_peak_bytes_unchunked": per_agent * N,
        "state_bytes_unchunked": state_bytes(representation, N, M, n, itemsize),
        "feasible": True,
        "infeasible_reason": None,
        "chunked": False,
        "chunk_size": N,
        "n_chunks": 1,
        "chunk_reason": None,
        "memory_estimate_calibrated": False,
    }
    if per_agent > budget:
        rec.update(
            feasible=False,
            infeasible_reason=(f"one agent alone needs ~{_fmt_bytes(per_agent)} > budget {args.budget_gb:g} GB"),
        )
        return rec
    chunk = N if per_agent * N <= budget else max(1, budget // per_agent)
    if chunk < N and args.no_chunk:
        rec.update(
            feasible=False,
            infeasible_reason=(
                f"needs ~{_fmt_bytes(per_agent * N)} > budget {args.budget_gb:g} GB and --no-chunk was given"
            ),
        )
        return rec
    chunk_reason = "memory budget" if chunk < N else None
    if args.chunk_agents and args.chunk_agents < chunk:
        chunk, chunk_reason = args.chunk_agents, "--chunk-agents"

    side = OurSide(feats, X, y, n, noise, representation, device, args.seed + 1)
    mem = PeakMemory(device)

    def warm_up(side: OurSide = side) -> tuple[float, int]:
        """Run the first chunk (all agents when unchunked): peak memory, then a steadier time."""
        mem.start()
        t0 = time.perf_counter()
        side.run(N, chunk, max_agents=chunk)
        wall = time.perf_counter() - t0
        peak = mem.delta()
        if wall < args.cell_seconds / 4:  # first calls pay one-off costs; time a second run
            t0 = time.perf_counter()
            side.run(N, chunk, max_agents=chunk)
            wall = time.perf_counter() - t0
        return wall, peak

    try:
        warm, measured = warm_up()
        rec["warmup_peak_delta_bytes"] = measured
        if measured >= 64 * 1024**2 and measured / chunk > per_agent:  # the estimate was low: calibrate
            per_agent = int(1.1 * measured / chunk)
            rec.update(
                estimated_bytes_per_agent=per_agent,
                estimated_peak_bytes_unchunked=per_agent * N,
                memory_estimate_calibrated=True,
            )
            new_chunk = N if per_agent * N <= budget else max(1, budget // per_agent)
            if new_chunk < chunk:
                if args.no_chunk:
                    rec.update(
                        feasible=False,
                        infeasible_reason=(
                            f"measured ~{_fmt_bytes(per_agent * N)} > budget {args.budget_gb:g} GB and --no-chunk"
                        ),
                    )
                    return rec
                chunk, chunk_reason = new_chunk, "memory budget (estimate calibrated at warm-up)"
                warm, measured = warm_up()
                rec["warmup_peak_delta_bytes"] = measured
        n_chunks = math.ceil(N / chunk)
        est_pass = warm * n_chunks
        repeats = int(max(1, min(args.repeats, args.cell_seconds // max(est_pass, 1e-9))))
        if n_chunks > 1 or est_pass > 5:
            print(
                f"    [{representation}] N={N} M={M}: {n_chunks} chunk(s) of {chunk}, "
                f"~{est_pass:.1f} s per pass, {repeats} repeat(s)",
                flush=True,
            )
        mem.start()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        runs = [side.run(N, chunk) for _ in range(repeats)]
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        rec.update(
            minor_page_faults_per_pass=(ru1.ru_minflt - ru0.ru_minflt) / repeats,
            system_cpu_s_per_pass=(ru1.ru_stime - ru0.ru_stime) / repeats,
            chunk_reason=chunk_reason,
        )
        rec.update(
            chunked=n_chunks > 1,
            chunk_size=int(chunk),
            n_chunks=int(n_chunks),
            repeats=repeats,
            warmup_wall_s=warm,
            peak_memory_bytes=mem.peak(),
            peak_memory_delta_bytes=mem.delta(),
            peak_memory_method=mem.method,
            representation_resolved=side.resolved,
            omega_finite=side.all_finite,
        )
        for key in runs[0]:
            rec[key] = statistics.median(r[key] for r in runs)
        rec["repeats_wall_s"] = {p: [r[f"{p}_wall_s"] for r in runs] for p in PHASES}
    except (RuntimeError, MemoryError) as exc:  # torch.cuda.OutOfMemoryError is a RuntimeError
        rec.update(feasible=False, infeasible_reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    finally:
        del side
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rec


def time_reference(
    R: Any,
    spectral: np.ndarray,
    phase: np.ndarray,
    outputscale: float,
    X: np.ndarray,
    y: np.ndarray,
    n: int,
    noise: float,
    args: argparse.Namespace,
    seed: int,
) -> dict[str, Any]:
    """Time the per-agent reference loop on a random subset of agents and extrapolate to ``N``."""
    N = X.shape[0]
    feats = R.ReferenceRFF.from_arrays(spectral, phase, outputscale)
    rng = np.random.default_rng(seed)
    order = rng.permutation(N)
    min_agents = min(N, 3)

    def one(i: int) -> tuple[float, ...]:
        t0 = time.perf_counter()
        c0 = time.process_time()
        nu, cov = R.reference_blr_posterior(feats.phi_batch(X[i, :n]), y[i, :n], noise)
        t1 = time.perf_counter()
        c1 = time.process_time()
        omega = R.reference_sample_omega(nu, cov, rng)
        t2 = time.perf_counter()
        c2 = time.process_time()
        R.reference_blr_posterior(feats.phi_batch(X[i, : n + 1]), y[i, : n + 1], noise)  # refit on n+1
        t3 = time.perf_counter()
        c3 = time.process_time()
        assert omega.shape == (feats.M,)
        return t1 - t0, t3 - t2, t2 - t1, c1 - c0, c3 - c2, c2 - c1

    one(int(order[0]))  # warm-up
    rows: list[tuple[float, ...]] = []
    start = time.perf_counter()
    for i in order:
        rows.append(one(int(i)))
        if len(rows) >= args.reference_agents and len(rows) >= min_agents:
            break
        if time.perf_counter() - start >= args.reference_seconds and len(rows) >= min_agents:
            break
    arr = np.asarray(rows)
    k = len(rows)
    rec: dict[str, Any] = {
        "method": "per-agent loop: phi_batch + np.linalg.inv(PhiᵀPhi + σ²I) + rng.multivariate_normal; "
        "update = the same fit on n+1 points (no incremental form)",
        "agents_timed": k,
        "measured": k == N,
        "extrapolated": k < N,
        "extrapolation": None if k == N else f"mean per-agent time of {k} random agents x N={N}",
        "timed_wall_s": float(arr[:, :3].sum()),
    }
    for j, p in enumerate(PHASES):
        col, ccol = arr[:, j], arr[:, 3 + j]
        rec[f"{p}_per_agent_mean_s"] = float(col.mean())
        rec[f"{p}_per_agent_median_s"] = float(np.median(col))
        rec[f"{p}_per_agent_std_s"] = float(col.std())
        rec[f"{p}_wall_s"] = float(col.mean() * N)
        rec[f"{p}_cpu_s"] = float(ccol.mean() * N)
    return rec


# ------------------------------------------------------------ machine / env
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            m = re.search(r"MemTotal:\s+(\d+)\s+kB", fh.read())
        return int(m.group(1)) * 1024 if m else None
    except OSError:
        return None


def _git() -> dict[str, Any]:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        return {"commit": head.stdout.strip() or None, "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def machine_info(devices: list[torch.device]) -> dict[str, Any]:
    import scipy

    info: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "cores_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_total_bytes": _mem_total(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "git": _git(),
        "devices": {},
    }
    for dev in devices:
        if dev.type == "cuda":
            props = torch.cuda.get_device_properties(dev)
            info["devices"]["cuda"] = {
                "name": torch.cuda.get_device_name(dev),
                "total_memory_bytes": int(props.total_memory),
                "cuda_version": torch.version.cuda,
            }
        else:
            info["devices"]["cpu"] = {"name": info["cpu_model"]}
    return info


def thread_info() -> dict[str, Any]:
    env = {
        k: os.environ.get(k)
        for k in (
            "OMP_NUM_THREADS",
            "MKL_NUM_THREADS",
            "OPENBLAS_NUM_THREADS",
            "BLIS_NUM_THREADS",
            "NUMEXPR_NUM_THREADS",
        )
    }
    out: dict[str, Any] = {
        "torch_num_threads": torch.get_num_threads(),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
        "env": env,
    }
    try:
        from threadpoolctl import threadpool_info

        out["threadpools"] = [
            {k: p.get(k) for k in ("user_api", "internal_api", "prefix", "num_threads", "version", "threading_layer")}
            for p in threadpool_info()
        ]
    except ImportError:
        out["threadpools"] = None
    return out


# --------------------------------------------------------------------- output
def _fmt_t(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    if s >= 100:
        return f"{s:.0f}s"
    if s >= 1:
        return f"{s:.2f}s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f}ms"
    return f"{s * 1e6:.0f}us"


def _fmt_x(r: float | None) -> str:
    if r is None or not math.isfinite(r):
        return "-"
    return f"{r:.0f}x" if r >= 10 else f"{r:.2f}x"


def print_table(cells: list[dict[str, Any]]) -> None:
    head = (
        f"{'dev':<4} {'M':>5} {'N':>6} {'repr':<7} {'chunks':>6} | {'fit':>8} {'update':>8} {'sample':>8}"
        f" | {'ref fit':>8} {'ref upd':>8} {'ref smp':>8} {'timed':>11} | {'x fit+smp':>9} {'x upd+smp':>9}"
        f" | {'peak MB':>8}"
    )
    print(head)
    print("-" * len(head))
    for c in cells:
        o, r, x = c["ours"], c["reference"], c["ratio"]
        timed = f"{r['agents_timed']}/{c['N']}" + ("*" if r["extrapolated"] else "")
        rep = o.get("representation_resolved") or o["representation_requested"]
        if o["representation_requested"] not in ("default", rep):
            rep = f"{o['representation_requested'][:4]}>{rep[:2]}"
        if not o["feasible"]:
            ours = f"{'infeasible: ' + str(o['infeasible_reason']):<26.26}"
            chunks = "-"
            peak = "-"
        else:
            ours = f"{_fmt_t(o['fit_wall_s']):>8} {_fmt_t(o['update_wall_s']):>8} {_fmt_t(o['sample_wall_s']):>8}"
            chunks = str(o["n_chunks"])
            peak = f"{o['peak_memory_delta_bytes'] / 2**20:.0f}"
        print(
            f"{c['device']:<4} {c['M']:>5} {c['N']:>6} {rep:<7} {chunks:>6} | {ours}"
            f" | {_fmt_t(r['fit_wall_s']):>8} {_fmt_t(r['update_wall_s']):>8} {_fmt_t(r['sample_wall_s']):>8}"
            f" {timed:>11} | {_fmt_x(x['fit_sample']):>9} {_fmt_x(x['update_sample']):>9} | {peak:>8}"
        )
    print(
        "times: wall seconds for all N agents (median of repeats); ref = per-agent NumPy loop;"
        " '*' = reference extrapolated from the timed agents; x = reference time / ours;"
        " peak MB = peak memory above the cell's baseline"
    )


def plot(cells: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Ms = sorted({c["M"] for c in cells})
    fig, axes = plt.subplots(2, len(Ms), figsize=(max(7.0, 5.6 * len(Ms)), 9), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    series = sorted({(c["device"], c["ours"]["representation_requested"]) for c in cells})
    for j, M in enumerate(Ms):
        ax_t, ax_r = axes[0, j], axes[1, j]
        ref_cells = {}
        for k, (dev, rep) in enumerate(series):
            cs = sorted(
                (
                    c
                    for c in cells
                    if c["M"] == M
                    and c["device"] == dev
                    and c["ours"]["representation_requested"] == rep
                    and c["ours"]["feasible"]
                ),
                key=lambda c: c["N"],
            )
            for c in cs:
                ref_cells[c["N"]] = c
            if not cs:
                continue
            col = colors[k % len(colors)]
            Ns = [c["N"] for c in cs]
            lab = f"ours {rep} ({dev})"
            for op, ls in (("update_sample", "-"), ("fit_sample", "--")):
                a, b = op.split("_")
                ax_t.plot(
                    Ns,
                    [c["ours"][f"{a}_wall_s"] + c["ours"][f"{b}_wall_s"] for c in cs],
                    ls,
                    color=col,
                    marker="o",
                    label=f"{lab}: {a}+{b}",
                )
                ax_r.plot(Ns, [c["ratio"][op] for c in cs], ls, color=col, marker="o", label=f"{lab}: {a}+{b}")
                chunked = [c for c in cs if c["ours"]["chunked"]]
                if chunked:
                    ax_t.plot(
                        [c["N"] for c in chunked],
                        [c["ours"][f"{a}_wall_s"] + c["ours"][f"{b}_wall_s"] for c in chunked],
                        "s",
                        mfc="none",
                        color=col,
                        ms=11,
                    )
        if ref_cells:
            Ns = sorted(ref_cells)
            for op, ls in (("update_sample", "-"), ("fit_sample", "--")):
                a, b = op.split("_")
                ys = [ref_cells[N]["reference"][f"{a}_wall_s"] + ref_cells[N]["reference"][f"{b}_wall_s"] for N in Ns]
                ax_t.plot(Ns, ys, ls, color="k", label=f"reference loop: {'refit' if a == 'update' else a}+{b}")
                for N, yv in zip(Ns, ys, strict=False):
                    ext = ref_cells[N]["reference"]["extrapolated"]
                    ax_t.plot([N], [yv], "^", color="k", mfc="none" if ext else "k")
        ax_r.axhline(GOAL_RATIO, color="gray", ls=":", label=f"goal {GOAL_RATIO:.0f}x")
        ax_r.axhline(1.0, color="gray", lw=0.5)
        for ax in (ax_t, ax_r):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("agents N")
            ax.grid(True, which="both", alpha=0.3)
        ax_t.set_title(f"M = {M} features, n = {cells[0]['n']}, d = {cells[0]['d']}")
        ax_t.set_ylabel("wall time for all agents (s)")
        ax_r.set_ylabel("speed-up (reference / ours)")
        ax_t.legend(fontsize=7)
        ax_r.legend(fontsize=7)
    fig.suptitle(
        "Posterior update + one ω per agent:\nbatched fbo_torch vs per-agent NumPy reference loop\n"
        "(hollow triangles: reference extrapolated from a subset; squares: ours run in chunks)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _ratio(ref: dict[str, Any], ours: dict[str, Any], *phases: str) -> float | None:
    if not ours.get("feasible") or f"{phases[0]}_wall_s" not in ours:
        return None
    den = sum(ours[f"{p}_wall_s"] for p in phases)
    return sum(ref[f"{p}_wall_s"] for p in phases) / den if den > 0 else None


# ----------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes, a few seconds (for the test suite)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="output directory")
    p.add_argument(
        "--device",
        nargs="+",
        default=["cpu"],
        choices=["cpu", "cuda", "all"],
        help="devices for our side ('all' = cpu plus cuda when available); the reference runs on CPU",
    )
    p.add_argument("--N", type=int, nargs="+", default=None, help="numbers of agents (default 10 100 1000 10000)")
    p.add_argument("--M", type=int, nargs="+", default=None, help="numbers of features (default 100 1000)")
    p.add_argument("--n", type=int, default=None, help="observations per agent (default 50)")
    p.add_argument("--d", type=int, default=2, help="input dimension (default 2)")
    p.add_argument(
        "--representations",
        nargs="+",
        default=None,
        help="representations to time (default: weight dual when the constructor has representation=, "
        "else the default)",
    )
    p.add_argument("--noise", type=float, default=1e-6, help="BLR noise variance σ² (papers: 1e-6)")
    p.add_argument("--obs-noise", type=float, default=0.01, help="std of the noise added to the observations")
    p.add_argument("--lengthscale", type=float, default=0.2, help="RFF lengthscale")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64", help="our dtype (reference: float64)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads for our side; NumPy's BLAS is pinned to the same (default: torch's)",
    )
    p.add_argument("--budget-gb", type=float, default=None, help="memory budget for our side per cell (default 8)")
    p.add_argument("--no-chunk", action="store_true", help="mark over-budget cells infeasible instead of chunking")
    p.add_argument(
        "--chunk-agents",
        type=int,
        default=None,
        help="also cap our chunk size at this many agents (to study chunking; default: budget only)",
    )
    p.add_argument(
        "--reference-seconds",
        type=float,
        default=None,
        help="time budget of the reference loop per cell before extrapolating (default 20)",
    )
    p.add_argument(
        "--reference-agents",
        type=int,
        default=None,
        help="at most this many agents timed in the reference loop per cell (default 200)",
    )
    p.add_argument("--repeats", type=int, default=None, help="max timed repeats of our side per cell (default 5)")
    p.add_argument(
        "--cell-seconds",
        type=float,
        default=None,
        help="target time of our repeats per cell; fewer repeats for big cells (default 30)",
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    q = args.quick
    defaults = {
        "N": [3, 12] if q else [10, 100, 1000, 10000],
        "M": [16, 48] if q else [100, 1000],
        "n": 8 if q else 50,
        "budget_gb": 0.001 if q else 8.0,  # quick: small enough that one cell is chunked
        "reference_seconds": 0.05 if q else 20.0,
        "reference_agents": 5 if q else 200,
        "repeats": 2 if q else 5,
        "cell_seconds": 0.5 if q else 30.0,
    }
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.representations is None:
        args.representations = default_representations()
    allowed = constructor_representations()
    for rep in args.representations:
        if allowed is None and rep != "default":
            p.error(f"RFFBayesianLinear has no `representation=` argument; cannot time {rep!r}")
        if allowed is not None and rep not in allowed + ["default"]:
            p.error(f"unknown representation {rep!r}; choose from {allowed + ['default']}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    devices: list[torch.device] = []
    for d in args.device:
        if d in ("cpu", "all"):
            devices.append(torch.device("cpu"))
        if d == "cuda" or (d == "all" and torch.cuda.is_available()):
            if not torch.cuda.is_available():
                raise SystemExit("--device cuda: no CUDA device is available")
            devices.append(torch.device("cuda"))
    devices = list(dict.fromkeys(devices))
    loadavg_start = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    dtype = getattr(torch, args.dtype)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    nthreads = torch.get_num_threads()
    R = load_reference()
    threads_before = thread_info()

    try:
        from threadpoolctl import threadpool_limits

        limiter: Any = threadpool_limits(limits=nthreads, user_api="blas")
        blas_note = (
            f"NumPy/SciPy BLAS pinned to {nthreads} thread(s) with threadpoolctl "
            f"(= torch.get_num_threads()) for the whole run"
        )
    except ImportError:
        limiter = None
        blas_note = "threadpoolctl not installed: NumPy's BLAS threads NOT pinned (library default)"
    print(f"threads: torch {nthreads}; {blas_note}", flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if nthreads > 1 and load > 0.5 * (os.cpu_count() or 1):
        print(
            f"warning: load average {load:.2f} on {os.cpu_count()} cores; multi-threaded BLAS on a busy machine "
            "can be many times slower for small matrices (try --threads 1, or a quiet machine)",
            flush=True,
        )

    cells: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    try:
        threads_during = thread_info()
        for M in args.M:
            for N in args.N:
                cell_seed = args.seed * 1_000_003 + 7919 * M + N
                Xn, yn = make_data(N, args.n, args.d, args.obs_noise, cell_seed)
                feats_cpu = RandomFourierFeatures(args.d, M, args.lengthscale, seed=args.seed + M)
                print(f"M={M} N={N}: reference loop ...", flush=True)
                ref = time_reference(
                    R,
                    feats_cpu.spectral.numpy(),
                    feats_cpu.phase.numpy(),
                    float(feats_cpu.outputscale),
                    Xn,
                    yn,
                    args.n,
                    args.noise,
                    args,
                    cell_seed + 1,
                )
                for dev in devices:
                    feats = RandomFourierFeatures(
                        args.d, M, args.lengthscale, seed=args.seed + M, dtype=dtype, device=dev
                    )
                    X = torch.as_tensor(Xn, dtype=dtype, device=dev)
                    y = torch.as_tensor(yn, dtype=dtype, device=dev)
                    for rep in args.representations:
                        print(f"M={M} N={N}: ours {rep} on {dev.type} ...", flush=True)
                        ours = time_ours(feats, X, y, args.n, args.noise, rep, dev, args)
                        ratio = {
                            "fit": _ratio(ref, ours, "fit"),
                            "update": _ratio(ref, ours, "update"),
                            "sample": _ratio(ref, ours, "sample"),
                            "fit_sample": _ratio(ref, ours, "fit", "sample"),
                            "update_sample": _ratio(ref, ours, "update", "sample"),
                        }
                        cells.append(
                            {
                                "device": dev.type,
                                "N": N,
                                "M": M,
                                "n": args.n,
                                "d": args.d,
                                "representation": rep,
                                "dtype": args.dtype,
                                "ours": ours,
                                "reference": ref,
                                "ratio": ratio,
                                "ours_measured_all_agents": bool(ours["feasible"]),
                                "reference_measured": ref["measured"],
                                "reference_extrapolated": ref["extrapolated"],
                                "loadavg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
                            }
                        )
                    del X, y, feats
    finally:
        if limiter is not None:
            limiter.restore_original_limits()

    goal = []
    for c in cells:
        if c["N"] == GOAL_N:
            goal.append(
                {
                    "device": c["device"],
                    "M": c["M"],
                    "representation": c["representation"],
                    "ratio_update_sample": c["ratio"]["update_sample"],
                    "ratio_fit_sample": c["ratio"]["fit_sample"],
                    "met_update_sample": (c["ratio"]["update_sample"] or 0) >= GOAL_RATIO,
                    "met_fit_sample": (c["ratio"]["fit_sample"] or 0) >= GOAL_RATIO,
                    "reference_extrapolated": c["reference_extrapolated"],
                }
            )
    info = machine_info(devices)
    info["loadavg_start"] = loadavg_start
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    result = {
        "benchmark": "posterior_sampling",
        "schema_version": SCHEMA_VERSION,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
        "total_wall_s": time.perf_counter() - t_start,
        "description": (
            "Wall time to fit every agent's RFF Bayesian-linear posterior from n observations, to update it "
            "after one appended observation, and to draw one ω per agent: batched RFFBayesianLinear vs the "
            "per-agent NumPy reference loop (explicit inverse + multivariate_normal), same data and features, "
            "same thread count. Ratios are reference / ours; 'update_sample' is the per-round cost."
        ),
        "settings": {
            "quick": args.quick,
            "N": args.N,
            "M": args.M,
            "n": args.n,
            "d": args.d,
            "representations": args.representations,
            "constructor_has_representation": constructor_representations() is not None,
            "devices": [d.type for d in devices],
            "dtype_ours": args.dtype,
            "dtype_reference": "float64",
            "noise_variance": args.noise,
            "obs_noise_std": args.obs_noise,
            "lengthscale": args.lengthscale,
            "budget_gb": args.budget_gb,
            "no_chunk": args.no_chunk,
            "chunk_agents": args.chunk_agents,
            "reference_seconds": args.reference_seconds,
            "reference_agents": args.reference_agents,
            "repeats_max": args.repeats,
            "cell_seconds": args.cell_seconds,
            "seed": args.seed,
            "timing": "warm-up once, then the median over repeats (fewer repeats for big cells); CUDA is synchronized "
            "around every timed call; ours runs in the process's main thread, single process",
        },
        "threads": {
            "torch_num_threads": nthreads,
            "blas_pinning": blas_note,
            "before_pinning": threads_before,
            "during_run": threads_during,
        },
        "machine": info,
        "goal": {"target_ratio": GOAL_RATIO, "at_N": GOAL_N, "metric": "reference / ours wall time", "results": goal},
        "cells": cells,
        "notes": [
            "reference 'update' = a full refit on n+1 points (the reference has no incremental update); "
            "ours = RFFBayesianLinear.update (rank-one / incremental).",
            "reference cells with reference_extrapolated=true were timed on reference.agents_timed random agents "
            "and scaled linearly to N (the loop is per agent, so its cost is linear in N).",
            "ours cells with chunked=true processed all N agents, chunk_size at a time, times summed, so the N "
            "posteriors never coexist in memory; chunk_reason says why (the memory budget, or --chunk-agents).",
            "peak memory is for our side only; on CPU it is the process resident-set peak during the cell "
            "(absolute, and above the cell's starting RSS).",
        ],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "posterior_sampling.json"
    json_path.write_text(json.dumps(result, indent=1))
    png_path = args.out / "posterior_sampling.png"
    plot(cells, png_path)
    print()
    print(
        f"{info['cpu_model']}, {info['cores_available']} cores, torch {torch.__version__}, numpy {np.__version__}, "
        f"{nthreads} thread(s) both sides; n={args.n}, d={args.d}, σ²={args.noise:g}, budget {args.budget_gb:g} GB"
    )
    print_table(cells)
    for g in goal:
        print(
            f"goal (>= {GOAL_RATIO:.0f}x at N={GOAL_N}) {g['device']} M={g['M']} {g['representation']}: "
            f"update+sample {_fmt_x(g['ratio_update_sample'])} ({'met' if g['met_update_sample'] else 'NOT met'}), "
            f"fit+sample {_fmt_x(g['ratio_fit_sample'])} ({'met' if g['met_fit_sample'] else 'NOT met'})"
        )
    print(f"wrote {json_path} and {png_path}")
    return result


if __name__ == "__main__":
    main()
