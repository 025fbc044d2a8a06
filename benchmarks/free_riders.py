r"""Free-riders and reciprocity: does an agent that sends nothing useful gain less from federating?

Setting: the FTS paper's synthetic near-copies (one GP sample ``f`` on a 1-D grid of 1000 points,
lengthscale 0.03, and ``N`` agents each with ``f ± 0.02`` and observation noise ``σ² = 0.01``;
:class:`~fbo_torch.objectives.synthetic.GPSampleGridFederation` with ``perturb_first``), the agents
optimizing together (``FTSRunner(together=True)``: every agent sends one draw per round and may
follow any other's), ``k`` of them free-riders (``free_riders: {agents: [0..k-1], kind}``): they
follow their peers as everyone does but send a ``stale`` (their round-0 draw forever) or ``noise``
(a fresh prior draw) message. FTS with ``p_t = 0.3`` (an agent follows a peer in 70 % of rounds),
the paper's shared map (``M = 100``, lengthscale 0.03), ``--rounds`` rounds from 5 random points.

Three configurations on the same seeds, so every agent of every federation (``--federations``
initializations) starts from the same points in each: ``local`` (TS with the same GP, no messages:
the counterfactual), ``FTS`` and ``FTS + reciprocity`` (``reciprocity: true``: an agent flagged as a
free-rider by the report's binomial test on its federation's follow and improvement counts so far
follows no peer while flagged).

Reported per configuration and free-rider kind, over the federations (the independent units; the
agents of one federation exchange messages): each group's gain from federating (its agents' final
regret under ``local`` minus under the configuration, agent-averaged per federation: mean and
standard error), the free-riders' gain minus the honest agents' (paired per federation), the honest
agents' final regret, with and without reciprocity (and their paired difference), the share of
rounds each group was excluded (reciprocity), and the peers the report flags (pooled over the
federations, as ``accounting.json`` does).

``--reciprocity improvements,scores,ranks`` adds a configuration per signal (``reciprocity_signal``):
``scores`` lets an agent follow a peer with probability ``min(1, u / median u)``, ``u`` how helpful its
receivers score its messages on their own observations
(:func:`~fbo_torch.protocol.reciprocity.reciprocal_share`); ``ranks`` keeps the same scores as each
receiver's ranks of its peers, accumulated over the rounds, and bars an agent rated low with confidence
(:func:`~fbo_torch.protocol.reciprocity.flag_low_rated`). Besides the final regret, each gain is also
given on the regret averaged over rounds ``1..T`` (``cumulative``), where federating's early help shows.
``--reciprocity ranks+replays`` also bars an agent whose message repeats its previous one bit for bit
(``reciprocity_replays``). ``--report collude`` makes the free-riders lie in what they report to
reciprocity (``free_riders.report``: their fellow riders the most useful peers, every honest agent the least).

Usage::

    python benchmarks/free_riders.py --out benchmarks/results/free_riders.json
    python benchmarks/free_riders.py --out benchmarks/results/free_riders_early.json --num-init 2 \
        --rounds 20 --p-t "1-1/sqrt(t)" --federations 60 --reciprocity improvements,scores
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from fbo_torch.experiments.accounting import method_accounting
from fbo_torch.experiments.fts import result_record
from fbo_torch.federation.settings import FTSSettings
from fbo_torch.objectives.synthetic import GPSampleGridFederation
from fbo_torch.protocol.reciprocity import flag_free_riders
from fbo_torch.simulate.fts import FTSResult, FTSRunner

#: The FTS paper's shared map for its synthetic functions, fresh messages every round.
MAP = dict(num_features=100, rff_lengthscale=0.03, rff_noise_variance=0.01, communication="every-round")


def mean_se(x: torch.Tensor) -> dict[str, float]:
    """Mean and standard error over the first dimension (the federations)."""
    return {"mean": float(x.mean()), "stderr": float(x.std() / x.numel() ** 0.5) if x.numel() > 1 else float("nan")}


def near_copies(agents: int) -> GPSampleGridFederation:
    """The FTS paper's synthetic near-copies, every agent perturbed (``f ± 0.02`` on a 1-D grid)."""
    return GPSampleGridFederation(
        num_groups=1, agents_per_group=agents, perturb_first=True, grid_size=1000, perturbation=0.02, seed=0
    )


def setting_record(agents: int, federations: int, rounds: int, p_t: float | str, num_init: int) -> dict[str, Any]:
    """The ``setting`` block of a study on :func:`near_copies` with the agents together (JSON)."""
    return {
        "objective": "GPSampleGridFederation(num_groups=1, agents_per_group=N, perturb_first=True, "
        "grid_size=1000, perturbation=0.02, seed=0): f ± 0.02 on a 1-D grid, noise variance 0.01",
        "agents": agents,
        "federations": federations,
        "rounds": rounds,
        "p_t": p_t,
        "num_init": num_init,
        "map": MAP,
        "together": True,
    }


