"""Plots and progress a reader can trust."""

import json
import re

from fbo_torch.cli import main
from fbo_torch.experiments.dp_fts_de import plot_privacy
from fbo_torch.experiments.report import plot_curves, plot_message_length, series_styles, summary_table


def _method(name, i, private=True, T=5, runs=3):
    curve = [1.0 / (t + 1 + i) for t in range(T + 1)]
    m = {
        "name": name,
        "loss_name": "simple regret",
        "iterations": list(range(T + 1)),
        "loss_mean": curve,
        "loss_stderr": [0.01] * (T + 1),
        "runs": [curve] * runs,
        "settings": {"algorithm": "fts_de"},
        "parameters_per_agent": 100,
        "wall_time_s": 1.0,
        "stderr_over": "repetitions (agent-averaged curves)",
        "accountant": "rdp-classic",
        "delta": 0.02,
    }
    if private:
        m.update(epsilon=[0.5 * (t + 1) + i for t in range(T)], epsilon_final=0.5 * T + i)
    else:
        m.update(epsilon=[None] * T, epsilon_final=None)
    return m


def _landmine_like():
    names = (
        ["TS", "FTS", "FTS-DE"]
        + [f"q=0.35, z={z}" for z in (1, 1.6, 2, 3, 4)]
        + [f"q={q}, z=1" for q in (0.1, 0.15, 0.2, 0.25)]
    )
    methods = [_method(n, i, private=i >= 3) for i, n in enumerate(names)]
    return {
        "name": "landmine_dp_fts_de",
        "experiment": "dp_fts_de",
        "scenarios": [{"name": "landmine: privacy-utility", "num_runs": 3, "methods": methods}],
    }


def _looks(ax):
    """(colour, line style, marker) of every series: labelled lines and error-bar points."""
    lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    lines += [c[0] for c in ax.containers if hasattr(c, "has_xerr")]
    return [(line.get_color(), line.get_linestyle(), line.get_marker()) for line in lines]


def test_styles_are_pairwise_different():
    looks = [(s["color"], s["linestyle"], s["marker"]) for s in series_styles(240)]
    assert len(set(looks)) == 240
    assert len({s["color"] for s in series_styles(10)}) == 10  # colours first


def test_twelve_methods_never_share_a_look_and_bands_are_explained(tmp_path, figures):
    res = _landmine_like()
    plot_curves(res, tmp_path / "regret.png", title=res["name"])
    plot_privacy(res, tmp_path)
    regret, utility, eps = figures
    ax = regret.axes[0]
    assert len(_looks(ax)) == 12 and len(set(_looks(ax))) == 12
    assert "mean ± 1 s.e. over 3 repetitions" in ax.get_ylabel()
    looks = _looks(eps.axes[0])
    assert len(looks) == 9 and len(set(looks)) == 9
    uax = utility.axes[0]
    assert "mean ± 1 s.e. over 3 repetitions" in uax.get_ylabel()
    series = _looks(uax)  # 3 reference lines + 1 group of points
    assert len(series) == 4 and len(set(series)) == 4


def test_fts_plots_say_over_how_many_runs(tmp_path, figures):
    res = {
        "name": "x",
        "scenarios": [
            {
                "name": "a",
                "num_runs": 4,
                "methods": [
                    {
                        **_method("TS", 0, private=False),
                        "stderr_over": None,
                        "settings": {"algorithm": "ts"},
                        "parameters_per_agent": 0,
                        "elapsed_s": [1, 2, 3, 4, 5],
                    },
                    {
                        **_method("FTS M=100", 1, private=False),
                        "settings": {"algorithm": "fts"},
                        "elapsed_s": [1, 2, 3, 4, 5],
                    },
                ],
            }
        ],
    }
    for m in res["scenarios"][0]["methods"]:
        del m["stderr_over"]
    plot_curves(res, tmp_path / "r.png", title="x")
    plot_message_length(res, tmp_path / "m.png")
    assert "mean ± 1 s.e. over 4 runs" in figures[0].axes[0].get_ylabel()
    assert "error bars: mean ± 1 s.e. over 4 runs" in figures[1].axes[0].get_ylabel()
    assert "mean ± 1 s.e. over 4 runs" in summary_table(res)


def _texts(fig):
    out = [t.get_text() for t in fig.texts]  # the suptitle is one of them
    for ax in fig.axes:
        out.append(ax.get_title())
    return out


def test_a_lone_panel_named_like_the_run_shows_its_title_once(tmp_path, figures):
    res = {
        "name": "quickstart",
        "scenarios": [{"name": "quickstart", "num_runs": 3, "methods": [_method("TS", 0, private=False)]}],
    }
    plot_curves(res, tmp_path / "r.png", title="quickstart")
    assert _texts(figures[0]).count("quickstart") == 1
    res["scenarios"].append({**res["scenarios"][0], "name": "other"})
    plot_curves(res, tmp_path / "r.png", title="quickstart")
    assert _texts(figures[1]).count("quickstart") == 2  # the run's title over two panels


DP = """
experiment: dp_fts_de
name: tiny-dp
objective: {type: gp_grid, num_groups: 1, agents_per_group: 4, grid_size: 50, perturb_first: true}
runs: {num_inits: 2}
privacy: {accountant: rdp-classic}
defaults: {num_iterations: 4, num_init: 2, num_features: 10, gp_refit_every: 0}
methods:
  - {name: DP, algorithm: fts_de, num_regions: 2, sample_rate: 0.5, noise_multiplier: 1.0, clip_norm: 5.0}
"""


def test_progress_bar_shows_the_epsilon_after_the_round_it_counts(tmp_path, capsys, monkeypatch):
    import sys

    import fbo_torch.experiments.loop as loop

    monkeypatch.setattr(loop, "render_reports", lambda results, out: [])  # plots: not this test's subject
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # bars are drawn on terminals only
    cfg = tmp_path / "c.yaml"
    cfg.write_text(DP)
    assert main(["run", str(cfg), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    eps = json.loads((tmp_path / "out" / "results.json").read_text())["scenarios"][0]["methods"][0]["epsilon"]
    assert len(set(f"{e:.2f}" for e in eps)) == 4  # ε grows every round, so a stale value would show
    shown = {}
    for segment in re.split(r"[\r\n]", err):  # each redraw of the bar
        found = re.search(r"\b(\d)/4 \[.*eps=([\d.]+)", segment)
        if found:
            shown[int(found.group(1))] = found.group(2)
    assert shown, err
    for k, e in shown.items():
        assert e == f"{eps[k - 1]:.2f}", (k, e, eps)
    assert shown.get(4) == f"{eps[-1]:.2f}"
    assert re.search(r"eps=[\d.]+ \(δ=", err)  # with its δ
