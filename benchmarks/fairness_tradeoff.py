r"""The fairness trade-off of ``fairness: λ``: total regret against the regret of the agents behind.

Setting (one where federating pays): ``--agents`` agents optimizing together
(``FTSRunner(together=True)``) on the FTS paper's synthetic near-copies (one GP sample ``f`` on a 1-D
grid of 1000 points, lengthscale 0.03, every agent ``f ± 0.02``, noise variance 0.01;
:class:`~fbo_torch.objectives.synthetic.GPSampleGridFederation` with ``perturb_first``), each from
``--num-init`` random points, FTS with the paper's shared map (``M = 100``), every-round messages,
``p_t = 1 − 1/√t``, ``--rounds`` rounds. ``fairness: λ`` (:mod:`fbo_torch.protocol.fairness`) makes an
agent whose incumbent ranks behind its federation's follow peers more and the leaders less, and draws
the peer followed towards the leaders; ``λ = 0`` is FTS.

Every configuration runs on the same seeds (``--federations`` initializations; the agents of one
federation start from the same points in every configuration), plus the local counterfactual (TS with
the same GP, no messages). Per federation (the independent unit) and configuration, from each agent's
regret averaged over rounds ``1..T`` (the cumulative regret / T) and its final regret:

* ``total``: the agents' mean regret (efficiency; Sim et al.'s fair regret at ``ρ = 1``, divided by N);
* ``fair_regret``: Sim et al. (2021)'s fair regret ``Σ_i ρ^(i-1) R_(i)`` at ``ρ = 0.5``
  (:func:`~fbo_torch.experiments.fairness.fair_regret`, agents sorted from the worst down);
* ``worst``: the largest agent regret (``ρ = 0``);

each as mean ± standard error over the federations, and paired against ``λ = 0`` (the difference per
federation: mean ± s.e.). Also: the share of the agents' follows made by the bottom half of the
ranks, and the local counterfactual's numbers (whether federating pays at all).

Usage::

    python benchmarks/fairness_tradeoff.py --out benchmarks/results/fairness_tradeoff.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from free_riders import MAP, machine_record, mean_se, near_copies, p_t_value, run, setting_record

from fbo_torch.experiments.fairness import fair_regret
from fbo_torch.federation.settings import FTSSettings
from fbo_torch.simulate.fts import FTSResult

#: ``ρ`` of the fair regret reported between the total (1) and the worst agent (0).
RHO = 0.5


def indices(res: FTSResult, N: int, F: int) -> dict[str, dict[str, torch.Tensor]]:
    """Per federation (``F``): total (mean), fair (``ρ = RHO``) and worst agent regret, cumulative and final."""
    out = {}
    for name, per_run in (("cumulative", res.loss[:, 1:].mean(-1)), ("final", res.loss[:, -1])):
        R = per_run.view(N, F).T  # F x N: runs are agent-major
        out[name] = {"total": R.mean(-1), "fair_regret": fair_regret(R, RHO), "worst": R.amax(-1)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--federations", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--num-init", type=int, default=2)
    ap.add_argument("--p-t", type=p_t_value, default="1-1/sqrt(t)")
    ap.add_argument("--lambdas", default="0,0.5,1,2", help="fairness values (comma list; the first is the reference)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    N, F, T = args.agents, args.federations, args.rounds
    objective = near_copies(N)
    common: dict[str, Any] = dict(num_init=args.num_init, num_iterations=T, p_t=args.p_t)
    local, local_s, _ = run(objective, FTSSettings(algorithm="ts", **common), N, F)
    print(f"local: {local_s:.1f} s", file=sys.stderr)
    local_i = indices(local, N, F)
    lambdas = [float(v) for v in args.lambdas.split(",")]
    results: dict[str, Any] = {}
    reference: dict[str, dict[str, torch.Tensor]] | None = None
    for lam in lambdas:
        res, secs, _ = run(objective, FTSSettings(algorithm="fts", fairness=lam, **common, **MAP), N, F)
        print(f"fairness {lam}: {secs:.1f} s", file=sys.stderr)
        got = indices(res, N, F)
        reference = reference or got
        entry: dict[str, Any] = {}
        for name, block in got.items():
            entry[name] = {k: mean_se(v) for k, v in block.items()}
            entry[name + "_minus_lambda_0"] = {k: mean_se(v - reference[name][k]) for k, v in block.items()}
            entry[name + "_gain_over_local"] = {k: mean_se(local_i[name][k] - v) for k, v in block.items()}
        follows = res.sources >= 0
        if res.behind is not None:
            behind = res.behind >= 0.5
            entry["share_of_follows_by_the_bottom_half"] = float(follows[behind].sum() / follows.sum().clamp_min(1))
        entry["follow_rate"] = float(follows.double().mean())
        entry["wall_time_s"] = secs
        results[f"{lam:g}"] = entry
    out: dict[str, Any] = {
        "setting": {**setting_record(N, F, T, args.p_t, args.num_init), "rho": RHO},
        "local": {name: {k: mean_se(v) for k, v in block.items()} for name, block in local_i.items()},
        "fairness": results,
        "machine": machine_record(),
        "command": "PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/fairness_tradeoff.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    plot(out, args.out.with_suffix(".png"))
    return 0


def plot(out: dict[str, Any], path: Path) -> None:
    """Total, fair and worst-agent round-averaged regret against ``λ`` (mean ± s.e. over federations), the
    local counterfactual dashed; and each one's paired difference to ``λ = 0``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lams = list(out["fairness"])
    x = [float(v) for v in lams]
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.6))
    for key, color in (("total", "tab:blue"), ("fair_regret", "tab:purple"), ("worst", "tab:red")):
        for ax, block in ((axes[0], "cumulative"), (axes[1], "cumulative_minus_lambda_0")):
            m = [out["fairness"][v][block][key]["mean"] for v in lams]
            s = [out["fairness"][v][block][key]["stderr"] for v in lams]
            ax.errorbar(x, m, yerr=s, marker="o", capsize=3, color=color, label=key.replace("_", " "))
        axes[0].axhline(out["local"]["cumulative"][key]["mean"], color=color, ls="--", lw=0.8)
    axes[0].set_ylabel("regret averaged over rounds\n(dashed: local, no federation)")
    axes[1].set_ylabel("paired difference to λ = 0")
    axes[1].axhline(0, color="k", lw=0.6)
    for ax in axes:
        ax.set_xlabel("fairness λ")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
