"""FTS as an Ax generation step (fbo_torch.integrations.ax), with real Ax."""

from __future__ import annotations

import importlib.util
import logging
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

pytest.importorskip("ax")

from ax.api.client import Client
from ax.api.configs import ChoiceParameterConfig, RangeParameterConfig
from ax.core.data import Data
from ax.core.experiment import Experiment
from ax.core.objective import Objective
from ax.core.optimization_config import OptimizationConfig
from ax.core.parameter import FixedParameter, ParameterType, RangeParameter
from ax.core.search_space import SearchSpace
from ax.utils.common.logger import set_stderr_log_level

from fbo_torch import RandomFourierFeatures
from fbo_torch.integrations.ax import (
    AxFederation,
    UnitCube,
    agent_message,
    objective_data,
)
from fbo_torch.protocol import AgentMessage

ROOT = Path(__file__).resolve().parents[2]
set_stderr_log_level(logging.WARNING)


def _client(bounds=((0.0, 1.0),), objective="-f", seed=0, scalings=None) -> Client:
    scalings = scalings or [None] * len(bounds)
    client = Client(random_seed=seed)
    client.configure_experiment(
        parameters=[
            RangeParameterConfig(name=f"x{i}", parameter_type="float", bounds=b, scaling=sc)
            for i, (b, sc) in enumerate(zip(bounds, scalings, strict=True))
        ]
    )
    client.configure_optimization(objective=objective)
    return client


def _attach(client: Client, points, f) -> None:
    """Observations of ``f`` at ``points`` (each a tuple of parameter values)."""
    for x in points:
        params = {f"x{i}": float(v) for i, v in enumerate(x)}
        index = client.attach_trial(params)
        client.complete_trial(index, raw_data={"f": f(params)})


def _message(features: RandomFourierFeatures, agent_id: int, seed: int) -> AgentMessage:
    g = torch.Generator().manual_seed(seed)
    omega = torch.randn(features.num_features, generator=g, dtype=torch.float64)
    return AgentMessage(omega=omega, agent_id=agent_id, num_observations=3, fingerprint=features.fingerprint)


def _next(client: Client) -> tuple[int, dict]:
    ((index, params),) = client.get_next_trials(max_trials=1).items()
    return index, params


def test_example_runs_end_to_end():
    spec = importlib.util.spec_from_file_location("ax_federation_example", ROOT / "examples" / "ax_federation.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    best = example.main(num_agents=2, num_initial=2, num_rounds=2, num_features=50, baseline=False)
    assert list(best) == ["FTS"] and len(best["FTS"]) == 2
    # the shifted mixed Branin's minimum is at least Branin's (a minimizer stays inside the box)
    assert all(math.isfinite(b) and b >= example.BRANIN_MIN - 1e-6 for b in best["FTS"])


def test_sobol_then_fts_trials_lie_in_the_search_space():
    features = RandomFourierFeatures(dim=2, num_features=50, lengthscale=0.3, seed=1)
    federation = AxFederation(features, p_t=0.5, num_restarts=2, raw_samples=64)
    clients = [_client(((1e-3, 10.0), (-2.0, 3.0)), seed=n, scalings=("log", "linear")) for n in range(2)]
    nodes = [federation.add_agent(c, num_initial_trials=2) for c in clients]
    for round in range(4):
        if round >= 2:
            federation.exchange()
        for client in clients:
            index, params = _next(client)
            assert 1e-3 <= params["x0"] <= 10.0 and -2.0 <= params["x1"] <= 3.0
            client.complete_trial(index, raw_data={"f": (params["x0"] - 1) ** 2 + params["x1"] ** 2})
    # 2 Sobol trials, then every trial came from the FTS node
    assert [len(n.history) for n in nodes] == [2, 2]
    assert all(s.num_messages == 1 for n in nodes for s in n.history)


def test_unit_cube_maps_log_and_linear_parameters_and_passes_fixed_ones():
    space = SearchSpace(
        parameters=[
            RangeParameter("lr", ParameterType.FLOAT, 1e-4, 1e-1, log_scale=True),
            RangeParameter("m", ParameterType.FLOAT, -1.0, 3.0),
            FixedParameter("tag", ParameterType.STRING, "a"),
        ]
    )
    cube = UnitCube.from_search_space(space)
    assert cube.names == ("lr", "m") and cube.dim == 2
    X = cube.to_unit([{"lr": 1e-4, "m": -1.0}, {"lr": 1e-1, "m": 3.0}, {"lr": 10**-2.5, "m": 1.0}])
    torch.testing.assert_close(X, torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.5, 0.5]], dtype=torch.float64))
    back = cube.from_unit(torch.tensor([0.5, 0.25], dtype=torch.float64))
    assert back["tag"] == "a" and back["m"] == pytest.approx(0.0) and back["lr"] == pytest.approx(10**-2.5)
    space.check_membership(cube.from_unit(torch.tensor([1.2, -0.1], dtype=torch.float64)), raise_error=True)


