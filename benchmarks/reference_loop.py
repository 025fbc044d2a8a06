r"""The same DP-FTS-DE round timed two ways in one run: fbo_torch vs the reference loop.

The reference is :mod:`benchmarks.reference_impl`, our NumPy/SciPy
re-implementation of the authors' per-agent loop (explicit inverses, 1,000
random points scored one by one + 20 L-BFGS-B restarts, GP refit with 10
restarts every 5 iterations). It is the yardstick only.

Both sides get the same data (``N`` agents x ``n`` observations in ``[0,1]^D``),
the same shared random features, and do the same work per round: every agent
adds its new observation, draws and sends ``ω``, the server aggregates, and
every agent maximizes a Thompson sample of its own GP (``p_t = 1``, the
expensive branch; the refit schedule runs on 1 in 5 agents, as it would on
average). Times exclude the objective. The reference loop is timed on
``--ref-agents`` agents and scaled per agent; ours on all ``N`` at once. Both are
measured ``--pairs`` times, alternated, and the median run of each is reported
(the speed-up is the ratio of the medians; every run's time is in the JSON).

Acquisition quality: on the *same* functions ``x ↦ φ(x)ᵀω_n`` (``ω_n`` drawn
by our sampler) both maximizers run and their values are compared, for a
smooth (lengthscale 0.1) and the papers' rough (0.01) feature map.

Usage::

    python benchmarks/reference_loop.py            # N=200, M=100, D=2
    python benchmarks/reference_loop.py --quick    # seconds; used by the tests
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def ours_round(N: int, M: int, D: int, n: int, threads: int) -> dict:
    """Our round in a fresh process (clean threads setting), via round_time's cell runner."""
    cmd = [
        sys.executable,
        str(HERE / "round_time.py"),
        "--cell",
        str(N),
        str(M),
        str(D),
        "--n",
        str(n),
        "--repeats",
        "3",
        "--threads",
        str(threads),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("CELL_RESULT ")]
    if not line:
        raise RuntimeError(f"our round failed: {proc.stderr[-2000:]}")
    return json.loads(line[0][len("CELL_RESULT ") :])


def reference_round_time(N: int, M: int, D: int, n: int, k: int, seed: int = 0) -> dict:
    """Time the reference round on ``k`` of the ``N`` agents (same data recipe as ours)."""
    import torch

    from fbo_torch import RandomFourierFeatures

    ref = _load("reference_impl")
    gen = torch.Generator().manual_seed(0)  # the same data as round_time.run_cell
    X = torch.rand(N, n + 1, D, generator=gen, dtype=torch.float64)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(N, n + 1, 1, generator=gen, dtype=torch.float64)
    rff = RandomFourierFeatures(D, M, lengthscale=0.1, seed=0)
    feats = ref.ReferenceRFF.from_arrays(rff.spectral.numpy(), rff.phase.numpy(), 1.0)
    bounds = np.array([[0.0, 1.0]] * D)
    agents = [
        ref.ReferenceAgent(X=X[i, :n].numpy().copy(), y=Y[i, :n, 0].numpy().copy(), bounds=bounds, n_iter=i)
        for i in range(k)
    ]  # n_iter = i: the refit schedule hits 1 agent in 5, as on average
    P = 4 if D >= 2 else 2
    part = ref.BoxPartition(D, P)
    regions = [i % P for i in range(k)]
    weights = ref.de_weights(regions, P, 16.0, 1.0)
    rng = np.random.default_rng(seed)
    nxt = {i: (X[i, n].numpy(), float(Y[i, n, 0])) for i in range(k)}
    # the new observation of this round is added first (as in ours)
    for i, a in enumerate(agents):
        a.observe(*nxt[i])

    def objective(i: int, x: np.ndarray) -> float:
        return float(np.sin(5 * x).sum())

    res = ref.reference_round(
        agents,
        feats,
        objective,
        t=2,
        p_t=1.0,
        server_args=ref.ServerArgs(q=0.35, S=22.0, z=1.0, weights=weights),
        rng=rng,
        partition=part,
    )
    tm = dict(res.timings)
    total = tm["total"] - tm.get("objective", 0.0)
    return {"agents_timed": k, "phases_s": tm, "round_s_for_timed_agents": total, "per_agent_ms": 1000 * total / k}


