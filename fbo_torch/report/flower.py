r"""A Flower run's federation report: the ServerApp's summary as one self-contained HTML page.

A deployment's server knows each round's release and ε and, only with ``report-best``, each agent's
best value (sent in clear by the agents, outside the DP guarantee). It runs no local counterfactual
and cannot tell whose message helped whom: the broadcast is one aggregate of the sampled agents'
messages. :func:`flower_sections` says so in the sections that need more, and fills the others from
the round log; building the page releases nothing new and costs no ε.
"""

from __future__ import annotations

import math
from typing import Any

from fbo_torch.report.page import block, esc, fmt, page, svg_lines, table


def flower_sections(summary: dict[str, Any]) -> dict[str, str]:
    r"""A Flower run's sections from its ServerApp summary (``rounds``, ``privacy``, ``num_agents``).

    A deployment's server knows each round's release, ε, and — only with ``report-best`` — each agent's
    best value, which the agents send in clear, outside the DP guarantee. It has no local counterfactual
    (an agent's run without the federation is not run) and cannot tell whose message helped whom: the
    broadcast is one aggregate of the sampled agents' messages.
    """
    rounds = summary.get("rounds") or []
    priv = summary.get("privacy") or {}
    agents = sorted({int(a) for r in rounds for a in (r.get("best_values") or {})})

    def num(v: Any) -> float | None:
        try:
            x = float(v)
        except (TypeError, ValueError):
            return None
        return x if math.isfinite(x) else None

    xs = [int(r["round"]) for r in rounds]
    best = {a: [num((r.get("best_values") or {}).get(str(a))) for r in rounds] for a in agents}
    if agents:
        regret = (
            "<p>Each agent's best value after each round, as the agents reported it (<code>report-best</code>: "
            "sent in clear, outside the DP guarantee). A deployment runs no local counterfactual: the gain from "
            "federating is measured in simulation (<code>fbo-torch run</code>).</p>"
            + svg_lines([(f"agent {a}", xs, best[a]) for a in agents], "round", "best value reported")
        )
        gains = {a: (v[-1] - v[0]) for a, v in best.items() if v and v[0] is not None and v[-1] is not None}
    else:
        regret = (
            '<p class="note">The agents did not report their best values (<code>report-best = false</code>): the '
            "server knows nothing of their progress, and a deployment runs no local counterfactual.</p>"
        )
        gains = {}
    eps = [num(r.get("epsilon")) for r in rounds]
    series = [("ε", xs, eps)]
    if any("epsilon_server" in r for r in rounds):
        series.append(("ε against the server", xs, [num(r.get("epsilon_server")) for r in rounds]))
    privacy = (
        f"<p>Accountant <b>{esc(priv.get('accountant', '?'))}</b>, δ = <b>{fmt(priv.get('delta'), 3)}</b>. "
        "This report uses only the server's round log: it releases nothing new and costs no ε.</p>"
        + svg_lines(series, "round", "ε after the round")
        + table(
            ["round", "released", "reported", "invalid", "ε"],
            [
                [r["round"], str(r.get("released")), r.get("num_reported"), r.get("num_invalid"), num(r.get("epsilon"))]
                for r in rounds
            ],
        )
    )
    if gains:
        vals = sorted(gains.values())
        fairness = (
            table(
                ["index", "value"],
                [
                    ["agents reporting", len(vals)],
                    ["smallest improvement of the best value (first to last round)", vals[0]],
                    ["largest improvement", vals[-1]],
                    ["mean improvement", sum(vals) / len(vals)],
                ],
            )
            + '<p class="note">Regrets need each agent\'s optimum, which a deployment does not know.</p>'
        )
    else:
        fairness = '<p class="note">No per-agent values were reported: no fairness index can be computed.</p>'
    refused = summary.get("refused_agents") or {}
    invalid = summary.get("invalid_replies") or {}
    contributions = (
        '<p class="note">The broadcast is one aggregate of every sampled agent\'s clipped message: the server '
        "cannot tell whose message helped whom (a secure round does not even see them). What it knows per agent:"
        "</p>"
        + table(
            ["agent", "rounds reported in", "invalid replies", "refused"],
            [
                [
                    f"agent {a}",
                    sum(1 for r in rounds if str(a) in (r.get("best_values") or {})),
                    invalid.get(str(a), 0),
                    refused.get(str(a), ""),
                ]
                for a in range(int(summary.get("num_agents") or (max(agents) + 1 if agents else 0)))
            ],
        )
    )
    flagged = sorted(set(refused) | set(invalid))
    free = (
        f'<p class="flag">Left out of releases: {esc(", ".join("agent " + a for a in flagged))}</p>'
        if flagged
        else "<p>No agent refused or sending invalid replies.</p>"
    ) + (
        '<p class="note">Without per-message attribution a deployment flags only agents whose replies were refused '
        "or invalid; usefulness-based flagging needs the simulator's accounting.</p>"
    )
    help_ = (
        "<p>Every round's release is one broadcast to all agents; the server logs how many agents entered it:</p>"
        + svg_lines([("agents in the release", xs, [num(r.get("num_reported")) for r in rounds])], "round", "agents")
    )
    return {
        "regret": regret,
        "help": help_,
        "privacy": privacy,
        "fairness": fairness,
        "contributions": contributions,
        "free-riders": free,
    }


def flower_html(summary: dict[str, Any]) -> str:
    """A Flower run's report page (:func:`flower_sections`) from its ServerApp summary."""
    title = f"Federation report: Flower run {str(summary.get('fingerprint', ''))[:12]}"
    intro = f"<p>Method {esc(summary.get('method', '?'))}, {esc(summary.get('num_agents', '?'))} agents.</p>"
    return page(title, intro, [block("flower", "the federation", flower_sections(summary))])


__all__ = ["flower_html", "flower_sections"]
