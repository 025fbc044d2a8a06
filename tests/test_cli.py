import csv
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from fbo_torch.cli import main
from fbo_torch.experiments.config import ConfigError, load_config, parse_config

FTS_TINY = """
experiment: fts
name: tiny
seed: 1
objective: {type: gp_grid, num_groups: 2, agents_per_group: 5, grid_size: 100, perturbation: 0.02}
runs: {num_inits: 2}
history: {mode: random, t_n: 15}
defaults: {num_iterations: 3, rff_noise_variance: 1e-2}
scenarios:
  - name: small M
    methods:
      - {name: TS, algorithm: ts}
      - {name: FTS M=20, algorithm: fts, num_features: 20}
  - name: large d_n
    objective: {perturbation: 1.2}
    methods:
      - {name: FTS fast p_t, algorithm: fts, num_features: 20, p_t: 1-1/t^2}
"""

DP_TINY = """
experiment: dp_fts_de
name: tiny-dp
objective: {type: gp_grid, num_groups: 1, agents_per_group: 6, grid_size: 100, perturb_first: true}
runs: {num_inits: 2}
privacy: {accountant: rdp-classic, extra_accountants: [rdp]}
defaults: {num_iterations: 3, num_init: 3, num_features: 20}
methods:
  - {name: TS, algorithm: ts}
  - {name: FTS-DE P=2, algorithm: fts_de, num_regions: 2}
  - {name: DP-FTS-DE, algorithm: fts_de, num_regions: 2, sample_rate: 0.5, noise_multiplier: 1.0, clip_norm: 5.0}
"""


