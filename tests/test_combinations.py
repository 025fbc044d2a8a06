r"""Every combination of an FTS method's settings runs, or is refused before anything runs.

The axes: algorithm × own acquisition × communication × history mode (none, random,
ts, together) × agent weights × peer trust × output warp. Each combination goes
through both entry points:

* **YAML**: the experiment file is parsed and its scenarios prepared
  (:func:`~fbo_torch.experiments.loop.prepare_scenarios`), which is what ``fbo-torch run``
  does before it creates the output folder. A refusal must be one line naming a key.
* **Python**: the settings dataclass and the runner's constructor; a refusal is a
  ``ValueError`` raised before the first iteration.

The two must agree. The combinations both accept are then run for two iterations
on a tiny federation: every combination of every pair of axis values is run
(a pairwise covering set, built greedily; about 40 runs), and with
``FBO_FULL_MATRIX=1`` every accepted combination is.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest
import torch
import yaml

from fbo_torch.experiments import loop
from fbo_torch.experiments.config import ConfigError, parse_config
from fbo_torch.federation.settings import FTSSettings
from fbo_torch.methods import method_names
from fbo_torch.objectives.synthetic import GPSampleContinuousFederation
from fbo_torch.optim.domain import Domain
from fbo_torch.simulate.fts import FederationHistory, FTSRunner

AXES: dict[str, tuple[Any, ...]] = {
    "algorithm": tuple(sorted(method_names("fts"))),
    "own_acquisition": ("ts", "logei", "ucb"),
    "communication": ("one-shot", "every-round"),
    "history": ("none", "random", "ts", "together"),
    "agent_weights": ("uniform", "learned"),
    "peer_trust": (False, True),
    "gp_warp": ("none", "auto"),
}
OBJECTIVE = {"type": "gp_continuous", "dim": 2, "num_groups": 1, "agents_per_group": 3, "seed": 0}
TINY = {"num_init": 3, "num_iterations": 2, "num_features": 16, "rff_lengthscale": 0.3, "gp_fit_maxiter": 10}
DOMAIN = {"raw_samples": 32, "num_restarts": 2, "raw_samples_rff": 32, "num_restarts_rff": 2}


def combinations() -> list[dict[str, Any]]:
    return [dict(zip(AXES, values, strict=True)) for values in itertools.product(*AXES.values())]


def method_keys(combo: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in combo.items() if k != "history"}


def yaml_config(combo: dict[str, Any]) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "experiment": "fts",
        "seed": 0,
        "objective": dict(OBJECTIVE),
        "runs": {"num_inits": 1, **({"targets": [0]} if combo["history"] != "together" else {})},
        "domain": dict(DOMAIN),
        "defaults": dict(TINY),
        "methods": [{"name": "m", **method_keys(combo)}],
    }
    if combo["history"] != "none":
        cfg["history"] = {"mode": combo["history"], "t_n": 5, "num_init": 3}
    return cfg


_SHARED: dict[str, Any] = {}


def shared_objective() -> GPSampleContinuousFederation:
    """One tiny federation for every combination (it is read, never changed, by the checks and runs)."""
    if "objective" not in _SHARED:
        _SHARED["objective"] = GPSampleContinuousFederation(**{k: v for k, v in OBJECTIVE.items() if k != "type"})
    return _SHARED["objective"]


def shared_history(mode: str, domain: Domain) -> FederationHistory:
    if mode not in _SHARED:
        _SHARED[mode] = FederationHistory(shared_objective(), domain, t_n=5, mode=mode, num_init=3, seed=17)
    return _SHARED[mode]


def yaml_verdict(combo: dict[str, Any]) -> str | None:
    """``None`` when the YAML path accepts the combination, else its one-line refusal (the scenario's
    objective is the shared one: building it is not what is checked here)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "build_objective", lambda spec, device="cpu": shared_objective())
        try:
            cfg = parse_config(yaml.safe_load(yaml.safe_dump(yaml_config(combo))), source="combo.yaml")
            loop.prepare_scenarios(cfg, "cpu", log=lambda _: None)
        except ConfigError as err:
            return str(err)
    return None


def python_runner(combo: dict[str, Any]) -> FTSRunner:
    objective = shared_objective()
    domain = Domain(objective.bounds, objective.candidates, **DOMAIN)
    settings = FTSSettings(**TINY, **method_keys(combo))
    mode = combo["history"]
    if mode == "together":
        return FTSRunner(objective, settings, torch.arange(3), 1, domain=domain, together=True)
    history = None if mode == "none" else shared_history(mode, domain)
    return FTSRunner(objective, settings, torch.tensor([0]), 1, history=history, domain=domain)


def python_verdict(combo: dict[str, Any]) -> tuple[str | None, FTSRunner | None]:
    try:
        return None, python_runner(combo)
    except ValueError as err:
        return str(err), None


def pairwise(accepted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    r"""A small subset of ``accepted`` covering every pair of (axis, value) the accepted set has (greedy)."""

    def pairs(c: dict[str, Any]) -> set[tuple[tuple[str, Any], tuple[str, Any]]]:
        items = sorted(c.items(), key=lambda kv: kv[0])
        return {(a, b) for a, b in itertools.combinations(items, 2)}

    todo = set().union(*(pairs(c) for c in accepted))
    chosen = []
    while todo:
        best = max(accepted, key=lambda c: len(pairs(c) & todo))
        chosen.append(best)
        todo -= pairs(best)
    return chosen


_VERDICTS: dict[str, list] = {}


def verdicts() -> list[tuple[dict[str, Any], str | None, str | None]]:
    if "all" not in _VERDICTS:
        out = []
        for combo in combinations():
            out.append((combo, yaml_verdict(combo), python_verdict(combo)[0]))
        _VERDICTS["all"] = out
    return _VERDICTS["all"]


def test_yaml_and_python_accept_and_refuse_the_same_combinations():
    disagree = [(c, y, p) for c, y, p in verdicts() if (y is None) != (p is None)]
    assert not disagree, f"{len(disagree)} combinations differ between YAML and Python; first: {disagree[0]}"
    accepted = [c for c, y, _ in verdicts() if y is None]
    # every algorithm runs in some combination of every other axis value it may take
    assert {c["algorithm"] for c in accepted} == set(AXES["algorithm"])
    assert {c["history"] for c in accepted} == set(AXES["history"])


def test_a_refusal_is_one_line_naming_a_key():
    keys = (*AXES, "history.mode", "methods[0]", "`")
    for combo, y, p in verdicts():
        for text in (y, p):
            if text is None:
                continue
            assert "\n" not in text and "Traceback" not in text, (combo, text)
            assert any(k in text for k in keys), (combo, text)


def selected() -> list[dict[str, Any]]:
    accepted = [c for c, y, _ in verdicts() if y is None]
    return accepted if os.environ.get("FBO_FULL_MATRIX") == "1" else pairwise(accepted)


def test_every_selected_accepted_combination_runs():
    torch.set_num_threads(1)
    for combo in selected():
        runner = python_runner(combo)
        result = runner.run()
        assert result.loss.shape[-1] == 3, combo
        assert bool(torch.isfinite(result.loss).all()), combo
