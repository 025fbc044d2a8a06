"""Checkpoints are data, never code: a planted checkpoint cannot run anything when a run is resumed."""

import os
from fractions import Fraction

import pytest
import torch

from fbo_torch.cli import main
from fbo_torch.experiments.checkpoints import CHECKPOINT_VERSION, Checkpoints
from fbo_torch.experiments.outdir import ResumeError

TINY = """
experiment: dp_fts_de
name: tiny
seed: 3
checkpoint_every: 1
objective: {type: gp_grid, num_groups: 1, agents_per_group: 3, grid_size: 40}
runs: {num_inits: 1}
defaults: {num_iterations: 2, num_init: 2, num_features: 8, gp_refit_every: 0}
methods:
  - {name: TS, algorithm: ts}
"""


class _Payload:
    """What an attacker pickles: unpickling it calls ``os.mkdir(marker)`` (any callable would do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_a_planted_checkpoint_never_runs_code_on_resume(tmp_path, capsys):
    """Before: `Checkpoints.load` called `torch.load(weights_only=False)` on a planted `--out/checkpoints/*.pt`
    before checking its fingerprint: `fbo-torch run --resume` ran its code, then said "fingerprint differs"."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(TINY)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-progress"]) == 0
    marker = tmp_path / "the-attackers-code-ran"
    planted = out / "checkpoints" / "scenario0_method0.pt"
    torch.save({"version": CHECKPOINT_VERSION, "fingerprint": "x", "runner": _Payload(marker)}, planted)
    capsys.readouterr()
    code = main(["run", str(cfg), "--out", str(out), "--resume", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert not marker.exists()
    assert code != 0 and f"checkpoint {planted} is unreadable" in err and len(err.splitlines()) == 1


def test_a_checkpoint_that_would_not_load_is_refused_when_written(tmp_path):
    ckpt = Checkpoints(tmp_path, "fingerprint", resume=False)
    with pytest.raises(TypeError, match="plain containers"):
        ckpt.save(tmp_path / "a.pt", {"runner": {"rate": Fraction(1, 2)}})
    assert not (tmp_path / "a.pt").exists()
    ckpt.save(tmp_path / "b.pt", {"runner": {"x": torch.ones(2), "n": 3, "names": ["a"], "pair": (1.0, None)}})
    loaded = Checkpoints(tmp_path, "fingerprint", resume=True).load(tmp_path / "b.pt")
    assert loaded is not None and loaded["runner"]["n"] == 3 and torch.equal(loaded["runner"]["x"], torch.ones(2))
    with pytest.raises(ResumeError, match="different configuration"):
        Checkpoints(tmp_path, "another", resume=True).load(tmp_path / "b.pt")
