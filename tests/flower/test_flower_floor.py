"""The privacy floor each node owns: a run config below it is refused by that node, in one line, for good."""

import json

import pytest

pytest.importorskip("flwr")

from flower_grid import InProcessGrid
from test_flower import RUN_CONFIG as CENTRAL
from test_flower import SECRET, N
from test_flower_secagg import RUN_CONFIG as SECURE

from fbo_torch.flower import client_app, client_round, server_app
from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.flower.floor import PrivacyFloor, PrivacyFloorError


@pytest.mark.parametrize(
    ("floor", "run_config", "says"),
    [
        (
            {"privacy.min-noise-multiplier": 1.5},
            SECURE,
            "run config `noise-multiplier` = 1 is below this node's `privacy.min-noise-multiplier` = 1.5",
        ),
        ({"privacy.min-noise-multiplier": "0.1"}, dict(SECURE, **{"noise-multiplier": 0.0}), "`noise-multiplier` = 0"),
        ({"privacy.aggregation": "secure"}, CENTRAL, 'run config `aggregation` = "central", this node requires'),
        ({"privacy.min-threshold": 4}, SECURE, "threshold is 3 (run config `secagg-threshold`, `dropout-tolerance`)"),
        ({"privacy.max-dropout-tolerance": 0.1}, SECURE, "`dropout-tolerance` = 0.25 is above this node's"),
        ({"privacy.max-epsilon": 1.0}, SECURE, "against a server that deviates from SecAgg+), above this node's"),
        ({"privacy.max-epsilon": 1.0}, CENTRAL, "(released), above this node's `privacy.max-epsilon` = 1"),
        ({"privacy.max-epsilon": 10.0, "privacy.delta": 1e-9}, SECURE, "above this node's `privacy.max-epsilon` = 10"),
    ],
)
def test_a_run_config_below_the_nodes_floor_is_refused_in_one_line(floor, run_config, says):
    """Before: a node accepted whatever the run config said (noise-multiplier = 0 in secure mode, a central
    aggregation, low thresholds): the run config is written by whoever submits the run, not the device's owner."""
    cfg = FlowerRunConfig.from_run_config(run_config)
    with pytest.raises(PrivacyFloorError) as err:
        client_round.check_floor(cfg, floor, 2)
    assert says in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("agent 2 refuses the run: ")


def test_a_run_config_at_the_floor_is_accepted():
    cfg = FlowerRunConfig.from_run_config(SECURE)
    eps = PrivacyFloor().epsilon(cfg)
    floor = {
        "privacy.min-noise-multiplier": 1.0,
        "privacy.aggregation": "secure",
        "privacy.min-threshold": 3,
        "privacy.max-dropout-tolerance": 0.25,
        "privacy.max-epsilon": eps * (1 + 1e-9),
    }
    assert client_round.check_floor(cfg, floor, 0).required_threshold(cfg) == 3


@pytest.mark.parametrize(
    ("floor", "says"),
    [
        ({"privacy.max-epsilon": 0}, "`privacy.max-epsilon` must be a finite number > 0"),
        ({"privacy.min-noise-multiplier": "lots"}, "`privacy.min-noise-multiplier` must be a number"),
        ({"privacy.min-noise-multiplier": -1}, "`privacy.min-noise-multiplier` must be finite and >= 0"),
        ({"privacy.aggregation": "local"}, "`privacy.aggregation` must be one of ('', 'secure', 'central')"),
        ({"privacy.delta": 1.0}, "`privacy.delta` must lie in (0, 1)"),
        ({"privacy.min-threshold": 2.5}, "`privacy.min-threshold` must be an integer"),
        ({"privacy.min-threshold": -1}, "`privacy.min-threshold` must be >= 0"),
        ({"privacy.max-epsilom": 1}, "unknown node config key(s) ['privacy.max-epsilom']"),
    ],
)
def test_a_floor_that_cannot_be_read_is_refused(floor, says):
    with pytest.raises(PrivacyFloorError) as err:
        PrivacyFloor.from_node_config(floor)
    assert says in str(err.value)


def test_a_node_below_whose_floor_the_run_is_refuses_it_and_is_never_contacted_again():
    grid = InProcessGrid(client_app.app, CENTRAL, N, node_configs={1: {"privacy.aggregation": "secure"}})
    sent = []
    push = grid.push_messages
    grid.push_messages = lambda msgs: push([sent.append(m.metadata.dst_node_id) or m for m in msgs])
    lines = []
    coord = server_app.run_federation(
        grid, FlowerRunConfig.from_run_config(CENTRAL), echo=lines.append, poll_interval=0.0, secret=SECRET
    )
    assert sent.count(101) == 1 and sent.count(100) == CENTRAL["num-rounds"] + 1
    assert 'this node requires `privacy.aggregation` = "secure"' in coord.refused_nodes[101]
    assert all(r.released for r in coord.logs)  # the others go on
    assert json.dumps(server_app.summary(coord))  # the refusal is in the run's record


def test_the_floor_asks_the_algorithm_what_its_agents_send(monkeypatch):
    """What the floor checks is the method registry's say (``federated``, ``is_private``), not a name compare."""
    from fbo_torch.methods.fts_de import FTSDE

    strict = {"privacy.min-noise-multiplier": 100.0, "privacy.max-epsilon": 1e-9, "privacy.aggregation": "secure"}
    ts = FlowerRunConfig.from_run_config(dict(CENTRAL, method="ts"))  # the agents send nothing of their data
    assert PrivacyFloor().epsilon(ts) == 0.0
    client_round.check_floor(ts, strict, 1)
    cfg = FlowerRunConfig.from_run_config(CENTRAL)
    assert 0 < PrivacyFloor().epsilon(cfg) < float("inf")
    monkeypatch.setattr(FTSDE, "is_private", classmethod(lambda cls, settings: False))
    assert PrivacyFloor().epsilon(cfg) == float("inf")  # z > 0, but the algorithm says it is not private
