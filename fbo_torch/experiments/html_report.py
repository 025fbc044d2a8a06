r"""The federation report of a finished run: ``report.html``, one self-contained page a person can open.

For every federated method of every scenario, :func:`html_report` fills the six
:data:`~fbo_torch.report.page.SECTIONS` from the run's accounting
(:func:`~fbo_torch.experiments.accounting.accounting`):

* ``regret``: each agent's final regret against its local counterfactual (a static PNG for print,
  and a scatter whose points name the agent and its numbers when hovered);
* ``help``: the who-helped-whom matrix (receiving agent x whom it followed: own proposal, broadcast,
  each peer), cumulative, with a slider over the rounds;
* ``privacy``: ε and δ after each round (or why there is none);
* ``fairness``: fair regret and the simpler indices (:mod:`~fbo_torch.experiments.fairness`);
* ``contributions``: each peer's messages: followed, improving, gain given;
* ``free-riders``: the peers flagged by :func:`~fbo_torch.experiments.accounting.flag_free_riders`.

``fbo-torch report RUN_DIR`` and every run write it (:func:`~fbo_torch.experiments.loop.render_reports`).
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from fbo_torch.experiments.accounting import accounting
from fbo_torch.experiments.outdir import atomic_write_text
from fbo_torch.experiments.report import series_styles, summary_table
from fbo_torch.report.page import block, esc, fmt, help_map, page, svg_lines, svg_scatter, table


def _png(fig: Figure, alt: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def _regret_figure(acc: dict[str, Any]) -> Figure:
    """Static plot for print: each agent's gain from federating (± 2 s.e.) and the agent-averaged curves."""
    fig = Figure(figsize=(10, 3.4))
    ax1, ax2 = fig.subplots(1, 2)
    agents = [str(a) for a in acc["agents"]]
    gain = acc.get("gain")
    if gain is not None:
        se = [2 * s if s is not None else 0.0 for s in acc["gain_stderr"]]
        vals = [g if g is not None else 0.0 for g in gain]
        ax1.bar(agents, vals, yerr=se, color=["C2" if g >= 0 else "C3" for g in vals], capsize=2)
        ax1.axhline(0, color="0.3", lw=0.8)
        ax1.set_ylabel(f"gain: local − federated\nfinal {acc['loss_name']} (± 2 s.e.)", fontsize=8)
    else:
        ax1.text(0.5, 0.5, "no local counterfactual in this scenario", ha="center", va="center")
    ax1.set_xlabel("agent")
    if len(agents) > 20:
        ax1.set_xticks(range(0, len(agents), max(1, len(agents) // 10)))
    styles = series_styles(2)
    curves = [(acc["name"], acc["regret_curve"])]
    if "local" in acc:
        curves.append((acc["local"]["name"], acc["local"]["regret_curve"]))
    for (name, rows), style in zip(curves, styles, strict=False):
        T1 = len(rows[0])
        mean = [sum(r[t] for r in rows if r[t] is not None) / len(rows) for t in range(T1)]
        ax2.plot(range(T1), mean, label=name, **style)
    ax2.set_xlabel("iteration")
    ax2.set_ylabel(f"{acc['loss_name']} (mean over agents)", fontsize=8)
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def regret_section(acc: dict[str, Any]) -> str:
    """The ``regret`` section of one method's accounting."""
    parts = []
    if "local" in acc:
        se = acc.get("gain_mean_stderr")
        pm = f" ± {se:.3g}" if se is not None else ""
        starts = (
            "every pair started from the same initial points"
            if acc["paired_starts"]
            else "the pairs share the seed but not their initial points (e.g. distributed exploration)"
        )
        parts.append(
            f"<p>Gain from federating (final {esc(acc['loss_name'])} of the local counterfactual "
            f"<b>{esc(acc['local']['name'])}</b> minus this method's; positive: federating helped): "
            f"<b>{acc['gain_mean']:.4g}{pm}</b> (mean ± 1 s.e. over {esc(acc['gain_stderr_over'])}, "
            f"{acc['paired_runs']} paired runs; {starts}).</p>"
        )
        points = [
            (f"agent {a}", lx, fx)
            for a, lx, fx in zip(acc["agents"], acc["local"]["final_regret"], acc["final_regret"], strict=True)
            if lx is not None and fx is not None
        ]
        scatter = svg_scatter(points, f"local final {acc['loss_name']}", f"federated final {acc['loss_name']}")
        parts.append(
            f'<p class="note">Each point is an agent (green: lower regret federated). Hover for numbers.</p>{scatter}'
        )
    else:
        parts.append(
            '<p class="note">This scenario has no local method (<code>algorithm: ts</code>): no counterfactual, '
            "so no gain from federating. Add one to the scenario's methods to measure it.</p>"
        )
    parts.append(_png(_regret_figure(acc), "per-agent gain from federating and regret curves"))
    rows = []
    for k, a in enumerate(acc["agents"]):
        row = [f"agent {a}", acc["final_regret"][k], acc["final_regret_stderr"][k]]
        if "local" in acc:
            row += [acc["local"]["final_regret"][k], acc["gain"][k], acc["gain_stderr"][k]]
        rows.append(row)
    header = ["agent", f"final {acc['loss_name']}", "s.e."]
    if "local" in acc:
        header += ["local", "gain", "gain s.e."]
    parts.append(table(header, rows))
    return "".join(parts)


def help_section(acc: dict[str, Any]) -> str:
    """The ``help`` section: the heatmap over rounds and the totals per source."""
    if not acc["rounds"]:
        return '<p class="note">No rounds were run.</p>'
    cols = [c if isinstance(c, str) else f"peer {c}" for c in acc["sources"]]
    parts = [
        '<p class="note">Row: the agent; column: whose proposal it followed (its own, the server\'s broadcast, '
        "or a peer's message). Colour: the improvement of its incumbent gained that way, summed over rounds, "
        "mean per run. Hover a cell for numbers; the slider picks the round.</p>",
        help_map(acc["agents"], cols, acc["matrix_rounds"], acc["help_matrix"], acc["follow_matrix"]),
    ]
    rows = [[f"agent {a}", *f] for a, f in zip(acc["agents"], acc["followed"], strict=True)]
    parts.append("<h4>Times followed per run (all rounds)</h4>" + table(["agent", *cols], rows))
    if acc.get("posterior_gained") is None:
        parts.append(
            '<p class="note">No posterior gain: this run did not record its queries and observations (a run '
            "of an older version, or a federation too large to keep them).</p>"
        )
        return "".join(parts)
    parts.append(
        '<h4>Posterior gain per run (all rounds)</h4><p class="note">Measured on one GP fitted to each '
        "run's observations after the run (BoTorch's <code>SingleTaskGP</code> model). Belief: the change of "
        "the agent's best posterior mean over the inputs it has observed, in the objective's units (signed: an "
        "observation can show a guess was optimistic). Information: nats the observations carried about the "
        "agent's function, ½ log(1 + σ²/σ²<sub>n</sub>) each.</p>"
    )
    for title, key in (("belief gain", "posterior_gained"), ("information (nats)", "information_gained")):
        rows = [[f"agent {a}", *f] for a, f in zip(acc["agents"], acc[key], strict=True)]
        parts.append(f"<h4>{esc(title)}</h4>" + table(["agent", *cols], rows))
    return "".join(parts)


def privacy_section(priv: dict[str, Any] | None) -> str:
    """The ``privacy`` section: ε after each round (and against the server), with δ and the accountant."""
    if priv is None:
        return (
            '<p class="note">This method releases nothing under differential privacy: its messages are sent as '
            "they are (no ε). The accounting in this report reads only the simulator's records: it costs no "
            "privacy budget.</p>"
        )
    eps = priv.get("epsilon") or []
    series = [("ε", list(range(1, len(eps) + 1)), eps)]
    if priv.get("epsilon_server"):
        series.append(("ε against the server", list(range(1, len(eps) + 1)), priv["epsilon_server"]))
    final = next((e for e in reversed(eps) if e is not None), None)
    return (
        f"<p>Accountant <b>{esc(priv.get('accountant'))}</b>, δ = <b>{fmt(priv.get('delta'), 3)}</b> in every "
        f"round; final ε = <b>{fmt(final)}</b>. The accounting in this report reads only the simulator's "
        "records: it costs no privacy budget.</p>" + svg_lines(series, "round", "ε after the round")
    )


def fairness_section(acc: dict[str, Any]) -> str:
    """The ``fairness`` section: this method's indices next to its local counterfactual's."""
    rows = []
    cols = [acc["fairness"]] + ([acc["local_fairness"]] if "local_fairness" in acc else [])
    worst = [f["worst_agent"] for f in cols]
    rows.append(["worst agent's final regret", *(f["worst_regret"] for f in cols)])
    rows.append(["worst agent", *worst])
    rows.append(["mean final regret", *(f["mean_regret"] for f in cols)])
    for rho in cols[0]["fair_regret"]:
        rows.append([f"fair regret, ρ = {rho} (cumulative regret)", *(f["fair_regret"][rho] for f in cols)])
    f = acc["fairness"]
    if "gain_mean" in f:
        rows += [
            ["gain from federating: mean over agents", f["gain_mean"]],
            ["spread of per-agent gains (s.d.)", f["gain_std"]],
            ["smallest / largest gain", f"{f['gain_min']:.4g} / {f['gain_max']:.4g}"],
            ["share of agents that lost by federating", f["share_lost"]],
            ["share that lost significantly (gain + 2 s.e. < 0)", f["share_lost_significantly"]],
        ]
    header = ["index", acc["name"]] + ([acc["local"]["name"]] if "local" in acc else [])
    return (
        '<p class="note">Fair regret (Sim, Zhang, Low &amp; Jaillet, ICML 2021): Σ ρ<sup>i−1</sup> R<sub>(i)</sub> '
        "over the agents' cumulative regrets sorted from the largest; ρ = 1 is the total, ρ = 0 the worst "
        "agent's.</p>" + table(header, [r + [""] * (len(header) - len(r)) for r in rows])
    )


def contributions_section(acc: dict[str, Any]) -> str:
    """The ``contributions`` section: one row per peer whose messages were followed."""
    if not acc["contributions"]:
        return (
            '<p class="note">No peer\'s message can be told apart here: the agents followed their own proposals '
            "or the server's broadcast (an aggregate of every sampled agent's message).</p>"
        )
    rows = [
        [
            f"peer {c['peer']}",
            c["followed"],
            c["improved"],
            c["improvement_rate"],
            c["others_rate"],
            c["gain_given"],
            c.get("posterior_gain_given"),
            c.get("information_given"),
            c["p_value"],
        ]
        for c in acc["contributions"]
    ]
    return table(
        [
            "peer",
            "followed",
            "improved",
            "rate",
            "others' rate",
            "gain given (sum)",
            "belief gain given (sum)",
            "information given (nats)",
            "p-value (lower rate)",
        ],
        rows,
    )


def free_riders_section(acc: dict[str, Any]) -> str:
    """The ``free-riders`` section: the flagged peers, or what was tested."""
    test = (
        "A peer is flagged when following its messages improved the follower's incumbent significantly less "
        "often than following the other peers' (one-sided binomial test, level 0.01, at least 8 follows)."
    )
    if not acc["contributions"]:
        return f'<p class="note">Nothing to test: no peer\'s messages were followed one by one. {test}</p>'
    if not acc["free_riders"]:
        return f'<p>No peer flagged.</p><p class="note">{test}</p>'
    flagged = ", ".join(f"peer {p}" for p in acc["free_riders"])
    return f'<p class="flag">Flagged: {esc(flagged)}</p><p class="note">{test}</p>'


def methodblock(sc_index: int, m_index: int, scenario: str, acc: dict[str, Any]) -> str:
    """One method's six sections (:data:`~fbo_torch.report.page.SECTIONS`)."""
    bodies = {
        "regret": regret_section(acc),
        "help": help_section(acc),
        "privacy": privacy_section(acc.get("privacy")),
        "fairness": fairness_section(acc),
        "contributions": contributions_section(acc),
        "free-riders": free_riders_section(acc),
    }
    return block(f"s{sc_index}-m{m_index}", f"{scenario}: {acc['name']}", bodies)


def html_report(results: dict[str, Any], acc: dict[str, Any] | None = None) -> str:
    r"""The report page of a finished run (``acc``: its :func:`~fbo_torch.experiments.accounting.accounting`)."""
    acc = accounting(results) if acc is None else acc
    env = results.get("environment") or {}
    intro = (
        f"<p>Experiment <b>{esc(results.get('experiment', 'fts'))}</b>, fbo_torch "
        f"{esc(results.get('fbo_torch_version', '?'))}, torch {esc(env.get('torch', '?'))} "
        f"on {esc(env.get('device', '?'))}"
        f"; command: <code>{esc(results.get('command', ''))}</code></p>"
        f"<h2>Summary</h2><pre>{esc(summary_table(results))}</pre>"
    )
    blocks = []
    for si, sc in enumerate(acc["scenarios"]):
        if not sc["methods"]:
            blocks.append(
                f'<h2>{esc(sc["name"])}</h2><p class="note">No federated method in this scenario: nothing to '
                "account.</p>"
            )
        for mi, m in enumerate(sc["methods"]):
            blocks.append(methodblock(si, mi, sc["name"], m))
    return page(f"Federation report: {results.get('name') or 'run'}", intro, blocks)


def write_html_report(results: dict[str, Any], path: str | Path, acc: dict[str, Any] | None = None) -> Path:
    """Write :func:`html_report` to ``path`` atomically; returns the path."""
    atomic_write_text(path, html_report(results, acc))
    return Path(path)


__all__ = ["html_report", "write_html_report"]
