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

A second attack (issue 50, item 9), ``decorrelated``: each sybil is the spiked
copy plus a random component in the null space of the target's observed
features ``φ(X)`` (its predictions at ``X`` are the spiked copy's), of the
smallest size that brings its correlation with every other message below 0.45,
so that :func:`~fbo_torch.protocol.fidelity.redundancy` counts none of them
(:func:`decorrelated_sybils`; the message norms, honest and sybil, are reported).
A third attack, ``spread``, is the second with the attacker's points kept at
least 1.3 lengthscales apart (:func:`spread_points`), so that no two sybils'
maximizers coincide: the adaptation open to an attacker against rules that
count peers whose maximizers coincide.
``candidate_rules`` compares near-duplicate rules that do not rely on copied
messages and a cross-check of each peer's maximizer by the peers outside its
group (:func:`candidate_counts`, :func:`fbo_torch.protocol.fidelity.cross_check`) on the three
attacks and without sybils; ``corroborated`` is the last of them as ``fbo_torch`` computes it for
``agent_weights: corroborated`` (:func:`fbo_torch.protocol.fidelity.corroborated_counts`).

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
from fbo_torch.protocol.fidelity import (
    CROSS_CHECK_STRENGTH,
    coinciding_maximizers,
    corroborated_counts,
    cross_check,
    fidelity_scores,
    fidelity_weights,
    learn_peer_choice,
    maximizer_correlation,
    near_copies,
    peer_predictions,
    redundancy,
    reference_values,
)
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
    x_s = spike_points(X, grid, k, gen)
    return base.unsqueeze(1) + spike(features, base.unsqueeze(1).expand(-1, k, -1), x_s, grid)


def spread_points(X: torch.Tensor, grid: torch.Tensor, k: int, spacing: float = 0.04) -> torch.Tensor:
    r"""``R x k`` attacker's points kept apart: greedily the grid point farthest from each run's inputs
    and from the points already chosen, each at least ``spacing`` (1.3 lengthscales: kernel correlation
    0.41) from the others, so that no two sybils' maximizers coincide under ``candidate_counts``."""
    far = (grid.view(1, -1) - X[..., 0].unsqueeze(-1)).abs().amin(-2)  # R x C
    chosen = []
    for _ in range(k):  # k <= 10 attacker's points
        x = grid[far.argmax(-1)]  # R
        chosen.append(x)
        dist = (grid.view(1, -1) - x.unsqueeze(-1)).abs()
        far = torch.where(dist < spacing, torch.full_like(far, -1.0), torch.minimum(far, dist))
    return torch.stack(chosen, -1)


def spike_points(X: torch.Tensor, grid: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    r"""``R x k`` attacker's points: the grid point farthest from each run's inputs, moved by up to half
    a lengthscale per sybil."""
    R = X.shape[0]
    far = (grid.view(1, -1) - X[..., 0].unsqueeze(-1)).abs().amin(-2)  # R x C: distance to the nearest input
    x_s = grid[far.argmax(-1)]  # R
    jitter = (torch.rand(R, k, generator=gen, dtype=torch.float64) - 0.5) * 0.03  # up to half a lengthscale
    return (x_s.unsqueeze(-1) + jitter).clamp(0, 1)  # R x k


def spike(features, omegas: torch.Tensor, x_s: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    r"""``R x k x M`` the smallest change of each message ``omegas`` (``R x k x M``) that makes its
    function top its own maximum over ``grid`` at ``x_s`` (``R x k``) by 25% of its range."""
    f = torch.einsum("cm,rkm->rkc", features(grid.view(-1, 1)), omegas)
    top, low = f.amax(-1), f.amin(-1)
    phi_s = features(x_s.unsqueeze(-1))  # R x k x M
    at_s = (phi_s * omegas).sum(-1)
    c = (top - at_s) + 0.25 * (top - low)
    return c.unsqueeze(-1) * phi_s / phi_s.square().sum(-1, keepdim=True)


def null_space(features, X: torch.Tensor, mask: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    r"""``R x k x M`` the part of each vector ``w`` (``R x k x M``) in the null space of its run's
    observed features ``φ(X)`` (``R x n x M``, valid rows ``mask``): ``w - Φᵀ(ΦΦᵀ)⁺Φw``, which
    predicts 0 at every observed input."""
    phi = features(X) * mask.unsqueeze(-1)  # R x n x M, failed evaluations ignored
    coef = torch.linalg.pinv(phi @ phi.transpose(-1, -2), hermitian=True) @ (phi @ w.transpose(-1, -2))
    return w - (phi.transpose(-1, -2) @ coef).transpose(-1, -2)


def decorrelated_sybils(
    features,
    base: torch.Tensor,
    others: torch.Tensor,
    keep: torch.Tensor,
    X: torch.Tensor,
    mask: torch.Tensor,
    grid: torch.Tensor,
    k: int,
    gen: torch.Generator,
    target: float = 0.45,
    spread: bool = False,
) -> torch.Tensor:
    r"""``R x k x M`` spiked copies of ``base`` (``R x M``) made to look unrelated to every message.

    Each sybil is ``ω_h + v_j(a) + spike_j`` with ``v_j(a) = a u_j - min(a, 1)(I - P)ω_h`` in the
    null space of the target's observed features (``P`` the projection on their span, so the sybil
    predicts at ``X`` what the spiked copy predicts): ``u_j`` a standard normal vector of that null
    space rescaled to the norm of ``(I - P)ω_h``. At ``a = 1`` the copy's function away from the
    target's data is replaced by an independent one of the same size (the message's norm stays an
    honest draw's); beyond, the independent part grows. One ``a`` per run, the smallest (bisection)
    that brings every sybil's correlation with every other message (``others``, ``R x N x M`` where
    ``keep``, the copied one included, and the other sybils) below ``target`` (under ``ρ_0 = 0.5`` of
    :func:`~fbo_torch.protocol.fidelity.redundancy`); the spike is computed after, so each sybil
    still peaks at its point ``x_s``. With ``spread`` the points are kept apart (:func:`spread_points`),
    so that no two sybils' maximizers coincide.
    """
    R, M = base.shape
    x_s = spread_points(X, grid, k) if spread else spike_points(X, grid, k, gen)
    unseen = null_space(features, X, mask, base.unsqueeze(1))  # R x 1 x M
    u = null_space(features, X, mask, torch.randn(R, k, M, generator=gen, dtype=torch.float64))
    u = u / u.norm(dim=-1, keepdim=True) * unseen.norm(dim=-1, keepdim=True)

    def build(a: torch.Tensor) -> torch.Tensor:
        a = a.view(R, 1, 1)
        w = base.unsqueeze(1) + a * u - a.clamp_max(1) * unseen
        return w + spike(features, w, x_s, grid)

    def worst(s: torch.Tensor) -> torch.Tensor:
        unit = lambda w: w / w.norm(dim=-1, keepdim=True)  # noqa: E731
        to_others = (unit(s) @ unit(others).transpose(-1, -2)).masked_fill(~keep.unsqueeze(1), -2).amax((-1, -2))
        among = unit(s) @ unit(s).transpose(-1, -2) - 2 * torch.eye(k, dtype=s.dtype)
        return torch.maximum(to_others, among.amax((-1, -2)))

    lo, hi = torch.zeros(R, dtype=torch.float64), torch.full((R,), 8.0, dtype=torch.float64)
    for _ in range(40):
        mid = (lo + hi) / 2
        ok = worst(build(mid)) < target
        hi, lo = torch.where(ok, mid, hi), torch.where(ok, lo, mid)
    return build(hi)


def observed_correlation(features, omegas: torch.Tensor, X: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r"""``R x N x N`` ``cos(Pω_n, Pω_m)``, ``P`` the projection on the span of the target's observed
    features: how alike two messages are at the target's own inputs (1 for messages that differ only
    in the null space of ``φ(X)``)."""
    phi = features(X) * mask.unsqueeze(-1)
    pred = phi @ omegas.transpose(-1, -2)  # R x n x N
    inner = pred.transpose(-1, -2) @ torch.linalg.pinv(phi @ phi.transpose(-1, -2), hermitian=True) @ pred
    d = inner.diagonal(dim1=-2, dim2=-1).clamp_min(1e-300).sqrt()
    return inner / d.unsqueeze(-1) / d.unsqueeze(-2)


def candidate_counts(
    features, omegas: torch.Tensor, X: torch.Tensor, mask: torch.Tensor, grid: torch.Tensor, scores: torch.Tensor
) -> dict:
    r"""Near-duplicate counts ``c_n`` (``R x N``) of the rules compared in the study (a factor ``e^{ℓ_n}``
    on ``P_N`` enters as ``c_n e^{-ℓ_n}``).

    * ``messages``: :func:`~fbo_torch.protocol.fidelity.redundancy` (the library's rule);
    * ``proposals``: also peers whose maximizers over ``grid`` coincide (kernel correlation
      ``φ(x̂_n)ᵀφ(x̂_m) / ‖·‖‖·‖ > 0.5``, about 1.2 lengthscales) count as one;
    * ``proposals_and_correlated``: a coinciding pair counts in proportion to its messages'
      correlation between 0.05 and 0.15 (honest pairs are mostly below);
    * ``observed_part``: also peers whose messages' parts at the target's inputs coincide
      (``cos(Pω_n, Pω_m)`` from 0.9 to 1);
    * ``proposals_and_observed``: peers whose maximizers coincide, in proportion to the last;
    * ``cross_check``: the library's count and :func:`cross_check` (``β = 8``), the raters weighted by
      the ``P_N`` of the library's count; ``cross_check_strong``: the same with ``β = 25``;
    * ``proposals_and_cross_check``: ``proposals`` and :func:`cross_check` (``β = 8``), the raters
      weighted by the ``P_N`` of ``proposals``: a group of coinciding maximizers weighs one peer, times
      what the peers outside it think of its claim;
    * ``corroborated``: the library's opt-in rule, ``agent_weights: corroborated``
      (:func:`~fbo_torch.protocol.fidelity.corroborated_counts` on the grid): ``proposals_and_cross_check``
      computed by ``fbo_torch``.

    The maximizer comparisons and the cross-check are ``fbo_torch``'s
    (:mod:`fbo_torch.protocol.fidelity`: :func:`~fbo_torch.protocol.fidelity.coinciding_maximizers`,
    :func:`~fbo_torch.protocol.fidelity.cross_check`).
    """
    by_message = near_copies(omegas)
    reference = grid.view(-1, 1)
    values = reference_values(features, omegas, reference)
    correlation = maximizer_correlation(features, values, reference)
    same_point = coinciding_maximizers(correlation)
    unit_w = omegas / omegas.norm(dim=-1, keepdim=True)
    rho = unit_w @ unit_w.transpose(-1, -2)
    at_x = ((observed_correlation(features, omegas, X, mask) - 0.9) / 0.1).clamp(0, 1)
    rules = {
        "messages": by_message,
        "proposals": torch.maximum(by_message, same_point),
        "proposals_and_correlated": torch.maximum(by_message, same_point * ((rho - 0.05) / 0.1).clamp(0, 1)),
        "observed_part": torch.maximum(by_message, at_x),
        "proposals_and_observed": torch.maximum(by_message, same_point * at_x),
    }
    counts = {name: c.sum(-1).clamp_min(1.0) for name, c in rules.items()}
    for name, base, strength in (
        ("cross_check", "messages", CROSS_CHECK_STRENGTH),
        ("cross_check_strong", "messages", 25.0),
        ("proposals_and_cross_check", "proposals", CROSS_CHECK_STRENGTH),
    ):
        raters = fidelity_weights(scores, None, counts[base])
        counts[name] = counts[base] * (-cross_check(values, correlation, raters, strength)).exp()
    counts["corroborated"] = corroborated_counts(features, omegas, scores, reference)
    return counts


ATTACKS = ("spiked_copy", "decorrelated", "spread")


def study(functions: int, inits: int, seed: int) -> dict:
    obj, domain, history = federation(functions)
    grid = obj.candidates[:, 0]
    rows, candidates = [], []
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
        base = honest[torch.arange(R), copied[:, 0]]
        for attack in ATTACKS:
            for k in SYBILS:
                if attack != ATTACKS[0] and not k:
                    continue  # no sybils: the same federation for every attack
                omegas, is_sybil = honest.clone(), torch.zeros_like(kinds, dtype=torch.bool)
                row = {"attack": attack if k else "none", "sybils": k, "observations": n, "runs": R}
                if k:
                    slots = useless_idx[:, :k]
                    is_sybil.scatter_(1, slots, True)
                    if attack == "spiked_copy":
                        sybils = sybil_messages(features, base, X, grid, k, gen)
                    else:
                        sybils = decorrelated_sybils(
                            features, base, honest, ~is_sybil, X, mask, grid, k, gen, spread=attack == "spread"
                        )
                    omegas.scatter_(1, slots.unsqueeze(-1).expand(-1, -1, M), sybils)
                    unit_s = omegas / omegas.norm(dim=-1, keepdim=True)
                    rho_s = unit_s @ unit_s.transpose(-1, -2)
                    to_copied = rho_s.gather(2, copied.view(R, 1, 1).expand(-1, 20, 1))[..., 0][is_sybil]
                    row["sybil_to_copied_correlation"] = {
                        "min": float(to_copied.min()),
                        "mean": float(to_copied.mean()),
                    }
                    pair = is_sybil.unsqueeze(-1) & off
                    row["sybil_to_any_other_correlation_max"] = float(rho_s[pair].max())
                    values = torch.einsum("cm,rkm->rkc", features(grid.view(-1, 1)), sybils)
                    far = (grid.view(1, -1) - X[..., 0].unsqueeze(-1)).abs().amin(-2)
                    x_far = grid[far.argmax(-1)].unsqueeze(-1)
                    if attack == "spread":
                        x_far = spread_points(X, grid, k)  # each sybil's own point
                    row["sybils_peaking_within_a_lengthscale_of_the_attack_point"] = float(
                        ((grid[values.argmax(-1)] - x_far).abs() <= 0.03).double().mean()
                    )
                    row["message_norm"] = {
                        "honest_mean": float(honest.norm(dim=-1).mean()),
                        "honest_max": float(honest.norm(dim=-1).max()),
                        "sybil_mean": float(sybils.norm(dim=-1).mean()),
                        "sybil_max": float(sybils.norm(dim=-1).max()),
                    }
                scores = fidelity_scores(peer_predictions(features, omegas, X), y, mask)
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
                rows.append(row)
                if k in (0, max(SYBILS)):
                    for rule, counts in candidate_counts(features, omegas, X, mask, grid, scores).items():
                        w = fidelity_weights(scores, None, counts)
                        candidates.append(
                            {
                                "rule": rule,
                                "attack": row["attack"],
                                "sybils": k,
                                "observations": n,
                                "share_sybils": float((w * is_sybil).sum(-1).mean()),
                                "share_helpful": float((w * (kinds == HELPFUL) * ~is_sybil).sum(-1).mean()),
                            }
                        )
        honest_rho = rho[:, off]
        first = next(r for r in rows if r["observations"] == n)
        first["honest_correlation"] = {"max": float(honest_rho.max()), "mean": float(honest_rho.mean())}
    return {"rows": rows, "candidate_rules": candidates}


def table(rows: list[dict]) -> str:
    lines = [
        "| attack | sybils | n | uniform share | share before | share after | helpful before | helpful after "
        "| own GP (trust) before | after | sybil follows /60 uniform | before | after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b, a, u = r["before"], r["after"], r["uniform"]
        lines.append(
            f"| {r['attack']} | {r['sybils']} | {r['observations']} | {u['share_sybils']:.0%} | "
            f"{b['share_sybils']:.1%} | "
            f"{a['share_sybils']:.1%} | {b['share_helpful']:.1%} | {a['share_helpful']:.1%} | "
            f"{b['own_gp_probability_trust']:.2f} | {a['own_gp_probability_trust']:.2f} | "
            f"{u['sybil_follows_in_60']:.1f} | {b['sybil_follows_in_60_trust']:.1f} | "
            f"{a['sybil_follows_in_60_trust']:.1f} |"
        )
    return "\n".join(lines)


def candidate_table(rows: list[dict]) -> str:
    lines = ["| rule | attack | sybils | n | sybils' share | helpful share |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['rule']} | {r['attack']} | {r['sybils']} | {r['observations']} | "
            f"{r['share_sybils']:.1%} | {r['share_helpful']:.1%} |"
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
    print(candidate_table(out["candidate_rules"]))
    for r in out["rows"]:
        if "honest_correlation" in r:
            print(
                f"n = {r['observations']}: honest peers' messages, correlation max "
                f"{r['honest_correlation']['max']:.3f}, mean {r['honest_correlation']['mean']:.3f}"
            )
        if "sybil_to_copied_correlation" in r and r["sybils"] == max(SYBILS):
            nm = r["message_norm"]
            print(
                f"n = {r['observations']}, {r['attack']}: a sybil and the message it copied, correlation min "
                f"{r['sybil_to_copied_correlation']['min']:.3f}, mean {r['sybil_to_copied_correlation']['mean']:.3f}; "
                f"a sybil and any other message, max {r['sybil_to_any_other_correlation_max']:.3f}; norms honest "
                f"{nm['honest_mean']:.1f} (max {nm['honest_max']:.1f}), sybil {nm['sybil_mean']:.1f} "
                f"(max {nm['sybil_max']:.1f}); sybils peaking within a lengthscale of the attack point "
                f"{r['sybils_peaking_within_a_lengthscale_of_the_attack_point']:.0%}"
            )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
