r"""Cost of one iteration of the federated baselines RGPE and TAF as the number of agents N grows.

The FTS paper (Dai et al. 2020, Sec. 3.2) adapts RGPE and TAF to federated BO:
every other agent sends its whole RFF posterior (``M + M²`` numbers; TAF also
its incumbent, ``M + M² + 1``). One iteration of a target agent, as in
``FTSRunner._transfer_step`` (``fbo_torch/simulate/fts.py``), is timed phase by phase:

* ``peers`` — the ``N`` other agents' RFF Bayesian-linear posteriors
  (``RFFBayesianLinear`` on ``n_agent`` observations each, all agents batched)
  and their ``AgentRFFPosteriors``; done once with one-shot communication,
  every iteration with every-round communication;
* ``rgpe_weights`` — ``RGPE.from_data``: the ranking-loss weights from joint
  posterior draws of the target GP (leave-one-out) and of every agent;
* ``rgpe_maximize`` — ``maximize_acquisition`` of LogEI on the RGPE ensemble;
* ``taf_construct`` — ``TransferAcquisitionFunction`` (TST-R weights, incumbents);
* ``taf_maximize`` — ``maximize_acquisition`` of TAF.

The target's GP (``n_target`` observations, fitted like the runner's
``AgentGPs`` and unbatched with ``unbatch_gp``) does not depend on ``N``; its
fit is recorded as ``target_gp`` but left out of the iteration totals
``rgpe_s = peers + rgpe_weights + rgpe_maximize`` and
``taf_s = peers + taf_construct + taf_maximize`` (``*_acq_s``: without ``peers``).
Each phase is warmed up once, then the median of ``--repeats`` runs is kept.
The log-log slope of the totals against ``N`` (least squares over the measured
cells) says whether the cost grows sub-linearly (slope < 1). A cell whose
predicted time (linear in N from the previous cell) exceeds ``--cell-budget``
seconds is skipped and marked so. Cells run in this process, one after another.

Defaults follow the FTS landmine setting (``M`` in 50..200 features, ``D = 2``)
and ``FTSSettings`` (256 RGPE draws, TAF bandwidth 0.5, ``σ² = 0.01``).

Usage::

    python benchmarks/baselines_scaling.py                  # N = 10..1000, M = 100, D = 2 on CPU
    python benchmarks/baselines_scaling.py --device cuda    # on a GPU
    python benchmarks/baselines_scaling.py --threads 1      # one torch thread
    python benchmarks/baselines_scaling.py --quick          # seconds; used by the tests

Writes ``benchmarks/results/baselines_scaling_<device>.json`` and ``.png``
(``baselines_scaling_<device>_quick.*`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from round_time import machine_info  # sibling script: benchmarks/ is sys.path[0] when run

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("target_gp", "peers", "rgpe_weights", "rgpe_maximize", "taf_construct", "taf_maximize")
TOTALS = {
    "rgpe_s": ("peers", "rgpe_weights", "rgpe_maximize"),
    "taf_s": ("peers", "taf_construct", "taf_maximize"),
    "rgpe_acq_s": ("rgpe_weights", "rgpe_maximize"),
    "taf_acq_s": ("taf_construct", "taf_maximize"),
}


# ---------------------------------------------------------------------- cell
def run_cell(
    N: int,
    M: int,
    d: int,
    n_target: int,
    n_agent: int,
    device: str,
    repeats: int,
    rgpe_samples: int,
    taf_bandwidth: float,
    quick: bool,
) -> dict:
    """Time one target iteration of RGPE and TAF against ``N`` agents, in this process."""
    import torch
    from botorch.acquisition import LogExpectedImprovement

    from fbo_torch.acquisition.rgpe import RGPE
    from fbo_torch.acquisition.taf import TransferAcquisitionFunction
    from fbo_torch.federation.settings import FTSSettings
    from fbo_torch.models.agent_posteriors import AgentRFFPosteriors
    from fbo_torch.models.batched_gp import BatchedExactGP
    from fbo_torch.models.rff_blr import RFFBayesianLinear
    from fbo_torch.optim.domain import Domain
    from fbo_torch.simulate.common import maximize_acquisition
    from fbo_torch.simulate.presets import PAPER

    dev = torch.device(device)
    f64 = torch.float64
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    s = FTSSettings(num_features=M, rgpe_samples=rgpe_samples, taf_bandwidth=taf_bandwidth, **PAPER)
    params = {}
    for a in ("rgpe", "taf"):
        sa = FTSSettings(algorithm=a, num_features=M, **PAPER)
        params[a] = sa.method.parameters_per_agent(sa, 2)

    def f(X):  # a smooth 2-D-ish test function shared by the target and its peers
        return torch.sin(5 * X).sum(-1, keepdim=True)

    gen = torch.Generator().manual_seed(0)
    X_a = torch.rand(N, n_agent, d, generator=gen, dtype=f64)
    Y_a = f(X_a) + 0.1 * torch.randn(N, n_agent, 1, generator=gen, dtype=f64)
    X_t = torch.rand(n_target, d, generator=gen, dtype=f64)
    Y_t = f(X_t) + 0.1 * torch.randn(n_target, 1, generator=gen, dtype=f64)
    X_a, Y_a, X_t, Y_t = X_a.to(dev), Y_a.to(dev), X_t.to(dev), Y_t.to(dev)
    bounds = torch.tensor([[0.0] * d, [1.0] * d], dtype=f64, device=dev)
    domain = Domain(bounds, raw_samples=64, num_restarts=2) if quick else Domain(bounds)
    features = s.features(d, device=dev)

    def clock(fn):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        return out, time.perf_counter() - t0

    def target_gp():
        batched = BatchedExactGP(X_t.unsqueeze(0), Y_t.unsqueeze(0), domain.bounds, spec=s.gp_kernel).fit()
        return batched.to_botorch(index=0)

    def peers():
        return AgentRFFPosteriors.from_model(RFFBayesianLinear(features, X_a, Y_a, s.rff_noise_variance))

    def one_iteration() -> dict:
        t = {}
        gp, t["target_gp"] = clock(target_gp)
        post, t["peers"] = clock(peers)
        g = torch.Generator().manual_seed(1)  # the same draws and starts in every repeat
        model, t["rgpe_weights"] = clock(
            lambda: RGPE.from_data(gp, post, X_t, Y_t, num_samples=s.rgpe_samples, generator=g)
        )
        _, t["rgpe_maximize"] = clock(
            lambda: maximize_acquisition(LogExpectedImprovement(model, best_f=Y_t.max()), domain, generator=g)
        )
        taf, t["taf_construct"] = clock(
            lambda: TransferAcquisitionFunction(gp, post, X_t, Y_t, bandwidth=s.taf_bandwidth)
        )
        _, t["taf_maximize"] = clock(lambda: maximize_acquisition(taf, domain, generator=g))
        return t

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    one_iteration()  # warm-up (allocator, kernels, lazy imports)
    runs = [one_iteration() for _ in range(repeats)]
    phases = {k: statistics.median(r[k] for r in runs) for k in PHASES}
    out = {
        "N": N,
        "M": M,
        "d": d,
        "n_target": n_target,
        "n_agent": n_agent,
        "device": device,
        "repeats": repeats,
        "rgpe_samples": s.rgpe_samples,
        "taf_bandwidth": s.taf_bandwidth,
        "raw_samples": domain.raw_samples,
        "num_restarts": domain.num_restarts,
        "phases_s": phases,
        **{k: sum(phases[p] for p in ps) for k, ps in TOTALS.items()},
        "parameters_per_agent": params,
        "parameters_received": {a: N * p for a, p in params.items()},
        "torch_threads": torch.get_num_threads(),
    }
    if dev.type == "cuda":
        out["peak_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def loglog_slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``log t`` against ``log N`` (None with fewer than two distinct N)."""
    pts = [(math.log(n), math.log(t)) for n, t in points if n > 0 and t > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def scaling(cells: list[dict]) -> dict:
    """Log-log slope of every total and phase against N over the measured cells."""
    ok = [c for c in cells if "phases_s" in c]
    out = {}
    for key in (*TOTALS, *PHASES):
        get = (lambda c, k=key: c[k]) if key in TOTALS else (lambda c, k=key: c["phases_s"][k])
        slope = loglog_slope([(c["N"], get(c)) for c in ok])
        out[key] = {"slope": slope, "sublinear": None if slope is None else slope < 1.0}
    out["N_fitted"] = [c["N"] for c in ok]
    return out


# ---------------------------------------------------------------------- grid
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--N", type=int, nargs="+", default=[10, 30, 100, 300, 1000], help="numbers of agents")
    ap.add_argument("--M", type=int, default=100, help="random Fourier features")
    ap.add_argument("--D", type=int, default=2, help="input dimensions")
    ap.add_argument("--n-target", type=int, default=20, help="target observations")
    ap.add_argument("--n-agent", type=int, default=50, help="observations per other agent")
    ap.add_argument("--rgpe-samples", type=int, default=256, help="RGPE ranking-loss draws")
    ap.add_argument("--taf-bandwidth", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per cell after one warm-up (median kept)")
    ap.add_argument("--cell-budget", type=float, default=300.0, help="skip cells predicted to take longer (s)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--tag", default=None, help="suffix of the output files (default: device, +_quick)")
    ap.add_argument("--quick", action="store_true", help="tiny grid, a few seconds")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.N, args.M, args.n_target, args.n_agent, args.rgpe_samples, args.repeats = [4, 8], 20, 8, 10, 32, 1
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or (f"{args.device}_quick" if args.quick else args.device)

    cells, last = [], None
    for N in sorted(set(args.N)):
        if last is not None:  # a cell is (warm-up + repeats) iterations, assumed linear in N
            prevN, prevT = last
            predicted = prevT * N / prevN
            if predicted > args.cell_budget:
                cells.append({"N": N, "skipped": f"predicted {predicted:.0f} s > budget {args.cell_budget:.0f} s"})
                print(f"N={N:>6}  skipped (predicted {predicted:.0f} s > {args.cell_budget:.0f} s)", flush=True)
                continue
        t0 = time.perf_counter()
        res = run_cell(
            N,
            args.M,
            args.D,
            args.n_target,
            args.n_agent,
            args.device,
            args.repeats,
            args.rgpe_samples,
            args.taf_bandwidth,
            args.quick,
        )
        res["cell_wall_s"] = time.perf_counter() - t0
        cells.append(res)
        last = (N, res["cell_wall_s"])
        ph = res["phases_s"]
        print(
            f"N={N:>6} M={args.M} D={args.D}  RGPE {res['rgpe_s']:8.4f} s  TAF {res['taf_s']:8.4f} s  | "
            + "  ".join(f"{k}={ph[k]:.4f}" for k in PHASES),
            flush=True,
        )

    slopes = scaling(cells)
    for key, name in (
        ("rgpe_s", "RGPE"),
        ("taf_s", "TAF"),
        ("rgpe_acq_s", "RGPE w/o peers"),
        ("taf_acq_s", "TAF w/o peers"),
    ):
        sl = slopes[key]["slope"]
        if sl is None:
            print(f"{name:>15}: log-log slope n/a (fewer than two measured cells)")
        else:
            verdict = "sub-linear" if sl < 1.0 else "linear or faster"
            print(f"{name:>15}: log-log slope {sl:.3f} over N={slopes['N_fitted']} -> {verdict} growth in N")
    M = args.M
    result = {
        "benchmark": "baselines_scaling",
        "machine": machine_info(args.device),
        "settings": vars(args) | {"out": str(args.out)},
        "parameters_per_agent": {"rgpe": M + M * M, "taf": M + M * M + 1},
        "cells": cells,
        "scaling": slopes,
    }
    json_path = args.out / f"baselines_scaling_{tag}.json"
    json_path.write_text(json.dumps(result, indent=1, default=str))
    plot(result, args.out / f"baselines_scaling_{tag}.png")
    print(f"wrote {json_path}")
    return 0


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = sorted((c for c in result["cells"] if "phases_s" in c), key=lambda c: c["N"])
    if not ok:
        return
    s, sc = result["settings"], result["scaling"]
    Ns = [c["N"] for c in ok]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8))
    for key, label, style in (
        ("rgpe_s", "RGPE", "o-"),
        ("taf_s", "TAF", "s-"),
        ("rgpe_acq_s", "RGPE w/o peers", "o:"),
        ("taf_acq_s", "TAF w/o peers", "s:"),
    ):
        sl = sc[key]["slope"]
        ax.loglog(Ns, [c[key] for c in ok], style, label=label + ("" if sl is None else f" (slope {sl:.2f})"))
    t0 = ok[0]["rgpe_s"]
    ax.loglog(Ns, [t0 * n / Ns[0] for n in Ns], "k--", alpha=0.5, label="∝ N (linear)")
    ax.set_title(f"one iteration, M={s['M']}, D={s['D']} ({result['machine']['device']})", fontsize=9)
    ax.set_xlabel("agents N")
    ax.set_ylabel("seconds")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    for k in PHASES:
        bx.loglog(Ns, [c["phases_s"][k] for c in ok], "o-", label=k)
    bx.set_title("phases", fontsize=9)
    bx.set_xlabel("agents N")
    bx.grid(alpha=0.3, which="both")
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
