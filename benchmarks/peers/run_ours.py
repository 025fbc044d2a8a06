r"""fbo_torch's configurations on the peers' suites: together from pyfmto's designs, or as a newcomer.

Two settings, each paired over seeds across every configuration:

* ``--setting together`` (pyfmto's): every agent is a target, the agents of one seed
  optimize at once and are each other's peers (``FTSRunner(together=True)``), each
  starting from exactly the design pyfmto's run ``seed`` started from, with pyfmto's
  budget (``fe_init`` initial points, ``fe_max − fe_init`` iterations) — so run ``seed``
  of every configuration of both libraries is paired;
* ``--setting newcomer`` (the FTS paper's, its Figure 1): each agent in turn joins
  peers that already hold ``--peer-observations`` observations each (they ran the local
  engine from their own random points: a :class:`~fbo_torch.simulate.fts.FederationHistory`
  per seed, shared by every configuration) with the first ``--newcomer-init`` points of
  pyfmto's design and ``fe_max − fe_init`` iterations; the peers have finished and
  their messages are drawn once (``communication: one-shot``). pyfmto has no such setting.

The problem comes from a pyfmto results file (``benchmarks/results/peers/pyfmto/<problem>_d<d>.json``,
written by ``run_pyfmto.py``: its problem, budget and designs; ``tetci2019``,
``svm_landmine`` and, through ``benchmarks/peers/ports.py``, the other ports) or a designs
file in the same schema (``benchmarks/results/peers/designs/``, written by ``lhs_designs.py``), or is
``synthetic`` — the FTS paper's synthetic family (GP samples on a 1-D grid and their
copies perturbed by ±0.02, observation noise 0.01; 5 sampled functions with 10 agents
each; newcomers are each group's first agent, with the other agents' 100 random
observations, as in the paper; seeds are initializations, uniform initial points).
Writes the schema of ``run_pyfmto.py`` (``y`` minimized, original units) plus
``"setting"``, so ``compare.py`` reads every file alike.

Usage::

    python benchmarks/peers/run_ours.py benchmarks/results/peers/pyfmto/tetci2019_d3.json \
        --out benchmarks/results/peers/ours/tetci2019_d3.json [--configs local,transfer] [--seeds 0-9]
    python benchmarks/peers/run_ours.py benchmarks/results/peers/pyfmto/tetci2019_d3.json --setting newcomer \
        --out benchmarks/results/peers/ours/tetci2019_d3_newcomer.json
    python benchmarks/peers/run_ours.py synthetic --setting newcomer --seeds 0-9 --out ...
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
#: A checkout of Xiaoxu-Zhang/fmto for the ports that read its data files (``--fmto``).
FMTO: Path | None = None

#: The papers' agents, our previous default: BoTorch's SingleTaskGP, a Thompson sample (``setup: paper``).
OLD = dict(gp_kernel="botorch", gp_warp="none", own_acquisition="ts")
#: The local engine: a BoTorch GP with a noise floor for noiseless values, outputs warped by
#: evidence, LogEI (``docs/design.md``, "The local engine"); the settings' defaults.
ENGINE = dict(gp_kernel="fbo", gp_warp="auto", own_acquisition="logei")
#: What every federated configuration shares: fresh messages every round, fitted on the
#: senders' warped outputs; a 300-feature map with lengthscale 0.2 on the unit box (the
#: synthetic suite uses the paper's map instead: :data:`SYNTHETIC_MAP`).
MESSAGES = dict(communication="every-round", num_features=300, rff_lengthscale=0.2, message_outputs="warped")
#: The FTS paper's shared map for its synthetic functions (the kernel they were drawn from).
SYNTHETIC_MAP = dict(num_features=100, rff_lengthscale=0.03, rff_noise_variance=0.01)

#: label -> FTSSettings arguments. "local *" configurations send nothing.
CONFIGS: dict[str, dict] = {
    "local TS (old engine)": dict(algorithm="ts", **OLD),
    "local LogEI (old engine)": dict(algorithm="ts", **{**OLD, "own_acquisition": "logei"}),
    "local": dict(algorithm="ts", **ENGINE),
    "local UCB": dict(algorithm="ts", gp_kernel="fbo", gp_warp="auto", own_acquisition="ucb", ucb_beta=2.0),
    "FTS": dict(algorithm="fts", **ENGINE, **MESSAGES),
    "FTS learned + trust": dict(algorithm="fts", agent_weights="learned", peer_trust=True, **ENGINE, **MESSAGES),
    "peer prior": dict(algorithm="peer_prior", **ENGINE, **MESSAGES),
    "peer prior learned": dict(algorithm="peer_prior", agent_weights="learned", **ENGINE, **MESSAGES),
    # the recommended federated configuration: every channel, learned per agent, with the sybil
    # defence of docs/security.md (corroborated peer weights; docs/design.md)
    "transfer": dict(algorithm="transfer", agent_weights="corroborated", **ENGINE, **MESSAGES),
}

#: ``--ablation``: the local engine's ingredients one at a time (``docs/design.md``, "The local
#: engine"). Two GP specs exist only here: the ``fbo`` spec's noise floor alone and its
#: lengthscale prior alone.
ABLATION: dict[str, dict] = {
    "BoTorch GP + TS (old default)": dict(algorithm="ts", **OLD),
    "BoTorch GP + LogEI": dict(algorithm="ts", **{**OLD, "own_acquisition": "logei"}),
    "+ noise floor 1e-6": dict(algorithm="ts", **{**OLD, "own_acquisition": "logei", "gp_kernel": "ablation_floor"}),
    "+ short-lengthscale prior": dict(
        algorithm="ts", **{**OLD, "own_acquisition": "logei", "gp_kernel": "ablation_prior"}
    ),
    "+ both (fbo GP)": dict(algorithm="ts", **{**OLD, "own_acquisition": "logei", "gp_kernel": "fbo"}),
    "+ both + warp (engine)": dict(algorithm="ts", **ENGINE),
    "engine with TS": dict(algorithm="ts", gp_kernel="fbo", gp_warp="auto", own_acquisition="ts"),
    "BoTorch GP + warp + LogEI": dict(algorithm="ts", gp_kernel="botorch", own_acquisition="logei", gp_warp="auto"),
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
    try:
        from ports import build_objective as build_port  # the other ports (gecco2020, tevc2024, arxiv2017)
    except ImportError:
        raise SystemExit(f"unknown problem {problem!r} (expected tetci2019 or svm_landmine)") from None
    return build_port(meta, FMTO)


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
    if not hasattr(objective, "search_space") and not hasattr(objective, "lb"):  # the unit box itself
        return objective.bounds[0].to(torch.float64), objective.bounds[1].to(torch.float64)
    if hasattr(objective, "lb"):
        return objective.lb[agent].to(torch.float64), objective.ub[agent].to(torch.float64)
    space = objective.search_space  # LandmineSVM: a linear box (checked in build_objective's configuration)
    lo = torch.tensor([p.low for p in space.parameters], dtype=torch.float64)
    hi = torch.tensor([p.high for p in space.parameters], dtype=torch.float64)
    return lo, hi


def minimized(objective, meta: dict, values: torch.Tensor) -> torch.Tensor:
    """pyfmto's minimized ``f`` from our maximized values: ``−value`` (tetci2019), ``1 − AUC`` (landmine)."""
    return 1.0 - values if meta["problem"] == "svm_landmine" else -values


