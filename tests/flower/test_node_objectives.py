"""Node-local objectives: each SuperNode evaluates the black box its own node config names.

The run config describes only the federation's domain (``objective = '{"type": "node", ...}'``);
the server never builds a node's objective. A node whose objective is missing, unexpected or on
another domain is refused for good, with one line.
"""

import json

import pytest
import torch

pytest.importorskip("flwr")

from test_flower import RUN_CONFIG, N, deploy, simulate

from fbo_torch.flower.agent_node import AgentNode
from fbo_torch.flower.config import FlowerRunConfig, ObjectiveMismatch, node_objective_spec

FEDERATION = json.loads(RUN_CONFIG["objective"])
BOUNDS = FlowerRunConfig.from_run_config(RUN_CONFIG).build_objective().bounds.tolist()
NODE_LOCAL = dict(RUN_CONFIG, objective=json.dumps({"type": "node", "bounds": BOUNDS}))


def own(n: int, **overrides) -> dict:
    """Node ``n``'s node config: its own black box, agent ``n`` of the simulated federation."""
    spec = {"type": "node_objectives:AgentOf", "federation": dict(FEDERATION, agents_per_group=N), "agent": n}
    return {"objective": json.dumps({**spec, **overrides})}


def test_nodes_with_their_own_objectives_compute_what_the_simulator_computes(monkeypatch):
    """Each node names agent n's function in its node config; the run config holds only the bounds. The
    releases, every query and ε equal the simulator's run of the federation objective."""
    runner, sim_releases = simulate(RUN_CONFIG)
    coord, releases, states, lines = deploy(NODE_LOCAL, monkeypatch, node_configs={n: own(n) for n in range(N)})
    assert len(releases) == RUN_CONFIG["num-rounds"]
    for got, want in zip(releases, sim_releases, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)  # as in test_flower.py
    for n in range(N):
        n_obs = int(states[n]["n"])
        assert torch.equal(states[n]["X"][0, :n_obs], runner.agents.train_X[n]), n
    assert [r.epsilon for r in coord.logs] == runner.epsilons
    assert not coord.refused_nodes


def test_the_server_never_builds_a_node_objective(monkeypatch):
    """The run config of a node-local federation names no class: the server's objective has bounds only."""
    cfg = FlowerRunConfig.from_run_config(NODE_LOCAL)
    domain = cfg.build_objective()
    assert domain.bounds.tolist() == BOUNDS and domain.num_agents == N
    with pytest.raises(RuntimeError, match="node-local"):
        domain(torch.zeros(1, 1, 1, dtype=torch.float64), torch.tensor([0]))


def test_a_node_whose_objective_does_not_fit_is_refused_for_good_with_one_line(monkeypatch):
    """Node 1 names a 2-dimensional objective, node 2 none, node 3 an objective on other bounds: each is
    refused once (one line naming what differs) and left out of every round; node 0 runs."""
    configs = {
        0: own(0),
        1: {"objective": "node_objectives:Shifted", "objective.dim": 2},
        2: {},
        3: {"objective.type": "node_objectives:Shifted", "objective.high": 2.0},
    }
    coord, _, states, lines = deploy(NODE_LOCAL, monkeypatch, node_configs=configs)
    refused = {
        n: [line for line in lines if f"node {100 + n} " in line and "refused for good" in line] for n in (1, 2, 3)
    }
    assert all(len(v) == 1 for v in refused.values()), lines
    assert "ObjectiveMismatch" in refused[1][0] and "is 2-dimensional" in refused[1][0]
    assert "federation's domain is 1-dimensional, bounds [[0.0], [1.0]]" in refused[1][0]
    assert "agent 2 has no objective" in refused[2][0] and "objective=" in refused[2][0]
    assert "bounds [[0.0], [2.0]]" in refused[3][0]
    assert sorted(coord.refused_nodes) == [101, 102, 103]
    assert [r.num_reported for r in coord.logs] == [1] * RUN_CONFIG["num-rounds"]
    assert list(states) == [0]  # the refused nodes never took a step
    assert all("\n" not in v for v in coord.refused_nodes.values())


def test_a_node_objective_in_a_federation_of_the_run_configs_objective_is_refused():
    cfg = FlowerRunConfig.from_run_config(RUN_CONFIG)
    with pytest.raises(ObjectiveMismatch, match='names its own objective \'node_objectives:Shifted\'.*"type": "node"'):
        AgentNode(cfg, 1, node_config={"objective": "node_objectives:Shifted"})


def test_node_objectives_are_validated_like_yaml_custom_objectives():
    cfg = FlowerRunConfig.from_run_config(NODE_LOCAL)
    with pytest.raises(
        ValueError,
        match=r"agent 0: node config `objective` \(node_objectives:Shiftd\): module "
        r"'node_objectives' has no attribute 'Shiftd' \(did you mean 'Shifted'\?\)",
    ):
        cfg.node_objective({"objective": "node_objectives:Shiftd"}, 0)
    with pytest.raises(ValueError, match="unknown objective type 'Shifted'.*'package.module:ClassName'"):
        cfg.node_objective({"objective": "Shifted"}, 0)
    with pytest.raises(ValueError, match=r"unexpected keyword argument|does not take|unknown"):
        cfg.node_objective({"objective": "node_objectives:Shifted", "objective.width": 3}, 0)
    with pytest.raises(ObjectiveMismatch, match="has 4 agents; a node's objective is one agent's function"):
        cfg.node_objective({"objective": json.dumps(dict(FEDERATION, agents_per_group=N))}, 0)
    # the spellings of a node config
    assert node_objective_spec({"objective": "m:C"}) == {"type": "m:C"}
    assert node_objective_spec({"objective": '{"type": "m:C", "a": 1}'}) == {"type": "m:C", "a": 1}
    assert node_objective_spec({"objective.type": "m:C", "objective.a": 1}) == {"type": "m:C", "a": 1}
    assert node_objective_spec({"partition-id": 0}) is None


def test_a_node_must_fit_the_named_parameters_of_the_federation():
    """With `parameters` in the run config, a node's objective must search exactly that space."""
    params = {"learning_rate": {"low": 1e-4, "high": 1.0, "log": True}}
    cfg = FlowerRunConfig.from_run_config(
        dict(NODE_LOCAL, objective=json.dumps({"type": "node", "parameters": params}))
    )
    assert cfg.build_objective().bounds.tolist() == [[0.0], [1.0]]
    with pytest.raises(ObjectiveMismatch, match="searches no named search space; the federation's parameters are"):
        cfg.node_objective({"objective": "node_objectives:Shifted"}, 0)  # [0, 1]: same bounds, no names


@pytest.mark.parametrize(
    "objective, message",
    [
        ({"type": "node"}, "exactly one of `bounds`"),
        ({"type": "node", "bounds": [[0, 0], [1, 1]], "parameters": {}}, "exactly one of `bounds`"),
        ({"type": "node", "bounds": [[0, 1], [1, 0]]}, "every upper bound above its lower bound"),
        ({"type": "node", "bounds": [0, 1]}, "2 x d finite numbers"),
        ({"type": "node", "parameters": {"lr": {"low": 1}}}, r"`parameters`: Search-space entry `lr` is missing"),
    ],
)
def test_a_bad_node_local_run_config_is_one_line(objective, message):
    with pytest.raises(ValueError, match=message):
        FlowerRunConfig.from_run_config(dict(RUN_CONFIG, objective=json.dumps(objective)))
