"""Setups (ours and the authors'): what each sets, and each runs end to end on a tiny landmine study."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fbo_torch.federation.settings import DPFTSDESettings, FTSSettings
from fbo_torch.simulate.presets import PAPER, SETUPS, apply_setup, objective_setup

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "LandmineData.mat"


def test_authors_setup_sets_the_authors_choices_and_overrides_win():
    s = apply_setup(DPFTSDESettings(), "authors")
    assert (s.gp_kernel, s.gp_restarts, s.gp_refit_every, s.gp_sample_features) == ("authors", 10, 5, 100)
    assert (s.repeated_query, s.broadcast_maximization) == ("random", "per_agent")
    assert apply_setup(DPFTSDESettings(), "engine") == DPFTSDESettings()  # the engine is the default
    assert apply_setup(DPFTSDESettings(), "paper") == DPFTSDESettings(**PAPER)
    assert apply_setup(DPFTSDESettings(), "modern") == apply_setup(DPFTSDESettings(), "paper")  # its former name
    assert apply_setup(DPFTSDESettings(), "authors", {"gp_restarts": 2}).gp_restarts == 2
    f = apply_setup(FTSSettings(), "authors")  # FTS has no broadcast: that choice is skipped
    assert f.gp_kernel == "authors" and not hasattr(f, "broadcast_maximization")
    land = objective_setup("landmine", "authors")
    assert land["scoring"] == "platt" and land["search_space"]["C"] == {"low": 1e-4, "high": 10.0, "log": False}
    land["scoring"] = "changed"  # a copy: the table is not mutated
    assert objective_setup("landmine", "authors")["scoring"] == "platt"
    assert objective_setup("synthetic", "authors") == {} and set(SETUPS) == {"engine", "paper", "modern", "authors"}
    with pytest.raises(ValueError, match="`setup` must be one of"):
        apply_setup(DPFTSDESettings(), "papers")


@pytest.mark.skipif(not DATA.is_file(), reason=f"landmine data not at {DATA}")
def test_both_setups_run_a_tiny_landmine_study(tmp_path):
    out = tmp_path / "study"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "landmine_setups.py"), "--quick", "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    res = json.loads((out / "results.json").read_text())
    assert {(r["setup"], r["method"]) for r in res["records"]} == {
        (s, m) for s in ("modern", "authors") for m in ("TS", "DP q=0.35 z=1")
    }
    rows = {(r["setup"], r["method"]): r for r in res["paired_final"]}
    assert rows[("modern", "TS")]["diff_to_ts"] == 0.0
    for (setup, method), r in rows.items():  # paired differences are per repetition: mean of (method - TS)
        rec = next(x for x in res["records"] if x["setup"] == setup and x["method"] == method)
        ts = next(x for x in res["records"] if x["setup"] == setup and x["method"] == "TS")
        d = [a[-1] - b[-1] for a, b in zip(rec["per_rep_curves"], ts["per_rep_curves"], strict=True)]
        assert r["diff_to_ts"] == pytest.approx(sum(d) / len(d), abs=1e-12)
    dp = next(x for x in res["records"] if x["method"] == "DP q=0.35 z=1")
    assert dp["epsilon_final"] > 0 and len(dp["noise_norm"]) == res["rounds"]
    assert (out / "landmine_setups.png").is_file()


TINY_BOTH_SETUPS = """
experiment: dp_fts_de
name: tiny-setups
seed: 1
objective: {type: gp_grid, num_groups: 1, agents_per_group: 4, grid_size: 60, perturb_first: true}
runs: {num_inits: 2}
privacy: {accountant: rdp-classic}
defaults: {num_iterations: 5, num_init: 3, num_features: 12, gp_refit_every: 5}
scenarios:
  - name: authors
    setup: authors
    methods:
      - {name: TS, algorithm: ts}
      - {name: DP, algorithm: fts_de, num_regions: 2, sample_rate: 0.5, noise_multiplier: 1.0, clip_norm: 5.0}
  - name: modern
    setup: modern
    methods:
      - {name: TS, algorithm: ts}
      - {name: DP, algorithm: fts_de, num_regions: 2, sample_rate: 0.5, noise_multiplier: 1.0, clip_norm: 5.0}