def quality(M: int, D: int, K: int, lengthscale: float, seed: int = 0) -> dict:
    """Maximize the same K functions φ(x)ᵀω_n both ways; compare the values reached."""
    import torch

    from fbo_torch import RandomFourierFeatures
    from fbo_torch.acquisition.search import maximize_rff_samples
    from fbo_torch.optim.domain import Domain

    ref = _load("reference_impl")
    rff = RandomFourierFeatures(D, M, lengthscale=lengthscale, seed=seed)
    omegas = torch.randn(K, M, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    dom = Domain(torch.tensor([[0.0] * D, [1.0] * D], dtype=torch.float64))
    t0 = time.perf_counter()
    _, ours = maximize_rff_samples(rff, omegas, dom, generator=torch.Generator().manual_seed(seed))
    t_ours = time.perf_counter() - t0
    feats = ref.ReferenceRFF.from_arrays(rff.spectral.numpy(), rff.phase.numpy(), 1.0)
    bounds = np.array([[0.0, 1.0]] * D)
    rng = np.random.default_rng(seed)
    vals = []
    t0 = time.perf_counter()
    for w in omegas.numpy():
        _, v = ref.reference_maximize(lambda x, w=w: float(feats.phi(x) @ w), bounds, rng)
        vals.append(v)
    t_ref = time.perf_counter() - t0
    ours = ours.numpy()
    vals = np.asarray(vals)
    scale = np.maximum(np.abs(vals), 1e-12)
    return {
        "lengthscale": lengthscale,
        "functions": K,
        "ours_mean": float(ours.mean()),
        "reference_mean": float(vals.mean()),
        "fraction_ours_at_least_as_good": float(np.mean(ours >= vals - 1e-9 * scale)),
        "median_relative_gain": float(np.median((ours - vals) / scale)),
        "worst_relative_gap": float(np.min((ours - vals) / scale)),
        "ours_seconds_all": t_ours,
        "reference_seconds_all": t_ref,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="fbo_torch vs the reference per-agent loop, one run")
    ap.add_argument("--N", type=int, default=200)
    ap.add_argument("--M", type=int, default=100)
    ap.add_argument("--D", type=int, default=2)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--ref-agents", type=int, default=40, help="agents timed in the reference loop")
    ap.add_argument("--quality-functions", type=int, default=40)
    ap.add_argument(
        "--pairs", type=int, default=3, help="times both sides are measured, alternated (medians are reported)"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.N, args.M, args.n, args.ref_agents, args.quality_functions, args.pairs = 12, 16, 6, 3, 3, 1
    args.out.mkdir(parents=True, exist_ok=True)

    from threadpoolctl import threadpool_limits

    rt = _load("round_time")
    result = {
        "benchmark": "reference_loop",
        "machine": rt.machine_info("cpu"),
        "settings": vars(args) | {"out": str(args.out)},
    }
    print(f"N={args.N} M={args.M} D={args.D} n={args.n}", flush=True)
    # both sides measured `pairs` times, alternated, and the median run of each kept (the faster of
    # the middle two for an even number): on a shared machine one run of each side, a minute
    # apart, measures the machine's drift as much as the code (docs/performance.md)
    runs: dict[int | str, list[dict]] = {1: [], 2: [], "reference": []}
    for _ in range(args.pairs):
        for threads in (1, 2):
            runs[threads].append(ours_round(args.N, args.M, args.D, args.n, threads))
            print(
                f"ours ({threads} thread{'s' if threads > 1 else ''}): round {runs[threads][-1]['round_s']:.3f} s, "
                f"{runs[threads][-1]['per_agent_ms']:.3f} ms per agent-round",
                flush=True,
            )
        with threadpool_limits(limits=1):  # the reference's fastest setting (small matrices, no BLAS spinning)
            runs["reference"].append(reference_round_time(args.N, args.M, args.D, args.n, min(args.ref_agents, args.N)))
        print(
            f"reference (1 BLAS thread, {runs['reference'][-1]['agents_timed']} agents timed): "
            f"{runs['reference'][-1]['per_agent_ms']:.1f} ms per agent-round",
            flush=True,
        )

    def median_run(rs: list[dict]) -> dict:
        return sorted(rs, key=lambda r: r["per_agent_ms"])[(len(rs) - 1) // 2]

    ours = {t: median_run(runs[t]) for t in (1, 2)}
    refr = median_run(runs["reference"])
    speedups = {t: refr["per_agent_ms"] / ours[t]["per_agent_ms"] for t in ours}
    for t, s in speedups.items():
        print(f"speed-up per agent-round (medians of {args.pairs} runs), ours with {t} thread(s): {s:.1f}x")
    result.update(
        ours={str(k): v for k, v in ours.items()},
        reference=refr,
        speedup_per_agent_round={str(k): v for k, v in speedups.items()},
        runs_per_agent_ms={str(k): [r["per_agent_ms"] for r in v] for k, v in runs.items()},
    )

    q = []
    with threadpool_limits(limits=1):
        for ls in (0.1, 0.01):
            r = quality(args.M, args.D, args.quality_functions, ls)
            q.append(r)
            print(
                f"acquisition values, lengthscale {ls}: ours mean {r['ours_mean']:.4f} "
                f"vs reference {r['reference_mean']:.4f}; "
                f"ours >= reference on {100 * r['fraction_ours_at_least_as_good']:.0f}% "
                f"(median gain {100 * r['median_relative_gain']:.2f}%, worst {100 * r['worst_relative_gap']:.2f}%)",
                flush=True,
            )
    result["quality"] = q
    tag = "quick" if args.quick else f"N{args.N}_M{args.M}_D{args.D}"
    path = args.out / f"reference_loop_{tag}.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    _plot(result, args.out / f"reference_loop_{tag}.png")
    print(f"wrote {path}")
    return 0


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    ref = result["reference"]
    names = ["reference (1 thread)"] + [f"fbo_torch ({t} thr.)" for t in result["ours"]]
    vals = [ref["per_agent_ms"]] + [v["per_agent_ms"] for v in result["ours"].values()]
    axes[0].bar(names, vals, color=["tab:gray", "tab:blue", "tab:cyan"])
    axes[0].set_yscale("log")
    axes[0].set_ylabel("ms per agent-round")
    s = result["settings"]
    axes[0].set_title(f"DP-FTS-DE round, N={s['N']}, M={s['M']}, D={s['D']}", fontsize=9)
    for i, v in enumerate(vals):
        axes[0].text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    q = result["quality"]
    axes[1].bar(
        [f"ℓ={r['lengthscale']}\nreference" for r in q] + [f"ℓ={r['lengthscale']}\nfbo_torch" for r in q],
        [r["reference_mean"] for r in q] + [r["ours_mean"] for r in q],
        color=["tab:gray"] * len(q) + ["tab:blue"] * len(q),
    )
    axes[1].set_ylabel("mean max of φ(x)ᵀω found")
    axes[1].set_title("acquisition values on the same functions", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
