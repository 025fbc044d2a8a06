r"""Who helped whom: per-agent accounting of a finished run, from its ``results.json``.

For every method of every scenario, and every agent and round, the accounting says whose proposal
the agent followed (its own, a peer's message, or the server's broadcast), what it gained when it
did (the improvement of its incumbent, the best value it has observed), and what each peer's messages
gave every other agent (the who-helped-whom matrix, cumulative over rounds). Against the scenario's
*local counterfactual* — the method whose agents hear from nobody (``algorithm: ts``), run with the
same seed, so with the same initial points where the method's do not depend on its settings — the
gain from federating is each agent's paired difference of final regrets, with a standard error over
its initializations (repetitions). :mod:`~fbo_torch.experiments.fairness` turns the per-agent numbers
into fairness indices, and :func:`flag_free_riders` tests every peer's usefulness against the others'.

Everything is computed from what the run recorded (``sources``, ``best_value_runs``, ``used_server``,
``targets`` / ``agents``, ``inits`` / ``repetitions``), so ``fbo-torch report`` recomputes it for any
finished run, and the accounting costs the run nothing. It needs no privacy budget either: it reads
the simulator's own records, which no agent or server of a deployment sees (a deployment's report,
:mod:`fbo_torch.report.flower`, uses only what its server logs).

Shapes: ``R`` runs of a method (rows of its ``runs``), ``T`` rounds, ``G`` agents that are targets,
``C`` sources an agent can follow (its own proposal, the broadcast, each peer seen).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from fbo_torch.experiments.fairness import fairness_indices
from fbo_torch.experiments.posterior_gain import PosteriorGains, method_posterior_gains
from fbo_torch.experiments.report import nan_for_none, none_if_nan
from fbo_torch.methods.base import METHODS, method_names
from fbo_torch.protocol.reciprocity import FREE_RIDER_ALPHA, FREE_RIDER_MIN_FOLLOWS, binomial_cdf, flag_free_riders
from fbo_torch.protocol.schedules import BROADCAST, OWN

#: Most rounds at which the who-helped-whom matrix is kept (evenly spaced, the last round included).
MAX_MATRIX_ROUNDS = 30


def is_local(record: dict[str, Any]) -> bool:
    """Whether a method record's agents hear from nobody (a local counterfactual, e.g. ``algorithm: ts``)."""
    algorithm = (record.get("settings") or {}).get("algorithm")
    return algorithm in method_names() and not METHODS[algorithm].federated()


