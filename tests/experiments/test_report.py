"""What a finished run leaves for people: a tidy CSV, plots named after what they show in the formats asked for,
plain labels, integer iteration ticks, no ± for a single run, every accountant in the privacy plot."""

import csv
import io

import pytest
from matplotlib.figure import Figure

from fbo_torch.experiments.dp_fts_de import plot_privacy
from fbo_torch.experiments.report import (
    TIDY_COLUMNS,
    check_plot_formats,
    loss_plot_stem,
    plot_curves,
    save_figure,
    summary_table,
    tidy_rows,
    write_tidy_csv,
)


def _fts(runs=2, T=3, loss_name="simple regret"):
    curves = [[0.5 / (t + 1 + r) for t in range(T + 1)] for r in range(runs)]
    return {
        "name": "x",
        "experiment": "fts",
        "scenarios": [
            {
                "name": "panel",
                "num_runs": runs,
                "methods": [
                    {
                        "name": "TS",
                        "loss_name": loss_name,
                        "iterations": list(range(T + 1)),
                        "loss_mean": [sum(c) / runs for c in zip(*curves, strict=True)],
                        "loss_stderr": [0.01] * (T + 1),
                        "runs": curves,
                        "best_value_runs": [[1 - v for v in c] for c in curves],
                        "targets": [4] * runs,
                        "inits": list(range(runs)),
                        "settings": {"algorithm": "ts"},
                        "wall_time_s": 1.0,
                        "parameters_per_agent": 0,
                    },
                ],
            }
        ],
    }


def _dp_method(name, i, private, T=3, N=2, R=1, others=None):
    curve = [0.4 / (t + 1 + i) for t in range(T + 1)]
    m = {
        "name": name,
        "loss_name": "simple regret",
        "iterations": list(range(T + 1)),
        "loss_mean": curve,
        "loss_stderr": [0.02] * (T + 1),
        "runs": [curve] * (N * R),
        "num_agents": N,
        "num_repetitions": R,
        "settings": {"algorithm": "fts_de"},
        "wall_time_s": 1.0,
        "parameters_per_agent": 10,
        "accountant": "rdp-classic",
        "delta": 0.1,
        "stderr_over": "repetitions (agent-averaged curves)",
        "epsilon": [None] * T,
        "epsilon_final": None,
    }
    if private:
        m.update(
            epsilon=[0.5 * (t + 1) + i for t in range(T)],
            epsilon_final=0.5 * T + i,
            epsilon_other_accountants=others or {},
        )
    return m


def _dp(R=1, others=None):
    return {
        "name": "dp",
        "experiment": "dp_fts_de",
        "scenarios": [
            {
                "name": "(c) impact of q",
                "num_runs": R,
                "methods": [
                    _dp_method("TS", 0, False, R=R),
                    _dp_method("q=0.25", 1, True, R=R, others=others),
                    _dp_method("q=0.5", 2, True, R=R, others=others),
                ],
            },
            {
                "name": "(d) impact of z",
                "num_runs": R,
                "methods": [
                    _dp_method("z=1.0", 3, True, R=R, others=others),
                    _dp_method("z=1.5", 4, True, R=R, others=others),
                ],
            },
        ],
    }


def test_the_tidy_csv_has_one_named_row_per_run_agent_and_iteration(tmp_path):
    res = _fts(runs=2, T=3)
    write_tidy_csv(res, tmp_path / "results.csv")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "results.csv").read_text())))
    assert (
        tuple(rows[0])
        == TIDY_COLUMNS
        == (
            "scenario",
            "method",
            "run",
            "agent",
            "init",
            "iteration",
            "loss_name",
            "loss",
            "best_value",
            "epsilon",
            "delta",
            "accountant",
            "failed",
            "source",
            "belief_gain",
            "information",
        )
    )
    assert len(rows) == 2 * 4  # runs x (iterations + 1)
    r = rows[5]  # run 1, iteration 1
    assert (r["scenario"], r["method"], r["run"], r["agent"], r["init"], r["iteration"]) == (
        "panel",
        "TS",
        "1",
        "4",
        "1",
        "1",
    )
    assert float(r["loss"]) == res["scenarios"][0]["methods"][0]["runs"][1][1]  # full precision
    assert float(r["best_value"]) == pytest.approx(1 - float(r["loss"])) and r["epsilon"] == ""