def test_unit_cube_relaxes_integers_and_choices_and_rounds_them_back():
    """Integers and ordered choices: one coordinate, each value an equal cell; unordered choices: one-hot,
    the largest coordinate wins; log-scaled integers by their logarithm. Every point maps to a valid arm."""
    from ax.core.parameter import ChoiceParameter

    space = SearchSpace(
        parameters=[
            RangeParameter("n", ParameterType.INT, 0, 3),
            RangeParameter("width", ParameterType.INT, 1, 64, log_scale=True),
            ChoiceParameter("act", ParameterType.STRING, ["relu", "tanh", "gelu"], is_ordered=False, sort_values=False),
            ChoiceParameter("lr", ParameterType.FLOAT, [0.01, 0.1, 1.0], is_ordered=True),
            FixedParameter("tag", ParameterType.STRING, "a"),
        ]
    )
    cube = UnitCube.from_search_space(space)
    assert cube.names == ("n", "width", "act=relu", "act=tanh", "act=gelu", "lr") and cube.dim == 6
    X = cube.to_unit([{"n": 0, "width": 1, "act": "tanh", "lr": 0.01}, {"n": 3, "width": 64, "act": "gelu", "lr": 1.0}])
    # integers and ordered choices at the centres of their cells; the choice one-hot
    torch.testing.assert_close(X[:, 0], torch.tensor([0.125, 0.875], dtype=torch.float64))
    torch.testing.assert_close(X[:, 2:5], torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64))
    torch.testing.assert_close(X[:, 5], torch.tensor([1 / 6, 5 / 6], dtype=torch.float64))
    for row, arm in zip(
        X,
        [{"n": 0, "width": 1, "act": "tanh", "lr": 0.01}, {"n": 3, "width": 64, "act": "gelu", "lr": 1.0}],
        strict=True,
    ):
        assert cube.from_unit(row) == {**arm, "tag": "a"}  # round trip
    # every cell of n is a quarter of [0, 1]; any point of the relaxed cube is a member of the search space
    assert [
        cube.from_unit(torch.tensor([u, 0.5, 0.2, 0.3, 0.1, 0.5], dtype=torch.float64))["n"]
        for u in (0.0, 0.24, 0.26, 0.74, 0.76, 1.0)
    ] == [0, 0, 1, 2, 3, 3]
    g = torch.Generator().manual_seed(0)
    for u in torch.rand(200, 6, generator=g, dtype=torch.float64):
        arm = cube.from_unit(u)
        space.check_membership(arm, raise_error=True)
        assert isinstance(arm["n"], int) and isinstance(arm["width"], int)
        assert arm["act"] == ["relu", "tanh", "gelu"][int(u[2:5].argmax())]


def test_a_mixed_space_federation_generates_valid_trials_that_use_messages():
    features = RandomFourierFeatures(dim=5, num_features=50, lengthscale=0.3, seed=1)  # x, k, c one-hot (3)
    federation = AxFederation(features, p_t=0.0, num_restarts=2, raw_samples=64)
    clients = []
    for n in range(2):
        client = Client(random_seed=n)
        client.configure_experiment(
            parameters=[
                RangeParameterConfig(name="x", parameter_type="float", bounds=(-1.0, 1.0)),
                RangeParameterConfig(name="k", parameter_type="int", bounds=(1, 5)),
                ChoiceParameterConfig(name="c", parameter_type="str", values=["u", "v", "w"], is_ordered=False),
            ]
        )
        client.configure_optimization(objective="-f")
        federation.add_agent(client, num_initial_trials=2)
        clients.append(client)

    def f(p):
        return p["x"] ** 2 + (p["k"] - 3) ** 2 + (p["c"] != "u")

    for round in range(4):
        if round >= 2:
            federation.exchange()
        for client in clients:
            index, params = _next(client)
            assert -1 <= params["x"] <= 1 and params["k"] in range(1, 6) and params["c"] in ("u", "v", "w")
            client.complete_trial(index, raw_data={"f": f(params)})
    assert all(step.source != "own" for node in federation.agents for step in node.history)  # p_t = 0


