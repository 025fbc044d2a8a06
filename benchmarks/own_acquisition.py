r"""The own-GP branch with LogEI: the batched maximizer against per-agent ``optimize_acqf``.

With ``own_acquisition: logei`` every agent maximizes BoTorch's
``LogExpectedImprovement`` of its own GP. The engine does it for all agents in
one :meth:`~fbo_torch.optim.domain.Domain.maximize` call on
:class:`~fbo_torch.acquisition.batched.BatchedLogExpectedImprovement`; the
library's way is one ``optimize_acqf(LogExpectedImprovement(gp.to_botorch(b), best_f))``
per agent. On the same fitted GPs (``n = 10 d`` noisy observations of
``Σ sin(ν x_j)`` per agent, ``ν = 6`` (smooth) and ``20`` (several optima per
dimension), a new data set per seed) both run, and each point
found is scored with BoTorch's ``LogExpectedImprovement``:

* ``batched``: the engine's :class:`~fbo_torch.optim.domain.Domain` defaults
  (1024 raw points, 16 restarts, 25 BFGS iterations), all agents in one call;
  ``batched_64x100``: 64 restarts, 100 iterations;
* ``optimize_acqf``: the same raw-point and restart budget, one call per agent;
* ``optimize_acqf_512x10``: BoTorch's customary ``raw_samples=512, num_restarts=10``.

Reported per dimension and reference: the fraction of agents where a batched
value is at least the reference's minus ``1e-4`` (in log EI: 0.01 % of EI), the
mean and the worst of ``batched − reference``, and the wall time per round (all
agents, after an untimed warm-up; ``optimize_acqf``'s time excludes building the BoTorch models).

Usage::

    python benchmarks/own_acquisition.py            # 8 agents x 2 data sets, d = 2 and 5, one thread (~40 s CPU)
    python benchmarks/own_acquisition.py --quick    # seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

TOL = 1e-4  # log-EI tolerance of "at least as good"


def one_dim(d: int, K: int, seeds: int, device: torch.device, freq: float = 6.0) -> list[dict]:
    """Rows of one (dimension, frequency): each batched variant against each per-agent reference."""
    from botorch.acquisition import LogExpectedImprovement
    from botorch.optim import optimize_acqf

    from fbo_torch.acquisition.batched import BatchedLogExpectedImprovement
    from fbo_torch.models.batched_gp import BatchedExactGP
    from fbo_torch.optim.domain import Domain

    f64 = torch.float64
    bounds = torch.tensor([[0.0] * d, [1.0] * d], dtype=f64, device=device)
    dom = Domain(bounds)
    ours = {"batched": dom, "batched_64x100": dataclasses.replace(dom, num_restarts=64, maxiter=100)}
    refs = {"optimize_acqf": (dom.raw_samples, dom.num_restarts), "optimize_acqf_512x10": (512, 10)}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    vals = {k: [] for k in (*ours, *refs)}
    secs = dict.fromkeys(vals, 0.0)
    for seed in range(seeds):
        g = torch.Generator().manual_seed(1000 * d + seed)
        n = 10 * d
        X = torch.rand(K, n, d, generator=g, dtype=f64).to(device)
        Y = torch.sin(freq * X).sum(-1, keepdim=True) + 0.1 * torch.randn(K, n, 1, generator=g, dtype=f64).to(device)
        gp = BatchedExactGP(X, Y, bounds).fit(maxiter=60)
        best = Y.squeeze(-1).amax(-1)
        ref_acq = [LogExpectedImprovement(gp.to_botorch(b), best_f=best[b]) for b in range(K)]

        def score(points: torch.Tensor, ref_acq=ref_acq) -> torch.Tensor:  # K x d -> K, BoTorch's LogEI of each agent
            with torch.no_grad():
                return torch.stack([ref_acq[b](points[b].view(1, 1, d)).reshape(()) for b in range(K)])

        if seed == 0:  # warm-up, untimed (first calls: allocator, caches, lazy imports)
            dom.maximize(BatchedLogExpectedImprovement(gp.posterior_moments(), best), K, keys=torch.arange(K))
            optimize_acqf(ref_acq[0], bounds, q=1, num_restarts=2, raw_samples=16)
        for label, dom_ in ours.items():
            sync()
            t0 = time.perf_counter()
            acq = BatchedLogExpectedImprovement(gp.posterior_moments(), best)
            Xb, _ = dom_.maximize(acq, K, keys=torch.arange(K, device=device) + 7919 * seed)
            sync()
            secs[label] += time.perf_counter() - t0
            vals[label].append(score(Xb))
        for label, (raw, restarts) in refs.items():
            pts = []
            t0 = time.perf_counter()
            for b in range(K):
                torch.manual_seed(b + 7919 * seed)
                x, _ = optimize_acqf(ref_acq[b], bounds, q=1, num_restarts=restarts, raw_samples=raw)
                pts.append(x.reshape(d))
            sync()
            secs[label] += time.perf_counter() - t0
            vals[label].append(score(torch.stack(pts)))
    rows = []
    for label in vals:
        v = torch.cat(vals[label])
        row = {
            "d": d,
            "frequency": freq,
            "agents": K,
            "data_sets": seeds,
            "method": label,
            "seconds_per_round": secs[label] / seeds,
            "mean_logei": v.mean().item(),
        }
        if label in refs:
            row["raw_samples"], row["num_restarts"] = refs[label]
            for mine in ours:
                diff = torch.cat(vals[mine]) - v
                row[mine] = {
                    "at_least_ref": (diff >= -TOL).float().mean().item(),
                    "mean_minus_ref": diff.mean().item(),
                    "worst_minus_ref": diff.min().item(),
                }
        else:
            row["raw_samples"], row["num_restarts"], row["maxiter"] = (
                ours[label].raw_samples,
                ours[label].num_restarts,
                ours[label].maxiter,
            )
        rows.append(row)
        extra = "".join(
            f"  {mine}: {100 * row[mine]['at_least_ref']:5.1f}% >= it, mean {row[mine]['mean_minus_ref']:+.1e}, "
            f"worst {row[mine]['worst_minus_ref']:+.1e}"
            for mine in ours
            if mine in row
        )
        print(
            f"d={d} sin({freq:g}x) {label:<21} {row['seconds_per_round']:6.3f} s/round  mean logEI "
            f"{row['mean_logei']:8.4f}{extra}",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    from round_time import machine_info

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--data-sets", type=int, default=2)
    ap.add_argument("--dims", type=int, nargs="+", default=[2, 5])
    ap.add_argument("--frequencies", type=float, nargs="+", default=[6.0, 20.0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steady on a shared machine)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*(jit|Optimization failed).*")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.agents, args.data_sets, args.dims, args.frequencies = 3, 1, [2], [6.0]
    device = torch.device(args.device)
    rows = []
    for d in args.dims:
        for freq in args.frequencies:
            rows += one_dim(d, args.agents, args.data_sets, device, freq)
    result = {"benchmark": "own_acquisition", "machine": machine_info(args.device), "tolerance": TOL, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"own_acquisition_{'quick' if args.quick else args.device}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
