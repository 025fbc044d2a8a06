r"""fbo_torch's configurations on pyfmto's problems, from pyfmto's own initial designs.

Reads a pyfmto results file (``benchmarks/results/peers/pyfmto/<problem>_d<d>.json``,
written by ``run_pyfmto.py``), builds the same problem in fbo_torch
(``tetci2019`` ported; ``svm_landmine`` is our ``LandmineSVM`` configured as pyfmto's),
and runs each configuration below with the budget pyfmto used
(``fe_init`` initial points, ``fe_max − fe_init`` iterations), every agent
starting from exactly the design pyfmto's run ``seed`` started from — so run
``seed`` of every configuration of both libraries is paired. As in pyfmto, the
agents of one seed optimize together and are each other's peers
(``FTSRunner(together=True)``). Writes the same schema as ``run_pyfmto.py``
(``y`` minimized, original units), so ``compare.py`` reads both alike.

Usage::

    python benchmarks/peers/run_ours.py benchmarks/results/peers/pyfmto/tetci2019_d3.json \
        --out benchmarks/results/peers/ours/tetci2019_d3.json [--configs local,peer_prior] [--seeds 0-9]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

#: The new engine: a BoTorch GP with a noise floor for noiseless values, outputs warped by
#: evidence, LogEI (``docs/design.md``, "The local engine").
ENGINE = dict(gp_kernel="fbo", gp_warp="auto", own_acquisition="logei")
#: What every federated configuration shares: fresh messages every round, fitted on the
#: senders' warped outputs; a 300-feature map with lengthscale 0.2 on the unit box.
MESSAGES = dict(communication="every-round", num_features=300, rff_lengthscale=0.2, message_outputs="warped")

#: label -> FTSSettings arguments. "local *" configurations send nothing.
CONFIGS: dict[str, dict] = {
    "local TS (old engine)": dict(algorithm="ts"),
    "local LogEI (old engine)": dict(algorithm="ts", own_acquisition="logei"),
    "local": dict(algorithm="ts", **ENGINE),
    "local UCB": dict(algorithm="ts", gp_kernel="fbo", gp_warp="auto", own_acquisition="ucb", ucb_beta=2.0),
    "FTS": dict(algorithm="fts", **ENGINE, **MESSAGES),
    "FTS learned + trust": dict(algorithm="fts", agent_weights="learned", peer_trust=True, **ENGINE, **MESSAGES),
    "peer prior": dict(algorithm="peer_prior", **ENGINE, **MESSAGES),
    "peer prior learned": dict(algorithm="peer_prior", agent_weights="learned", **ENGINE, **MESSAGES),
}

#: ``--ablation``: the local engine's ingredients one at a time (``docs/design.md``, "The local
#: engine"). Two GP specs exist only here: the ``fbo`` spec's noise floor alone and its
#: lengthscale prior alone.
ABLATION: dict[str, dict] = {
    "BoTorch GP + TS (old default)": dict(algorithm="ts"),
    "BoTorch GP + LogEI": dict(algorithm="ts", own_acquisition="logei"),
    "+ noise floor 1e-6": dict(algorithm="ts", own_acquisition="logei", gp_kernel="ablation_floor"),
    "+ short-lengthscale prior": dict(algorithm="ts", own_acquisition="logei", gp_kernel="ablation_prior"),
    "+ both (fbo GP)": dict(algorithm="ts", own_acquisition="logei", gp_kernel="fbo"),
    "+ both + warp (engine)": dict(algorithm="ts", **ENGINE),
    "engine with TS": dict(algorithm="ts", gp_kernel="fbo", gp_warp="auto", own_acquisition="ts"),
    "BoTorch GP + warp + LogEI": dict(algorithm="ts", own_acquisition="logei", gp_warp="auto"),
}


def register_ablation_specs() -> None:
    from fbo_torch.models.batched_gp import GP_SPECS

    fbo = GP_SPECS["fbo"]
    GP_SPECS["ablation_floor"] = dataclasses.replace(fbo, ls_prior_median=None, ls_prior_scale=None)
    GP_SPECS["ablation_prior"] = dataclasses.replace(fbo, noise_lower=GP_SPECS["botorch"].noise_lower)


def build_objective(meta: dict):
    """The fbo_torch objective that evaluates the same functions as pyfmto's problem."""
    problem, dim = meta["problem"], int(meta["dim"])
    if problem == "tetci2019":
        from fbo_torch.objectives.tetci2019 import Tetci2019

        return Tetci2019(dim=dim)
    if problem == "svm_landmine":
        from fbo_torch.objectives.landmine import LandmineSVM
        from fbo_torch.objectives.search_space import Real, SearchSpace

        return LandmineSVM(
            search_space=SearchSpace([Real("C", 1e-4, 10.0), Real("gamma", 1e-2, 10.0)]), scoring="platt"
        )
    raise SystemExit(f"unknown problem {problem!r} (expected tetci2019 or svm_landmine)")


