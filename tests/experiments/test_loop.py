"""A tiny FTS experiment from YAML, end to end, with the own-GP branch's acquisition set per method."""

import json
import math

from fbo_torch.experiments.config import load_config
from fbo_torch.experiments.loop import run_experiment

OWN_ACQUISITION = """
experiment: fts
name: tiny-own
objective: {type: gp_continuous, dim: 2, num_groups: 1, agents_per_group: 3, num_basis: 64, lengthscale: 0.2}
runs: {num_inits: 1}
history: {t_n: 4}
domain: {raw_samples: 64, num_restarts: 2, maxiter: 10}
defaults: {num_iterations: 3, num_features: 10, gp_refit_every: 0}
methods:
  - {name: TS, algorithm: ts, own_acquisition: ts}
  - {name: TS-LogEI, algorithm: ts, own_acquisition: logei}
  - {name: FTS-LogEI, algorithm: fts, communication: every-round, own_acquisition: logei}
  - {name: FTS-UCB, algorithm: fts, own_acquisition: ucb, ucb_beta: 1.0}
"""


def test_fts_experiment_with_own_acquisition_runs_end_to_end(tmp_path):
    cfg_path = tmp_path / "own.yaml"
    cfg_path.write_text(OWN_ACQUISITION)
    run_experiment(load_config(cfg_path), tmp_path / "out", progress=False, log=lambda _: None)
    methods = {
        m["name"]: m for m in json.loads((tmp_path / "out" / "results.json").read_text())["scenarios"][0]["methods"]
    }
    assert list(methods) == ["TS", "TS-LogEI", "FTS-LogEI", "FTS-UCB"]
    assert [methods[k]["settings"]["own_acquisition"] for k in methods] == ["ts", "logei", "logei", "ucb"]
    assert methods["FTS-UCB"]["settings"]["ucb_beta"] == 1.0
    for m in methods.values():
        loss = m["runs"][0]
        assert len(loss) == 4 and all(math.isfinite(x) for x in loss)
        assert all(b <= a for a, b in zip(loss, loss[1:], strict=False))  # the best so far never gets worse
    # every method starts from the same initial point; LogEI then queries elsewhere than the Thompson sample
    ts, logei = methods["TS"]["queries"][0], methods["TS-LogEI"]["queries"][0]
    assert ts[0] == logei[0] and ts[1:] != logei[1:]
