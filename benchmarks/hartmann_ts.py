r"""Standard Thompson sampling on Hartmann-3: the batched engine against a plain BoTorch loop.

``A`` independent agents each maximize BoTorch's Hartmann-3 (``negate=True``,
maximum 3.86278) from ``n0`` random points with observation noise of standard
deviation 0.05, for ``T`` iterations of standard TS (no communication):

* ``batched``: fbo_torch's engine — all agents' GPs fitted by the batched BFGS
  every iteration, one Matheron-path Thompson sample per agent maximized by the
  batched maximizer (:class:`~fbo_torch.federation.agents.Agents`, exactly what
  the runners do with ``p_t = 1``);
* ``botorch``: the textbook loop, one agent at a time — ``SingleTaskGP`` +
  ``fit_gpytorch_mll`` + ``PathwiseThompsonSampling`` + ``optimize_acqf``.

Reported: the final simple regret of every agent (mean, median, quantiles,
worst), a rank test of the two distributions (one-sided Mann-Whitney U:
are the batched agents' regrets larger?), and wall time. Both sides use the
same initial points.

Usage::

    python benchmarks/hartmann_ts.py            # 24 agents x 2 seeds, 25 iterations
    python benchmarks/hartmann_ts.py --quick    # seconds; used by the tests
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

OPTIMUM = 3.86278
f64 = torch.float64


def hartmann_objective(num_agents: int, noise_std: float):
    from botorch.test_functions import Hartmann

    from fbo_torch.objectives.base import Objective

    class HartmannAgents(Objective):
        """The same Hartmann-3 for every agent (to maximize), Gaussian observation noise."""

        def __init__(self) -> None:
            self.num_agents = num_agents
            self.bounds = torch.tensor([[0.0] * 3, [1.0] * 3], dtype=f64)
            self.noise_variance = noise_std**2
            self.optimum = torch.full((num_agents,), OPTIMUM, dtype=f64)
            self._f = Hartmann(dim=3, negate=True)
            self.noise_generator = torch.Generator().manual_seed(12345)  # the plain loop's noise

        def _evaluate(self, X, agents, noise):
            vals = self._f(X.reshape(-1, 3)).reshape(X.shape[:-1]).to(X)
            if noise:  # observation noise for callers without keys (the BoTorch loop)
                eps = torch.randn(vals.shape, dtype=vals.dtype, generator=self.noise_generator)
                vals = vals + self.noise_variance**0.5 * eps.to(vals.device)
            return vals

    return HartmannAgents()


def run_batched(objective, X0, Y0, T: int, seed: int, device, **settings) -> tuple[torch.Tensor, float]:
    from fbo_torch.federation.agents import Agents
    from fbo_torch.federation.settings import MethodSettings
    from fbo_torch.optim.domain import Domain
    from fbo_torch.utils import keyed_random as kr

    A = X0.shape[0]
    dom = Domain(objective.bounds.to(device))
    s = MethodSettings(num_iterations=T, gp_refit_every=1, **settings)
    keys = kr.fold(kr.root_key(seed, "hartmann"), torch.arange(A, device=device))
    agents = Agents(keys, X0.to(device), Y0.to(device), dom, s, capacity=T)
    ids = torch.arange(A, device=device)
    t0 = time.perf_counter()
    for t in range(1, T + 1):
        X, _ = agents.next_queries(t, 1.0)
        agents.evaluate(objective, ids, X, t)
    if device.type == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    best = objective.evaluate_true(agents.train_X).max(-1).values
    return OPTIMUM - best.cpu(), secs


def run_botorch(objective, X0, Y0, T: int, seed: int) -> tuple[torch.Tensor, float]:
    from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from botorch.optim import optimize_acqf
    from gpytorch.mlls import ExactMarginalLogLikelihood

    bounds = objective.bounds
    regrets = []
    t0 = time.perf_counter()
    for a in range(X0.shape[0]):
        torch.manual_seed(seed * 1000 + a)
        X, Y = X0[a].clone(), Y0[a].clone()
        for _ in range(T):
            gp = SingleTaskGP(X, Y)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
            x, _ = optimize_acqf(PathwiseThompsonSampling(gp), bounds, q=1, num_restarts=10, raw_samples=512)
            y = objective(x.unsqueeze(0), agents=torch.tensor([a])).reshape(1, 1)  # noisy, like ours
            X, Y = torch.cat([X, x]), torch.cat([Y, y])
        regrets.append(OPTIMUM - objective.evaluate_true(X.unsqueeze(0), agents=torch.tensor([a])).max())
    return torch.stack(regrets), time.perf_counter() - t0


def summary(r: torch.Tensor) -> dict:
    q = torch.quantile(r, torch.tensor([0.25, 0.5, 0.75, 0.9], dtype=r.dtype))
    return {
        "mean": r.mean().item(),
        "stderr": (r.std() / r.numel() ** 0.5).item(),
        "q25": q[0].item(),
        "median": q[1].item(),
        "q75": q[2].item(),
        "q90": q[3].item(),
        "worst": r.max().item(),
        "agents": r.numel(),
        "values": r.tolist(),
    }


def main(argv: list[str] | None = None) -> int:
    from round_time import machine_info
    from scipy.stats import mannwhitneyu

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=24)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--n0", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=25)
    ap.add_argument("--noise-std", type=float, default=0.05)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.agents, args.seeds, args.iterations = 3, 1, 3
    device = torch.device(args.device)
    ours, ref, t_ours, t_ref = [], [], 0.0, 0.0
    for seed in range(args.seeds):
        obj = hartmann_objective(args.agents, args.noise_std)
        g = torch.Generator().manual_seed(seed)
        X0 = torch.rand(args.agents, args.n0, 3, generator=g, dtype=f64)
        Y0 = obj.evaluate_true(X0) + args.noise_std * torch.randn(args.agents, args.n0, generator=g, dtype=f64)
        r, s = run_batched(obj, X0, Y0.unsqueeze(-1), args.iterations, seed, device)
        ours.append(r)
        t_ours += s
        torch.manual_seed(seed)
        r, s = run_botorch(obj, X0, Y0.unsqueeze(-1), args.iterations, seed)
        ref.append(r)
        t_ref += s
        print(f"seed {seed}: batched mean regret {ours[-1].mean():.4f}, botorch {ref[-1].mean():.4f}", flush=True)
    ours, ref = torch.cat(ours), torch.cat(ref)
    test = mannwhitneyu(ours.numpy(), ref.numpy(), alternative="greater")
    result = {
        "benchmark": "hartmann_ts",
        "machine": machine_info(args.device),
        "settings": vars(args) | {"out": str(args.out)},
        "batched": summary(ours) | {"seconds": t_ours},
        "botorch": summary(ref) | {"seconds": t_ref},
        "mann_whitney_batched_greater_p": float(test.pvalue),
    }
    for name in ("batched", "botorch"):
        s = result[name]
        print(
            f"{name:<8} regret mean {s['mean']:.4f} ± {s['stderr']:.4f}  median {s['median']:.4f}  "
            f"q90 {s['q90']:.4f}  worst {s['worst']:.4f}  ({s['seconds']:.1f} s)"
        )
    print(f"one-sided Mann-Whitney p (batched regrets larger): {test.pvalue:.3f}")
    args.out.mkdir(parents=True, exist_ok=True)
    tag = "quick" if args.quick else args.device
    path = args.out / f"hartmann_ts_{tag}.json"
    path.write_text(json.dumps(result, indent=1))
    _plot(result, args.out / f"hartmann_ts_{tag}.png")
    print(f"wrote {path}")
    return 0


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    data = [result["batched"]["values"], result["botorch"]["values"]]
    ax.boxplot(data, showmeans=True)
    ax.set_xticks([1, 2], ["fbo_torch batched TS", "BoTorch loop (per agent)"])
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylabel("final simple regret")
    s = result["settings"]
    ax.set_title(
        f"Hartmann-3, {result['batched']['agents']} agents, {s['iterations']} iterations "
        f"(box: quartiles, triangle: mean)",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
