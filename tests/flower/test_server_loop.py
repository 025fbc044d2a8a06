"""The ServerApp's loop, piece by piece: what one node is sent, the summary path checked before the run, the
run's record. (Whole runs against an in-process Grid: tests/flower/test_flower.py and its neighbours.)"""

import json

import pytest

pytest.importorskip("flwr")

from test_flower import RUN_CONFIG, SECRET

from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.flower.coordinator import Coordinator
from fbo_torch.flower.secagg_records import SECAGG
from fbo_torch.flower.server_loop import check_summary_path, plan_content, report_path, summary

SECURE = dict(RUN_CONFIG, **{"aggregation": "secure", "dropout-tolerance": 0.25})


def _coordinator(run_config):
    config = FlowerRunConfig.from_run_config(run_config)
    objective = config.build_objective()
    return Coordinator(config, objective.bounds, objective.dim, secret=SECRET)


def test_a_node_is_sent_the_plan_and_in_a_secure_round_only_its_own_coin():
    central = _coordinator(RUN_CONFIG).plan()
    assert central.omega_round == 1 and SECAGG not in plan_content(central, 0).config_records
    secure = _coordinator(SECURE).plan()
    assert secure.coins is not None
    for agent in range(RUN_CONFIG["num-agents"]):
        record = plan_content(secure, agent).config_records[SECAGG]
        assert bool(record["sampled"]) == bool(secure.coins[agent])
    assert SECAGG not in plan_content(secure, None).config_records  # a node not bound to an agent yet


def test_the_summary_path_is_checked_before_the_run_and_the_report_goes_beside_it(tmp_path):
    check_summary_path("")
    check_summary_path(str(tmp_path / "summary.json"))
    with pytest.raises(ValueError, match="does not exist on the server"):
        check_summary_path(str(tmp_path / "missing" / "summary.json"))
    assert report_path(str(tmp_path / "summary.json")) == str(tmp_path / "summary.html")


def test_the_runs_record_is_json():
    coord = _coordinator(RUN_CONFIG)
    coord.plan()
    record = json.loads(json.dumps(summary(coord)))
    assert record["method"] == RUN_CONFIG["method"] and record["num_agents"] == RUN_CONFIG["num-agents"]
    assert record["privacy"]["accountant"] == coord.ledger.mechanism and record["rounds"] == []
