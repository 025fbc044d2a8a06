"""YAML runs of agents that optimize together (``history.mode: together``) with the local engine
and the peer prior: end to end through the CLI, and the refusals naming their keys."""

import json

import pytest

from fbo_torch.cli import main

TOGETHER = """
experiment: fts
name: tiny-together
seed: 1
objective: {type: tetci2019, dim: 2}
runs: {num_inits: 1}
history: {mode: together}
defaults: {num_init: 4, num_iterations: 3, gp_kernel: fbo, gp_warp: auto, own_acquisition: logei,
           communication: every-round, num_features: 20, rff_lengthscale: 0.2, message_outputs: warped}
methods:
  - {name: local, algorithm: ts}
  - {name: peer prior learned, algorithm: peer_prior, agent_weights: learned}
"""


def test_a_together_run_records_every_agent_of_the_federation(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(TOGETHER)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-progress", "--quiet"]) == 0
    res = json.loads((out / "results.json").read_text())
    methods = {m["name"]: m for m in res["scenarios"][0]["methods"]}
    assert set(methods) == {"local", "peer prior learned"}
    for m in methods.values():
        assert sorted(set(m["targets"])) == list(range(10))  # tetci2019's ten agents, each a target
        assert all(len(run) == 4 for run in m["runs"])  # the initial best, then 3 iterations
        assert all(b <= a + 1e-12 for run in m["runs"] for a, b in zip(run, run[1:], strict=False))  # regret


@pytest.mark.parametrize("signal", ["scores", "ranks"])
def test_fairness_and_reciprocity_on_scores_or_ranks_run_from_yaml(tmp_path, signal):
    cfg = tmp_path / "cfg.yaml"
    fair = f"{{name: fair, algorithm: fts, fairness: 1.0, reciprocity: true, reciprocity_signal: {signal}}}"
    cfg.write_text(TOGETHER.replace("{name: peer prior learned, algorithm: peer_prior, agent_weights: learned}", fair))
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-progress", "--quiet"]) == 0
    res = json.loads((out / "results.json").read_text())
    methods = {m["name"]: m for m in res["scenarios"][0]["methods"]}
    assert sorted(set(methods["fair"]["targets"])) == list(range(10))
    assert all(len(run) == 4 for run in methods["fair"]["runs"])


@pytest.mark.parametrize(
    "old,new,says",
    [
        (
            "  - {name: local, algorithm: ts}\n",
            "  - {name: R, algorithm: rgpe}\n",
            "methods[0] ('R'): algorithm 'rgpe' does not run with `history.mode: together`",
        ),
        ("communication: every-round", "communication: one-shot", "set `communication: every-round`"),
        (
            "runs: {num_inits: 1}",
            "runs: {num_inits: 1, targets: [0, 1]}",
            "runs.targets must be all 10 agents (leave it out), got [0, 1]",
        ),
    ],
    ids=["rgpe", "one-shot", "targets"],
)
def test_what_together_cannot_run_is_refused_naming_the_key(tmp_path, capsys, old, new, says):
    cfg = tmp_path / "cfg.yaml"
    assert old in TOGETHER
    cfg.write_text(TOGETHER.replace(old, new))
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {cfg}") and says in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
