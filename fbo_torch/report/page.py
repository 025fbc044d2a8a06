r"""Building blocks of the federation report, a self-contained HTML page a person can open.

The page (:func:`page`) inlines everything: its CSS, a few lines of JavaScript, SVG plots whose
points and cells say what they hold when hovered (:func:`svg_lines`, :func:`svg_scatter`, the
who-helped-whom heatmap with a slider over the rounds, :func:`help_map`) and, from the callers,
base64 PNGs for print. It loads nothing from the network. Its script sets
``document.body.dataset.ready`` once it has run, which the real-browser test
(``tests/report/test_browser.py``) checks along with the page's console.

Every accounted method (or a deployment) is one :func:`block` of the :data:`SECTIONS`, each a
``<section data-section=NAME>``; the experiments' page is built in
:mod:`fbo_torch.experiments.html_report`, a Flower run's in :mod:`fbo_torch.report.flower`.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from typing import Any

#: The sections every method's block has, in order: ``data-section`` name and heading.
SECTIONS = (
    ("regret", "Per-agent regret against its local counterfactual"),
    ("help", "Who helped whom"),
    ("privacy", "Privacy loss: ε and δ over rounds"),
    ("fairness", "Fairness"),
    ("contributions", "Contributions"),
    ("free-riders", "Free-riders"),
)

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em auto;max-width:1100px;
 color:#222;line-height:1.4;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.25em;border-bottom:2px solid #ccc;margin-top:2em}
h3{font-size:1.05em;margin-bottom:.3em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.8em}
.note{color:#555;font-size:.9em}.flag{color:#b00;font-weight:bold}
svg text{font-size:11px;font-family:inherit}
svg .pt:hover,svg .cell:hover{stroke:#000;stroke-width:2}
img{max-width:100%}
@media print{.noprint{display:none}section{break-inside:avoid}}
"""

_JS = """
(function(){
  function color(v, vmax){
    var a = vmax > 0 ? Math.max(0, Math.min(1, v / vmax)) : 0;
    var r = Math.round(255 - 205 * a), g = Math.round(255 - 135 * a), b = Math.round(255 - 35 * a);
    return 'rgb(' + r + ',' + g + ',' + b + ')';
  }
  document.querySelectorAll('.helpmap').forEach(function(box){
    var data = JSON.parse(box.querySelector('script[type="application/json"]').textContent);
    var slider = box.querySelector('input[type=range]');
    var label = box.querySelector('.round');
    function draw(k){
      label.textContent = data.rounds[k];
      box.querySelectorAll('rect.cell').forEach(function(cell){
        var i = +cell.dataset.i, j = +cell.dataset.j;
        var g = data.gain[k][i][j], f = data.follows[k][i][j];
        cell.setAttribute('fill', color(g, data.vmax));
        cell.querySelector('title').textContent = 'agent ' + data.rows[i] + ' following ' + data.cols[j] +
          ' up to round ' + data.rounds[k] + ': gained ' + g.toPrecision(3) + ' per run, followed ' +
          f.toFixed(2) + ' times per run';
      });
    }
    slider.addEventListener('input', function(){ draw(+slider.value); });
    draw(+slider.value);
  });
  document.body.dataset.ready = '1';
})();
"""


def esc(value: Any) -> str:
    """``str(value)`` escaped for HTML text and attribute values."""
    return html.escape(str(value))


