"""The Flower deployment computes what the batched simulator computes.

The ServerApp's loop (:func:`fbo_torch.flower.server_app.run_federation`) runs
against an in-process Grid that hands each Message to the ClientApp with the
node's own Context (tests/flower_grid.py), so the messages, records and node
states are Flower's, without a SuperLink.
"""

import json
import math

import pytest
import torch

pytest.importorskip("flwr")

from flower_grid import InProcessGrid

from fbo_torch.federation.faults import FaultInjector
from fbo_torch.flower import client_app, server_app
from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.flower.coordinator import Coordinator
from fbo_torch.flower.records import AGENT_STATE, record_to_state
from fbo_torch.protocol.randomness import SecretServerRandomness
from fbo_torch.simulate.dp_fts_de import DPFTSDERunner

N = 4
RUN_CONFIG = {
    "method": "dp-fts-de",
    "num-agents": N,
    "num-rounds": 3,
    "sample-rate": 0.75,
    "noise-multiplier": 1.0,
    "clip-norm": 1.0,
    "num-regions": 2,
    "seed": 3,
    "num-init": 3,
    "num-features": 20,
    "rff-lengthscale": 0.05,
    "objective": json.dumps({"type": "gp_grid", "grid_size": 200, "perturbation": 0.05, "perturb_first": True}),
    "gp-sample-features": 32,
    "gp-fit-maxiter": 15,
    "round-timeout": 5.0,
    "min-nodes-timeout": 0.0,
    "report-best": True,
}
#: The server's secret, given to the simulator and to the ServerApp server-side (never in the run config).
SECRET = bytes(range(32))


def _record_releases(server):
    """Keep a copy of every broadcast ``server.release`` returns."""
    out, release = [], server.release

    def wrapped(*args, **kwargs):
        b = release(*args, **kwargs)
        out.append(b.clone())
        return b

    server.release = wrapped
    return out


_SIMULATED = {}


def simulate(run_config, secret=SECRET):
    key = json.dumps(run_config, sort_keys=True) + secret.hex()
    if key not in _SIMULATED:
        _SIMULATED[key] = _simulate(run_config, secret)
    return _SIMULATED[key]


def _simulate(run_config, secret):
    cfg = FlowerRunConfig.from_run_config(run_config)
    obj = cfg.build_objective()
    runner = DPFTSDERunner(
        obj,
        cfg.dp_settings(),
        num_inits=1,
        domain=cfg.build_domain(obj),
        seed=cfg.seed,
        accountant=cfg.privacy.accountant,
        delta=cfg.ledger_delta,
        server_randomness=SecretServerRandomness(secret, secure_mode=cfg.secure_mode),
    )
    releases = _record_releases(runner.server)
    runner.run()
    return runner, releases


def deploy(run_config, monkeypatch, secret=SECRET, state=None, **grid_kwargs):
    releases = []
    init = Coordinator.__init__

    def init_and_record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        releases.extend([]) if self.server is None else releases.append(_record_releases(self.server))

    monkeypatch.setattr(Coordinator, "__init__", init_and_record)
    grid = InProcessGrid(client_app.app, run_config, N, **grid_kwargs)
    lines = []
    coord = server_app.run_federation(
        grid,
        FlowerRunConfig.from_run_config(run_config),
        echo=lines.append,
        poll_interval=0.0,
        secret=secret,
        state=state,
    )
    X = {
        n: record_to_state(ctx.state.array_records[AGENT_STATE])
        for n, ctx in enumerate(grid.contexts.values())
        if AGENT_STATE in ctx.state.array_records
    }
    return coord, releases[0], X, lines


def test_flower_run_equals_the_simulator_round_by_round(monkeypatch):
    runner, sim_releases = simulate(RUN_CONFIG)
    coord, releases, states, lines = deploy(RUN_CONFIG, monkeypatch)
    T = RUN_CONFIG["num-rounds"]
    assert len(releases) == len(sim_releases) == T
    for t in range(T):
        # Same keys, same functions, agent n alone (B = 1) vs in the batch: on this CPU the releases
        # are bit-identical. The tolerance only allows float64 roundoff (1e-12 on O(1) entries, far
        # above the ~1e-15 of an M = 20 sum) in case a BLAS picks other kernels for B = 1 and B = N.
        torch.testing.assert_close(releases[t], sim_releases[t], rtol=0, atol=1e-12)
    for n in range(N):
        X, n_obs = states[n]["X"], int(states[n]["n"])
        assert n_obs == RUN_CONFIG["num-init"] + T
        # every query, round by round: grid points (exact maximization over the grid), so exact
        assert torch.equal(X[0, :n_obs], runner.agents.train_X[n]), n
        assert float(states[n]["best"][0]) == float(runner.best[n, -1])
    eps = [r.epsilon for r in coord.logs]
    assert eps == runner.epsilons and all(math.isfinite(e) and e > 0 for e in eps)
    assert coord.ledger.epsilon == runner.ledger.epsilon and coord.ledger.rounds == runner.ledger.rounds == T
    assert [r.num_reported for r in coord.logs] == [N] * T
    assert len([line for line in lines if line.startswith("round ")]) == T


def test_server_stops_releasing_before_max_epsilon(monkeypatch):
    runner, _ = simulate(RUN_CONFIG)  # no budget
    budget = (runner.epsilons[1] + runner.epsilons[2]) / 2  # room for two releases, not three
    cfg = dict(RUN_CONFIG, **{"max-epsilon": budget})
    runner, _ = simulate(cfg)
    coord, releases, _, _ = deploy(cfg, monkeypatch)
    assert [r.released for r in coord.logs] == runner.released == [True, True, False]
    assert [r.epsilon for r in coord.logs] == runner.epsilons and coord.ledger.epsilon <= budget
    assert len(releases) == 2