def test_the_federation_builds_the_map_with_the_search_spaces_dimension():
    """Before: the user worked out the map's `dim` of one-hot choices by hand (here 1 + 1 + 3 = 5)."""
    federation = AxFederation(num_features=40, lengthscale=0.3, seed=2, num_restarts=2, raw_samples=32)
    assert federation.features is None
    mixed = [
        RangeParameterConfig(name="x", parameter_type="float", bounds=(-1.0, 1.0)),
        RangeParameterConfig(name="k", parameter_type="int", bounds=(1, 5)),
        ChoiceParameterConfig(name="c", parameter_type="str", values=["u", "v", "w"], is_ordered=False),
    ]
    client = Client(random_seed=0)
    client.configure_experiment(parameters=mixed)
    client.configure_optimization(objective="-f")
    federation.add_agent(client, num_initial_trials=1)
    expected = RandomFourierFeatures(dim=5, num_features=40, lengthscale=0.3, seed=2)
    assert federation.features is not None and federation.features.fingerprint == expected.fingerprint
    # every later agent shares that map, so its search space must have the same coordinates
    other = _client(bounds=((0.0, 1.0),) * 2, seed=1)
    with pytest.raises(ValueError, match=r"maps 5-dimensional inputs but the experiment's search space has 2"):
        federation.add_agent(other)
    with pytest.raises(ValueError, match="has no experiment"):
        AxFederation().add_agent(Client())


def _grid(d: int, n: int) -> torch.Tensor:
    axes = [torch.linspace(0, 1, n, dtype=torch.float64)] * d
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, d)


@pytest.mark.parametrize("d, n", [(1, 20001), (2, 401)])
def test_with_p_t_zero_the_trial_maximizes_the_message(d, n):
    features = RandomFourierFeatures(dim=d, num_features=100, lengthscale=0.15, seed=3)
    federation = AxFederation(features, p_t=0.0)
    bounds = ((2.0, 7.0), (-1.0, 1.0))[:d]
    client = _client(bounds)
    federation.add_agent(client, num_initial_trials=1)
    _attach(client, [(3.0, 0.0)[:d], (6.0, 0.5)[:d]], lambda p: sum(v * v for v in p.values()))
    message = _message(features, agent_id=7, seed=d)
    federation.deliver(message)
    _, params = _next(client)
    assert federation.agents[0].history[-1].source == 7
    lo = torch.tensor([b[0] for b in bounds], dtype=torch.float64)
    hi = torch.tensor([b[1] for b in bounds], dtype=torch.float64)
    u = (torch.tensor([params[f"x{i}"] for i in range(d)], dtype=torch.float64) - lo) / (hi - lo)
    grid = _grid(d, n)
    values = features(grid) @ message.omega
    best = int(values.argmax())
    value_at_trial = float(features(u.unsqueeze(0)) @ message.omega)
    # the grid's best is a lower bound of the maximum; L-BFGS-B reaches it to ~1e-6
    assert value_at_trial >= float(values[best]) - 1e-6
    # and the maximizer is the grid's, to a grid step
    assert float((u - grid[best]).abs().max()) <= 1.5 / (n - 1)


def test_a_used_message_is_not_used_again_in_one_shot_mode():
    features = RandomFourierFeatures(dim=1, num_features=50, lengthscale=0.2, seed=0)
    sources, xs, repeated = {}, {}, {}
    for one_shot in (True, False):
        federation = AxFederation(features, p_t=0.0, one_shot=one_shot, num_restarts=2, raw_samples=64)
        client = _client()
        node = federation.add_agent(client, num_initial_trials=1)
        _attach(client, [(0.2,), (0.7,)], lambda p: p["x0"])
        federation.deliver(_message(features, agent_id=3, seed=0))
        xs[one_shot] = []
        for _ in range(3):
            index, params = _next(client)
            client.complete_trial(index, raw_data={"f": params["x0"]})
            xs[one_shot].append(params["x0"])
        sources[one_shot] = [s.source for s in node.history]
        repeated[one_shot] = [s.repeated for s in node.history]
        assert len(node.inbox) == (0 if one_shot else 1)
    # one-shot: the message drives one trial, then (no message left) the own GP
    assert sources[True] == [3, "own", "own"]
    assert sources[False] == [3, 3, 3]
    # reusing one message gives its maximizer again: the repeats become uniform random points
    assert repeated[False] == [False, True, True] and len(set(xs[False])) == 3


def test_exchange_sends_fresh_messages_that_replace_the_old_ones():
    features = RandomFourierFeatures(dim=1, num_features=50, lengthscale=0.2, seed=0)
    federation = AxFederation(features)
    clients = [_client(seed=n) for n in range(3)]
    for c in clients:
        federation.add_agent(c, num_initial_trials=1)
    assert federation.exchange() == []  # nobody has data yet
    _attach(clients[0], [(0.1,), (0.9,)], lambda p: p["x0"])
    _attach(clients[1], [(0.4,)], lambda p: p["x0"])
    first = federation.exchange()
    assert [m.agent_id for m in first] == [0, 1]
    assert [m.num_observations for m in first] == [2, 1]
    assert [m.agent_id for m in federation.agents[2].inbox] == [0, 1]
    assert [m.agent_id for m in federation.agents[0].inbox] == [1]
    second = federation.exchange()
    held = federation.agents[2].inbox
    assert held[0] is second[0] and not torch.equal(held[0].omega, first[0].omega)