def settings_for(kw: dict, meta: dict, n0: int, T: int):
    from fbo_torch.federation.settings import FTSSettings

    extra = SYNTHETIC_MAP if meta["problem"] == "synthetic" and kw.get("algorithm", "ts") != "ts" else {}
    return FTSSettings(num_init=n0, num_iterations=T, **{**kw, **extra})


def records(objective, meta: dict, runner, seeds_of_runs: list[int], agents_of_runs: list[int]) -> dict:
    """``seed -> [{"X", "y"}]`` of a finished runner's runs (original units, ``y`` minimized)."""
    X = runner.X.cpu()
    values = objective.evaluate_true(X, agents=runner.targets.cpu())
    y = minimized(objective, meta, values)
    out: dict[int, list] = {}
    for r, (s, a) in enumerate(zip(seeds_of_runs, agents_of_runs, strict=True)):
        out.setdefault(s, []).append({"X": to_original(objective, X[r], a).tolist(), "y": y[r].tolist()})
    return out


def history(objective, seed: int, t_n: int, device: str):
    r"""The peers of a newcomer, for seed ``seed``: ``t_n`` observations per agent, from their own
    random points then the local engine (LogEI), the same for every configuration."""
    from fbo_torch.optim.domain import Domain
    from fbo_torch.simulate.fts import FederationHistory

    domain = Domain(objective.bounds, objective.candidates)
    if objective_kind(objective) == "synthetic":  # the paper's peers: random noisy observations
        return FederationHistory(objective, domain, t_n, mode="random", seed=1000 + seed, device=device)
    return FederationHistory(objective, domain, t_n, mode="ts", num_init=10, seed=1000 + seed, device=device)


