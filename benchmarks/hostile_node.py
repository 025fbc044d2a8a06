"""How far one hostile node can move a secure release: its in-range integers against the decoder's bounds.

    python benchmarks/hostile_node.py [--json benchmarks/results/hostile_node.json]

The demo's secure federation (N = 4 agents, P = 2 regions, M = 50 features, z = 1, dropout tolerance 0.25:
examples/flower_app/pyproject.toml with SECAGG=1): three honest agents and the hostile one each send their
integer vector (:meth:`~fbo_torch.federation.secure.SecureMechanism.contributions`); the hostile node adds
``m/2 - 1`` (or ``m/2``) to ``k`` coordinates of its own, the largest push the modular sum allows, and the
server decodes the sum. Addition modulo ``m`` makes that exactly what a node adding the offset to its masked
vector does in SecAgg+ (``tests/flower/test_flower_secagg.py`` runs it through Flower's records). Reported,
in lattice units, over 20 rounds of random ω: the largest coordinate shift and the norm of the shift, with
the decoder's clamp at the worst case of every share at its truncation bound (``±N·A``, the decoder before
issue 50) and with the release bounds (``±B`` per coordinate, ``R`` in norm), against an honest agent's
largest entry ``⌈c/√P⌉``, the sum's noise std ``√N σ`` and one agent's sensitivity ``Δ₂``.
"""

from __future__ import annotations

import argparse
import json
import math

import torch


def measure(rounds: int = 20) -> dict:
    from fbo_torch.federation.secure import SecureMechanism, agent_secret, research_master
    from fbo_torch.federation.settings import DPFTSDESettings

    N, P, M = 4, 2, 50
    settings = DPFTSDESettings(
        aggregation="secure",
        num_regions=P,
        num_features=M,
        sample_rate=0.75,
        noise_multiplier=1.0,
        clip_norm=1.0,
        dropout_tolerance=0.25,
    )
    m = SecureMechanism.from_settings(settings, N)
    secrets = [agent_secret(research_master(0), 0, n) for n in range(N)]
    gen = torch.Generator().manual_seed(0)
    entry, std = math.ceil(m.scale / math.sqrt(P)), math.sqrt(N * m.local_variance)
    out: dict = {
        "constants": {
            "N": N,
            "P": P,
            "M": M,
            "scale": m.scale,
            "share_std": math.sqrt(m.local_variance),
            "honest_entry": entry,
            "noise_std_of_sum": std,
            "sensitivity": m.l2_sensitivity,
            "old_bound_NA": m.sum_bound,
            "B": m.release_entry_bound,
            "R": m.release_norm_bound,
        },
        "attacks": {},
    }
    for k in (1, 4, 16, m.dim):
        old_max = new_max = new_norm = 0.0
        for t in range(1, rounds + 1):
            omegas = torch.randn(N, M, dtype=torch.float64, generator=gen)
            y, _ = m.contributions(
                omegas, torch.ones(N, dtype=torch.bool), torch.ones(N, P, dtype=torch.float64), secrets, t
            )
            honest = y.sum(0)
            for offset in (m.modulus // 2 - 1, m.modulus // 2):
                push = torch.zeros(m.dim, dtype=torch.int64)
                push[:k] = offset
                total = m.reduce(honest + push)
                old = m.centre(total).clamp(-m.sum_bound, m.sum_bound)
                new = m.decode(total)[0].reshape(-1) * (m.scale / m.clip_norm)
                old_max = max(old_max, float((old - honest).abs().max()))
                new_max = max(new_max, float((new - honest).abs().max()))
                new_norm = max(new_norm, float((new - honest).norm()))
        out["attacks"][f"{k} coordinate(s)"] = {
            "old_max_shift": old_max,
            "new_max_shift": new_max,
            "new_norm_shift": new_norm,
            "old_over_entry": old_max / entry,
            "new_over_entry": new_max / entry,
            "old_over_noise_std": old_max / std,
            "new_over_noise_std": new_max / std,
            "new_norm_over_sensitivity": new_norm / m.l2_sensitivity,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the results there")
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args(argv)
    out = measure(args.rounds)
    for name, row in out["attacks"].items():
        print(
            f"{name}: largest coordinate shift {row['old_max_shift']:.0f} -> {row['new_max_shift']:.0f} lattice units "
            f"({row['old_over_entry']:.0f}x -> {row['new_over_entry']:.1f}x an honest agent's largest entry, "
            f"{row['old_over_noise_std']:.0f}x -> {row['new_over_noise_std']:.1f}x the noise std); norm of the shift "
            f"{row['new_norm_shift']:.0f} = {row['new_norm_over_sensitivity']:.1f} sensitivities"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