def write(tmp_path, text, name="cfg.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_fts_cli_end_to_end(tmp_path, capsys):
    cfg = write(tmp_path, FTS_TINY)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-progress", "--inits", "2"]) == 0
    printed = capsys.readouterr().out
    # the resolved config is a file the output names, not an echo
    assert "rff_noise_variance" not in printed and f"config:  {out / 'config.resolved.yaml'}" in printed
    assert "rff_noise_variance: 0.01" in (out / "config.resolved.yaml").read_text()
    res = json.loads((out / "results.json").read_text())
    assert [s["name"] for s in res["scenarios"]] == ["small M", "large d_n"]
    ts, fts = res["scenarios"][0]["methods"]
    for m in (ts, fts):
        assert len(m["simple_regret_mean"]) == 4 and len(m["simple_regret_stderr"]) == 4
        assert len(m["runs"]) == 4 and all(len(r) == 4 for r in m["runs"])  # 2 targets x 2 inits
        assert all(x >= -1e-12 for x in m["simple_regret_mean"])
        assert len(m["sources"]) == 4 and len(m["sources"][0]) == 3
    assert all(s == -1 for row in ts["sources"] for s in row)
    assert fts["parameters_per_agent"] == 20
    assert res["environment"]["torch"] and res["config"]["scenarios"][1]["objective"]["perturbation"] == 1.2
    png = (out / "simple_regret.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert (out / "summary.txt").read_text().count("FTS") >= 2


def test_dp_cli_end_to_end_and_resume(tmp_path):
    cfg = write(tmp_path, DP_TINY)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-progress"]) == 0
    res = json.loads((out / "results.json").read_text())
    ts, de, dp = res["scenarios"][0]["methods"]
    assert ts["epsilon_final"] is None and de["epsilon_final"] is None
    assert dp["accountant"] == "rdp-classic" and len(dp["epsilon"]) == 3
    assert dp["epsilon"] == sorted(dp["epsilon"]) and dp["epsilon_final"] > 0
    assert dp["epsilon_other_accountants"]["rdp"] < dp["epsilon_final"]
    assert len(dp["fraction_clipped"]) == 3 and 0 <= dp["fraction_clipped_mean"] <= 1
    assert dp["delta"] == pytest.approx(1 / 6**1.1)
    assert len(dp["runs"]) == 12  # 2 repetitions x 6 agents
    for name in ("simple_regret.png", "privacy_utility.png", "epsilon.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 * 12 * 4  # methods x (2 repetitions x 6 agents) x (3 rounds + 1)
    dp_rows = [r for r in rows if r["method"] == "DP-FTS-DE" and r["iteration"] == "3"]
    assert len(dp_rows) == 12 and all(float(r["epsilon"]) == pytest.approx(dp["epsilon"][-1]) for r in dp_rows)
    # resuming a finished run re-uses the records
    assert main(["run", str(cfg), "--out", str(out), "--no-progress", "--resume"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["scenarios"][0]["methods"][2]["loss_mean"] == dp["loss_mean"]
    # every accountant asked for is in the summary, beside the run's own and its delta
    summary = (out / "summary.txt").read_text()
    assert f"(delta={dp['delta']:.3g}, rdp-classic; rdp: {dp['epsilon_other_accountants']['rdp']:.2f})" in summary


def test_a_run_without_private_methods_writes_no_privacy_plots(tmp_path, capsys):
    """Before: a non-private dp_fts_de run with `privacy.delta: 1e-5` wrote an empty privacy_utility.png
    labelled "privacy loss ε (, δ unknown)", and epsilon.png."""
    text = DP_TINY.replace("privacy: {accountant: rdp-classic, extra_accountants: [rdp]}", "privacy: {delta: 1.0e-5}")
    text = text.replace("runs: {num_inits: 2}", "runs: {num_inits: 1}").rsplit("  - {name: DP-FTS-DE", 1)[0]
    out = tmp_path / "out"
    assert main(["run", str(write(tmp_path, text)), "--out", str(out), "--no-progress"]) == 0
    assert not list(out.glob("privacy_utility.*")) and not list(out.glob("epsilon.*"))
    assert json.loads((out / "results.json").read_text())["reports"] == [
        "simple_regret.png",
        "results.csv",
        "summary.txt",
        "accounting.json",
        "report.html",
    ]
    assert "plots:   " + str(out / "simple_regret.png") + "\n" in capsys.readouterr().out


def test_a_closed_pipe_ends_the_output_not_the_run(tmp_path):
    """Before: `fbo-torch run ... | head -1` killed the run ("Broken pipe", exit status 1)."""
    cfg = _tiny_quickstart(tmp_path)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "fbo_torch.cli", "run", str(cfg), "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("resolved config:")
    proc.stdout.close()  # as `| head -1` does after its line
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "Broken pipe" not in err and "BrokenPipeError" not in err
    assert {"results.json", "summary.txt", "simple_regret.png"} <= {p.name for p in out.iterdir()}


@pytest.mark.parametrize(
    "patch, match",
    [
        ("objective: {type: gp_grid, agents_per_grup: 5}", "unknown key 'agents_per_grup'.*agents_per_group"),
        ("objective: {type: nope}", "unknown objective type"),
        ("runs: {num_inits: 0}", "num_inits"),
        ("defaults: {num_iterations: 3, p_t: 7}", "p_t"),
        ("defaults: {num_iterations: 3, algoritm: ts}", "unknown key 'algoritm'"),
        ("seed: -3", "seed"),
        ("history: {mode: telepathy}", "mode"),
        ("domain: {refine: newton}", "refine"),
    ],
)
def test_config_errors_are_clear(tmp_path, patch, match):
    text = FTS_TINY
    key = patch.split(":")[0]
    lines = [ln for ln in text.splitlines() if not ln.startswith(key + ":")]
    text = "\n".join(lines) + "\n" + patch + "\n"
    if key == "objective" and "type: gp_grid" in patch:
        text = text.replace("    objective: {perturbation: 1.2}\n", "")
    with pytest.raises(ConfigError, match=match):
        load_config(write(tmp_path, text))


def test_unset_environment_variable_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("FBO_NOT_SET_ANYWHERE", raising=False)
    text = (
        "experiment: dp_fts_de\nobjective: {type: har, path: ${FBO_NOT_SET_ANYWHERE}}\n"
        "methods: [{name: TS, algorithm: ts}]\n"
    )
    with pytest.raises(ConfigError, match="FBO_NOT_SET_ANYWHERE"):
        load_config(write(tmp_path, text))


def test_config_structure_errors():
    with pytest.raises(ConfigError, match="experiment"):
        parse_config({"experiment": "bo", "objective": {"type": "gp_grid"}, "methods": [{"name": "a"}]})
    with pytest.raises(ConfigError, match="methods"):
        parse_config({"experiment": "fts", "objective": {"type": "gp_grid"}})
    with pytest.raises(ConfigError, match="duplicate"):
        parse_config(
            {
                "experiment": "fts",
                "objective": {"type": "gp_grid"},
                "methods": [{"name": "a", "algorithm": "ts"}, {"name": "a", "algorithm": "ts"}],
            }
        )
    with pytest.raises(ConfigError, match="clip_norm"):
        parse_config(
            {
                "experiment": "dp_fts_de",
                "objective": {"type": "gp_grid"},
                "methods": [{"name": "a", "noise_multiplier": 1.0}],
            }
        )


def test_cli_errors_and_help(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    proc = subprocess.run([sys.executable, "-m", "fbo_torch.cli", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "quickstart" in proc.stdout and "run" in proc.stdout


def test_repo_configs_validate(monkeypatch, tmp_path):
    root = Path(__file__).resolve().parents[1]
    configs = sorted((root / "configs").rglob("*.yaml"))  # configs/learned_weights, configs/peers too
    assert configs, "configs/ is empty"
    monkeypatch.setenv("FBO_HAR_PATH", str(tmp_path))
    monkeypatch.setenv("FBO_EMNIST_ROOT", str(tmp_path))
    for path in configs:
        cfg = load_config(path)
        assert cfg.scenarios and all(s.methods for s in cfg.scenarios)


def test_privacy_command(capsys):
    assert main(["privacy", "-q", "0.25", "-z", "1.0", "-T", "40", "-N", "200"]) == 0
    out = capsys.readouterr().out
    line = [ln for ln in out.splitlines() if "rdp-classic" in ln][0]
    assert math.isclose(float(line.split("=")[-1]), 9.91, abs_tol=0.005)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["-q", "0", "-z", "1", "-T", "40", "-N", "200"], "`--sample-rate` must lie in (0, 1], got 0.0."),
        (["-q", "nan", "-z", "1", "-T", "40", "-N", "200"], "`--sample-rate` must lie in (0, 1]"),
        (["-q", "0.25", "-z", "-1", "-T", "40", "-N", "200"], "`--noise-multiplier` must be finite and >= 0"),
        (["-q", "0.25", "-z", "inf", "-T", "40", "-N", "200"], "`--noise-multiplier` must be finite and >= 0"),
        (["-q", "0.25", "-z", "1", "-T", "0", "-N", "200"], "`--steps` must be >= 1, got 0."),
        (["-q", "0.25", "-z", "1", "-T", "2.5", "-N", "200"], "`--steps` must be an integer, got '2.5'."),
        (["-q", "0.25", "-z", "1", "-T", "40", "--delta", "1"], "`--delta` must lie in (0, 1), got 1.0."),
        (["-q", "0.25", "-z", "1", "-T", "40", "-N", "1"], "`--num-agents` must be >= 2, got 1."),
    ],
)
def test_privacy_flags_are_checked_as_the_settings_are_naming_the_flag(capsys, flags, says):
    """The privacy command's flags go through the settings' checks (privacy.accountants.check_*), in one line."""
    with pytest.raises(SystemExit):
        main(["privacy", *flags])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert says in err


def test_privacy_with_no_noise_is_infinite_epsilon(capsys):
    """``z = 0`` is accepted as the settings accept it (no noise): every accountant says epsilon = inf."""
    assert main(["privacy", "-q", "0.25", "-z", "0", "-T", "40", "-N", "200"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if "epsilon =" in ln]
    assert rows and all(ln.split("=")[-1].strip() == "inf" for ln in rows)


QUICKSTART = Path(__file__).resolve().parents[1] / "fbo_torch" / "experiments" / "quickstart.yaml"


def _tiny_quickstart(tmp_path):
    text = QUICKSTART.read_text()
    for old, new in (
        ("grid_size: 1000", "grid_size: 100"),
        ("num_inits: 3", "num_inits: 1"),
        ("t_n: 100", "t_n: 10"),
        ("num_iterations: 30", "num_iterations: 3"),
    ):
        assert old in text
        text = text.replace(old, new)
    return write(tmp_path, text, "quickstart.yaml")


def test_a_run_logged_to_files_is_a_few_lines_without_the_config_or_bars(tmp_path, monkeypatch):
    cfg = _tiny_quickstart(tmp_path)
    with open(tmp_path / "stdout.txt", "w") as out, open(tmp_path / "stderr.txt", "w") as err:
        monkeypatch.setattr(sys, "stdout", out)  # as `fbo-torch run ... >stdout.txt 2>stderr.txt`
        monkeypatch.setattr(sys, "stderr", err)
        code = main(["run", str(cfg), "--out", str(tmp_path / "out")])
        monkeypatch.undo()
    out, err = (tmp_path / "stdout.txt").read_text(), (tmp_path / "stderr.txt").read_text()
    assert code == 0, err
    assert err == ""  # no progress bar redrawn into a log file
    lines = out.splitlines()
    # 1 config pointer, 1 scenario, 1 history, 3 methods, a blank, the 5-line table, a blank, 5 lines of where
    assert len(lines) <= 20, out
    assert "num_features" not in out and f"resolved config: {tmp_path / 'out' / 'config.resolved.yaml'}" in lines
    assert sum(": final simple regret" in line for line in lines) == 3  # one line per method


def test_quiet_prints_nothing_and_still_writes_everything(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(_tiny_quickstart(tmp_path)), "--out", str(out), "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")
    assert {"results.json", "results.csv", "summary.txt", "simple_regret.png", "config.resolved.yaml"} <= {
        p.name for p in out.iterdir()
    }


def test_plot_format_writes_each_format_and_report_redraws_in_others(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(_tiny_quickstart(tmp_path)), "--out", str(out), "--quiet", "--plot-format", "pdf,svg"]) == 0
    assert (out / "simple_regret.pdf").read_bytes()[:5] == b"%PDF-" and (out / "simple_regret.svg").is_file()
    assert not (out / "simple_regret.png").exists()
    assert {"simple_regret.pdf", "simple_regret.svg"} <= set(json.loads((out / "run.json").read_text())["files"])
    assert main(["report", str(out), "--plot-format", "png"]) == 0 and (out / "simple_regret.png").is_file()
    with pytest.raises(SystemExit):
        main(["run", "x.yaml", "--out", str(tmp_path / "o"), "--plot-format", "jpg"])
    assert "expected one or more of png, pdf, svg" in capsys.readouterr().err


def test_inits_sets_num_inits_and_seeds_still_works_with_a_note(tmp_path, capsys):
    cfg = _tiny_quickstart(tmp_path)
    assert main(["run", str(cfg), "--out", str(tmp_path / "a"), "--quiet", "--inits", "2"]) == 0
    assert json.loads((tmp_path / "a" / "results.json").read_text())["config"]["scenarios"][0]["runs"]["num_inits"] == 2
    assert capsys.readouterr().err == ""
    assert main(["run", str(cfg), "--out", str(tmp_path / "b"), "--quiet", "--seeds", "2"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("note: --seeds is now called --inits") and len(err.splitlines()) == 1
    assert (
        json.loads((tmp_path / "b" / "results.json").read_text())["config"]
        == json.loads((tmp_path / "a" / "results.json").read_text())["config"]
    )
    with pytest.raises(SystemExit):
        main(["run", str(cfg), "--out", str(tmp_path / "c"), "--inits", "2", "--seeds", "2"])


def test_privacy_table_has_no_warning_inside_it(capsys):
    with warnings.catch_warnings(record=True) as escaped:  # a warning that escapes is printed where it arises
        warnings.simplefilter("always")
        assert main(["privacy", "-q", "0.25", "-z", "1.0", "-T", "40", "-N", "200"]) == 0
    assert not escaped, [str(w.message) for w in escaped]
    out, err = capsys.readouterr()
    assert err == "" and "Warning" not in out and "site-packages" not in out
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[1:5]] == ["rdp", "prv", "gdp", "rdp-classic"]
    assert lines[5] == (
        "note (gdp): GDP accounting is experimental and can underestimate privacy expenditure. "
        "Proceed with caution. More details: https://arxiv.org/pdf/2106.02848.pdf"
    )


def test_help_and_version_answer_without_importing_torch():
    """`fbo-torch --help`, `--version` and each command's `--help` import neither torch nor the libraries
    built on it (they took ~2 s of CPU when they did)."""
    code = (
        "import sys\nfrom fbo_torch.cli import main\n"
        "for argv in (['--help'], ['--version'], ['run', '--help'], ['data', 'emnist', '--help'], []):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "print(sorted(m for m in ('torch', 'botorch', 'gpytorch', 'matplotlib', 'opacus') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert "data emnist" not in out.stderr
    assert "COMMAND (run, quickstart, report, privacy, examples, data)" in out.stderr


def test_device_switches_every_part_of_a_run_the_objective_included(tmp_path, monkeypatch, capsys):
    """`--device cpu` moves a config whose objective says `device: cuda` (a GPU config on a CPU machine), and
    `--device cuda` would move it the other way: the override reaches objective.device."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = write(
        tmp_path,
        """
experiment: dp_fts_de
name: cnn-on-gpu
device: cuda
objective: {type: digits_cnn, num_agents: 2, samples_per_agent: 60, min_samples_per_agent: 40, steps: 2,
            channels: [2, 4], device: cuda}
runs: {num_inits: 1}
defaults: {num_iterations: 1, num_init: 2, num_features: 10}
methods:
  - {name: TS, algorithm: ts}
""",
    )
    assert main(["run", str(cfg), "--out", str(tmp_path / "a"), "--no-progress"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert main(["run", str(cfg), "--out", str(tmp_path / "b"), "--no-progress", "--device", "cpu", "--quiet"]) == 0
    resolved = json.loads((tmp_path / "b" / "results.json").read_text())["config"]
    assert resolved["device"] == "cpu" and resolved["scenarios"][0]["objective"]["device"] == "cpu"


def test_a_run_whose_delta_is_at_least_one_over_n_warns_and_says_delta_with_every_epsilon(tmp_path, capsys):
    cfg = write(
        tmp_path,
        DP_TINY.replace(
            "privacy: {accountant: rdp-classic, extra_accountants: [rdp]}", "privacy: {accountant: rdp, delta: 0.5}"
        ).replace("num_iterations: 3", "num_iterations: 1"),
    )
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"warning: {cfg}: privacy.delta = 0.5 >= 1/N = 0.167 (6 agents)" in printed
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "(delta=0.5, rdp)" in summary and "note: delta=0.5 >= 1/N = 0.167 (6 agents)" in summary
    with open(tmp_path / "out" / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["delta"] for r in rows if r["method"] == "DP-FTS-DE" and r["epsilon"]} == {"0.5"}
