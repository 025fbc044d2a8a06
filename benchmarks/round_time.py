r"""Wall time, operator counts and peak memory of one full DP-FTS-DE round, phase by phase.

A round for ``N`` agents (``n`` observations each, ``d`` dimensions, ``M``
shared features), run with the engine the runners use
(:class:`~fbo_torch.federation.agents.Agents`,
:class:`~fbo_torch.federation.server.DPFTSDEServer`):

* ``posterior_update`` — every agent adds its new observation (data, RFF posterior row append);
* ``sampling`` — every agent draws ``ω_n`` (keyed streams);
* ``server`` — the DP server aggregates (``P`` regions, Poisson sampling, clipping,
  noise) and the ledger accounts the release;
* ``acq_server`` — maximize the broadcast ``φ(x)ᵀω^(i[x])`` (shared by all agents);
* ``gp_update`` — every agent's GP on its new data (no hyperparameter fit): Cholesky;
* ``acq_own`` — every agent maximizes a Thompson sample of its own GP (upper
  bound: in a real round only a fraction ``p_t`` of agents use it);
* ``gp_refit`` — warm-started hyperparameter refit of all GPs (batched BFGS),
  done every ``refit_every`` rounds; the round total includes ``gp_refit / refit_every``.

``--ops`` also counts, per phase, the operators torch dispatches (``torch.profiler``
on any device): on a GPU each non-view operator is about one kernel launch,
so a round whose count does not grow with ``N`` cannot become launch-bound.
It also counts host synchronizations (``aten::_local_scalar_dense``, i.e.
``.item()``/``bool()``, and ``aten::nonzero``). ``--profile`` on CUDA measures
real kernel launches, synchronizations and GPU busy time per phase.

Each cell runs in a fresh subprocess so its peak memory (max RSS on CPU,
``torch.cuda.max_memory_allocated`` on CUDA) is its own. A cell whose
predicted time (linear in N from the previous cell) exceeds ``--cell-budget``
seconds is skipped and marked so.

Usage::

    python benchmarks/round_time.py                          # the full grid on CPU
    python benchmarks/round_time.py --device cuda --profile  # on a GPU
    python benchmarks/round_time.py --ops --N 100 1000 --M 100 --D 3 --max-points cuda --tag ops
    python benchmarks/round_time.py --quick                  # seconds; used by the tests
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("posterior_update", "sampling", "server", "acq_server", "gp_update", "acq_own", "gp_refit")


def machine_info(device: str) -> dict:
    import numpy
    import torch

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "device": device,
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name] + sys.argv),
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


# ---------------------------------------------------------------------- cell
def profile_cuda(fn) -> dict:
    """Kernel launches, synchronizations, device-host copies and GPU busy time of ``fn()`` on CUDA."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ev = prof.key_averages()
    launches = sum(
        e.count
        for e in ev
        if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
    )
    syncs = sum(e.count for e in ev if "Synchronize" in e.key)
    copies = sum(e.count for e in ev if e.key in ("cudaMemcpyAsync", "cudaMemcpy"))
    dev_time = lambda e: getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0))  # noqa: E731
    kernels = sorted((e for e in ev if e.device_type == torch.autograd.DeviceType.CUDA), key=dev_time, reverse=True)
    busy = sum(dev_time(e) for e in kernels)
    top = [{"kernel": e.key[:90], "ms": dev_time(e) / 1e3, "count": e.count} for e in kernels[:6]]
    return {
        "kernel_launches": launches,
        "syncs": syncs,
        "memcpys": copies,
        "gpu_busy_ms": busy / 1e3,
        "top_kernels": top,
    }


