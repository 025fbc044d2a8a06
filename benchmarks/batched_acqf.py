r"""Many acquisition functions, one call: ``optimize_acqf_batched`` against per-problem ``optimize_acqf``.

``B`` independent problems (one GP each, 4-D, 20 observations of a randomly
shifted sum of sines), fitted once (:class:`~fbo_torch.models.BatchedExactGP`)
and exported twice with the same hyperparameters: as one batched
``SingleTaskGP`` (``batch_shape = [B]``) and as ``B`` unbatched ones. For
BoTorch's ``UpperConfidenceBound`` (β = 2), ``LogExpectedImprovement`` (each
problem's incumbent) and ``PosteriorMean``:

* ``batched``: :func:`fbo_torch.optim.optimize_acqf_batched` on the batched model, one call;
* ``optimize_acqf``: BoTorch's ``optimize_acqf``, one call per problem on its own model,

with the same budget (``raw_samples`` raw points and ``num_restarts`` restarts per
problem). Quality is paired: each problem's acquisition (its unbatched one) at
both methods' candidates, difference batched − per-problem. Time is the wall
time and the process's CPU time of all ``B`` problems, each the median of
``--repeats`` runs (the same seeds, so the same candidates). On a shared machine
wall times vary several-fold with the other processes' load; CPU time much less.

Usage::

    python benchmarks/batched_acqf.py                 # B = 4, 16, 64 on the CPU
    python benchmarks/batched_acqf.py --device cuda
    python benchmarks/batched_acqf.py --quick         # seconds; used by the tests
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

ACQUISITIONS = ("UpperConfidenceBound", "LogExpectedImprovement", "PosteriorMean")


def problems(B: int, d: int, n: int, device: torch.device, seed: int = 0):
    """``(batched SingleTaskGP, [B unbatched ones], train_Y, bounds)`` with equal hyperparameters."""
    from fbo_torch.models import BatchedExactGP

    f64 = torch.float64
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(B, n, d, generator=g, dtype=f64)
    shift = torch.rand(B, 1, d, generator=g, dtype=f64) * 6
    Y = torch.sin(5 * X + shift).sum(-1, keepdim=True) + 0.05 * torch.randn(B, n, 1, generator=g, dtype=f64)
    X, Y = X.to(device), Y.to(device)
    bounds = torch.tensor([[0.0] * d, [1.0] * d], dtype=f64, device=device)
    gp = BatchedExactGP(X, Y, bounds).fit()
    return gp.to_botorch(), [gp.to_botorch(b) for b in range(B)], Y, bounds


def acquisition(name: str, model, best_f):
    from botorch.acquisition import LogExpectedImprovement, PosteriorMean, UpperConfidenceBound

    if name == "UpperConfidenceBound":
        return UpperConfidenceBound(model, beta=2.0)
    if name == "LogExpectedImprovement":
        return LogExpectedImprovement(model, best_f=best_f)
    return PosteriorMean(model)


def run(B: int, device: torch.device, d: int, n: int, raw_samples: int, num_restarts: int, repeats: int) -> list[dict]:
    from botorch.optim import optimize_acqf

    from fbo_torch.optim import optimize_acqf_batched

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    batched, singles, Y, bounds = problems(B, d, n, device)
    rows = []
    for name in ACQUISITIONS:
        single_acqfs = [acquisition(name, m, Y[b].max()) for b, m in enumerate(singles)]
        acqf = acquisition(name, batched, Y.amax(-2))  # best_f: B x 1
        times_b, times_s, cpu_b, cpu_s = [], [], [], []
        for _ in range(repeats):  # the same seeds every time: the same candidates, the median time
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            Xb, vb = optimize_acqf_batched(
                acqf, bounds, num_restarts=num_restarts, raw_samples=raw_samples, options={"seed": 0}
            )
            sync()
            times_b.append(time.perf_counter() - t0)
            cpu_b.append(time.process_time() - c0)
            t0, c0 = time.perf_counter(), time.process_time()
            Xs = []
            for b, a in enumerate(single_acqfs):
                torch.manual_seed(b)
                x, _ = optimize_acqf(a, bounds, q=1, num_restarts=num_restarts, raw_samples=raw_samples)
                Xs.append(x)
            sync()
            times_s.append(time.perf_counter() - t0)
            cpu_s.append(time.process_time() - c0)
        t_batched, t_single = statistics.median(times_b), statistics.median(times_s)
        c_batched, c_single = statistics.median(cpu_b), statistics.median(cpu_s)
        with torch.no_grad():  # both methods' candidates, scored by each problem's own acquisition
            v_batched = torch.cat([a(Xb[b : b + 1]) for b, a in enumerate(single_acqfs)])
            v_single = torch.cat([a(x.unsqueeze(0)) for a, x in zip(single_acqfs, Xs, strict=False)])
        diff = (v_batched - v_single).cpu()
        scale = v_single.abs().cpu().clamp_min(1.0)
        rows.append(
            {
                "B": B,
                "acquisition": name,
                "d": d,
                "n": n,
                "raw_samples": raw_samples,
                "num_restarts": num_restarts,
                "seconds_batched": t_batched,
                "seconds_optimize_acqf": t_single,
                "speedup": t_single / t_batched,
                "cpu_seconds_batched": c_batched,
                "cpu_seconds_optimize_acqf": c_single,
                "cpu_speedup": c_single / c_batched,
                "repeats_seconds_batched": times_b,
                "repeats_seconds_optimize_acqf": times_s,
                "diff_mean": diff.mean().item(),
                "diff_min": diff.min().item(),
                "diff_max": diff.max().item(),
                "batched_worse": int((diff < -1e-6 * scale).sum()),
                "batched_better": int((diff > 1e-6 * scale).sum()),
                "values_consistent": bool(torch.allclose(vb.cpu(), v_batched.cpu(), atol=1e-9, rtol=1e-9)),
                "diffs": diff.tolist(),
            }
        )
        r = rows[-1]
        print(
            f"B={B:<3} {name:<23} batched {t_batched:6.2f} s  optimize_acqf {t_single:6.2f} s  "
            f"x{r['speedup']:.1f} (CPU time x{r['cpu_speedup']:.1f})   "
            f"value diff mean {r['diff_mean']:+.2e} min {r['diff_min']:+.2e}  "
            f"worse/better {r['batched_worse']}/{r['batched_better']}",
            flush=True,
        )
    return rows


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for j, name in enumerate(ACQUISITIONS):
        rs = [r for r in rows if r["acquisition"] == name]
        Bs = [r["B"] for r in rs]
        c = f"C{j}"
        axes[0].plot(Bs, [r["cpu_seconds_batched"] for r in rs], "o-", color=c, label=f"{name} batched")
        axes[0].plot(Bs, [r["cpu_seconds_optimize_acqf"] for r in rs], "s--", color=c, label=f"{name} optimize_acqf")
        for r in rs:
            x = r["B"] * (1 + 0.12 * (j - 1))
            axes[1].scatter(
                [x] * len(r["diffs"]), r["diffs"], s=8, color=c, alpha=0.6, label=name if r is rs[0] else None
            )
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("problems B")
    axes[0].set_ylabel("CPU time, all problems (s)")
    axes[0].set_title(f"time ({result['machine']['device']}, {result['machine']['torch_threads']} threads)", fontsize=9)
    axes[0].legend(fontsize=6)
    axes[1].set_xscale("log")
    axes[1].set_yscale("symlog", linthresh=1e-6)
    axes[1].axhline(0, color="k", lw=0.5)
    axes[1].set_xlabel("problems B")
    axes[1].set_ylabel("acquisition value: batched − optimize_acqf")
    axes[1].set_title("paired quality per problem (> 0: batched better)", fontsize=9)
    axes[1].legend(fontsize=6)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from round_time import machine_info

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--problems", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--dim", type=int, default=4)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--raw-samples", type=int, default=256)
    ap.add_argument("--num-restarts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per cell (median reported)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.problems, args.raw_samples, args.num_restarts, args.repeats = [3], 64, 2, 1
    warnings.filterwarnings("ignore", message=".*optimization failed.*")  # BoTorch's restart notices
    device = torch.device(args.device)
    t0 = time.perf_counter()
    rows = [
        row
        for B in args.problems
        for row in run(B, device, args.dim, args.n, args.raw_samples, args.num_restarts, args.repeats)
    ]
    result = {
        "benchmark": "batched_acqf",
        "machine": machine_info(args.device),
        "settings": {
            "problems": args.problems,
            "dim": args.dim,
            "n": args.n,
            "raw_samples": args.raw_samples,
            "num_restarts": args.num_restarts,
            "repeats": args.repeats,
            "quick": args.quick,
        },
        "total_seconds": time.perf_counter() - t0,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    tag = "quick" if args.quick else args.device
    path = args.out / f"batched_acqf_{tag}.json"
    path.write_text(json.dumps(result, indent=1))
    plot(result, args.out / f"batched_acqf_{tag}.png")
    print(f"total {result['total_seconds']:.0f} s; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