def objective_kind(objective) -> str:
    return "synthetic" if type(objective).__name__ == "GPSampleGridFederation" else "pyfmto"


def run_config(
    label: str, kw: dict, objective, meta: dict, seeds: list[int], source: dict, args: argparse.Namespace
) -> list[dict]:
    r"""One configuration on every seed: ``[{"seed", "wall_time", "tasks": [{"X", "y"}]}]``."""
    from fbo_torch.simulate.fts import FTSRunner

    n0, T = int(meta["fe_init"]), int(meta["fe_max"]) - int(meta["fe_init"])
    if args.setting == "newcomer" and kw.get("algorithm", "ts") != "ts":
        kw = {**kw, "communication": "one-shot"}  # the peers have finished: their messages are drawn once
    settings = settings_for(kw, meta, n0, T)
    targets = source["targets"]
    federated = settings.algorithm != "ts"
    out: dict[int, list] = {}
    t0 = time.perf_counter()
    if args.setting == "together":
        S = len(seeds)
        runner = FTSRunner(
            objective,
            settings,
            torch.tensor(targets),
            S,
            seed=0,
            device=args.device,
            name=label,
            together=federated,
            initial_points=source["initial"](seeds),
        )
        runner.run()
        out = records(objective, meta, runner, [s for _ in targets for s in seeds], [a for a in targets for _ in seeds])
    else:  # newcomer: one runner per seed, its peers' history that seed's
        for s in seeds:
            runner = FTSRunner(
                objective,
                settings,
                torch.tensor(targets),
                1,
                seed=s,
                device=args.device,
                name=label,
                history=source["history"](s) if federated else None,
                initial_points=source["initial"]([s]),
            )
            runner.run()
            out.update(records(objective, meta, runner, [s] * len(targets), list(targets)))
    wall = time.perf_counter() - t0
    per = wall / (len(targets) * len(seeds) * T)
    print(f"{label}: {wall:.1f} s for {len(seeds)} seeds ({per * 1e3:.1f} ms per agent-iteration)", file=sys.stderr)
    return [{"seed": s, "wall_time": wall / len(seeds), "tasks": out[s]} for s in seeds]


def pyfmto_source(meta: dict, seeds: list[int], setting: str, n0: int, t_n: int, device: str) -> tuple:
    """The objective, the header of our results, and how runs start (designs, histories) for a pyfmto file."""
    objective = build_objective(meta)
    design = designs(meta, seeds)
    A = objective.num_agents
    fe_init = int(meta["fe_init"]) if setting == "together" else min(n0, int(meta["fe_init"]))

    def initial(ss: list[int]) -> torch.Tensor:  # target-major, one run per seed
        X0 = [
            [to_unit(objective, torch.tensor(design[s][a][:fe_init], dtype=torch.float64), a) for s in ss]
            for a in range(A)
        ]
        return torch.stack([torch.stack(row) for row in X0]).reshape(A * len(ss), fe_init, -1)

    histories: dict[int, object] = {}

    def hist(s: int):
        if s not in histories:
            histories[s] = history(objective, s, t_n, device)
        return histories[s]

    head = {k: meta[k] for k in ("problem", "dim", "fe_init", "fe_max", "tasks") if k in meta}
    if "problem_kwargs" in meta:
        head["problem_kwargs"] = meta["problem_kwargs"]
    head["fe_init"] = fe_init
    head["fe_max"] = fe_init + int(meta["fe_max"]) - int(meta["fe_init"])
    return objective, head, {"targets": list(range(A)), "initial": initial, "history": hist}