def fmt(value: Any, digits: int = 4) -> str:
    """A table cell: a float to ``digits`` significant digits, ``None`` or a non-finite float as a dash."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return esc(value)


def json_script(data: Any) -> str:
    """``data`` as an inline JSON block, safe inside ``<script>`` (no ``</`` can close it)."""
    text = json.dumps(data, allow_nan=False).replace("<", "\\u003c").replace(">", "\\u003e")
    return f'<script type="application/json">{text}</script>'


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An HTML table of ``rows`` (cells through :func:`fmt`) under ``header``."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{fmt(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# ------------------------------------------------------------------ SVG plots
def _scale(lo: float, hi: float, a: float, b: float) -> Any:
    span = hi - lo if hi > lo else 1.0
    return lambda v: a + (v - lo) / span * (b - a)


def svg_lines(
    series: Sequence[tuple[str, Sequence[float], Sequence[float | None]]],
    xlabel: str,
    ylabel: str,
    width: int = 640,
    height: int = 300,
) -> str:
    r"""A line chart as inline SVG: one line per ``(name, xs, ys)`` (``None`` values skipped), every
    point a circle whose hover title says the series, x and y."""
    pts = [(x, y) for _, xs, ys in series for x, y in zip(xs, ys, strict=True) if y is not None and math.isfinite(y)]
    if not pts:
        return '<p class="note">nothing to plot</p>'
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if y1 == y0:
        y0, y1 = y0 - 0.5 * (abs(y0) or 1), y1 + 0.5 * (abs(y1) or 1)
    L, R, Tp, B = 60, 160, 10, 40
    sx, sy = _scale(x0, x1, L, width - R), _scale(y0, y1, height - B, Tp)
    out = [f'<svg width="{width}" height="{height}" role="img" aria-label="{esc(ylabel)}">']
    out.append(f'<rect x="{L}" y="{Tp}" width="{width - L - R}" height="{height - Tp - B}" fill="none" stroke="#999"/>')
    for k in range(5):
        yv = y0 + (y1 - y0) * k / 4
        out.append(f'<text x="{L - 4}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:.3g}</text>')
        xv = x0 + (x1 - x0) * k / 4
        out.append(f'<text x="{sx(xv):.1f}" y="{height - B + 14}" text-anchor="middle">{xv:.3g}</text>')
    out.append(f'<text x="{(L + width - R) / 2}" y="{height - 6}" text-anchor="middle">{esc(xlabel)}</text>')
    out.append(
        f'<text transform="translate(12,{(height - B + Tp) / 2}) rotate(-90)" text-anchor="middle">{esc(ylabel)}</text>'
    )
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    for k, (name, xs, ys) in enumerate(series):
        c = palette[k % len(palette)]
        dash = "" if k < len(palette) else ' stroke-dasharray="4 3"'
        xy = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None and math.isfinite(y)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in xy)
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.6"{dash} points="{path}"/>')
        for x, y in xy:
            out.append(
                f'<circle class="pt" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{c}">'
                f"<title>{esc(name)}: {esc(xlabel)} {x:g}, {esc(ylabel)} {y:.4g}</title></circle>"
            )
        ly = Tp + 14 + 16 * k
        out.append(f'<line x1="{width - R + 10}" x2="{width - R + 30}" y1="{ly - 4}" y2="{ly - 4}" stroke="{c}"/>')
        out.append(f'<text x="{width - R + 34}" y="{ly}">{esc(name[:22])}</text>')
    out.append("</svg>")
    return "".join(out)


def svg_scatter(
    points: Sequence[tuple[str, float, float]], xlabel: str, ylabel: str, width: int = 420, height: int = 360
) -> str:
    r"""A scatter as inline SVG with the diagonal ``y = x``: each ``(label, x, y)`` a circle whose hover
    title gives its label and numbers (below the diagonal: lower on the y axis than on the x axis)."""
    pts = [(n, x, y) for n, x, y in points if math.isfinite(x) and math.isfinite(y)]
    if not pts:
        return '<p class="note">nothing to plot</p>'
    lo = min(min(x, y) for _, x, y in pts)
    hi = max(max(x, y) for _, x, y in pts)
    lo, hi = (lo - 0.05 * (hi - lo or 1), hi + 0.05 * (hi - lo or 1))
    L, R, Tp, B = 60, 30, 10, 40
    sx, sy = _scale(lo, hi, L, width - R), _scale(lo, hi, height - B, Tp)
    out = [f'<svg width="{width}" height="{height}" role="img" aria-label="{esc(ylabel)} against {esc(xlabel)}">']
    out.append(f'<rect x="{L}" y="{Tp}" width="{width - L - R}" height="{height - Tp - B}" fill="none" stroke="#999"/>')
    out.append(
        f'<line x1="{sx(lo):.1f}" y1="{sy(lo):.1f}" x2="{sx(hi):.1f}" y2="{sy(hi):.1f}" stroke="#aaa" '
        'stroke-dasharray="5 4"/>'
    )
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        out.append(f'<text x="{L - 4}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
        out.append(f'<text x="{sx(v):.1f}" y="{height - B + 14}" text-anchor="middle">{v:.3g}</text>')
    out.append(f'<text x="{(L + width - R) / 2}" y="{height - 6}" text-anchor="middle">{esc(xlabel)}</text>')
    out.append(
        f'<text transform="translate(12,{(height - B + Tp) / 2}) rotate(-90)" text-anchor="middle">{esc(ylabel)}</text>'
    )
    for name, x, y in pts:
        c = "#2ca02c" if y <= x else "#d62728"
        out.append(
            f'<circle class="pt" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{c}" fill-opacity="0.8">'
            f"<title>{esc(name)}: {esc(xlabel)} {x:.4g}, {esc(ylabel)} {y:.4g}</title></circle>"
        )
    out.append("</svg>")
    return "".join(out)


def help_map(
    rows: Sequence[Any], cols: Sequence[Any], rounds: Sequence[int], gain: Any, follows: Any, cell: int = 22
) -> str:
    r"""The who-helped-whom heatmap: ``rows`` receiving agents x ``cols`` sources, one matrix per round in
    ``rounds`` (``gain`` and ``follows``: rounds x rows x cols, per run), drawn at the last round; a
    slider redraws it at any kept round, and every cell's hover title says what it holds."""
    vmax = max((v for mat in gain for row in mat for v in row), default=0.0)
    L, Tp = 90, 70
    width, height = L + cell * len(cols) + 10, Tp + cell * len(rows) + 10
    out = [
        '<div class="helpmap">',
        json_script(
            {
                "rounds": list(rounds),
                "gain": gain,
                "follows": follows,
                "rows": [str(r) for r in rows],
                "cols": [str(c) for c in cols],
                "vmax": vmax,
            }
        ),
    ]
    last = len(rounds) - 1
    out.append(
        f'<div class="noprint">round <input type="range" min="0" max="{last}" value="{last}" step="1" '
        f'aria-label="round"> <span class="round">{rounds[last]}</span> (cumulative up to this round)</div>'
    )
    out.append(f'<svg width="{width}" height="{height}" role="img" aria-label="who helped whom">')
    for j, c in enumerate(cols):
        x = L + cell * j + cell / 2
        out.append(f'<text transform="translate({x:.1f},{Tp - 6}) rotate(-60)">{esc(c)}</text>')
    for i, r in enumerate(rows):
        y = Tp + cell * i
        out.append(f'<text x="{L - 6}" y="{y + cell * 0.7:.1f}" text-anchor="end">agent {esc(r)}</text>')
        for j in range(len(cols)):
            g = gain[last][i][j]
            a = max(0.0, min(1.0, g / vmax)) if vmax > 0 else 0.0
            fill = f"rgb({round(255 - 205 * a)},{round(255 - 135 * a)},{round(255 - 35 * a)})"
            out.append(
                f'<rect class="cell" data-i="{i}" data-j="{j}" x="{L + cell * j}" y="{y}" width="{cell - 1}" '
                f'height="{cell - 1}" fill="{fill}"><title>agent {esc(r)} following {esc(cols[j])}: gained '
                f"{g:.3g} per run</title></rect>"
            )
    out.append("</svg></div>")
    return "".join(out)


def block(ident: str, title: str, bodies: dict[str, str]) -> str:
    """One method's part of the page: its title and every section of ``SECTIONS``, from ``bodies``."""
    sections = "".join(
        f'<section data-section="{name}"><h3>{esc(heading)}</h3>{bodies[name]}</section>' for name, heading in SECTIONS
    )
    return f'<div class="method" id="{esc(ident)}"><h2>{esc(title)}</h2>{sections}</div>'


def page(title: str, intro: str, blocks: Sequence[str]) -> str:
    """The whole page: inline style and script, the intro, the blocks."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{esc(title)}</h1>{intro}{''.join(blocks)}<script>{_JS}</script></body></html>"
    )


__all__ = ["SECTIONS", "block", "esc", "fmt", "help_map", "json_script", "page", "svg_lines", "svg_scatter", "table"]
