"""The memory estimate of a method, term by term, and a YAML run refused before it starts, naming the key."""

from fbo_torch.cli import main
from fbo_torch.experiments.resources import method_memory
from fbo_torch.federation.settings import FTSSettings


def test_corroborated_weights_cost_every_agents_peers_values_on_the_reference_points():
    B, A, C, M = 6, 20, 4096, 50
    learned = method_memory(
        FTSSettings(algorithm="fts", agent_weights="learned", num_features=M), B, 1, 0, 2, 100, None, A, C
    )
    corroborated = method_memory(
        FTSSettings(algorithm="fts", agent_weights="corroborated", num_features=M), B, 1, 0, 2, 100, None, A, C
    )
    assert learned["agent_weights"] == 0.0
    # values, their sorted copy and the quantiles (B x A x C float64), and phi at the points (C x M)
    assert corroborated["agent_weights"] == 8 * (3 * B * A * C + C * M)
    assert {k: v for k, v in corroborated.items() if k != "agent_weights"} == {
        k: v for k, v in learned.items() if k != "agent_weights"
    }


CONFIG = """
experiment: fts
name: many-peers
objective: {type: gp_grid, num_groups: 1, agents_per_group: 60, grid_size: 2000}
runs: {num_inits: 1}
defaults: {num_iterations: 2, num_features: 10, gp_refit_every: 0}
methods:
  - {name: FTS, algorithm: fts, agent_weights: corroborated}
"""


def test_a_run_whose_corroborated_weights_do_not_fit_is_refused_before_it_starts_naming_the_key(
    tmp_path, capsys, monkeypatch
):
    # one target's run and 60 agents, each weighing 60 peers' values on the 2000 grid points (x 3 float64):
    # about 176 MB; every other term of this run is below 5 MB
    monkeypatch.setenv("FBO_MEMORY_LIMIT", "100MiB")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CONFIG)
    code = main(["run", str(cfg), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "`agent_weights: corroborated`" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out" / "results.json").exists()
