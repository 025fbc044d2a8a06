r"""A full DP-FTS-DE run of a large federation on one machine, round by round: time and memory.

Runs ``configs/scale_100k.yaml``'s federation (``function_families``: every agent its own shifted
classic function in ``d = 3``, normalized; ``M = 100``, ``P = 4``, ``q = 0.35``, ``z = 1``, ten rounds)
with :class:`~fbo_torch.simulate.dp_fts_de.DPFTSDERunner` for ``--N`` agents, the agents' own steps in
chunks that fit ``--max-memory``, and records per round the wall time, ε and the process's peak
resident memory (max RSS), then the run's mean loss. The settings are read from the YAML file, so
this is the run ``fbo-torch run configs/scale_100k.yaml`` makes (with progress lines).

Usage::

    python benchmarks/scale_run.py                      # N = 100,000 (about an hour on 2 cores)
    python benchmarks/scale_run.py --N 1000 --rounds 2  # a minute
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "scale_100k.yaml")
    ap.add_argument("--N", type=int, default=None, help="agents (default: the config's)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default: the config's num_iterations)")
    ap.add_argument("--max-memory", default=None, help="working-memory budget (default: the config's)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--out", type=Path, default=None, help="JSON file (default: benchmarks/results/scale_N<N>_cpu.json)"
    )
    args = ap.parse_args(argv)

    import dataclasses

    import torch
    from round_time import machine_info

    from fbo_torch.experiments.config import load_config
    from fbo_torch.experiments.dp_fts_de import scenario_methods
    from fbo_torch.experiments.loop import prepare_scenarios
    from fbo_torch.utils.resources import parse_bytes

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    sc = cfg.scenarios[0]
    if args.N is not None:
        sc = dataclasses.replace(sc, objective={**sc.objective, "num_agents": args.N})
        cfg = dataclasses.replace(cfg, scenarios=[sc])
    if args.max_memory is not None:
        cfg = dataclasses.replace(cfg, max_memory=parse_bytes("--max-memory", args.max_memory))
    budget = cfg.max_memory
    # the objective, its domain and the checks `fbo-torch run` makes, then the runner it makes
    t0 = time.perf_counter()
    (ctx,) = prepare_scenarios(cfg, cfg.device, num_inits=1)
    objective = ctx.objective
    N = objective.num_agents
    t_objective = time.perf_counter() - t0
    label, settings = sc.methods[0]
    if args.rounds is not None:
        settings = dataclasses.replace(settings, num_iterations=args.rounds)
    t0 = time.perf_counter()
    runner = scenario_methods(ctx).make_runner(label, settings)
    t_start = time.perf_counter() - t0
    print(
        f"N={N}: objective {t_objective:.1f} s, initial queries {t_start:.1f} s, "
        f"chunks of {max(len(range(N)[c]) for c in runner.agents.chunks())} agents, max RSS {rss_gib():.2f} GiB",
        flush=True,
    )
    rounds = []
    while not runner.done:
        t0 = time.perf_counter()
        runner.step()
        eps = runner.epsilons[-1]  # reads the round's records: the round has finished on any device
        dt = time.perf_counter() - t0
        rounds.append(
            {"round": runner.t, "seconds": dt, "ms_per_agent": 1e3 * dt / N, "epsilon": eps, "max_rss_gib": rss_gib()}
        )
        print(
            f"round {runner.t:>2}: {dt:7.1f} s ({1e3 * dt / N:.3f} ms/agent)  eps {eps:.3f}  "
            f"max RSS {rss_gib():.2f} GiB",
            flush=True,
        )
    res = runner.result()
    loss = res.loss.mean(0)
    out = {
        "benchmark": "scale_run",
        "machine": machine_info("cpu"),
        "config": str(args.config.relative_to(ROOT)) if args.config.is_relative_to(ROOT) else str(args.config),
        "N": N,
        "max_memory": budget,
        "objective_s": t_objective,
        "start_s": t_start,
        "rounds": rounds,
        "mean_round_s": sum(r["seconds"] for r in rounds) / len(rounds),
        "max_rss_gib": rss_gib(),
        "mean_loss_by_round": loss.tolist(),
        "used_broadcast_fraction": res.used_server.double().mean(0).tolist(),
        "released": res.released,
    }
    path = args.out or ROOT / "benchmarks" / "results" / f"scale_N{N}_cpu.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"mean loss {loss[0]:.4f} -> {loss[-1]:.4f}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
