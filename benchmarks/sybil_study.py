r"""Sybils against learned ``P_N``: how much of an FTS agent's choice do copied, spiked messages take?

The attack (issue 35, item 7): a sybil copies a helpful peer's message ``ω_h``
and adds a spike where the target agent has not yet looked,
``ω_s = ω_h + c φ(x_s) / ‖φ(x_s)‖²`` (the smallest change of ``ω`` that raises
``f_h(x_s)`` by ``c``; ``c`` makes ``x_s`` the sybil's maximizer, so following a
sybil queries ``x_s``). At the target's own inputs a sybil predicts what the
copied peer predicts, so rank-based fidelity scores cannot tell them apart
until the target has looked at ``x_s``.

Federation: the ``50% helpful, 50% useless`` mixture of
``configs/learned_weights/mixtures.yaml`` (a GP-sampled target on a 1-D grid of
1000 points, 20 peers, 10 helpful ``f ± 0.02`` and 10 useless, each peer's
message one posterior draw from 40 random observations, ``M = 100``), with
``k`` of the useless peers replaced by sybils (``k = 0, 1, 3, 10``). Each
sybil copies one helpful peer (drawn per run) and spikes at the grid point
farthest from the target's observations, moved by up to half a lengthscale per
sybil. The target holds ``n = 5, 10, 20`` random observations; runs are
``--functions`` targets x ``--inits`` initializations. ``p_t = 0.5``.

Reported per ``(k, n)``, mean over runs, for the scoring of main (every
message scored alone: ``before``) and with near-duplicates counted once
(:func:`fbo_torch.protocol.fidelity.redundancy`: ``after``): the sybils' and
the helpful peers' shares of ``P_N`` with learned weights, the probability of
the agent's own GP with peer trust (``p_t' = 1 - (1 - p_t) g``), and the
sybil messages an agent is expected to follow in 60 draws with trust,
``60 (1 - p_t') share``, against ``60 (1 - p_t) k / 20`` with uniform ``P_N``.
Also the correlations ``ρ = cos(ω_n, ω_m)`` between honest peers' messages and
between a sybil and the message it copied.

Usage::

    python benchmarks/sybil_study.py --out benchmarks/results/sybil_study.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from fbo_torch.federation.settings import FTSSettings
from fbo_torch.objectives.synthetic import AGENT_KINDS, GPSampleGridFederation
from fbo_torch.optim.domain import Domain
from fbo_torch.protocol.fidelity import fidelity_scores, learn_peer_choice, peer_predictions, redundancy
from fbo_torch.protocol.schedules import AgentDistribution
from fbo_torch.simulate.fts import FederationHistory, FTSRunner
from fbo_torch.simulate.presets import PAPER

HELPFUL, USELESS = AGENT_KINDS.index("helpful"), AGENT_KINDS.index("useless")
SYBILS = (0, 1, 3, 10)
OBSERVATIONS = (5, 10, 20)
P_T, DRAWS = 0.5, 60


def federation(functions: int) -> tuple[GPSampleGridFederation, Domain, FederationHistory]:
    obj = GPSampleGridFederation(
        num_groups=functions,
        agents_per_group=21,
        grid_size=1000,
        lengthscale=0.03,
        noise_variance=0.01,
        perturbation=0.02,
        useless_fraction=0.5,
    )
    domain = Domain(obj.bounds, obj.candidates)
    return obj, domain, FederationHistory(obj, domain, t_n=40, mode="random", seed=17)


def sybil_messages(
    features, base: torch.Tensor, X: torch.Tensor, grid: torch.Tensor, k: int, gen: torch.Generator
) -> torch.Tensor:
    r"""``R x k x M`` sybils of the ``R x M`` messages ``base``: each spiked near the grid point
    farthest from the run's inputs ``X`` (``R x n x 1``)."""
    R = base.shape[0]
    far = (grid.view(1, -1) - X[..., 0].unsqueeze(-1)).abs().amin(-2)  # R x C: distance to the nearest input
    x_s = grid[far.argmax(-1)]  # R
    jitter = (torch.rand(R, k, generator=gen, dtype=torch.float64) - 0.5) * 0.03  # up to half a lengthscale
    x_s = (x_s.unsqueeze(-1) + jitter).clamp(0, 1)  # R x k
    f_base = features(grid.view(-1, 1)) @ base.T  # C x R
    top, low = f_base.amax(0), f_base.amin(0)
    phi_s = features(x_s.unsqueeze(-1))  # R x k x M
    at_s = torch.einsum("rkm,rm->rk", phi_s, base)
    c = (top.unsqueeze(-1) - at_s) + 0.25 * (top - low).unsqueeze(-1)  # the spike tops the copy by 25% of its range
    return base.unsqueeze(1) + c.unsqueeze(-1) * phi_s / phi_s.square().sum(-1, keepdim=True)