"""


def test_both_setups_run_end_to_end_from_yaml_without_data(tmp_path):
    # the landmine study above needs the data; this runs each preset through `fbo-torch run` anywhere
    from fbo_torch.cli import main

    cfg = tmp_path / "setups.yaml"
    cfg.write_text(TINY_BOTH_SETUPS)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-progress"]) == 0
    res = json.loads((out / "results.json").read_text())
    text = json.dumps(res)
    assert '"setup": "authors"' in text and '"setup": "modern"' in text
    resolved = (out / "config.resolved.yaml").read_text()
    assert "gp_kernel: authors" in resolved and "broadcast_maximization: per_agent" in resolved


def test_dp_regime_study_quick(tmp_path):
    out = tmp_path / "regime"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "dp_regime.py"), "--quick", "--threads", "1", "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    res = json.loads((out / "results.json").read_text())
    cells = {(r["cell_name"], r["method"]) for r in res["records"]}
    assert cells == {("base", "TS"), ("base", "DP-FTS-DE"), ("base", "FTS-DE"), ("z=2.0", "DP-FTS-DE"), ("z=2.0", "TS")}
    rows = {(r["setup"], r["method"]): r for r in res["paired_final"]}
    for (cell, method), r in rows.items():  # paired per repetition against the cell's TS
        rec = next(x for x in res["records"] if x["cell_name"] == cell and x["method"] == method)
        ts = next(x for x in res["records"] if x["cell_name"] == cell and x["method"] == "TS")
        d = [a[-1] - b[-1] for a, b in zip(rec["per_rep_curves"], ts["per_rep_curves"], strict=True)]
        assert r["diff_to_ts"] == pytest.approx(sum(d) / len(d), abs=1e-12)
    eps = {c: rows[(c, "DP-FTS-DE")]["epsilon_final"] for c in ("base", "z=2.0")}
    assert eps["z=2.0"] < eps["base"]  # more noise, less privacy loss at the same q, T, N
    assert rows[("base", "FTS-DE")]["epsilon_final"] is None
    assert (out / "dp_regime.png").is_file()


def test_fts_history_follows_the_scenario_setup():
    # the other agents' TS histories are built as the setup's own GP does it, unless history.gp_kernel says otherwise
    import torch

    from fbo_torch.federation.settings import HistorySettings
    from fbo_torch.models.batched_gp import GP_SPECS
    from fbo_torch.objectives.synthetic import GPSampleGridFederation
    from fbo_torch.optim.domain import Domain
    from fbo_torch.simulate.fts import FederationHistory

    assert HistorySettings().gp_kernel is None
    obj = GPSampleGridFederation(num_groups=1, agents_per_group=3, grid_size=40, seed=0)
    dom = Domain(obj.bounds, obj.candidates)
    authors = FederationHistory(obj, dom, t_n=4, mode="ts", num_init=3, gp_kernel=None, setup="authors")
    assert (authors.settings.gp_kernel, authors.settings.gp_restarts, authors.settings.gp_sample_features) == (
        "authors",
        SETUPS["authors"]["gp_restarts"],
        SETUPS["authors"]["gp_sample_features"],
    )
    assert authors.agents.gp_spec == GP_SPECS["authors"]
    override = FederationHistory(obj, dom, t_n=4, mode="ts", num_init=3, gp_kernel="botorch", setup="authors")
    assert (
        override.settings.gp_kernel == "botorch" and override.settings.gp_restarts == SETUPS["authors"]["gp_restarts"]
    )
    engine = FederationHistory(obj, dom, t_n=4, mode="ts", num_init=3, gp_kernel=None)  # the default setup
    assert engine.settings.gp_kernel == "fbo" and engine.settings.gp_restarts == 0
    paper = FederationHistory(obj, dom, t_n=4, mode="ts", num_init=3, gp_kernel=None, setup="paper")
    assert paper.settings.gp_kernel == "botorch" and paper.settings.own_acquisition == "ts"
    assert torch.isfinite(authors.train_Y).all() and authors.train_X.shape == (3, 4, 1)


TINY_FTS_BOTH_SETUPS = """
experiment: fts
name: tiny-fts-setups
seed: 2
objective: {type: gp_grid, num_groups: 1, agents_per_group: 4, grid_size: 60}
runs: {num_inits: 3}
history: {mode: ts, t_n: 5, num_init: 3}
defaults: {num_iterations: 3, num_init: 2, num_features: 12}
scenarios:
  - {name: authors, setup: authors, methods: [{name: TS, algorithm: ts}, {name: FTS, algorithm: fts}]}
  - {name: modern, setup: modern, methods: [{name: TS, algorithm: ts}, {name: FTS, algorithm: fts}]}
"""


def test_fts_two_setups_run_and_pair_per_run(tmp_path):
    # the FTS two-setup comparison end to end from YAML, then paired differences to TS per (target, init)
    from fbo_torch.cli import main

    cfg = tmp_path / "fts.yaml"
    cfg.write_text(TINY_FTS_BOTH_SETUPS)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-progress"]) == 0
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import paired_to_ts

    assert paired_to_ts.main([str(out / "results.json")]) == 0
    rows = {(r["setup"], r["method"]): r for r in json.loads((out / "paired.json").read_text())["paired"]}
    res = json.loads((out / "results.json").read_text())
    assert set(rows) == {(s, m) for s in ("authors", "modern") for m in ("TS", "FTS")}
    for sc in res["scenarios"]:
        curves = {m["name"]: m["runs"] for m in sc["methods"]}
        d = [a[-1] - b[-1] for a, b in zip(curves["FTS"], curves["TS"], strict=True)]
        targets = sc["methods"][0]["targets"]
        assert len(d) == len(targets) == 3 * len(set(targets))  # 3 initializations per target
        assert rows[(sc["name"], "FTS")]["diff_to_ts"] == pytest.approx(sum(d) / len(d), abs=1e-12)
        assert rows[(sc["name"], "TS")]["diff_to_ts"] == 0.0
    with pytest.raises(SystemExit):  # a DP experiment's results are not an FTS experiment's
        paired_to_ts.main([str(ROOT / "benchmarks" / "results" / "dp_fts_de_synthetic" / "results.json")])