def test_dropped_replies_are_aggregated_as_the_simulator_aggregates_dropouts(monkeypatch):
    cfg = dict(RUN_CONFIG, faults=json.dumps({"dropout_rate": 0.4}))
    runner, sim_releases = simulate(cfg)
    fc = FlowerRunConfig.from_run_config(cfg)
    keys = fc.agent_keys(torch.arange(N))
    injector = FaultInjector(dropout_rate=0.4)
    dropped = {t: injector.dropped(keys, t) for t in range(1, fc.num_rounds + 1)}
    # the reply to exchange t - 1 carries ω for round t: lose it when the simulator drops agent n in round t
    coord, releases, _, _ = deploy(
        cfg, monkeypatch, drop_reply=lambda t, n: t + 1 in dropped and bool(dropped[t + 1][n])
    )
    assert sum(int(d.sum()) for d in dropped.values()) > 0  # some agents did drop
    assert [r.num_reported for r in coord.logs] == [N - int(dropped[t].sum()) for t in range(1, fc.num_rounds + 1)]
    for t in range(fc.num_rounds):
        torch.testing.assert_close(releases[t], sim_releases[t], rtol=0, atol=1e-12)  # as above
    assert [r.epsilon for r in coord.logs] == runner.epsilons  # dropouts change no ε


def test_a_node_that_misses_a_round_does_not_stop_the_federation(monkeypatch):
    runner, _ = simulate(RUN_CONFIG)
    coord, _, states, lines = deploy(RUN_CONFIG, monkeypatch, deliver=lambda t, n: not (t == 2 and n == 1))
    assert [r.num_reported for r in coord.logs] == [N, N, N - 1]  # its ω for round 3 never came
    assert int(states[1]["n"]) == RUN_CONFIG["num-init"] + RUN_CONFIG["num-rounds"] - 1  # it skipped round 2
    assert int(states[0]["n"]) == RUN_CONFIG["num-init"] + RUN_CONFIG["num-rounds"]
    assert [r.epsilon for r in coord.logs] == runner.epsilons
    assert any("replies=3/4" in line for line in lines)


def test_a_client_with_another_feature_map_is_refused(monkeypatch):
    other = dict(RUN_CONFIG, **{"rff-lengthscale": 0.2})
    coord, _, states, lines = deploy(RUN_CONFIG, monkeypatch, node_run_configs={2: other})
    refusals = [line for line in lines if "FeatureMapMismatch" in line and "agent 2 refuses" in line]
    assert refusals and "fingerprint" in refusals[0]
    assert len(refusals) == 1  # refused once, then left out
    assert [r.num_reported for r in coord.logs] == [N - 1] * RUN_CONFIG["num-rounds"]
    assert 2 not in states and list(coord.refused_nodes) == [102]  # it never took a step
    # the server checks too: a reply built on another map is refused and never aggregated
    cfg = FlowerRunConfig.from_run_config(RUN_CONFIG)
    obj = cfg.build_objective()
    c = Coordinator(cfg, obj.bounds, obj.dim)
    c.plan()
    with pytest.raises(ValueError, match="agent 1 refused: feature map fingerprint"):
        c.receive(1, "0123456789abcdef", torch.zeros(cfg.settings.num_features, dtype=torch.float64))
    assert not c._reported.any() and 1 in c.refused


def test_the_package_imports_without_flwr():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['flwr'] = None\n"
        "import fbo_torch.flower, fbo_torch.flower.config, fbo_torch.flower.agent_node, "
        "fbo_torch.flower.coordinator\n"
        "try:\n    import fbo_torch.flower.server_app\nexcept ImportError:\n    print('lazy')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "lazy"


def test_the_deployment_imports_no_simulator_code():
    """An agent's step and the server's round come from fbo_torch.federation: with the simulator
    (fbo_torch.simulate) unimportable, a node and the coordinator still build and take a round."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['fbo_torch.simulate'] = None\n"
        "import json, torch\n"
        "from fbo_torch.flower.config import FlowerRunConfig\n"
        "from fbo_torch.flower.agent_node import AgentNode\n"
        "from fbo_torch.flower.coordinator import Coordinator\n"
        f"cfg = FlowerRunConfig.from_run_config({RUN_CONFIG!r})\n"
        "obj = cfg.build_objective()\n"
        "coord = Coordinator(cfg, obj.bounds, obj.dim)\n"
        "plan = coord.plan()\n"
        "node = AgentNode(cfg, 1)\n"
        "reply = node.step(plan.round, plan.p, plan.broadcast, plan.region_bounds, plan.omega_round)\n"
        "assert reply.omega.shape == (cfg.settings.num_features,)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_two_nodes_claiming_one_agent_keep_the_first(monkeypatch):
    from flower_grid import InProcessGrid as Grid

    grid = Grid(client_app.app, RUN_CONFIG, N)
    grid.contexts[103].node_config["partition-id"] = 1  # a misconfigured SuperNode: agent 1 twice, no agent 3
    lines = []
    coord = server_app.run_federation(
        grid, FlowerRunConfig.from_run_config(RUN_CONFIG), echo=lines.append, poll_interval=0.0
    )
    assert [r.num_reported for r in coord.logs] == [N - 1] * RUN_CONFIG["num-rounds"]
    assert sum("claims agent 1, played by node 101" in line for line in lines) == RUN_CONFIG["num-rounds"] + 1
