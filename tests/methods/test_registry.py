"""The algorithm registry: look-ups, errors, and an algorithm added from one module (this file)."""

import dataclasses

import pytest
import torch

from fbo_torch.federation.settings import DPFTSDESettings, FTSSettings
from fbo_torch.methods import METHODS, Method, get_method, method_names, register_method, unregister_method
from fbo_torch.methods.ts import StandardTS
from fbo_torch.objectives.synthetic import GPSampleContinuousFederation
from fbo_torch.simulate.fts import FTSRunner


def test_every_builtin_is_registered_under_its_kinds():
    assert set(method_names("fts")) >= {"ts", "fts", "peer_prior", "rgpe", "taf", "transfer"}
    assert set(method_names("dp_fts_de")) == {"ts", "fts_de"}
    assert get_method("ts") is StandardTS
    assert get_method("dp-fts-de", "dp_fts_de").name == "fts_de"  # Flower's name for it


@pytest.mark.parametrize(
    "name,kind,says",
    [
        ("fst", "fts", r"`algorithm` must be one of .* got 'fst' \(did you mean 'fts'\?\)"),
        ("fts_de", "fts", r"in an `experiment: fts`, got 'fts_de'"),
        (3, None, "got 3"),
    ],
)
def test_an_unknown_algorithm_names_the_key_and_the_choices(name, kind, says):
    with pytest.raises(ValueError, match=says):
        get_method(name, kind)
    if kind == "fts":
        with pytest.raises(ValueError, match=says):
            FTSSettings(algorithm=name)


def test_registration_refuses_what_is_not_an_algorithm():
    with pytest.raises(ValueError, match="non-empty string"):
        register_method(type("NoName", (Method,), {}))
    with pytest.raises(ValueError, match="subset of"):
        register_method(type("BadKind", (Method,), {"name": "bad", "kinds": ("nope",)}))
    with pytest.raises(ValueError, match="already registered"):
        register_method(type("Clash", (Method,), {"name": "fts"}))
    with pytest.raises(ValueError, match="Method subclass"):
        register_method(object)  # type: ignore[arg-type]


def test_each_algorithm_refuses_its_own_combinations_with_one_line():
    with pytest.raises(ValueError, match="does not work with algorithm 'peer_prior'"):
        FTSSettings(algorithm="peer_prior", own_acquisition="ts")
    with pytest.raises(ValueError, match="`peer_trust` scales FTS"):
        FTSSettings(algorithm="peer_prior", peer_trust=True)
    with pytest.raises(ValueError, match="`channels` must be a non-empty list"):
        FTSSettings(algorithm="transfer", channels=["optima", "gossip"])
    with pytest.raises(ValueError, match=r"algorithm 'rgpe' does not run with `history.mode: together`"):
        get_method("rgpe").check_history(FTSSettings(algorithm="rgpe"), "together")


def test_what_a_message_costs_comes_from_the_algorithm():
    s = FTSSettings(algorithm="fts", num_features=50)
    assert s.method.parameters_per_agent(s, 3) == 50
    assert get_method("rgpe").parameters_per_agent(dataclasses.replace(s, algorithm="rgpe"), 3) == 50 + 2500
    assert get_method("taf").parameters_per_agent(dataclasses.replace(s, algorithm="taf"), 3) == 50 + 2500 + 1
    t = FTSSettings(algorithm="transfer", num_features=50, gp_kernel="fbo")
    assert t.method.parameters_per_agent(t, 3) == 50 + 3 + 3  # draw, incumbent, ARD lengthscales
    assert get_method("ts").parameters_per_agent(dataclasses.replace(s, algorithm="ts"), 3) == 0
    assert not DPFTSDESettings(algorithm="ts").is_private
    assert DPFTSDESettings(noise_multiplier=1.0, clip_norm=1.0).is_private


class Greedy(Method):
    """A new algorithm, defined in this module only: every agent queries the point halfway between
    its incumbent and the centre of the unit box."""

    name = "greedy_test"

    def step(self, t):
        r = self.runner
        X = 0.5 * (r.agents.incumbents() + 0.5)  # halfway to the centre of the unit box
        return X, torch.full((r.num_runs,), -1, dtype=torch.long)


def test_a_new_algorithm_is_one_class_and_its_registration():
    register_method(Greedy)
    try:
        assert "greedy_test" in method_names("fts")
        objective = GPSampleContinuousFederation(dim=2, num_groups=1, agents_per_group=3, seed=0)
        settings = FTSSettings(algorithm="greedy_test", num_init=2, num_iterations=3)
        runner = FTSRunner(objective, settings, torch.tensor([0, 1]), 2, seed=0)
        result = runner.run()
        assert result.loss.shape == (4, 4) and bool((result.sources == -1).all())
        assert result.parameters_per_agent == 0
        # the queries are the algorithm's: halfway between the incumbent and the centre
        X = runner.X
        first = X[:, 2]
        y0 = runner.Y[:, :2].squeeze(-1)
        inc = X[torch.arange(4), y0.argmax(-1)]
        torch.testing.assert_close(first, 0.5 * (inc + 0.5))
    finally:
        unregister_method("greedy_test")
    assert "greedy_test" not in METHODS


def test_a_deployment_takes_its_method_from_the_registry():
    """A Flower run config's ``method`` choices are the registered algorithms of DP-FTS-DE's kind,
    by their run-config spelling: an algorithm registered for that kind is offered without an edit
    to the Flower package, and one of another kind is refused naming the key."""
    from fbo_torch.flower.config import FlowerRunConfig, deployment_methods

    assert sorted(deployment_methods()) == ["dp-fts-de", "ts"]
    with pytest.raises(ValueError, match=r"`method` must be one of \['ts', 'dp-fts-de'\], got 'fts'"):
        FlowerRunConfig(method="fts")
    plugin = type("Plugin", (Method,), {"name": "plugin_test", "kinds": ("dp_fts_de",), "aliases": ("plugin-test",)})
    register_method(plugin)
    try:
        assert "plugin-test" in deployment_methods()
    finally:
        unregister_method("plugin_test")
    assert "plugin-test" not in deployment_methods()