def study(functions: int, inits: int, seed: int) -> dict:
    obj, domain, history = federation(functions)
    grid = obj.candidates[:, 0]
    rows = []
    for n in OBSERVATIONS:
        settings = FTSSettings(
            **PAPER,
            algorithm="fts",
            num_init=n,
            num_iterations=1,
            num_features=100,
            rff_lengthscale=0.03,
            rff_noise_variance=0.01,
            communication="one-shot",
            agent_weights="learned",
            peer_trust=True,
        )
        runner = FTSRunner(obj, settings, obj.targets, inits, history=history, domain=domain, seed=seed)
        features = runner.features
        R = runner.num_runs
        peers = torch.stack([obj.members(int(g))[1:] for g in runner.targets // obj.agents_per_group])  # R x 20
        kinds = obj.kind_of_agent[peers]
        honest = runner.method.omegas.gather(
            1, peers.unsqueeze(-1).expand(-1, -1, runner.method.omegas.shape[-1])
        )  # R x 20 x M
        X, y, mask = runner.X, runner.Y.squeeze(-1), runner.agents.mask
        gen = torch.Generator().manual_seed(seed + n)
        helpful_idx = torch.stack([torch.nonzero(row == HELPFUL).squeeze(-1) for row in kinds])  # R x 10
        copied = helpful_idx.gather(1, torch.randint(0, helpful_idx.shape[1], (R, 1), generator=gen))  # R x 1
        useless_idx = torch.stack([torch.nonzero(row == USELESS).squeeze(-1) for row in kinds])  # R x 10
        M = honest.shape[-1]
        unit = honest / honest.norm(dim=-1, keepdim=True)
        rho = unit @ unit.transpose(-1, -2)
        off = ~torch.eye(honest.shape[1], dtype=torch.bool)
        for k in SYBILS:
            omegas, is_sybil = honest.clone(), torch.zeros_like(kinds, dtype=torch.bool)
            if k:
                base = honest[torch.arange(R), copied[:, 0]]
                slots = useless_idx[:, :k]
                sybils = sybil_messages(features, base, X, grid, k, gen)
                omegas.scatter_(1, slots.unsqueeze(-1).expand(-1, -1, M), sybils)
                is_sybil.scatter_(1, slots, True)
                spike_rho = torch.nn.functional.cosine_similarity(sybils, base.unsqueeze(1), dim=-1)
            scores = fidelity_scores(peer_predictions(features, omegas, X), y, mask)
            row = {"sybils": k, "observations": n, "runs": R}
            for label, copies in (("before", None), ("after", redundancy(omegas))):
                shares, own = {}, None
                for trust in (False, True):
                    dist = AgentDistribution(omegas.shape[1], batch_shape=torch.Size([R]))
                    p = learn_peer_choice(dist, scores, mask.sum(-1), P_T, "learned", trust, copies)
                    probs = dist.probs
                    if trust:
                        own = torch.as_tensor(p, dtype=torch.float64).expand(R)
                    else:
                        shares = {
                            "sybil": float((probs * is_sybil).sum(-1).mean()),
                            "helpful": float((probs * (kinds == HELPFUL) * ~is_sybil).sum(-1).mean()),
                        }
                sybil_share_trust = (probs * is_sybil).sum(-1)
                row[label] = {
                    "share_sybils": shares["sybil"],
                    "share_helpful": shares["helpful"],
                    "own_gp_probability_trust": float(own.mean()),
                    "sybil_follows_in_60_trust": float((DRAWS * (1 - own) * sybil_share_trust).mean()),
                }
            row["uniform"] = {"share_sybils": k / 20, "sybil_follows_in_60": DRAWS * (1 - P_T) * k / 20}
            if k:
                row["sybil_to_copied_correlation"] = {"min": float(spike_rho.min()), "mean": float(spike_rho.mean())}
            rows.append(row)
        honest_rho = rho[:, off]
        rows[-len(SYBILS)]["honest_correlation"] = {"max": float(honest_rho.max()), "mean": float(honest_rho.mean())}
    return {"rows": rows}


def table(rows: list[dict]) -> str:
    lines = [
        "| sybils | n | uniform share | share before | share after | helpful before | helpful after "
        "| own GP (trust) before | after | sybil follows /60 uniform | before | after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b, a, u = r["before"], r["after"], r["uniform"]
        lines.append(
            f"| {r['sybils']} | {r['observations']} | {u['share_sybils']:.0%} | {b['share_sybils']:.1%} | "
            f"{a['share_sybils']:.1%} | {b['share_helpful']:.1%} | {a['share_helpful']:.1%} | "
            f"{b['own_gp_probability_trust']:.2f} | {a['own_gp_probability_trust']:.2f} | "
            f"{u['sybil_follows_in_60']:.1f} | {b['sybil_follows_in_60_trust']:.1f} | "
            f"{a['sybil_follows_in_60_trust']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=20, help="target functions (default 20)")
    parser.add_argument("--inits", type=int, default=5, help="initializations per target (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    out = study(args.functions, args.inits, args.seed)
    out.update(
        command=" ".join(["python", "benchmarks/sybil_study.py", *(argv if argv is not None else sys.argv[1:])]),
        machine=f"{platform.machine()} {platform.processor() or ''}".strip(),
        torch=torch.__version__,
        wall_time_s=round(time.perf_counter() - t0, 1),
    )
    print(table(out["rows"]))
    for r in out["rows"]:
        if "honest_correlation" in r:
            print(
                f"n = {r['observations']}: honest peers' messages, correlation max "
                f"{r['honest_correlation']['max']:.3f}, mean {r['honest_correlation']['mean']:.3f}"
            )
        if "sybil_to_copied_correlation" in r and r["sybils"] == max(SYBILS):
            print(
                f"n = {r['observations']}: a sybil and the message it copied, correlation min "
                f"{r['sybil_to_copied_correlation']['min']:.3f}"
            )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
