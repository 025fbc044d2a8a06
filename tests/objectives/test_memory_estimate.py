"""Objectives estimate their own memory: a setting that cannot fit is refused before anything is allocated,
naming its key (the YAML run and the Flower run config alike)."""

import json

import pytest

from fbo_torch.cli import main
from fbo_torch.objectives import build_objective
from fbo_torch.objectives.function_families import FunctionFamilyFederation
from fbo_torch.objectives.synthetic import GPSampleContinuousFederation, GPSampleGridFederation
from fbo_torch.utils.resources import MemoryLimitError

YAML = """
experiment: dp_fts_de
name: big
objective: {type: gp_grid, %s}
runs: {num_inits: 1}
defaults: {num_iterations: 2, num_init: 2, num_features: 8}
methods:
  - {name: TS, algorithm: ts}
"""


@pytest.fixture(autouse=True)
def _one_gib(monkeypatch):
    monkeypatch.setenv("FBO_MEMORY_LIMIT", "1GiB")  # the same machine everywhere


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ("grid_size: 200000", "grid_size"),
        ("num_groups: 100000", "num_groups"),
        ("agents_per_group: 2000000", "agents_per_group"),
    ],
)
def test_an_objective_that_cannot_fit_is_refused_up_front_naming_its_key(tmp_path, capsys, kwargs, key):
    """Before: `grid_size: 2e8`-sized grids or `num_groups: 1e5` were built until the operating system refused
    the allocation (~32 GB / ~30 GB tried)."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(YAML % kwargs)
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "--no-progress"]) != 0
    err = capsys.readouterr().err.strip()
    assert f"objective (gp_grid): `{key}`: the 'gp_grid' objective needs about" in err and len(err.splitlines()) == 1
    assert "more than the 1.0 GiB" in err


def test_the_estimate_follows_the_arrays_and_passes_what_fits():
    small = GPSampleGridFederation.memory_estimate(grid_size=100, num_groups=2, agents_per_group=3)
    assert small == {"grid_size": 8.0 * 3 * 100**2, "agents_per_group": 8.0 * 5 * 6 * 100}
    assert build_objective({"type": "gp_grid", "grid_size": 100, "agents_per_group": 3}).num_agents == 3
    assert GPSampleGridFederation.memory_estimate(grid_size="many") == {"grid_size": 0.0, "agents_per_group": 0.0}
    assert max(GPSampleContinuousFederation.memory_estimate(num_basis=10**9).values()) > 2**40
    with pytest.raises(MemoryLimitError, match="`num_agents`"):
        build_objective({"type": "function_families", "num_agents": 10**8})
    assert set(FunctionFamilyFederation.memory_estimate(dim=10**9)) == {"dim"}


def test_a_flower_run_config_naming_a_huge_objective_is_refused_by_every_party():
    pytest.importorskip("flwr")
    from fbo_torch.flower.config import FlowerRunConfig

    cfg = FlowerRunConfig.from_run_config(
        {"num-agents": 2, "objective": json.dumps({"type": "gp_grid", "grid_size": 10**6})}
    )
    with pytest.raises(MemoryLimitError, match="`grid_size`"):
        cfg.build_objective()
