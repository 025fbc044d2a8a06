"""Setups (ours and the authors'): what each sets, and each runs end to end on a tiny landmine study."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fbo_torch.runners.dp_fts_de import DPFTSDESettings
from fbo_torch.runners.fts import FTSSettings
from fbo_torch.runners.presets import SETUPS, apply_setup, objective_setup

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "LandmineData.mat"


def test_authors_setup_sets_the_authors_choices_and_overrides_win():
    s = apply_setup(DPFTSDESettings(), "authors")
    assert (s.gp_kernel, s.gp_restarts, s.gp_refit_every, s.gp_sample_features) == ("authors", 10, 5, 100)
    assert (s.repeated_query, s.broadcast_maximization) == ("random", "per_agent")
    assert apply_setup(DPFTSDESettings(), "modern") == DPFTSDESettings()
    assert apply_setup(DPFTSDESettings(), "authors", {"gp_restarts": 2}).gp_restarts == 2
    f = apply_setup(FTSSettings(), "authors")  # FTS has no broadcast: that choice is skipped
    assert f.gp_kernel == "authors" and not hasattr(f, "broadcast_maximization")
    land = objective_setup("landmine", "authors")
    assert land["scoring"] == "platt" and land["search_space"]["C"] == {"low": 1e-4, "high": 10.0, "log": False}
    land["scoring"] = "changed"  # a copy: the table is not mutated
    assert objective_setup("landmine", "authors")["scoring"] == "platt"
    assert objective_setup("synthetic", "authors") == {} and set(SETUPS) == {"modern", "authors"}
    with pytest.raises(ValueError, match="`setup` must be one of"):
        apply_setup(DPFTSDESettings(), "paper")


@pytest.mark.skipif(not DATA.is_file(), reason=f"landmine data not at {DATA}")
def test_both_setups_run_a_tiny_landmine_study(tmp_path):
    out = tmp_path / "study"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "landmine_setups.py"), "--quick", "--out", str(out)],
                   check=True, capture_output=True, timeout=600)
    res = json.loads((out / "results.json").read_text())
    assert {(r["setup"], r["method"]) for r in res["records"]} == {
        (s, m) for s in ("modern", "authors") for m in ("TS", "DP q=0.35 z=1")}
    rows = {(r["setup"], r["method"]): r for r in res["paired_final"]}
    assert rows[("modern", "TS")]["diff_to_ts"] == 0.0
    for (setup, method), r in rows.items():  # paired differences are per repetition: mean of (method - TS)
        rec = next(x for x in res["records"] if x["setup"] == setup and x["method"] == method)
        ts = next(x for x in res["records"] if x["setup"] == setup and x["method"] == "TS")
        d = [a[-1] - b[-1] for a, b in zip(rec["per_rep_curves"], ts["per_rep_curves"])]
        assert r["diff_to_ts"] == pytest.approx(sum(d) / len(d), abs=1e-12)
    dp = next(x for x in res["records"] if x["method"] == "DP q=0.35 z=1")
    assert dp["epsilon_final"] > 0 and len(dp["noise_norm"]) == res["rounds"]
    assert (out / "landmine_setups.png").is_file()
