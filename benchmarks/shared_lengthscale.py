r"""The shared map's lengthscale: guessed or fitted from the federation's data (Branin).

A federation of ``N`` peers, each observing Branin shifted by up to 0.3 per
coordinate (2 % of the box), ``n`` initial points each on the raw box
``[-5, 10] x [0, 15]``. Every peer fits an ``RFFBayesianLinear`` with
``Normalize(2, bounds)`` and ``Standardize`` and sends a message
(:meth:`~fbo_torch.models.RFFBayesianLinear.messages`); the target follows each
message once (``FederatedThompsonSampling`` with ``p_t = 0``, ``optimize_acqf``)
and we record the regret of Branin at the point it queries (noisy: one Thompson
draw per message), and each peer's posterior-mean RMSE on its own function. The map's
lengthscale (normalized units) is one of the guesses or
:func:`fbo_torch.fit_shared_features` on the peers' data (median over peers), with
the guesses' ``M`` and with the ``M`` it suggests. Also the test RMSE of the RFF GP
(``SingleTaskGP(covar_module=SharedRFFKernel(rff))``) on the target's function,
against a raw-input map of lengthscale 0.2 (in Branin's units) and the std of Y.

Usage::

    python benchmarks/shared_lengthscale.py          # 4 federations of 8 peers, 50 points each
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch
from botorch.test_functions import Branin

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

f64 = torch.float64
BOUNDS = torch.tensor([[-5.0, 0.0], [10.0, 15.0]], dtype=f64)
BRANIN_MAX = -0.397887
GUESSES = (0.1, 0.2, 0.3, 0.5)


_BRANIN = Branin()


def branin(X):
    """Negated Branin (to maximize) at any point: BoTorch's formula, without ``evaluate_true``'s domain check."""
    return -_BRANIN._evaluate_true(X)


def raw(U):
    return BOUNDS[0] + U * (BOUNDS[1] - BOUNDS[0])


def follow_messages(rff, Xp, Yp, shift, g) -> tuple[list[float], float]:
    """Regret at the point the target queries when it follows each peer's message, and the peers' test RMSE."""
    from botorch.models import SingleTaskGP
    from botorch.models.transforms.input import Normalize
    from botorch.models.transforms.outcome import Standardize
    from botorch.optim import optimize_acqf

    from fbo_torch import RFFBayesianLinear
    from fbo_torch.acquisition import FederatedThompsonSampling

    N = Xp.shape[0]
    peers = RFFBayesianLinear(
        rff,
        Xp,
        Yp,
        1e-3,
        input_transform=Normalize(2, bounds=BOUNDS),
        outcome_transform=Standardize(1, batch_shape=torch.Size([N])),
    )
    X = raw(torch.rand(5, 2, generator=g, dtype=f64))
    gp = SingleTaskGP(X, branin(X).unsqueeze(-1), input_transform=Normalize(2, bounds=BOUNDS))
    msgs = peers.messages(generator=g)
    regrets = []
    for i in range(N):
        probs = torch.nn.functional.one_hot(torch.tensor(i), N).to(f64)
        acqf = FederatedThompsonSampling(gp, msgs, rff, p_t=0.0, agent_probs=probs, generator=g)
        torch.manual_seed(i)
        x, _ = optimize_acqf(acqf, BOUNDS, q=1, num_restarts=4, raw_samples=128)
        regrets.append(BRANIN_MAX - branin(x).item())
    Xt = raw(torch.rand(500, 2, generator=g, dtype=f64))
    with torch.no_grad():  # each peer's posterior mean against its own function
        err = peers.posterior(Xt.expand(N, -1, -1)).mean.squeeze(-1) - branin(Xt.unsqueeze(0) - shift)
    return regrets, err.pow(2).mean().sqrt().item()


def rff_gp_rmse(rff, input_transform, X, Y, Xt, Yt) -> float:
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from fbo_torch import SharedRFFKernel

    gp = SingleTaskGP(X, Y, covar_module=SharedRFFKernel(rff), input_transform=input_transform)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    with torch.no_grad():
        return (gp.posterior(Xt).mean - Yt).pow(2).mean().sqrt().item()


def main(argv: list[str] | None = None) -> int:
    from round_time import machine_info

    from fbo_torch import RandomFourierFeatures, fit_shared_features

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--federations", type=int, default=4)
    ap.add_argument("--peers", type=int, default=8)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--num-features", type=int, default=200, help="M of the guessed maps")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*optimization failed.*")
    t0 = time.perf_counter()
    regrets = {f"guess {ls}": [] for ls in GUESSES} | {"fitted": [], "fitted, suggested M": [], "random point": []}
    fitted, rmse = [], {"raw map, lengthscale 0.2 (Branin units)": [], "fitted map, Normalize": [], "std of Y": []}
    peer_rmse = {k: [] for k in regrets if k != "random point"}
    for seed in range(args.federations):
        g = torch.Generator().manual_seed(seed)
        shift = (torch.rand(args.peers, 1, 2, generator=g, dtype=f64) - 0.5) * 0.6
        Xp = raw(torch.rand(args.peers, args.n, 2, generator=g, dtype=f64))
        Yp = branin(Xp - shift).unsqueeze(-1)
        fit = fit_shared_features((Xp, Yp), bounds=BOUNDS, seed=seed)
        fitted.append(
            {"lengthscale": fit.lengthscale, "num_features": fit.num_features, "per_peer": fit.lengthscales.tolist()}
        )
        maps = {f"guess {ls}": RandomFourierFeatures(2, args.num_features, lengthscale=ls, seed=seed) for ls in GUESSES}
        maps["fitted"] = RandomFourierFeatures(2, args.num_features, lengthscale=fit.lengthscale, seed=seed)
        maps["fitted, suggested M"] = fit.features
        for key, rff in maps.items():
            r, e = follow_messages(rff, Xp, Yp, shift, torch.Generator().manual_seed(100 + seed))
            regrets[key] += r
            peer_rmse[key].append(e)
        regrets["random point"] += (
            BRANIN_MAX - branin(raw(torch.rand(args.peers, 2, generator=g, dtype=f64)))
        ).tolist()
        X = raw(torch.rand(30, 2, generator=g, dtype=f64))
        Xt = raw(torch.rand(500, 2, generator=g, dtype=f64))
        Y, Yt = branin(X).unsqueeze(-1), branin(Xt).unsqueeze(-1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the raw map warns (its inputs leave the unit cube): that is the point
            rmse["raw map, lengthscale 0.2 (Branin units)"].append(
                rff_gp_rmse(RandomFourierFeatures(2, args.num_features, lengthscale=0.2, seed=seed), None, X, Y, Xt, Yt)
            )
        rmse["fitted map, Normalize"].append(rff_gp_rmse(fit.features, fit.input_transform(), X, Y, Xt, Yt))
        rmse["std of Y"].append(Yt.std().item())
    summary = {k: {"median": torch.tensor(v).median().item(), "mean": sum(v) / len(v)} for k, v in regrets.items()}
    for k, v in summary.items():
        e = f"   peers' test RMSE {sum(peer_rmse[k]) / len(peer_rmse[k]):6.2f}" if k in peer_rmse else ""
        print(f"{k:<20} regret at the followed message's query: median {v['median']:7.2f}  mean {v['mean']:7.2f}{e}")
    for k, v in rmse.items():
        print(f"test RMSE {k:<42} {sum(v) / len(v):7.2f}")
    print("fitted:", [(round(f["lengthscale"], 3), f["num_features"]) for f in fitted])
    result = {
        "benchmark": "shared_lengthscale",
        "machine": machine_info("cpu"),
        "settings": vars(args) | {"out": str(args.out)},
        "regret": summary,
        "regrets": regrets,
        "rmse": rmse,
        "peer_rmse": peer_rmse,
        "fitted": fitted,
        "total_seconds": time.perf_counter() - t0,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "shared_lengthscale.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"total {result['total_seconds']:.0f} s; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
