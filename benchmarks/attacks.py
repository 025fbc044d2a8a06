"""Attacks on a deployed DP-FTS-DE server, played in process: what each attacker gets.

    python benchmarks/attacks.py [--json benchmarks/results/attacks.json]

Each attack drives the deployment's server (``fbo_torch.flower.coordinator.Coordinator``,
what the ServerApp runs) the way a hostile or careless party could, and prints
what it achieved. The script uses only the Coordinator's long-standing API
(``plan``, ``receive``), so it also runs against older fbo_torch versions to
show what they let through. ``tests/flower/test_flower_security.py`` asserts the
outcomes over Flower's records and an in-process Grid.

1. noise: an agent derives the server's streams from the run config's seed (which
   every node reads), subtracts the noise it predicts and compares with the
   noise-free aggregate; also guesses which agents were sampled.
2. same-config: two servers built from one run config, given the same messages.
3. nan: one agent's ω has one NaN entry.
4. malformed: a reply without its ``fbo.reply`` record (what reading it raises: the
   ServerApp died on the ``KeyError`` it raised before; ``tests/flower/test_flower_security.py``
   runs the ServerApp's loop through such replies).
5. no-node: no agent replies at all.
6. forged-ledger: a saved ledger whose ε were halved is loaded.
7. large-delta: a run config with δ = 0.3 for N = 4 agents.
8. report-best: does an agent send its best value by default?
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings

import torch

N, M = 4, 20
RUN_CONFIG = {
    "method": "dp-fts-de",
    "num-agents": N,
    "num-rounds": 3,
    "sample-rate": 0.75,
    "noise-multiplier": 1.0,
    "clip-norm": 1.0,
    "num-regions": 2,
    "seed": 3,
    "num-init": 3,
    "num-features": M,
    "rff-lengthscale": 0.05,
    "objective": json.dumps({"type": "gp_grid", "grid_size": 200, "perturbation": 0.05, "perturb_first": True}),
    "gp-sample-features": 32,
    "gp-fit-maxiter": 15,
}


def _coordinator(run_config=RUN_CONFIG):
    from fbo_torch.flower.config import FlowerRunConfig
    from fbo_torch.flower.coordinator import Coordinator

    cfg = FlowerRunConfig.from_run_config(run_config)
    obj = cfg.build_objective()
    return cfg, Coordinator(cfg, obj.bounds, obj.dim)


def _omegas(seed=0):
    return torch.randn(N, M, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _release(coord, omegas, skip=()):
    """Exchange 0 (the server asks for ω), the agents' replies, exchange 1 (round 1's release)."""
    coord.plan()
    for n in range(N):
        if n in skip:
            continue
        try:
            coord.receive(n, coord.fingerprint, omegas[n])
        except ValueError as err:  # a reply the server refuses
            _release.refused.append(str(err))
    return coord.plan()


_release.refused = []


def noise() -> dict:
    from fbo_torch.federation import clip_vectors
    from fbo_torch.utils import keyed_random as kr

    cfg, coord = _coordinator()
    omegas = _omegas()
    plan = _release(coord, omegas)
    server = coord.server
    rec = server.last_record
    W = server.aggregator.weights(1)
    P, q, S, z = W.shape[0], cfg.settings.sample_rate, cfg.settings.clip_norm, cfg.settings.noise_multiplier
    std = z * float(W.max()) * S / q
    clipped, _ = clip_vectors(omegas.unsqueeze(0), S / math.sqrt(P))
    signal = (W @ (clipped * rec.sampled.unsqueeze(-1)))[0] / q
    key = cfg.federation_key()  # what every agent can compute from the run config
    guess = std * kr.normal(kr.fold(kr.fold(key, "noise"), 1), P * M).view(P, M)
    coins = kr.uniform(kr.fold(kr.fold(kr.fold(key.unsqueeze(-1), "poisson"), 1), torch.arange(N)), 1).squeeze(-1)
    err = (plan.broadcast - guess - signal).pow(2).mean().sqrt().item()
    return {
        "error_over_noise_std": err / std,
        "sample_guessed": bool(torch.equal((coins < q).view(-1), rec.sampled[0])),
    }


def same_config() -> dict:
    (_, a), (_, b) = _coordinator(), _coordinator()
    pa, pb = _release(a, _omegas()), _release(b, _omegas())
    return {"identical_broadcasts": bool(torch.equal(pa.broadcast, pb.broadcast))}


def nan() -> dict:
    _, coord = _coordinator()
    omegas = _omegas()
    omegas[1, 2] = math.nan
    _release.refused = []
    plan = _release(coord, omegas)
    return {
        "non_finite_broadcast_entries": int((~torch.isfinite(plan.broadcast)).sum()),
        "broadcast_entries": plan.broadcast.numel(),
        "refused": _release.refused[:1],
    }


def malformed() -> dict:
    from flwr.app import RecordDict

    from fbo_torch.flower import records

    try:
        records.records_to_reply(RecordDict())
    except Exception as err:
        return {"raises": type(err).__name__}
    return {"raises": None}


def no_node() -> dict:
    _, coord = _coordinator()
    for _ in range(RUN_CONFIG["num-rounds"] + 1):
        coord.plan()
    ledger = coord.ledger
    return {"releases": int(sum(r.released for r in coord.logs)), "epsilon": ledger.epsilon}


def forged_ledger() -> dict:
    from fbo_torch.privacy import PrivacyLedger

    ledger = PrivacyLedger("rdp", num_agents=200)
    for _ in range(10):
        ledger.record(1.0, 0.35)
    state = ledger.state_dict()
    state["epsilons"] = [e / 2 for e in state["epsilons"]]
    fresh = PrivacyLedger("rdp", num_agents=200)
    try:
        fresh.load_state_dict(state)
    except ValueError as err:
        return {"accepted": False, "true_epsilon": ledger.epsilon, "message": str(err)[:120]}
    return {"accepted": True, "true_epsilon": ledger.epsilon, "loaded_epsilon": fresh.epsilon}


def large_delta() -> dict:
    from fbo_torch.flower.config import FlowerRunConfig

    try:
        FlowerRunConfig.from_run_config(dict(RUN_CONFIG, delta=0.3))
    except ValueError as err:
        return {"accepted": False, "message": str(err)[:120]}
    return {"accepted": True}


def report_best() -> dict:
    from fbo_torch.flower.config import FlowerRunConfig

    return {"sent_by_default": bool(FlowerRunConfig().report_best)}


ATTACKS = {
    "noise": noise,
    "same-config": same_config,
    "nan": nan,
    "malformed": malformed,
    "no-node": no_node,
    "forged-ledger": forged_ledger,
    "large-delta": large_delta,
    "report-best": report_best,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="also write the outcomes to this JSON file")
    args = parser.parse_args(argv)
    import fbo_torch

    out = {"fbo_torch_version": fbo_torch.__version__, "attacks": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, attack in ATTACKS.items():
            out["attacks"][name] = result = attack()
            print(f"{name:14s} {json.dumps(result)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