def run_cell(
    N: int,
    M: int,
    d: int,
    n: int,
    device: str,
    repeats: int,
    refit_every: int,
    ops: bool = False,
    profile: bool = False,
    max_points: int | None = None,
    max_memory: str | None = None,
) -> dict:
    """Time one round for one (N, M, d) cell in this process (agents' own steps in the chunks
    ``max_memory`` allows, as a run does)."""
    import torch
    from op_count import count_ops  # benchmarks/op_count.py, next to this script

    from fbo_torch.acquisition.search import maximize_broadcast
    from fbo_torch.federation.agents import Agents
    from fbo_torch.federation.server import DPFTSDEServer
    from fbo_torch.federation.settings import DPFTSDESettings
    from fbo_torch.models.batched_gp import BatchedExactGP
    from fbo_torch.optim.domain import Domain
    from fbo_torch.protocol.keys import federation_agent_keys, federation_keys
    from fbo_torch.simulate.presets import PAPER
    from fbo_torch.utils import keyed_random as kr

    dev = torch.device(device)
    f64 = torch.float64
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    rounds = repeats + 4  # warm-up, timed repeats, the --ops round and the --profile round
    X = torch.rand(N, n + rounds, d, generator=gen, dtype=f64)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(N, n + rounds, 1, generator=gen, dtype=f64)
    X, Y = X.to(dev), Y.to(dev)
    bounds = torch.tensor([[0.0] * d, [1.0] * d], dtype=f64, device=dev)
    domain = Domain(bounds, max_points=max_points)
    P = 4 if d >= 2 else 2
    s = DPFTSDESettings(
        **PAPER,  # the papers' round (Thompson samples of BoTorch's GP), as every committed timing
        num_regions=P,
        sample_rate=0.35,
        clip_norm=22.0,
        noise_multiplier=1.0,
        num_features=M,
        rff_lengthscale=0.1,
        gp_refit_every=refit_every,
        num_iterations=rounds,
        const_rounds=10,
        decay_rounds=30,
    )
    try:
        import opacus  # noqa: F401

        accountant = "rdp"
    except ImportError:  # the GPU machines have no opacus: the mechanism runs, nothing is accounted
        accountant = None
    keys = federation_agent_keys(0, torch.zeros(N, dtype=torch.long, device=dev), torch.arange(N, device=dev))
    server = DPFTSDEServer(N, bounds, s, federation_keys(0, torch.arange(1, device=dev)), accountant=accountant)
    features = s.features(d, device=dev)
    agents = Agents(keys, X[:, :n], Y[:, :n], domain, s, features, capacity=rounds, max_memory=max_memory)
    agents.in_chunks(lambda part, rows: (part.gp().y_mean,))  # the first fit (cold start) is not a round's work
    F = s.gp_sample_features

    clocks: list[dict] = []

    def phases_of(t: int) -> dict:
        state = {}

        def own():
            paths = state["gp"].draw_paths(agents.round_keys(t, "own-sample"), num_features=F)
            return domain.maximize(paths, N, keys=agents.round_keys(t, "own-maximize"))

        def gp_update():
            state["gp"] = agents.gp(refit=False)
            return state["gp"].cholesky

        def own_steps():
            # per chunk of agents (all at once when they fit the budget): the GP on the new data, then
            # the sample's maximization; the two phases' times are summed over the chunks
            clock = {"gp_update": 0.0, "acq_own": 0.0}

            def step(part, rows):
                sync()
                t0 = time.perf_counter()
                gp = part.gp(refit=False)
                _ = gp.cholesky  # the factorization is the phase's work
                sync()
                t1 = time.perf_counter()
                paths = gp.draw_paths(part.round_keys(t, "own-sample"), num_features=F)
                out = part.domain.maximize(paths, part.num_agents, keys=part.round_keys(t, "own-maximize"))
                sync()
                clock["gp_update"] += t1 - t0
                clock["acq_own"] += time.perf_counter() - t1
                return out

            agents.in_chunks(step)
            clocks.append(clock)

        def refit():
            def step(part, rows):
                data = part._gp_data()
                gp = BatchedExactGP(
                    *data[:2], bounds, spec=part.gp_spec, mask=data[2], params=part.gp_params, validate=False
                )
                return (gp.fit(s.gp_fit_maxiter).params,)

            agents.in_chunks(step)

        def server_round():
            server.plan(t, 0.5)
            state["bc"] = server.release(state["omega"].view(1, N, M))

        def sample():
            state["omega"] = agents.message(t)

        return {
            "posterior_update": lambda: agents.observe(X[:, n + t - 1], Y[:, n + t - 1, 0]),
            "sampling": sample,
            "server": server_round,
            "acq_server": lambda: maximize_broadcast(
                features, state["bc"], server.region_bounds, domain, keys=kr.fold(server.keys, t)
            ),
            **(
                {"gp_update": gp_update, "acq_own": own}
                if len(agents.chunks()) == 1
                else {"own_steps": own_steps}  # gp_update and acq_own, timed inside (chunk by chunk)
            ),
            "gp_refit": refit,
        }

    def one_round(t: int, measure: str = "time") -> dict:
        out = {}
        for name, fn in phases_of(t).items():
            if measure == "ops":
                out[name] = count_ops(fn)
            elif measure == "cuda":
                out[name] = profile_cuda(fn)
            else:
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                out[name] = time.perf_counter() - t0
        if "own_steps" in out:  # chunked: the two phases timed inside, summed over the chunks
            if measure != "time":
                raise SystemExit("--ops/--profile count one chunk of agents: raise --max-memory")
            out.pop("own_steps")
            out.update(clocks[-1])
        return out

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    one_round(1)  # warm-up (allocator, kernels, imports)
    runs = [one_round(t) for t in range(2, 2 + repeats)]
    phases = {k: statistics.median(r[k] for r in runs) for k in PHASES}
    total = sum(v for k, v in phases.items() if k != "gp_refit") + phases["gp_refit"] / refit_every
    out = {
        "N": N,
        "M": M,
        "d": d,
        "n": n,
        "P": P,
        "repeats": repeats,
        "refit_every": refit_every,
        "representation": agents.rff.representation,
        "max_points": domain.max_points,
        "phases_s": phases,
        "round_s": total,
        "round_without_refit_s": total - phases["gp_refit"] / refit_every,
        "per_agent_ms": 1000 * total / N,
        "torch_threads": torch.get_num_threads(),
        "accounted": accountant is not None,
    }
    if dev.type == "cuda":
        out["peak_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
    else:
        out["peak_memory_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if ops:
        counts = one_round(2 + repeats, measure="ops")
        out["ops"] = counts
        out["round_kernel_ops"] = (
            sum(c["kernel_ops"] for k, c in counts.items() if k != "gp_refit")
            + counts["gp_refit"]["kernel_ops"] / refit_every
        )
        out["round_syncs"] = (
            sum(c["syncs"] for k, c in counts.items() if k != "gp_refit") + counts["gp_refit"]["syncs"] / refit_every
        )
        out["round_kernel_ops_with_graphs"] = (
            sum(c["kernel_ops_with_graphs"] for k, c in counts.items() if k != "gp_refit")
            + counts["gp_refit"]["kernel_ops_with_graphs"] / refit_every
        )
    if profile and dev.type == "cuda":
        prof = one_round(2 + repeats + int(ops), measure="cuda")  # the round after the last one run
        out["cuda_profile"] = prof
        busy = (
            sum(v["gpu_busy_ms"] for k, v in prof.items() if k != "gp_refit")
            + prof["gp_refit"]["gpu_busy_ms"] / refit_every
        )
        out["gpu_busy_fraction"] = busy / 1e3 / total
    return out


# ---------------------------------------------------------------------- grid
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--N", type=int, nargs="+", default=[10, 100, 1000, 10000])
    ap.add_argument("--M", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--D", type=int, nargs="+", default=[1, 3, 10])
    ap.add_argument("--n", type=int, default=20, help="observations per agent")
    ap.add_argument("--refit-every", type=int, default=5)
    ap.add_argument("--cell-budget", type=float, default=240.0, help="skip cells predicted to take longer (s)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--tag", default=None, help="suffix of the output files (default: device)")
    ap.add_argument("--quick", action="store_true", help="tiny grid, a few seconds")
    ap.add_argument(
        "--scale",
        action="store_true",
        help="the scale grid: N = 100 ... 100,000 at M = 100, D = 3 (tag scale_DEVICE), plotted per agent",
    )
    ap.add_argument(
        "--max-memory",
        default=None,
        help="working-memory budget of a round's own steps (e.g. 2GiB; default: half the free memory)",
    )
    ap.add_argument("--cell", nargs=3, type=int, metavar=("N", "M", "D"), help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--ops", action="store_true", help="also count operators and host syncs per phase (torch.profiler)")
    ap.add_argument(
        "--profile", action="store_true", help="on CUDA: kernel launches, syncs and GPU busy time per phase"
    )
    ap.add_argument(
        "--max-points",
        default=None,
        help="scoring chunk cap: an integer, 'cuda' (the GPU default, for CPU op-count proxies) or default by device",
    )
    args = ap.parse_args(argv)
    if args.max_points == "cuda":
        from fbo_torch.optim.batched import DEFAULT_MAX_POINTS_CUDA

        args.max_points = DEFAULT_MAX_POINTS_CUDA
    elif args.max_points is not None:
        args.max_points = int(args.max_points)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    if args.cell:
        N, M, D = args.cell
        res = run_cell(
            N,
            M,
            D,
            args.n,
            args.device,
            args.repeats or 1,
            args.refit_every,
            args.ops,
            args.profile,
            args.max_points,
            args.max_memory,
        )
        print("CELL_RESULT " + json.dumps(res))
        return 0

    if args.scale:
        args.N, args.M, args.D = args.N if args.N != [10, 100, 1000, 10000] else [100, 1000, 10000, 100000], [100], [3]
        args.cell_budget = max(args.cell_budget, 3600.0)
    if args.quick:  # two tiny cells in this process (no subprocess start-up)
        args.N, args.M, args.D, args.n = [8], [16], [1, 2], 6
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda but no CUDA device", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or ("quick" if args.quick else f"scale_{args.device}" if args.scale else args.device)
    cells, last = [], {}
    for M in args.M:
        for D in args.D:
            for N in sorted(args.N):
                key = (M, D)
                if key in last:  # cell time ~ (repeats + warm-up) rounds incl. a full refit, linear in N
                    prevN, prevT = last[key]
                    predicted = prevT * N / prevN * (4 if N <= 1000 else 2) + 15
                    if predicted > args.cell_budget:
                        cells.append(
                            {
                                "N": N,
                                "M": M,
                                "d": D,
                                "skipped": f"predicted {predicted:.0f} s > budget {args.cell_budget:.0f} s",
                            }
                        )
                        print(f"N={N:>6} M={M:>5} D={D:>2}  skipped (predicted {predicted:.0f} s)", flush=True)
                        continue
                repeats = 3 if N <= 1000 else 1
                if args.quick:
                    t0 = time.perf_counter()
                    res = run_cell(
                        N, M, D, args.n, args.device, 1, args.refit_every, args.ops, args.profile, args.max_points
                    )
                    res["cell_wall_s"] = time.perf_counter() - t0
                    cells.append(res)
                    print(f"N={N:>6} M={M:>5} D={D:>2}  round {res['round_s']:8.3f} s", flush=True)
                    continue
                cmd = [
                    sys.executable,
                    __file__,
                    "--cell",
                    str(N),
                    str(M),
                    str(D),
                    "--n",
                    str(args.n),
                    "--device",
                    args.device,
                    "--repeats",
                    str(repeats),
                    "--refit-every",
                    str(args.refit_every),
                ]
                if args.threads:
                    cmd += ["--threads", str(args.threads)]
                if args.ops:
                    cmd += ["--ops"]
                if args.profile:
                    cmd += ["--profile"]
                if args.max_points is not None:
                    cmd += ["--max-points", str(args.max_points)]
                if args.max_memory is not None:
                    cmd += ["--max-memory", str(args.max_memory)]
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
                wall = time.perf_counter() - t0
                line = [ln for ln in proc.stdout.splitlines() if ln.startswith("CELL_RESULT ")]
                if proc.returncode != 0 or not line:
                    err = (proc.stderr.strip().splitlines() or ["?"])[-1]
                    cells.append({"N": N, "M": M, "d": D, "failed": err})
                    _write(args, tag, cells)
                    print(f"N={N:>6} M={M:>5} D={D:>2}  failed: {err}", flush=True)
                    last[key] = (N, math.inf)
                    continue
                res = json.loads(line[0][len("CELL_RESULT ") :])
                res["cell_wall_s"] = wall
                cells.append(res)
                _write(args, tag, cells)
                last[key] = (N, sum(res["phases_s"].values()))
                ph = res["phases_s"]
                print(
                    f"N={N:>6} M={M:>5} D={D:>2}  round {res['round_s']:8.3f} s  ({res['per_agent_ms']:.3f} ms/agent)  "
                    + "  ".join(f"{k}={ph[k]:.3f}" for k in PHASES)
                    + f"  peak {res['peak_memory_mb']:.0f} MB  [{res['representation']}]"
                    + (
                        f"  ops/round {res['round_kernel_ops']:.0f} "
                        f"(with graphs {res['round_kernel_ops_with_graphs']:.0f})"
                        f" syncs {res['round_syncs']:.1f}"
                        if "ops" in res
                        else ""
                    )
                    + (f"  GPU busy {100 * res['gpu_busy_fraction']:.0f}%" if "gpu_busy_fraction" in res else ""),
                    flush=True,
                )
    json_path, result = _write(args, tag, cells)
    (plot_scale if args.scale else plot)(result, args.out / f"round_time_{tag}.png")
    print(f"wrote {json_path}")
    return 0


def _write(args: argparse.Namespace, tag: str, cells: list[dict]) -> tuple[Path, dict]:
    """Write the cells run so far (after every cell run: a run stopped at a time limit keeps them);
    the path and the result written."""
    result = {
        "benchmark": "round_time",
        "machine": machine_info(args.device),
        "settings": vars(args) | {"out": str(args.out)},
        "cells": cells,
    }
    json_path = args.out / f"round_time_{tag}.json"
    json_path.write_text(json.dumps(result, indent=1, default=str))
    return json_path, result


def plot_scale(result: dict, path: Path) -> None:
    """Time per agent (by phase) and peak memory per agent against N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = sorted((c for c in result["cells"] if "round_s" in c), key=lambda c: c["N"])
    if not ok:
        return
    Ns = [c["N"] for c in ok]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    a1.semilogx(Ns, [c["per_agent_ms"] for c in ok], "ko-", label="round")
    for k in PHASES:
        scale = 1 / ok[0]["refit_every"] if k == "gp_refit" else 1
        a1.semilogx(Ns, [1e3 * c["phases_s"][k] * scale / c["N"] for c in ok], ".--", label=k, alpha=0.7)
    a1.set_xlabel("agents N")
    a1.set_ylabel("ms per agent")
    a1.set_ylim(bottom=0)
    a1.grid(alpha=0.3, which="both")
    a1.legend(fontsize=7)
    m = result["machine"]
    a1.set_title(
        f"one DP-FTS-DE round, M={ok[0]['M']}, D={ok[0]['d']} ({m['device']}, {m['torch_threads']} threads)", fontsize=9
    )
    a2.loglog(Ns, [c["peak_memory_mb"] / 1024 for c in ok], "o-")
    for c in ok:
        a2.annotate(f"{c['peak_memory_mb'] / 1024:.1f} GiB", (c["N"], c["peak_memory_mb"] / 1024), fontsize=7)
    budget = result["settings"].get("max_memory")
    a2.set_xlabel("agents N" + (f" (working-memory budget {budget})" if budget else ""))
    a2.set_ylabel("peak memory (GiB)")
    a2.grid(alpha=0.3, which="both")
    a2.set_title("peak memory (max RSS of the cell's process)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [c for c in result["cells"] if "round_s" in c]
    if not ok:
        return
    Ms = sorted({c["M"] for c in ok})
    fig, axes = plt.subplots(1, len(Ms) + 1, figsize=(5 * (len(Ms) + 1), 3.8), squeeze=False)
    for ax, M in zip(axes[0], Ms, strict=False):
        for D in sorted({c["d"] for c in ok if c["M"] == M}):
            pts = sorted((c["N"], c["round_s"]) for c in ok if c["M"] == M and c["d"] == D)
            ax.loglog(*zip(*pts, strict=False), "o-", label=f"D={D}")
        ax.set_title(f"one DP-FTS-DE round, M={M} ({result['machine']['device']})", fontsize=9)
        ax.set_xlabel("agents N")
        ax.set_ylabel("seconds")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    # phase profile of the largest cell per M=min
    ax = axes[0][-1]
    big = max(ok, key=lambda c: (c["N"], -c["M"], c["d"]))
    ph = big["phases_s"]
    ax.barh(list(ph), [ph[k] for k in ph])
    ax.set_title(f"phases at N={big['N']}, M={big['M']}, D={big['d']}", fontsize=9)
    ax.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