def designs(meta: dict, seeds: list[int]) -> dict[int, list[list[list[float]]]]:
    """Seed -> the initial design of every task (original units), the same for every pyfmto configuration."""
    fe_init = int(meta["fe_init"])
    out: dict[int, list] = {}
    for label, runs in meta["runs"].items():
        for run in runs:
            s = int(run["seed"])
            if s not in seeds:
                continue
            d = [task["X"][:fe_init] for task in run["tasks"]]
            if s in out and out[s] != d:
                raise SystemExit(f"pyfmto's configurations disagree on the initial design of seed {s} ({label}).")
            out[s] = d
    missing = sorted(set(seeds) - set(out))
    if missing:
        raise SystemExit(f"no pyfmto run has seed(s) {missing}")
    return out


def to_unit(objective, X: torch.Tensor, agent: int) -> torch.Tensor:
    lo, hi = _box(objective, agent)
    return ((X - lo) / (hi - lo)).clamp(0.0, 1.0)  # pyfmto's LHS lies in the box; clamp the last ulp


def to_original(objective, U: torch.Tensor, agent: int) -> torch.Tensor:
    lo, hi = _box(objective, agent)
    return lo + (hi - lo) * U


def _box(objective, agent: int) -> tuple[torch.Tensor, torch.Tensor]:
    if hasattr(objective, "lb"):
        return objective.lb[agent].to(torch.float64), objective.ub[agent].to(torch.float64)
    space = objective.search_space  # LandmineSVM: a linear box (checked in build_objective's configuration)
    lo = torch.tensor([p.low for p in space.parameters], dtype=torch.float64)
    hi = torch.tensor([p.high for p in space.parameters], dtype=torch.float64)
    return lo, hi


def minimized(objective, meta: dict, values: torch.Tensor) -> torch.Tensor:
    """pyfmto's minimized ``f`` from our maximized values: ``−value`` (tetci2019), ``1 − AUC`` (landmine)."""
    return 1.0 - values if meta["problem"] == "svm_landmine" else -values


def run_config(label: str, kw: dict, objective, meta: dict, seeds: list[int], design: dict, device: str) -> list[dict]:
    from fbo_torch.federation.settings import FTSSettings
    from fbo_torch.simulate.fts import FTSRunner

    A, S = objective.num_agents, len(seeds)
    fe_init, fe_max = int(meta["fe_init"]), int(meta["fe_max"])
    settings = FTSSettings(num_init=fe_init, num_iterations=fe_max - fe_init, **kw)
    # run order: target-major, one run per seed ("initialization")
    X0 = torch.stack(
        [
            torch.stack([to_unit(objective, torch.tensor(design[s][a], dtype=torch.float64), a) for s in seeds])
            for a in range(A)
        ]
    ).reshape(A * S, fe_init, -1)
    t0 = time.perf_counter()
    runner = FTSRunner(
        objective, settings, torch.arange(A), S, seed=0, device=device, name=label, together=True, initial_points=X0
    )
    runner.run()
    wall = time.perf_counter() - t0
    X = runner.X.cpu()  # R x fe_max x d (unit box)
    values = objective.evaluate_true(X, agents=runner.targets.cpu())
    y = minimized(objective, meta, values)
    out = []
    for j, s in enumerate(seeds):
        tasks = []
        for a in range(A):
            r = a * S + j
            tasks.append({"X": to_original(objective, X[r], a).tolist(), "y": y[r].tolist()})
        out.append({"seed": s, "wall_time": wall / S, "tasks": tasks})
    per = wall / (A * S * (fe_max - fe_init))
    print(f"{label}: {wall:.1f} s for {S} seeds ({per * 1e3:.1f} ms per agent-iteration)", file=sys.stderr, flush=True)
    return out


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        seeds.extend(range(int(a), int(b or a) + 1))
    return seeds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pyfmto", type=Path, help="pyfmto results file (its problem, budget and initial designs)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated labels of {list(CONFIGS)}")
    ap.add_argument("--seeds", default=None, help="e.g. 0-9 (default: every seed pyfmto's file has)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ablation", action="store_true", help=f"run the engine's ablation {list(ABLATION)} instead")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    configs = CONFIGS
    if args.ablation:
        register_ablation_specs()
        configs = ABLATION
        if args.configs == ",".join(CONFIGS):
            args.configs = ",".join(ABLATION)
    meta = json.loads(args.pyfmto.read_text())
    labels = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in labels if c not in configs]
    if unknown:
        ap.error(f"--configs: unknown {unknown}; expected some of {list(configs)}")
    all_seeds = sorted({int(r["seed"]) for runs in meta["runs"].values() for r in runs})
    seeds = parse_seeds(args.seeds) if args.seeds else all_seeds
    design = designs(meta, seeds)
    objective = build_objective(meta)
    result = (
        json.loads(args.out.read_text())
        if args.out.exists()
        else {
            "problem": meta["problem"],
            "dim": meta["dim"],
            "fe_init": meta["fe_init"],
            "fe_max": meta["fe_max"],
            "tasks": meta["tasks"],
            "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s), "
            f"torch {torch.__version__}, {args.device}",
            "command": " ".join(sys.argv),
            "configs": {},
            "runs": {},
        }
    )
    for label in labels:
        result["runs"][label] = run_config(label, configs[label], objective, meta, seeds, design, args.device)
        result["configs"][label] = configs[label]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
