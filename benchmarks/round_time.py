r"""Wall time and peak memory of one full DP-FTS-DE round, phase by phase.

A round for ``N`` agents (``n`` observations each, ``d`` dimensions, ``M``
shared features):

* ``posterior_update`` — every agent adds its new observation to its RFF
  posterior (rank-one / row-append update, all agents batched);
* ``sampling`` — every agent draws ``ω_n``;
* ``server`` — the DP server aggregates (``P`` regions, Poisson sampling, clipping, noise);
* ``acq_server`` — maximize the broadcast ``φ(x)ᵀω^(i[x])`` (shared by all agents);
* ``gp_update`` — every agent's GP rebuilt on its new data (no hyperparameter fit);
* ``acq_own`` — every agent maximizes a Thompson sample of its own GP (upper
  bound: in a real round only a fraction ``p_t`` of agents do this);
* ``gp_refit`` — warm-started hyperparameter refit of all GPs, done every
  ``refit_every`` rounds; the round total includes ``gp_refit / refit_every``.

Each cell runs in a fresh subprocess so its peak memory (max RSS on CPU,
``torch.cuda.max_memory_allocated`` on CUDA) is its own. A cell whose
predicted time (linear in N from the previous cell) exceeds ``--cell-budget``
seconds is skipped and marked so.

Usage::

    python benchmarks/round_time.py                 # the full grid on CPU
    python benchmarks/round_time.py --device cuda   # on a GPU
    python benchmarks/round_time.py --quick         # seconds; used by the tests
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
def run_cell(N: int, M: int, d: int, n: int, device: str, repeats: int, refit_every: int) -> dict:
    """Time one round for one (N, M, d) cell in this process."""
    import torch

    from fbo_torch import RandomFourierFeatures, RFFBayesianLinear
    from fbo_torch.federation import DPAggregator, SubRegionPartition, exploration_weights
    from fbo_torch.models.agent_gp import fit_agent_gps
    from fbo_torch.runners.common import Domain, maximize_broadcast, maximize_own_samples
    from fbo_torch.runners.settings import MethodSettings

    dev = torch.device(device)
    f64 = torch.float64
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    X = torch.rand(N, n + 1, d, generator=gen, dtype=f64)
    Y = (torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(N, n + 1, 1, generator=gen, dtype=f64))
    X, Y = X.to(dev), Y.to(dev)
    bounds = torch.tensor([[0.0] * d, [1.0] * d], dtype=f64, device=dev)
    domain = Domain(bounds)
    P = 4 if d >= 2 else 2
    part = SubRegionPartition(bounds, P)
    W = exploration_weights(part.membership(part.assign_agents(N)), 16.0, 1.0).to(dev)
    server = DPAggregator(0.35, 22.0, 1.0, W)
    rff = RandomFourierFeatures(d, M, lengthscale=0.1, seed=0, device=dev)
    gp = fit_agent_gps(X[:, :n], Y[:, :n])
    hyper = {k: v for k, v in gp.state_dict().items() if k.startswith(("covar_module.", "likelihood.", "mean_module."))}

    def one_round(model: RFFBayesianLinear) -> dict:
        t = {}

        def clock(name, fn):
            sync()
            t0 = time.perf_counter()
            out = fn()
            sync()
            t[name] = time.perf_counter() - t0
            return out

        clock("posterior_update", lambda: model.update(X[:, n:], Y[:, n:]))
        omegas = clock("sampling", lambda: model.sample_weights(generator=gen))
        bc = clock("server", lambda: server.aggregate(omegas.unsqueeze(0), round=1, generator=gen))
        clock("acq_server", lambda: maximize_broadcast(rff, bc, part.region_bounds(), domain, generator=gen))
        g = clock("gp_update", lambda: fit_agent_gps(X, Y, previous=hyper, refit=False))
        clock("acq_own", lambda: maximize_own_samples(g, domain, seed=1, generator=gen, num_features=MethodSettings.gp_sample_features))
        clock("gp_refit", lambda: fit_agent_gps(X, Y, previous=hyper, refit=True))
        return t

    def fresh() -> RFFBayesianLinear:
        return RFFBayesianLinear(rff, X[:, :n], Y[:, :n], 1e-2).reserve(1)  # as the runners reserve T rounds

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    one_round(fresh())  # warm-up (allocator, kernels, imports)
    runs = [one_round(fresh()) for _ in range(repeats)]
    phases = {k: statistics.median(r[k] for r in runs) for k in PHASES}
    total = sum(v for k, v in phases.items() if k != "gp_refit") + phases["gp_refit"] / refit_every
    out = {
        "N": N, "M": M, "d": d, "n": n, "P": P, "repeats": repeats, "refit_every": refit_every,
        "representation": fresh().representation,
        "phases_s": phases, "round_s": total, "round_without_refit_s": total - phases["gp_refit"] / refit_every,
        "per_agent_ms": 1000 * total / N,
        "torch_threads": torch.get_num_threads(),
    }
    if dev.type == "cuda":
        out["peak_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
    else:
        out["peak_memory_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
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
    ap.add_argument("--cell", nargs=3, type=int, metavar=("N", "M", "D"), help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    if args.cell:
        N, M, D = args.cell
        res = run_cell(N, M, D, args.n, args.device, args.repeats or 1, args.refit_every)
        print("CELL_RESULT " + json.dumps(res))
        return 0

    if args.quick:  # two tiny cells in this process (no subprocess start-up)
        args.N, args.M, args.D, args.n = [8], [16], [1, 2], 6
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda but no CUDA device", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or ("quick" if args.quick else args.device)
    cells, last = [], {}
    for M in args.M:
        for D in args.D:
            for N in sorted(args.N):
                key = (M, D)
                if key in last:  # cell time ~ (repeats + warm-up) rounds incl. a full refit, linear in N
                    prevN, prevT = last[key]
                    predicted = prevT * N / prevN * (4 if N <= 1000 else 2) + 15
                    if predicted > args.cell_budget:
                        cells.append({"N": N, "M": M, "d": D, "skipped": f"predicted {predicted:.0f} s > budget {args.cell_budget:.0f} s"})
                        print(f"N={N:>6} M={M:>5} D={D:>2}  skipped (predicted {predicted:.0f} s)", flush=True)
                        continue
                repeats = 3 if N <= 1000 else 1
                if args.quick:
                    t0 = time.perf_counter()
                    res = run_cell(N, M, D, args.n, args.device, 1, args.refit_every)
                    res["cell_wall_s"] = time.perf_counter() - t0
                    cells.append(res)
                    print(f"N={N:>6} M={M:>5} D={D:>2}  round {res['round_s']:8.3f} s", flush=True)
                    continue
                cmd = [sys.executable, __file__, "--cell", str(N), str(M), str(D), "--n", str(args.n),
                       "--device", args.device, "--repeats", str(repeats), "--refit-every", str(args.refit_every)]
                if args.threads:
                    cmd += ["--threads", str(args.threads)]
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
                wall = time.perf_counter() - t0
                line = [ln for ln in proc.stdout.splitlines() if ln.startswith("CELL_RESULT ")]
                if proc.returncode != 0 or not line:
                    err = (proc.stderr.strip().splitlines() or ["?"])[-1]
                    cells.append({"N": N, "M": M, "d": D, "failed": err})
                    print(f"N={N:>6} M={M:>5} D={D:>2}  failed: {err}", flush=True)
                    last[key] = (N, math.inf)
                    continue
                res = json.loads(line[0][len("CELL_RESULT "):])
                res["cell_wall_s"] = wall
                cells.append(res)
                last[key] = (N, sum(res["phases_s"].values()))
                ph = res["phases_s"]
                print(
                    f"N={N:>6} M={M:>5} D={D:>2}  round {res['round_s']:8.3f} s  ({res['per_agent_ms']:.3f} ms/agent)  "
                    + "  ".join(f"{k}={ph[k]:.3f}" for k in PHASES)
                    + f"  peak {res['peak_memory_mb']:.0f} MB  [{res['representation']}]",
                    flush=True,
                )
    result = {"benchmark": "round_time", "machine": machine_info(args.device), "settings": vars(args) | {"out": str(args.out)}, "cells": cells}
    json_path = args.out / f"round_time_{tag}.json"
    json_path.write_text(json.dumps(result, indent=1, default=str))
    plot(result, args.out / f"round_time_{tag}.png")
    print(f"wrote {json_path}")
    return 0


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [c for c in result["cells"] if "round_s" in c]
    if not ok:
        return
    Ms = sorted({c["M"] for c in ok})
    fig, axes = plt.subplots(1, len(Ms) + 1, figsize=(5 * (len(Ms) + 1), 3.8), squeeze=False)
    for ax, M in zip(axes[0], Ms):
        for D in sorted({c["d"] for c in ok if c["M"] == M}):
            pts = sorted((c["N"], c["round_s"]) for c in ok if c["M"] == M and c["d"] == D)
            ax.loglog(*zip(*pts), "o-", label=f"D={D}")
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