def test_dp_rows_name_agent_and_repetition_and_carry_epsilon_after_each_round():
    res = _dp(R=2)
    rows = list(tidy_rows(res))
    assert len(rows) == 5 * (2 * 2) * 4  # methods x (repetitions x agents) x (rounds + 1)
    col = {c: i for i, c in enumerate(TIDY_COLUMNS)}
    q25 = [r for r in rows if r[col["method"]] == "q=0.25"]
    # row b of `runs` is agent b % N of repetition b // N
    assert [(r[col["run"]], r[col["agent"]]) for r in q25[::4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    eps = res["scenarios"][0]["methods"][1]["epsilon"]
    assert [r[col["epsilon"]] for r in q25[:4]] == ["", repr(eps[0]), repr(eps[1]), repr(eps[2])]
    assert q25[1][col["accountant"]] == "rdp-classic" and q25[1][col["delta"]] == repr(0.1)
    assert q25[0][col["delta"]] == ""  # no ε before the first round, so no δ either
    assert all(
        r[col["epsilon"]] == r[col["delta"]] == r[col["accountant"]] == "" for r in rows if r[col["method"]] == "TS"
    )


def test_every_epsilon_is_printed_with_its_delta_and_accountant(tmp_path, figures):
    res = _dp(R=2)
    text = summary_table(res)
    private = [line for line in text.splitlines() if "eps=" in line]
    assert len(private) == 4 and all("(delta=0.1, rdp-classic)" in line for line in private)
    assert not any("eps=" in line for line in text.splitlines() if line.strip().startswith("TS"))
    # N = 2 agents with delta = 0.1: fine; with delta = 0.5 = 1/N a note says what such a guarantee allows
    assert "note:" not in text
    for sc in res["scenarios"]:
        for m in sc["methods"]:
            m["delta"] = 0.5
    assert (
        "note: delta=0.5 >= 1/N = 0.5 (2 agents): such a guarantee allows releasing one agent's data in full"
        in summary_table(res)
    )
    # the papers' default delta = 1/N^1.1 is named as such
    res["config"] = {"privacy": {"delta": None}}
    assert "delta = 1/N^1.1 (privacy.delta: null) is the papers' choice" in summary_table(res)
    plot_privacy(_dp(), tmp_path)
    assert "δ = 0.1" in figures[0].axes[0].get_xlabel()
    assert all("rdp-classic, δ = 0.1" in ax.get_ylabel() for ax in figures[1].axes if ax.lines)


@pytest.mark.parametrize(
    "loss_name, stem",
    [
        ("simple regret", "simple_regret"),
        ("validation error", "validation_error"),
        ("1 - AUC", "1_minus_auc"),
        ("-f", "negative_f"),
        ("-accuracy", "negative_accuracy"),
    ],
)
def test_the_loss_plot_is_named_after_the_loss(loss_name, stem):
    assert loss_plot_stem(_fts(loss_name=loss_name)) == stem


def test_scenarios_with_different_losses_give_a_plain_loss_plot():
    res = _fts()
    res["scenarios"].append(_fts(loss_name="validation error")["scenarios"][0])
    assert loss_plot_stem(res) == "loss"


def test_plots_are_written_in_each_format_asked_for(tmp_path):
    written = plot_curves(_fts(), tmp_path / "simple_regret", formats=("pdf", "svg", "png"))
    assert [p.name for p in written] == ["simple_regret.pdf", "simple_regret.svg", "simple_regret.png"]
    assert written[0].read_bytes()[:5] == b"%PDF-"
    assert b"<svg" in written[1].read_bytes()[:2000]
    assert written[2].read_bytes()[:4] == b"\x89PNG"
    assert save_figure(Figure(), tmp_path / "a.svg")[0].name == "a.svg"  # default: the suffix's format
    assert check_plot_formats("PNG, .pdf,png") == ("png", "pdf")
    with pytest.raises(ValueError, match="'jpg' is not a plot format"):
        check_plot_formats(["jpg"])


def test_short_runs_have_integer_iteration_ticks(tmp_path, figures):
    plot_curves(_fts(T=3), tmp_path / "r.png")
    plot_privacy(_dp(), tmp_path)
    regret, _, eps = figures
    for ax in [regret.axes[0]] + [a for a in eps.axes if a.lines]:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks


def test_one_run_has_no_band_and_no_plus_minus(tmp_path, figures):
    one, two = _fts(runs=1), _fts(runs=2)
    assert "±" not in summary_table(one) and "± 0.0100" in summary_table(two)
    assert "mean of 1 run, no band" in summary_table(one)
    plot_curves(one, tmp_path / "one.png")
    plot_curves(two, tmp_path / "two.png")
    assert len(figures[0].axes[0].collections) == 0 and len(figures[1].axes[0].collections) == 1
    plot_privacy(_dp(R=1), tmp_path)
    assert all(not c.has_yerr for c in figures[2].axes[0].containers)  # no error bars over 1 repetition


def _legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_the_epsilon_plot_labels_methods_plainly_with_a_panel_per_scenario(tmp_path, figures):
    plot_privacy(_dp(), tmp_path)
    eps = figures[1]
    panels = [ax for ax in eps.axes if ax.lines]
    assert [ax.get_title() for ax in panels] == ["(c) impact of q", "(d) impact of z"]
    assert [_legend(ax) for ax in panels] == [["q=0.25", "q=0.5"], ["z=1.0", "z=1.5"]]


def test_the_privacy_plot_has_a_series_per_accountant(tmp_path, figures):
    others = {"rdp": 1.25, "prv": 0.75}
    res = _dp(others=others)
    res["scenarios"] = res["scenarios"][:1]
    plot_privacy(res, tmp_path)
    ax = figures[0].axes[0]
    series = [c for c in ax.containers if hasattr(c, "has_xerr")]
    assert len(series) == 3  # rdp-classic (the run's), rdp, prv
    xs = [sorted(c[0].get_xdata()) for c in series]
    q = res["scenarios"][0]["methods"][1:]
    assert xs == [sorted(m["epsilon_final"] for m in q), [1.25, 1.25], [0.75, 0.75]]
    assert _legend(ax) == ["TS (no DP)", "rdp-classic", "rdp", "prv"]
    # two scenarios: a legend entry per scenario (its colour) and one per accountant (its marker)
    figures.clear()
    plot_privacy(_dp(others=others), tmp_path)
    assert _legend(figures[0].axes[0]) == [
        "TS (no DP)",
        "(c) impact of q",
        "(d) impact of z",
        "ε under rdp-classic",
        "ε under rdp",
        "ε under prv",
    ]
    eps_ax = [a for a in figures[1].axes if a.lines][0]
    assert "final ε under rdp" in _legend(eps_ax) and "final ε under prv" in _legend(eps_ax)


def test_the_summary_names_every_requested_accountant(tmp_path):
    """Before: `extra_accountants: [rdp]` did not appear in summary.txt."""
    text = summary_table(_dp(others={"rdp": 1.25, "prv": None}))
    private = [line for line in text.splitlines() if "eps=" in line]
    assert private and all("(delta=0.1, rdp-classic; rdp: 1.25; prv: n/a)" in line for line in private)


def test_a_run_without_private_methods_draws_no_privacy_plot(tmp_path, figures):
    """Before: a non-private dp_fts_de run wrote privacy_utility.png (empty, "privacy loss ε (, δ unknown)")
    and epsilon.png."""
    res = _dp()
    for sc in res["scenarios"]:
        sc["methods"] = [m for m in sc["methods"] if m["epsilon_final"] is None]
    assert plot_privacy(res, tmp_path) == [] and figures == []
    assert not list(tmp_path.iterdir())