def machine_record() -> dict[str, Any]:
    """The machine a study ran on (JSON)."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "note": "2-core development machine shared with other jobs, no GPU",
    }


def p_t_value(text: str) -> float | str:
    """``--p-t``: a number, or a schedule string as the settings' ``p_t`` takes it."""
    try:
        return float(text)
    except ValueError:
        return text


def run(objective: Any, settings: FTSSettings, agents: int, federations: int) -> tuple[FTSResult, float, FTSRunner]:
    t0 = time.perf_counter()
    runner = FTSRunner(objective, settings, torch.arange(agents), federations, seed=0, together=True)
    return runner.run(), time.perf_counter() - t0, runner


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--agents", type=int, default=10, help="N, agents of a federation")
    ap.add_argument("--riders", type=int, default=2, help="k, free-riders among them (agents 0..k-1)")
    ap.add_argument("--federations", type=int, default=6, help="initializations (paired seeds)")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--p-t", type=p_t_value, default=0.3, help="a probability or a schedule such as 1-1/sqrt(t)")
    ap.add_argument("--num-init", type=int, default=5, help="random points each agent starts from")
    ap.add_argument("--kinds", default="stale,noise")
    ap.add_argument("--algorithm", default="fts", choices=("fts", "transfer"), help="what the agents run")
    ap.add_argument(
        "--reciprocity", default="improvements", help="reciprocity_signal values, one configuration each (comma list)"
    )
    ap.add_argument(
        "--report",
        default="honest",
        choices=("honest", "collude"),
        help="what the free-riders report about their peers to reciprocity (free_riders.report)",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    N, k, F, T = args.agents, args.riders, args.federations, args.rounds
    objective = near_copies(N)
    base = "FTS" if args.algorithm == "fts" else args.algorithm
    common: dict[str, Any] = dict(num_init=args.num_init, num_iterations=T, p_t=args.p_t)
    local, local_s, _ = run(objective, FTSSettings(algorithm="ts", **common), N, F)
    print(f"local: {local_s:.1f} s", file=sys.stderr)
    rider = torch.zeros(N, dtype=torch.bool)
    rider[:k] = True

    def per_federation(res: FTSResult, group: torch.Tensor, cumulative: bool = False) -> torch.Tensor:
        """``F`` agent-averaged final (or round-averaged) regrets of the group's agents (runs: agent-major,
        F per agent)."""
        loss = res.loss[:, 1:].mean(-1) if cumulative else res.loss[:, -1]
        return loss.view(N, F)[group].mean(0)

    groups = (("free_riders", rider), ("honest", ~rider))
    local_r = {g: per_federation(local, m) for g, m in groups}
    local_c = {g: per_federation(local, m, True) for g, m in groups}
    out: dict[str, Any] = {
        "setting": {
            **setting_record(N, F, T, args.p_t, args.num_init),
            "free_riders": list(range(k)),
            "free_riders_report": args.report,
            "algorithm": args.algorithm,
        },
        "local": {
            "final_regret": {g: mean_se(v) for g, v in local_r.items()},
            "cumulative_regret": {g: mean_se(v) for g, v in local_c.items()},
            "wall_time_s": local_s,
        },
        "kinds": {},
    }
    for kind in args.kinds.split(","):
        block: dict[str, Any] = {}
        # per configuration, each group's per-federation regret: final and round-averaged
        regrets: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
        for label, recip, signal, replays in configurations(args.reciprocity.split(","), base):
            s = FTSSettings(
                algorithm=args.algorithm,
                free_riders={"agents": list(range(k)), "kind": kind, "report": args.report},
                reciprocity=recip,
                reciprocity_signal=signal,
                reciprocity_replays=replays,
                **common,
                **MAP,
            )
            res, secs, runner = run(objective, s, N, F)
            print(f"{kind} {label}: {secs:.1f} s", file=sys.stderr)
            regret = {g: per_federation(res, m) for g, m in groups}
            gain = {g: local_r[g] - regret[g] for g in regret}
            cumulative = {g: per_federation(res, m, True) for g, m in groups}
            cum_gain = {g: local_c[g] - cumulative[g] for g in cumulative}
            regrets[label] = {"regret": regret, "cumulative_regret": cumulative}
            record = result_record(label, res, objective.loss_name)
            acc = method_accounting(record, None)
            follows = (res.sources >= 0).double().mean(-1).view(N, F)
            entry: dict[str, Any] = {
                "gain": {g: mean_se(v) for g, v in gain.items()},
                "free_rider_minus_honest_gain": mean_se(gain["free_riders"] - gain["honest"]),
                "cumulative_gain": {g: mean_se(v) for g, v in cum_gain.items()},
                "cumulative_free_rider_minus_honest_gain": mean_se(cum_gain["free_riders"] - cum_gain["honest"]),
                "final_regret": {g: mean_se(v) for g, v in regret.items()},
                "share_of_rounds_following_a_peer": {
                    "free_riders": float(follows[rider].mean()),
                    "honest": float(follows[~rider].mean()),
                },
                "report_flags_pooled": acc["free_riders"],
                "wall_time_s": secs,
            }
            if res.excluded is not None:
                ex = res.excluded.double().mean(-1).view(N, F)
                entry["share_of_rounds_excluded"] = {
                    "free_riders": float(ex[rider].mean()),
                    "honest": float(ex[~rider].mean()),
                }
                first = torch.where(res.excluded.any(-1), res.excluded.double().argmax(-1) + 1, -1).view(N, F)
                entry["first_excluded_round"] = first.tolist()  # per agent and federation, -1: never
                # what the test saw at the end, per federation: the free-riders' follows and improvements,
                # the pooled rate of the others, the p-values (the flag needs < 0.01)
                n, w = runner.sent_follows.view(N, F), runner.sent_wins.view(N, F)
                _, pvalue, p0 = flag_free_riders(n.T, w.T)
                entry["reciprocity_counts_at_the_end"] = {
                    "free_rider_follows_per_federation": mean_se(n[rider].mean(0)),
                    "free_rider_improvements_per_federation": mean_se(w[rider].mean(0)),
                    "honest_improvement_rate": mean_se(w[~rider].sum(0) / n[~rider].sum(0).clamp_min(1)),
                    "free_rider_p_values": pvalue.T[rider].tolist(),
                    "free_rider_others_rate": p0.T[rider].tolist(),
                }
            block[label] = entry
        for label in regrets:
            if label != base:
                suffix = label.removeprefix(base + " + reciprocity")
                for group, name in (("honest", "honest"), ("free_riders", "free_rider")):
                    for measure in ("regret", "cumulative_regret"):
                        paired = regrets[label][measure][group] - regrets[base][measure][group]
                        block[f"{name}_{measure}_reciprocity_minus_plain{suffix}"] = mean_se(paired)
        out["kinds"][kind] = block
    out["machine"] = machine_record()
    out["command"] = "PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/free_riders.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    plot(out, args.out.with_suffix(".png"))
    return 0


def configurations(signals: list[str], base: str = "FTS") -> list[tuple[str, bool, str, bool]]:
    """``(label, reciprocity, reciprocity_signal, reciprocity_replays)`` of the plain method (labelled ``base``)
    and one reciprocity configuration per signal (``improvements`` keeps the label ``<base> + reciprocity``;
    ``SIGNAL+replays`` also bars agents that replay their message, ``reciprocity_replays: true``)."""
    out = [(base, False, "improvements", False)]
    for entry in signals:
        signal, _, extra = entry.partition("+")
        if extra not in ("", "replays"):
            raise SystemExit(f"--reciprocity: {entry!r}; expected SIGNAL or SIGNAL+replays")
        replays = extra == "replays"
        if signal == "improvements" and not replays:
            label = f"{base} + reciprocity"
        else:
            label = f"{base} + reciprocity ({signal}{', replays' if replays else ''})"
        out.append((label, True, signal, replays))
    return out


def plot(out: dict[str, Any], path: Path) -> None:
    """Each group's gain from federating (mean ± s.e. over federations), per kind and configuration: the
    final regret's (top) and, where recorded, the round-averaged regret's (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(out["kinds"])
    first = next(iter(out["kinds"][kinds[0]].values()))
    metrics = [m for m in ("gain", "cumulative_gain") if m in first]
    fig, axes = plt.subplots(
        len(metrics), len(kinds), figsize=(4.6 * len(kinds), 3.2 * len(metrics)), squeeze=False, sharey="row"
    )
    for row, metric in enumerate(metrics):
        for ax, kind in zip(axes[row], kinds, strict=True):
            labels = [k for k, v in out["kinds"][kind].items() if isinstance(v, dict) and "gain" in v]
            for i, label in enumerate(labels):
                g = out["kinds"][kind][label][metric]
                for j, (group, color) in enumerate((("honest", "tab:blue"), ("free_riders", "tab:red"))):
                    ax.bar(
                        i + (j - 0.5) * 0.38,
                        g[group]["mean"],
                        0.36,
                        yerr=g[group]["stderr"],
                        color=color,
                        capsize=3,
                        label=group.replace("_", "-") if i == 0 else None,
                    )
            ax.axhline(0, color="k", lw=0.6)
            ax.set_xticks(range(len(labels)), [lb.split(" + ", 1)[-1] for lb in labels], fontsize=7)
            ax.set_title(f"{kind} free-riders")
        axes[row][0].set_ylabel(("final" if metric == "gain" else "round-averaged") + " gain\n(local − method regret)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