def synthetic_source(seeds: list[int], setting: str, t_n: int, device: str) -> tuple:
    """The FTS paper's synthetic suite (module docstring): a 1-D grid, 5 functions x 10 agents."""
    from fbo_torch.objectives.synthetic import GPSampleGridFederation

    objective = GPSampleGridFederation(
        num_groups=5, agents_per_group=10, grid_size=1000, lengthscale=0.03, noise_variance=0.01, perturbation=0.02
    )
    targets = objective.targets.tolist() if setting == "newcomer" else list(range(objective.num_agents))
    n0, T = (1, 30) if setting == "newcomer" else (5, 25)
    opt = objective.optimum.tolist()
    head = {
        "problem": "synthetic",
        "dim": 1,
        "fe_init": n0,
        "fe_max": n0 + T,
        "tasks": [
            {"name": f"f{a // 10} agent {a % 10}", "lb": [0.0], "ub": [1.0], "y_global": -opt[a]} for a in targets
        ],
    }
    histories: dict[int, object] = {}

    def hist(s: int):
        if s not in histories:
            histories[s] = history(objective, s, t_n, device)
        return histories[s]

    def initial(ss: list[int]) -> torch.Tensor:  # uniform grid points from a seeded stream, the same for all
        g = torch.Generator().manual_seed(7919 + 31 * ss[0] + len(ss))
        C = objective.candidates
        idx = torch.randint(C.shape[0], (len(targets) * len(ss), n0), generator=g)
        return C[idx]

    return objective, head, {"targets": targets, "initial": initial, "history": hist}


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        seeds.extend(range(int(a), int(b or a) + 1))
    return seeds


def main(argv: list[str] | None = None) -> int:
    global FMTO
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="a pyfmto or lhs_designs.py results file (problem, budget, designs), or 'synthetic'")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--setting", choices=("together", "newcomer"), default="together")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated labels of {list(CONFIGS)}")
    ap.add_argument("--extra", type=json.loads, default={}, help="further configurations: JSON {label: settings}")
    ap.add_argument("--seeds", default=None, help="e.g. 0-9 (default: every seed pyfmto's file has; synthetic: 0-9)")
    ap.add_argument("--newcomer-init", type=int, default=10, help="a newcomer's initial points (pyfmto suites)")
    ap.add_argument("--peer-observations", type=int, default=100, help="what each of a newcomer's peers holds")
    ap.add_argument("--fmto", type=Path, default=None, help="a checkout of Xiaoxu-Zhang/fmto (ports reading its data)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ablation", action="store_true", help=f"run the engine's ablation {list(ABLATION)} instead")
    args = ap.parse_args(argv)
    FMTO = args.fmto
    torch.set_num_threads(args.threads)
    configs = {**CONFIGS, **args.extra}
    if args.ablation:
        register_ablation_specs()
        configs = ABLATION
        if args.configs == ",".join(CONFIGS):
            args.configs = ",".join(ABLATION)
    labels = [c.strip() for c in args.configs.split(",") if c.strip()] + [k for k in args.extra if k not in CONFIGS]
    unknown = [c for c in labels if c not in configs]
    if unknown:
        ap.error(f"--configs: unknown {unknown}; expected some of {list(configs)}")
    if args.source == "synthetic":
        seeds = parse_seeds(args.seeds or "0-9")
        objective, head, source = synthetic_source(seeds, args.setting, args.peer_observations, args.device)
    else:
        meta = json.loads(Path(args.source).read_text())
        all_seeds = sorted({int(r["seed"]) for runs in meta["runs"].values() for r in runs})
        seeds = parse_seeds(args.seeds) if args.seeds else all_seeds
        objective, head, source = pyfmto_source(
            meta, seeds, args.setting, args.newcomer_init, args.peer_observations, args.device
        )
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    if result and (result.get("setting"), result.get("fe_max")) != (args.setting, head["fe_max"]):
        ap.error(f"--out: {args.out} holds another setting or budget; give another file")
    if not result:
        result = {
            **head,
            "setting": args.setting,
            "peer_observations": args.peer_observations if args.setting == "newcomer" else None,
            "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s), "
            f"torch {torch.__version__}, {args.device}",
            "command": " ".join(sys.argv),
            "configs": {},
            "runs": {},
        }
    for label in labels:
        result["runs"][label] = run_config(label, configs[label], objective, head, seeds, source, args)
        result["configs"][label] = configs[label]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
