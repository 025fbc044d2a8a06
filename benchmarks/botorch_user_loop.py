r"""A BoTorch user's loop: FTS with ``Normalize``d inputs and a data-chosen lengthscale vs plain BoTorch TS.

The target agent maximizes ``-f`` (Branin on its raw bounds ``[-5, 10] x [0, 15]``,
or Hartmann-6 on ``[0, 1]^6``) with BoTorch's ``SingleTaskGP(input_transform=Normalize,
outcome_transform=Standardize)``. Five peers hold 30 random observations each of
shifted versions ``-f(x + δ_n)`` (``δ_n`` uniform in ±5% of the box's width) and
send one message each: ``RFFBayesianLinear(..., input_transform=Normalize).messages()``
on a feature map whose lengthscale and ``M`` come from the peers' data
(:func:`fbo_torch.fit.fit_shared_features`). Per iteration the target uses

* **TS**: ``PathwiseThompsonSampling(gp)`` (BoTorch);
* **FTS**: ``FederatedThompsonSampling(gp, unused_messages, rff, p_t = 1 - 1/sqrt(t))``,
  a used message dropped (one-shot), ``p_t = 1`` once none is left;
* **FTS learned**: the same with ``agent_weights="learned"``;

each maximized with ``optimize_acqf`` (10 restarts, 512 raw samples). Every seed
starts all methods from the same initial points; the simple regret after the
last iteration is compared per seed (mean ± s.e. of the paired difference).

Usage::

    python benchmarks/botorch_user_loop.py --seeds 10 --out benchmarks/results/botorch_user_loop.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf
from botorch.test_functions import Branin, Hartmann
from gpytorch.mlls import ExactMarginalLogLikelihood

from fbo_torch import RFFBayesianLinear
from fbo_torch.acquisition import FederatedThompsonSampling
from fbo_torch.fit import fit_shared_features

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from paired_stats import paired_difference

PROBLEMS = {"branin": (Branin, 5, 20), "hartmann6": (lambda: Hartmann(dim=6), 8, 25)}  # (fn, n_init, iterations)
METHODS = ("TS", "FTS", "FTS learned")


def run(problem: str, seed: int, methods=METHODS) -> dict:
    make, n_init, T = PROBLEMS[problem]
    fn = make()
    bounds = fn.bounds.to(torch.float64)
    d = bounds.shape[-1]
    width = bounds[1] - bounds[0]
    g = torch.Generator().manual_seed(seed)

    def f(X: torch.Tensor, shift: torch.Tensor | None = None) -> torch.Tensor:
        # _evaluate_true: the formula, without the bounds check that shifted inputs would fail
        return -fn._evaluate_true(X if shift is None else X + shift).unsqueeze(-1)

    # five peers with shifted functions, 30 random observations each
    shifts = (torch.rand(5, d, generator=g, dtype=torch.float64) * 2 - 1) * 0.05 * width
    pX = bounds[0] + torch.rand(5, 30, d, generator=g, dtype=torch.float64) * width
    pY = torch.stack([f(pX[n], shifts[n]) for n in range(5)])
    fit = fit_shared_features([(pX[n], pY[n]) for n in range(5)], bounds=bounds, seed=seed)
    rff = fit.features
    peers = RFFBayesianLinear(
        rff,
        pX,
        pY,
        noise_variance=1e-2,
        input_transform=Normalize(d, bounds=bounds),
        outcome_transform=Standardize(m=1, batch_shape=torch.Size([5])),
    )
    messages = peers.messages(generator=g)
    X0 = bounds[0] + torch.rand(n_init, d, generator=g, dtype=torch.float64) * width
    optimum = -fn.optimal_value
    out = {"lengthscale": fit.lengthscale, "num_features": fit.num_features}
    for name in methods:
        torch.manual_seed(seed)  # the acquisitions' own draws
        X, Y = X0.clone(), f(X0)
        unused = list(range(len(messages)))
        t0 = time.perf_counter()
        for t in range(1, T + 1):
            gp = SingleTaskGP(X, Y, input_transform=Normalize(d, bounds=bounds), outcome_transform=Standardize(m=1))
            fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
            if name == "TS":
                acqf = PathwiseThompsonSampling(gp)
            else:
                p_t = 1 - 1 / math.sqrt(t) if unused else 1.0
                acqf = FederatedThompsonSampling(
                    gp,
                    [messages[i] for i in unused],
                    rff,
                    p_t=p_t,
                    agent_weights="learned" if name == "FTS learned" else "uniform",
                    train_X=X if name == "FTS learned" else None,
                )
            x, _ = optimize_acqf(acqf, bounds, q=1, num_restarts=10, raw_samples=512)
            if name != "TS" and acqf.source != "own":
                unused.pop(acqf.source)
            X, Y = torch.cat([X, x.detach()]), torch.cat([Y, f(x.detach())])
        out[name] = {
            "regret": float(optimum - Y.max()),
            "seconds": time.perf_counter() - t0,
            "messages_used": len(messages) - len(unused) if name != "TS" else 0,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/botorch_user_loop.json")
    args = ap.parse_args(argv)
    report = {
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "problems": {},
    }
    for problem in args.problems:
        runs = [run(problem, seed) for seed in range(args.seeds)]
        summary = {}
        for name in METHODS:
            r = [x[name]["regret"] for x in runs]
            mean = sum(r) / len(r)
            summary[name] = {
                "regret_mean": mean,
                "regret_se": math.sqrt(sum((v - mean) ** 2 for v in r) / (len(r) - 1) / len(r)),
                "seconds_mean": sum(x[name]["seconds"] for x in runs) / len(runs),
            }
            if name != "TS":
                summary[name]["vs_TS"] = paired_difference(
                    [a - b for a, b in zip(r, [x["TS"]["regret"] for x in runs], strict=False)]
                )
        report["problems"][problem] = {"summary": summary, "runs": runs}
        for name, s in summary.items():
            vs = s.get("vs_TS")
            print(
                f"{problem:<10} {name:<12} regret {s['regret_mean']:.4f} ± {s['regret_se']:.4f}"
                + ("" if vs is None else f"   vs TS {vs['diff']:+.4f} ± {vs['se']:.4f} ({vs['better']}/{vs['worse']})")
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