def run_table(record: dict[str, Any]) -> dict[str, Tensor]:
    r"""A method record's runs as tensors: ``agent`` and ``init`` (``R``), ``loss`` and ``best``
    (``R x (T+1)``), ``sources`` (``R x T``: :data:`OWN`, :data:`BROADCAST` or a peer's index)."""
    loss = torch.tensor(nan_for_none(record["runs"]), dtype=torch.float64)
    R, T1 = loss.shape
    best = torch.tensor(nan_for_none(record.get("best_value_runs") or [[math.nan] * T1] * R), dtype=torch.float64)
    if "num_agents" in record:  # DP-FTS-DE: row r·N + n is agent n of repetition r
        N = int(record["num_agents"])
        agent = torch.tensor(record.get("agents") or [b % N for b in range(R)], dtype=torch.long)
        init = torch.tensor(record.get("repetitions") or [b // N for b in range(R)], dtype=torch.long)
        used = record.get("used_server")
        if used is not None:
            sources = torch.where(torch.tensor(used, dtype=torch.bool), BROADCAST, OWN)
        else:
            sources = torch.full((R, T1 - 1), OWN, dtype=torch.long)
    else:
        agent = torch.tensor(record.get("targets") or [0] * R, dtype=torch.long)
        init = torch.tensor(record.get("inits") or list(range(R)), dtype=torch.long)
        src = record.get("sources")
        sources = (
            torch.tensor(src, dtype=torch.long).reshape(R, -1)
            if src
            else torch.full((R, T1 - 1), OWN, dtype=torch.long)
        )
    return {"agent": agent, "init": init, "loss": loss, "best": best, "sources": sources}


def group_mean_stderr(values: Tensor, groups: Tensor, num_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    r"""Mean and standard error of ``values`` (``R x ...``) per group (``R`` indices in ``[0, G)``).

    Returns:
        ``G x ...`` means, ``G x ...`` standard errors (NaN for a group of one), ``G`` counts.
    """
    values = values.to(torch.float64)
    n = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, groups, torch.ones_like(groups, dtype=torch.float64))
    shape = (num_groups, *values.shape[1:])
    extra = (1,) * (values.ndim - 1)
    total = torch.zeros(shape, dtype=torch.float64).index_add_(0, groups, values)
    mean = total / n.view(-1, *extra)
    ss = torch.zeros(shape, dtype=torch.float64).index_add_(0, groups, (values - mean[groups]).square())
    nn = n.view(-1, *extra)
    se = torch.where(nn > 1, (ss / (nn - 1).clamp_min(1) / nn).sqrt(), math.nan)
    return mean, se, n


def incumbent_gains(best: Tensor) -> Tensor:
    r"""``R x T`` improvement of each run's incumbent in each round (``best``: ``R x (T+1)`` best value so far)."""
    return (best[:, 1:] - best[:, :-1]).nan_to_num(0.0).clamp_min(0.0)


def help_over_rounds(
    sources: Tensor, gains: Tensor, receiver: Tensor, columns: Tensor, num_receivers: int
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Who helped whom, cumulative over rounds, per run of each receiver.

    Args:
        sources: ``R x T`` whom each run followed in each round.
        gains: ``R x T`` its incumbent's improvement in that round.
        receiver: ``R`` each run's receiving agent, a position in ``[0, G)``.
        columns: ``C`` the sources to tally, sorted (e.g. ``[BROADCAST, OWN, 0, 3, 7]``).
        num_receivers: ``G``.

    Returns:
        ``T x G x C`` tensors, means per run of the receiver after each round: the gain from following
        each source, how often it was followed, and how often following it improved the incumbent.
    """
    R, T = sources.shape
    C = columns.numel()
    col = torch.searchsorted(columns, sources.contiguous())  # R x T positions of each source among the columns
    cell = (receiver.unsqueeze(-1) * C + col).T  # T x R
    zeros = torch.zeros(T, num_receivers * C, dtype=torch.float64)
    gain = zeros.scatter_add(1, cell, gains.T.to(torch.float64))
    follows = zeros.scatter_add(1, cell, torch.ones(T, R, dtype=torch.float64))
    wins = zeros.scatter_add(1, cell, (gains.T > 0).to(torch.float64))
    runs = torch.zeros(num_receivers, dtype=torch.float64).index_add_(0, receiver, torch.ones(R, dtype=torch.float64))
    per_run = runs.clamp_min(1).repeat_interleave(C)
    return tuple(t.cumsum(0).div(per_run).view(T, num_receivers, C) for t in (gain, follows, wins))  # type: ignore[return-value]


def _pair(fed: dict[str, Tensor], local: dict[str, Tensor]) -> Tensor:
    """``R`` row of ``local`` with each ``fed`` run's (agent, init), ``-1`` where it has none."""
    same = (fed["agent"].unsqueeze(-1) == local["agent"]) & (fed["init"].unsqueeze(-1) == local["init"])
    return torch.where(same.any(-1), same.to(torch.int8).argmax(-1), -1)


def _matrix_rounds(T: int) -> list[int]:
    """Rounds (1-based) at which the who-helped-whom matrix is kept: all of them, or evenly spaced with the last."""
    if T <= MAX_MATRIX_ROUNDS:
        return list(range(1, T + 1))
    return sorted({round(1 + (T - 1) * k / (MAX_MATRIX_ROUNDS - 1)) for k in range(MAX_MATRIX_ROUNDS)})


def method_accounting(
    record: dict[str, Any], local: dict[str, Any] | None, posterior: PosteriorGains | None = None
) -> dict[str, Any]:
    r"""The accounting of one method record against its local counterfactual (``None``: none in its scenario)
    and, where its runs' queries were recorded, their posterior gains
    (:func:`~fbo_torch.experiments.posterior_gain.method_posterior_gains`).

    Returns:
        JSON-able: ``agents`` (the targets, in order), per agent ``final_regret`` / ``_stderr``,
        ``regret_curve`` (mean over its runs), ``followed`` (mean times per run each source was followed),
        ``gained`` (mean incumbent improvement per run from each source); ``sources`` (the columns:
        ``"own"``, ``"broadcast"`` or a peer's index), ``matrix_rounds`` and ``help_matrix`` / ``follow_matrix``
        (rounds x agents x sources, cumulative), ``contributions`` (per peer: follows, improvements, gain given,
        the free-rider test), ``free_riders`` (flagged peers), and, with a counterfactual, ``local`` (its name,
        per-agent regrets and curves), ``gain`` / ``gain_stderr`` per agent, ``gain_mean`` / ``gain_mean_stderr``
        over the independent units and ``paired_starts`` (whether every pair began from the same best value);
        with ``posterior``, per agent ``posterior_gained`` and ``information_gained`` (mean per run of the
        belief gain and the nats from following each source) and ``belief_final``, and per peer
        ``posterior_gain_given`` and ``information_given`` (``None`` throughout without); then ``fairness``
        (:func:`~fbo_torch.experiments.fairness.fairness_indices`) and ``local_fairness``.
    """
    tab = run_table(record)
    agents, receiver = torch.unique(tab["agent"], return_inverse=True)
    G = agents.numel()
    T = tab["sources"].shape[1]
    gains = incumbent_gains(tab["best"])
    columns = torch.unique(torch.cat([tab["sources"].reshape(-1), torch.tensor([OWN])]))
    help_m, follow_m, win_m = help_over_rounds(tab["sources"], gains, receiver, columns, G)
    keep = [t - 1 for t in _matrix_rounds(T)] if T else []
    final = tab["loss"][:, -1]
    reg_mean, reg_se, runs = group_mean_stderr(final, receiver, G)
    curve, _, _ = group_mean_stderr(tab["loss"], receiver, G)
    cumulative, _, _ = group_mean_stderr(tab["loss"][:, 1:].sum(-1), receiver, G)
    names = ["broadcast" if c == BROADCAST else "own" if c == OWN else int(c) for c in columns.tolist()]
    out: dict[str, Any] = {
        "name": record["name"],
        "loss_name": record.get("loss_name", "loss"),
        "agents": agents.tolist(),
        "runs_per_agent": runs.tolist(),
        "rounds": T,
        "final_regret": reg_mean.tolist(),
        "final_regret_stderr": none_if_nan(reg_se.tolist()),
        "regret_curve": none_if_nan(curve.tolist()),
        "sources": names,
        "followed": follow_m[-1].tolist() if T else [],
        "gained": help_m[-1].tolist() if T else [],
        "matrix_rounds": [t + 1 for t in keep],
        "help_matrix": help_m[keep].tolist() if T else [],
        "follow_matrix": follow_m[keep].tolist() if T else [],
    }
    belief_m = info_m = None
    out["posterior_gained"] = out["information_gained"] = out["belief_final"] = None
    if posterior is not None and posterior.belief_gain.shape == tab["sources"].shape and T:
        belief_m = help_over_rounds(tab["sources"], posterior.belief_gain, receiver, columns, G)[0]
        info_m = help_over_rounds(tab["sources"], posterior.information, receiver, columns, G)[0]
        out["posterior_gained"] = belief_m[-1].tolist()
        out["information_gained"] = info_m[-1].tolist()
        out["belief_final"] = none_if_nan(group_mean_stderr(posterior.belief[:, -1], receiver, G)[0].tolist())
    # every peer's contribution, summed over its followers' runs (per-run means times runs)
    peers = columns >= 0
    total_runs = runs.unsqueeze(-1)
    if T and bool(peers.any()):
        n = (follow_m[-1] * total_runs).sum(0)[peers]
        k = (win_m[-1] * total_runs).sum(0)[peers]
        given = (help_m[-1] * total_runs).sum(0)[peers]
        nan = torch.full_like(given, math.nan)
        belief_given = (belief_m[-1] * total_runs).sum(0)[peers] if belief_m is not None else nan
        info_given = (info_m[-1] * total_runs).sum(0)[peers] if info_m is not None else nan
        flagged, pvalue, p0 = flag_free_riders(n, k)
        out["contributions"] = [
            {
                "peer": int(j),
                "followed": int(round(float(nj))),
                "improved": int(round(float(kj))),
                "gain_given": float(gj),
                "posterior_gain_given": none_if_nan(float(bj)),
                "information_given": none_if_nan(float(ij)),
                "improvement_rate": float(kj / nj) if nj > 0 else None,
                "others_rate": none_if_nan(float(pj)),
                "p_value": none_if_nan(float(pv)),
                "flagged": bool(f),
            }
            for j, nj, kj, gj, bj, ij, pj, pv, f in zip(
                columns[peers].tolist(),
                n,
                k,
                given,
                belief_given,
                info_given,
                p0,
                pvalue,
                flagged.tolist(),
                strict=True,
            )
        ]
        out["free_riders"] = [int(j) for j, f in zip(columns[peers].tolist(), flagged.tolist(), strict=True) if f]
    else:
        out["contributions"], out["free_riders"] = [], []
    gain = gain_se = None
    if local is not None:
        loc = run_table(local)
        pair = _pair(tab, loc)
        ok = pair >= 0
        if bool(ok.any()):
            lp = loc["loss"][pair.clamp_min(0)]
            diff = (lp[:, -1] - final)[ok]
            gain, gain_se, _ = group_mean_stderr(diff, receiver[ok], G)
            l_mean, l_se, _ = group_mean_stderr(lp[:, -1][ok], receiver[ok], G)
            l_curve, _, _ = group_mean_stderr(lp[ok], receiver[ok], G)
            # independent units: the initializations (agents of one initialization may share messages)
            inits, unit = torch.unique(tab["init"][ok], return_inverse=True)
            if inits.numel() > 1:
                per_unit, _, _ = group_mean_stderr(diff, unit, inits.numel())
                over = "initializations (agent-averaged)"
            else:
                per_unit, over = diff, "runs"
            g_mean, g_se, _ = group_mean_stderr(per_unit, torch.zeros_like(per_unit, dtype=torch.long), 1)
            starts = (lp[:, 0] - tab["loss"][:, 0])[ok].abs()
            out["local"] = {
                "name": local["name"],
                "final_regret": none_if_nan(l_mean.tolist()),
                "final_regret_stderr": none_if_nan(l_se.tolist()),
                "regret_curve": none_if_nan(l_curve.tolist()),
            }
            out.update(
                gain=none_if_nan(gain.tolist()),
                gain_stderr=none_if_nan(gain_se.tolist()),
                gain_mean=float(g_mean[0]),
                gain_mean_stderr=none_if_nan(float(g_se[0])),
                gain_stderr_over=over,
                paired_runs=int(ok.sum()),
                paired_starts=bool((starts <= 1e-12).all()),
            )
            out["local_fairness"] = fairness_indices(
                l_mean, group_mean_stderr(lp[ok][:, 1:].sum(-1), receiver[ok], G)[0]
            )
    out["fairness"] = fairness_indices(reg_mean, cumulative, gain, gain_se)
    for key in ("fairness", "local_fairness"):  # the worst agent by its index, not its position
        if key in out:
            out[key]["worst_agent"] = int(agents[out[key]["worst_agent"]])
    return out


def privacy_record(record: dict[str, Any]) -> dict[str, Any] | None:
    r"""ε (and, with secure aggregation, ε against the server) after each round, with δ and the accountant;
    ``None`` for a method that releases nothing private."""
    if record.get("epsilon_final") is None:
        return None
    return {
        "accountant": record.get("accountant"),
        "delta": record.get("delta"),
        "epsilon": record.get("epsilon"),
        "epsilon_server": record.get("epsilon_server"),
        "released": record.get("released"),
    }


def all_posterior_gains(results: dict[str, Any]) -> dict[tuple[int, int], PosteriorGains | None]:
    r"""The posterior gains of every method with per-run curves, keyed by (scenario, method) position:
    what :func:`accounting` and the tidy table (:func:`~fbo_torch.experiments.report.write_tidy_csv`)
    share, computed once."""
    return {
        (i, j): method_posterior_gains(m, sc.get("domain_bounds"))
        for i, sc in enumerate(results["scenarios"])
        for j, m in enumerate(sc["methods"])
        if m.get("runs")
    }


def accounting(
    results: dict[str, Any], gains: dict[tuple[int, int], PosteriorGains | None] | None = None
) -> dict[str, Any]:
    r"""The accounting of every federated method of every scenario of a ``results.json`` dictionary.

    Each scenario's local counterfactual is its first method whose agents hear from nobody
    (:func:`is_local`); a method is accounted only if it is federated. ``gains``: the methods'
    posterior gains (:func:`all_posterior_gains`; computed here for the federated methods when not given).
    Returns ``{"scenarios": [{"name", "local", "methods": [method_accounting + "privacy"]}]}``.
    """
    scenarios = []
    for i, sc in enumerate(results["scenarios"]):
        local = next((m for m in sc["methods"] if is_local(m)), None)
        methods = []
        for j, m in enumerate(sc["methods"]):
            if is_local(m) or not m.get("runs"):
                continue
            pg = gains.get((i, j)) if gains is not None else method_posterior_gains(m, sc.get("domain_bounds"))
            acc = method_accounting(m, local, pg)
            acc["privacy"] = privacy_record(m)
            methods.append(acc)
        scenarios.append({"name": sc["name"], "local": None if local is None else local["name"], "methods": methods})
    return {"scenarios": scenarios}


__all__ = [
    "BROADCAST",
    "FREE_RIDER_ALPHA",
    "FREE_RIDER_MIN_FOLLOWS",
    "OWN",
    "accounting",
    "all_posterior_gains",
    "binomial_cdf",
    "flag_free_riders",
    "group_mean_stderr",
    "help_over_rounds",
    "incumbent_gains",
    "is_local",
    "method_accounting",
    "run_table",
]
