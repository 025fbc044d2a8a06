r"""DP-FTS-DE experiments (``experiment: dp_fts_de``): checks, runners, privacy records and plots.

Each scenario runs its methods for ``runs.num_inits`` repetitions of all the
objective's agents (:class:`~fbo_torch.simulate.dp_fts_de.DPFTSDERunner`); the
standard errors in a record are over repetitions of the agent-averaged curves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from fbo_torch.experiments.config import ConfigError
from fbo_torch.experiments.kind import ExperimentKind, ScenarioContext, ScenarioMethods
from fbo_torch.experiments.report import (
    band_label,
    integer_ticks,
    mean_stderr,
    none_if_nan,
    num_runs,
    save_figure,
    series_styles,
    summarize_curves,
    values_or_none,
)
from fbo_torch.experiments.resources import check_scenario_memory
from fbo_torch.federation.release import get_release
from fbo_torch.privacy import compute_epsilon
from fbo_torch.protocol.partition import SubRegionPartition
from fbo_torch.simulate.dp_fts_de import DPFTSDERunner


def _other_epsilons(settings: Any, releases: int, delta: float | None, names: list[str]) -> dict[str, float | None]:
    """Final ε of the same mechanism under other accountants (side by side; none describes a secure round's
    distributed discrete Gaussian, which only the ``"ddg"`` accountant accounts)."""
    if not settings.is_private or delta is None or not get_release(settings.aggregation).sees_messages:
        return {}
    out = {}
    for name in names:
        eps = compute_epsilon(settings.sample_rate, settings.noise_multiplier, releases, delta, accountant=name)
        out[name] = eps if math.isfinite(eps) else None
    return out


def check_scenario(ctx: ScenarioContext) -> None:
    r"""What a DP-FTS-DE scenario's runners would refuse once started, as a :class:`ConfigError`
    naming the YAML key: a private method on fewer than 2 agents with ``privacy.delta: null``
    (``δ = 1/N^1.1`` needs ``N ≥ 2``), a method whose release mechanism refuses ``N`` agents
    (:meth:`~fbo_torch.federation.release.ReleaseMechanism.check`: a secure sum's lattice), and more
    sub-regions than the candidates of a finite
    domain fill (with ``distributed_init``, agent ``n`` starts among the candidates of region
    ``n mod P``, which must hold one)."""
    cfg, sc, objective, domain = ctx.cfg, ctx.scenario, ctx.objective, ctx.domain
    N = objective.num_agents
    delta = cfg.privacy.delta
    if delta is not None and delta * N >= 1 and any(s.is_private for _, s in sc.methods):
        ctx.log(
            f"warning: {sc.where}: privacy.delta = {delta:g} >= 1/N = {1 / N:.3g} ({N} agents): such a "
            "guarantee allows releasing one agent's data in full; every epsilon of this run is for this delta"
        )
    check_scenario_memory(ctx, agents=ctx.num_inits * N, runs=ctx.num_inits * N)
    for j, (label, s) in enumerate(sc.methods):
        where = f"{sc.where}: methods[{j}] ({label!r})"
        if s.is_private and cfg.privacy.delta is None and N < 2:
            raise ConfigError(
                f"{where}: a private method (`noise_multiplier` {s.noise_multiplier}) with `privacy.delta` null "
                f"takes δ = 1/N^1.1, which needs N >= 2 agents, but the objective has {N}; set `privacy.delta` "
                "or give the objective more agents."
            )
        if s.method.federated():
            try:
                get_release(s.aggregation).check(s, N)
            except ValueError as err:
                raise ConfigError(f"{where}: {err}") from None
        P = s.num_regions
        candidates = domain.candidates  # the objective's (config.py builds the domain from them)
        if not (s.method.federated() and s.distributed_init and P > 1 and candidates is not None):
            continue
        filled = set(SubRegionPartition(domain.bounds, P).region_of(candidates).unique().tolist())
        empty = sorted({n % P for n in range(N)} - filled)
        if empty:
            shown = ", ".join(map(str, empty[:5])) + (", ..." if len(empty) > 5 else "")
            raise ConfigError(
                f"{where}: `num_regions: {P}` is too many for the objective's {candidates.shape[0]} "
                f"candidate points: sub-region(s) {shown}, where agents start (`distributed_init`), hold none; "
                "use fewer regions or `distributed_init: false`."
            )


def scenario_methods(ctx: ScenarioContext) -> ScenarioMethods:
    r"""The scenario's :class:`~fbo_torch.simulate.dp_fts_de.DPFTSDERunner` factory and records
    (ε under ``privacy.accountant`` and each of ``privacy.extra_accountants``)."""
    cfg, objective, domain, seed, device = ctx.cfg, ctx.objective, ctx.domain, ctx.seed, ctx.device
    num_inits = ctx.num_inits
    privacy = cfg.privacy
    accountant = privacy.accountant
    extra = list(privacy.extra_accountants)
    delta = privacy.delta

    def make_runner(label: str, settings: Any) -> DPFTSDERunner:
        return DPFTSDERunner(
            objective,
            settings,
            num_inits,
            domain=domain,
            seed=seed,
            device=device,
            name=label,
            accountant=accountant,
            delta=delta,
            max_memory=ctx.max_memory,
        )

    def make_record(label: str, settings: Any, runner: DPFTSDERunner) -> dict[str, Any]:
        res = runner.result()
        releases = int(sum(res.released))
        N = objective.num_agents
        per_run = res.loss.view(num_inits, N, -1).mean(1)  # agent-averaged curve of each repetition
        run_mean, run_se = mean_stderr(per_run)
        record = summarize_curves(
            label,
            res.loss,
            objective.loss_name,
            extra={
                "settings": res.settings,
                "num_agents": N,
                "num_repetitions": num_inits,
                "agents": res.agents.tolist(),  # agent and repetition of each row of `runs`
                "repetitions": res.runs.tolist(),
                "best_value_runs": res.best_value.tolist(),
                "failed": res.failed.tolist(),
                "repetition_mean": run_mean,
                "repetition_stderr": run_se,
                "accountant": res.accountant,
                "delta": res.delta,
                "epsilon": none_if_nan(res.epsilon),
                "epsilon_final": res.epsilon[-1] if res.epsilon and math.isfinite(res.epsilon[-1]) else None,
                "epsilon_other_accountants": _other_epsilons(settings, releases, res.delta, extra),
                "aggregation": settings.aggregation,
                # secure aggregation: ε against the server (it knows the sample: no amplification);
                # `epsilon` is then against other agents and outsiders
                "epsilon_server": None if res.epsilon_server is None else none_if_nan(res.epsilon_server),
                "epsilon_server_final": res.epsilon_server[-1]
                if res.epsilon_server and math.isfinite(res.epsilon_server[-1])
                else None,
                "releases": releases,
                "released": res.released,
                "fraction_clipped": none_if_nan(res.fraction_clipped),
                "fraction_clipped_mean": _nanmean(res.fraction_clipped),
                "num_sampled": none_if_nan(res.num_sampled),
                "fraction_queries_from_server": res.used_server.double().mean(0).tolist(),
                "used_server": res.used_server.tolist(),  # B x T: the row's query came from the broadcast
                "wall_time_s": res.wall_time,
                "parameters_per_agent": res.parameters_per_agent,
                # every row's queries and values (none for a large federation): the accounting's posterior gain
                "queries": res.queries.tolist() if res.queries is not None else None,
                "observations": values_or_none(res.observations) if res.observations is not None else None,
            },
        )
        # Agents of one repetition share every broadcast, so their curves are not
        # independent: the standard error is taken over repetitions (of the
        # agent-averaged curves); the per-curve one is kept for reference.
        record["agent_level_stderr"] = record["loss_stderr"]
        record["loss_stderr"] = run_se
        if "simple_regret_stderr" in record:
            record["simple_regret_stderr"] = run_se
        record["stderr_over"] = "repetitions (agent-averaged curves)"
        return record

    return ScenarioMethods(make_runner, make_record, num_inits)


def _nanmean(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def delta_text(methods: Any) -> str:
    r"""``"δ = 0.1"`` for the δ of private ``methods`` (records), ``"δ = 1e-05 to 0.1"`` when they differ."""
    deltas = sorted({m["delta"] for m in methods if m.get("delta") is not None})
    if not deltas:
        return "δ unknown"
    return f"δ = {deltas[0]:.3g}" if len(deltas) == 1 else f"δ = {deltas[0]:.3g} to {deltas[-1]:.3g}"


#: Markers of the accountants in ``privacy_utility``: the run's own accountant first (filled), then the others (open).
_ACCOUNTANT_MARKERS = "osD^v<>p"


def plot_privacy(results: dict[str, Any], out: Path, formats: Sequence[str] | None = None) -> list[Path]:
    r"""``privacy_utility`` (final ε vs final loss of every private method of every scenario, under
    ``privacy.accountant`` and each of ``privacy.extra_accountants``: one series per accountant and
    scenario; non-private methods as horizontal lines) and ``epsilon`` (ε after each round, one
    panel per scenario, the other accountants' final ε marked at the last round).
    No two series share a colour and line style; the axes say what the error bars are and every ε its
    δ. Returns the files written, in each of ``formats`` (default PNG); none when no method is private."""
    private = [(sc, m) for sc in results["scenarios"] for m in sc["methods"] if m.get("epsilon_final") is not None]
    if not private:  # a run without private methods has no privacy loss to plot
        return []
    public = [(sc, m) for sc in results["scenarios"] for m in sc["methods"] if m.get("epsilon_final") is None]
    loss_name = results["scenarios"][0]["methods"][0]["loss_name"]
    acc = private[0][1]["accountant"]
    accountants = [acc] + list(
        dict.fromkeys(name for _, m in private for name in (m.get("epsilon_other_accountants") or {}) if name != acc)
    )
    bands = sorted({band_label(sc) for sc, _ in private + public})
    fig = Figure(figsize=(7.5, 4.6))
    ax = fig.subplots()
    seen: dict[str, Any] = {}
    for _, m in public:
        seen.setdefault(m["name"], m)
    groups: dict[str, list[dict[str, Any]]] = {}
    scenario_of: dict[str, dict[str, Any]] = {}
    for sc, m in private:
        groups.setdefault(sc["name"], []).append(m)
        scenario_of[sc["name"]] = sc
    styles = series_styles(len(seen) + len(groups))
    dashed = {"-": "--", "--": ":", ":": "-.", "-.": "-"}  # reference lines dashed first; one-to-one, so still unique
    for (name, m), style in zip(seen.items(), styles, strict=False):
        ax.axhline(
            m["loss_mean"][-1], lw=1.0, color=style["color"], ls=dashed[style["linestyle"]], label=f"{name} (no DP)"
        )
    several = len(accountants) > 1
    for gi, ((sc_name, ms), style) in enumerate(zip(groups.items(), styles[len(seen) :], strict=False)):
        i = len(seen) + gi  # points have no line: the marker takes the line style's role
        yerr = [m["loss_stderr"][-1] for m in ms] if num_runs(scenario_of[sc_name]) > 1 else None
        y = [m["loss_mean"][-1] for m in ms]
        for ai, name in enumerate(accountants):
            eps = [m["epsilon_final"] if ai == 0 else (m.get("epsilon_other_accountants") or {}).get(name) for m in ms]
            keep = [k for k, e in enumerate(eps) if e is not None]
            if not keep:
                continue
            # one legend entry per scenario (its colour) and one per accountant (its marker): see below
            label = (name if len(groups) == 1 else "_nolegend_") if several else sc_name
            marker = _ACCOUNTANT_MARKERS[(ai if several else (i // 10)) % len(_ACCOUNTANT_MARKERS)]
            ax.errorbar(
                [e for e in eps if e is not None],  # eps[k] for k in keep, narrowed
                [y[k] for k in keep],
                yerr=[yerr[k] for k in keep] if yerr else None,
                capsize=3,
                label=label,
                ls="none",
                color=style["color"],
                marker=marker,
                mfc=style["color"] if ai == 0 else "none",
            )
        for m in ms:
            ax.annotate(
                m["name"],
                (m["epsilon_final"], m["loss_mean"][-1]),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
    what = "" if several else f"{acc}, "
    ax.set_xlabel(f"privacy loss ε ({what}{delta_text(m for _, m in private)})")
    ax.set_ylabel(f"final {loss_name}\n({'; '.join(bands)})", fontsize=9)
    ax.set_title(f"{results.get('name', '')}: privacy vs utility", fontsize=10)
    ax.grid(alpha=0.3)
    if several and len(groups) > 1:
        for (sc_name, _), style in zip(groups.items(), styles[len(seen) :], strict=False):
            ax.plot([], [], ls="none", marker="o", color=style["color"], label=sc_name)
        for ai, name in enumerate(accountants):
            ax.plot(
                [],
                [],
                ls="none",
                marker=_ACCOUNTANT_MARKERS[ai % len(_ACCOUNTANT_MARKERS)],
                color="0.35",
                mfc="0.35" if ai == 0 else "none",
                label=f"ε under {name}",
            )
    ax.legend(fontsize=7)
    fig.tight_layout()
    written = save_figure(fig, Path(out) / "privacy_utility", formats=formats or ("png",))

    panels = list(groups.items())
    cols = min(len(panels), 3)
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(7 if cols == 1 else 5.2 * cols, 4 if rows == 1 else 3.8 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, (sc_name, ms) in zip(axes.flat, panels, strict=False):
        for m, style in zip(ms, series_styles(len(ms)), strict=True):
            eps = [e if e is not None else float("nan") for e in m["epsilon"]]
            ax.plot(
                range(1, len(eps) + 1), eps, label=m["name"], markevery=max(1, len(eps) // 10), markersize=4, **style
            )
            for ai, name in enumerate(accountants[1:], start=1):
                other = (m.get("epsilon_other_accountants") or {}).get(name)
                if other is not None:
                    ax.plot(
                        [len(eps)],
                        [other],
                        ls="none",
                        color=style["color"],
                        marker=_ACCOUNTANT_MARKERS[ai % len(_ACCOUNTANT_MARKERS)],
                        mfc="none",
                    )
        for ai, name in enumerate(accountants[1:], start=1):  # one legend entry per other accountant
            ax.plot(
                [],
                [],
                ls="none",
                color="0.35",
                marker=_ACCOUNTANT_MARKERS[ai % len(_ACCOUNTANT_MARKERS)],
                mfc="none",
                label=f"final ε under {name}",
            )
        ax.set_xlabel("round")
        integer_ticks(ax)
        ax.set_ylabel(f"ε ({acc}, {delta_text(ms)}) after the round", fontsize=9)
        if sc_name and len(panels) > 1:
            ax.set_title(sc_name, fontsize=10)
        ax.grid(alpha=0.3)
        if ms:
            ax.legend(fontsize=7, ncol=2)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle("privacy loss ε after each round", fontsize=10)
    fig.tight_layout()
    return written + save_figure(fig, Path(out) / "epsilon", formats=formats or ("png",))


KIND = ExperimentKind(
    check=check_scenario, methods=scenario_methods, plot=plot_privacy, plot_names=("privacy_utility", "epsilon")
)
