"""A secure round over Flower, at its edges: a round whose cohort is smaller than ``min_survivors`` runs no SecAgg+,
releases nothing and costs nothing. (Whole secure runs, dropouts at every stage, hostile nodes and a crash between
the charge and the unmasking: tests/flower/test_flower_secagg.py.)"""

import pytest

pytest.importorskip("flwr")

from test_flower import RUN_CONFIG, SECRET

from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.flower.coordinator import Coordinator
from fbo_torch.flower.roster import NodeBinding
from fbo_torch.flower.secure_round import run_secure_round

SECURE = dict(RUN_CONFIG, **{"aggregation": "secure", "dropout-tolerance": 0.25})


class NoNetwork:
    """A transport that must not be used."""

    def exchange(self, messages, timeout):
        raise AssertionError("a round below min_survivors must not contact any node")


@pytest.mark.parametrize("num_keys", [0, 2])
def test_too_small_a_cohort_runs_no_secagg_and_the_round_costs_nothing(num_keys):
    config = FlowerRunConfig.from_run_config(SECURE)
    objective = config.build_objective()
    coord = Coordinator(config, objective.bounds, objective.dim, secret=SECRET)
    plan = coord.plan()
    assert plan.omega_round == 1 and coord.mechanism.min_survivors == 3
    binding = NodeBinding(None, config.num_agents)
    keys = {100 + n: (b"pk1-%d" % n, b"pk2-%d" % n, b"") for n in range(num_keys)}
    for nid in keys:
        binding.agent(nid, nid - 100)
    lines = []
    run_secure_round(NoNetwork(), coord, plan, keys, binding, config, lines.append)
    assert any("fewer than min_survivors = 3: the round releases nothing and costs nothing" in line for line in lines)
    coord.plan()  # the next exchange records round 1
    log = coord.logs[-1]
    assert not log.released and log.reason == "too few survivors" and log.secagg["cohort"] == num_keys
    assert coord.ledger.rounds == coord.server.server_ledger.rounds == 0