@pytest.mark.parametrize("objective, optimum", [("-f", 0.3), ("f", 1.0)])
def test_the_message_is_built_on_the_objective_to_maximize(objective, optimum):
    # f = (x - 0.3)^2 on [0, 1]: minimizing gives x = 0.3, maximizing x = 1
    features = RandomFourierFeatures(dim=1, num_features=200, lengthscale=0.1, seed=2)
    sender = _client(objective=objective)
    experiment = AxFederation(features).add_agent(sender).experiment
    _attach(sender, [(x / 20,) for x in range(21)], lambda p: (p["x0"] - 0.3) ** 2)
    X, Y = objective_data(experiment)
    sign = -1.0 if objective.startswith("-") else 1.0
    torch.testing.assert_close(Y.squeeze(-1), sign * (X.squeeze(-1) - 0.3) ** 2)
    g = torch.Generator().manual_seed(0)
    message = agent_message(experiment, features, agent_id=1, noise_variance=1e-4, generator=g)
    grid = _grid(1, 2001)
    x_best = float(grid[int((features(grid) @ message.omega).argmax())])
    assert abs(x_best - optimum) < 0.05


def test_bad_inputs_are_refused_with_clear_errors():
    features = RandomFourierFeatures(dim=1, num_features=20, seed=0)
    federation = AxFederation(features)

    client = Client()
    client.configure_experiment(
        parameters=[
            RangeParameterConfig(name="x0", parameter_type="float", bounds=(0.0, 1.0)),
            ChoiceParameterConfig(name="kind", parameter_type="str", values=["a", "b", "c"], is_ordered=False),
        ]
    )
    client.configure_optimization(objective="f")
    with pytest.raises(ValueError, match=r"4 coordinates \['x0', 'kind=a', 'kind=b', 'kind=c'\].*dim=4"):
        federation.add_agent(client)  # a one-hot choice takes a coordinate per value

    with pytest.raises(ValueError, match="dim=2"):
        federation.add_agent(_client(((0.0, 1.0), (0.0, 1.0))))
    with pytest.raises(ValueError, match="multi-objective"):
        federation.add_agent(_client(objective="f, -g"))
    client = Client()
    client.configure_experiment(parameters=[RangeParameterConfig(name="x0", parameter_type="float", bounds=(0.0, 1.0))])
    client.configure_optimization(objective="f", outcome_constraints=["g <= 1"])
    with pytest.raises(ValueError, match="outcome constraints"):
        federation.add_agent(client)
    with pytest.raises(ValueError, match="configure_experiment"):
        federation.add_agent(Client())
    assert federation.agents == []

    node = federation.add_agent(_client())
    other = RandomFourierFeatures(dim=1, num_features=20, seed=1)
    with pytest.raises(ValueError, match="different random-feature map"):
        federation.deliver(_message(other, agent_id=5, seed=0))
    with pytest.raises(ValueError, match="own message"):
        node.receive(_message(features, agent_id=0, seed=0))
    with pytest.raises(ValueError, match="no observation"):
        node.message()


def test_an_experiment_without_client_runs_through_its_generation_strategy():
    experiment = Experiment(
        search_space=SearchSpace([RangeParameter("x0", ParameterType.FLOAT, 0.0, 1.0)]),
        optimization_config=OptimizationConfig(Objective(expression="-f", metric_name_to_signature={"f": "f"})),
    )
    federation = AxFederation(RandomFourierFeatures(dim=1, num_features=30, seed=0), num_restarts=2, raw_samples=32)
    node = federation.add_agent(experiment, num_initial_trials=1)
    assert node.experiment is experiment
    for _ in range(2):
        ((run,),) = node.generation_strategy.gen(experiment=experiment, n=1)
        trial = experiment.new_trial(generator_run=run)
        trial.mark_running(no_runner_required=True)
        x = trial.arm.parameters["x0"]
        row = {
            "trial_index": trial.index,
            "arm_name": trial.arm.name,
            "metric_name": "f",
            "metric_signature": "f",
            "mean": (x - 0.3) ** 2,
            "sem": 0.0,
        }
        experiment.attach_data(Data(df=pd.DataFrame([row])))
        trial.mark_completed()
    assert len(node.history) == 1 and node.history[0].source == "own"
    X, Y = objective_data(experiment)
    torch.testing.assert_close(Y.squeeze(-1), -((X.squeeze(-1) - 0.3) ** 2))
