"""Secure aggregation on Flower: the simulator's releases, what the ServerApp sees, dropouts, hostile nodes.

Each run is the ServerApp's loop against the in-process Grid (tests/flower_grid.py), with an agent
roster (so every node is bound to its agent from the first exchange) and the agents' secrets put in
their node state, so a run can be compared with the simulator given the same secrets.
"""

import json
import math
import tempfile

import numpy as np
import pytest
import torch
from scipy import stats

pytest.importorskip("flwr")

from flower_grid import InProcessGrid, node_identities
from flwr.app import ConfigRecord, Message
from flwr.common.serde import recorddict_to_proto
from test_flower import RUN_CONFIG as CENTRAL
from test_flower import SECRET, N

from fbo_torch.federation.secure import SecureMechanism, agent_secret
from fbo_torch.flower import client_app, server_app
from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.flower.coordinator import Coordinator, InvalidReply
from fbo_torch.flower.floor import PrivacyFloor, worst_case_epsilons
from fbo_torch.flower.records import OMEGA
from fbo_torch.flower.roster import AgentRoster
from fbo_torch.flower.secagg import SecAggClient, SecAggError, SecAggServer, mask
from fbo_torch.flower.secagg_records import SECAGG, secagg_reply
from fbo_torch.flower.server_state import ServerState
from fbo_torch.privacy.accountants import get_epsilon
from fbo_torch.privacy.ddg import DistributedDiscreteGaussianAccountant
from fbo_torch.protocol.randomness import SecretServerRandomness
from fbo_torch.simulate.dp_fts_de import DPFTSDERunner

RUN_CONFIG = dict(
    CENTRAL,
    **{
        "gp-sample-features": 16,
        "gp-fit-maxiter": 5,
        "report-best": False,
        "round-timeout": 0.5,  # in process every reply is there at once: only a lost one waits this long
        "aggregation": "secure",
        "dropout-tolerance": 0.25,
    },
)
MASTER = bytes(range(32, 64))  # the agents' secrets derive from it, in the simulator and in the node states


_IDENTITIES = tempfile.TemporaryDirectory()  # the nodes' SuperNode keys and their roster, for this module
PEM, SSH, NODE_CONFIGS = node_identities(_IDENTITIES.name, N)
ROSTER = AgentRoster({n: SSH[n] for n in range(N)}, N)


def simulate(run_config):
    cfg = FlowerRunConfig.from_run_config(run_config)
    obj = cfg.build_objective()
    runner = DPFTSDERunner(
        obj,
        cfg.dp_settings(),
        num_inits=1,
        domain=cfg.build_domain(obj),
        seed=cfg.seed,
        delta=cfg.ledger_delta,
        server_randomness=SecretServerRandomness(SECRET),
        agent_master=MASTER,
    )
    releases, reveal = [], runner.server.reveal_secure
    runner.server.reveal_secure = lambda total: releases.append(reveal(total)) or releases[-1]
    runner.run()
    return runner, releases


class Recorder:
    """What a deployment computed: every secure release, and each agent's integer vector per round."""

    def __init__(self, monkeypatch):
        self.releases, self.vectors, self.omegas = [], {}, {}
        reveal, contributions = Coordinator.reveal_secure, SecureMechanism.contributions

        def reveal_and_record(coord, total, stats=None):
            reveal(coord, total, stats)
            self.releases.append(coord._secure_broadcast)

        def contributions_and_record(mech, omegas, sampled, ratios, secrets, round):
            y, clipped = contributions(mech, omegas, sampled, ratios, secrets, round)
            known = [agent_secret(MASTER, 0, a) for a in range(N)]
            if len(secrets) == 1 and secrets[0] in known:  # a deployed agent (the simulator batches)
                n = known.index(secrets[0])
                self.vectors[(round, n)], self.omegas[(round, n)] = y[0].clone(), omegas[0].clone()
            return y, clipped

        monkeypatch.setattr(Coordinator, "reveal_secure", reveal_and_record)
        monkeypatch.setattr(SecureMechanism, "contributions", contributions_and_record)


def deploy(run_config, monkeypatch=None, state=None, **grid_kwargs):
    rec = Recorder(monkeypatch) if monkeypatch is not None else None
    grid_kwargs.setdefault("node_configs", NODE_CONFIGS)
    grid = InProcessGrid(client_app.app, run_config, N, node_keys={n: PEM[n] for n in range(N)}, **grid_kwargs)
    for n, ctx in enumerate(grid.contexts.values()):  # the agents' own secrets, as the simulator derives them
        ctx.state["fbo.agent-secret"] = ConfigRecord({"secret": agent_secret(MASTER, 0, n)})
    lines = []
    coord = server_app.run_federation(
        grid,
        FlowerRunConfig.from_run_config(run_config),
        echo=lines.append,
        poll_interval=0.0,
        secret=SECRET,
        roster=ROSTER,
        state=state,
    )
    return coord, grid, lines, rec


@pytest.fixture(scope="module")
def secure_run():
    mp = pytest.MonkeyPatch()
    try:
        deployed = deploy(RUN_CONFIG, mp)
    finally:
        mp.undo()
    return deployed, simulate(RUN_CONFIG)


def test_a_secure_flower_run_releases_what_the_simulator_releases_given_the_same_secrets(secure_run):
    (coord, _, lines, rec), (runner, sim) = secure_run
    T = RUN_CONFIG["num-rounds"]
    assert len(rec.releases) == len(sim) == T
    for t in range(T):
        assert torch.equal(rec.releases[t], sim[t][0])  # integer sums: bit for bit
    assert [r.epsilon for r in coord.logs] == runner.epsilons
    assert [r.epsilon_server for r in coord.logs] == [r.epsilon_server for r in runner.server.rounds]
    # (the simulator's two figures are recomputed by hand from the closed forms in tests/federation/test_secure.py)
    assert coord.ledger.mechanism == coord.server.server_ledger.mechanism == "ddg"
    assert [r.num_reported for r in coord.logs] == [N] * T
    assert all(r.secagg["survivors"] == N and r.secagg["bytes_sent"] > 0 for r in coord.logs)
    assert all("epsilon_server=" in line for line in lines if line.startswith("round ") and "released" in line)


def test_the_server_never_holds_an_individual_omega(secure_run):
    """Everything the ServerApp received: public keys, ciphertexts, masked vectors, shares — no ω, no float
    array, no ω's bytes; every masked vector is uniform on Z_m and uncorrelated with its agent's ω."""
    (coord, grid, _, rec), _ = secure_run
    mech = coord.mechanism
    wire = b"".join(recorddict_to_proto(m.content).SerializeToString() for m in grid.received)
    masked, weighted = [], []
    for m in grid.received:
        assert OMEGA not in m.content.array_records
        for record in m.content.array_records.values():
            assert all(a.dtype != "float64" for a in record.values())
        if m.metadata.message_type == "train.masked_vector":
            n = grid.contexts[m.metadata.src_node_id].node_config["partition-id"]
            v = np.frombuffer(m.content.config_records[SECAGG]["masked"], dtype="<i8")
            t = int(m.metadata.group_id) + 1  # the exchange of round t - 1 asks for round t's vectors
            masked.append(v / mech.modulus)
            weighted.append(np.tile(rec.omegas[(t, n)].numpy(), mech.num_regions))
    for (t, n), omega in rec.omegas.items():
        for entry in omega.numpy():
            assert entry.tobytes() not in wire, (t, n)
    masked, weighted = np.concatenate(masked), np.concatenate(weighted)
    assert len(masked) == N * RUN_CONFIG["num-rounds"] * mech.dim
    assert stats.kstest(masked, "uniform").pvalue > 1e-3
    r = np.corrcoef(masked, weighted)[0, 1]
    assert abs(r) < 4 / math.sqrt(len(masked))


def test_a_masked_vector_has_one_distribution_whatever_the_vector():
    """The same statistics for an all-zero vector and for the largest honest vector: the masks make it uniform."""
    m, d = 2**24, 16
    out = {}
    for name, vec in (("zero", np.zeros(d, dtype=np.int64)), ("large", np.full(d, 2**22, dtype=np.int64))):
        draws = []
        for _ in range(40):
            clients = {
                100 + i: SecAggClient.setup(100 + i, 1, m, vec if i == 0 else np.zeros(d, dtype=np.int64))
                for i in range(3)
            }
            server = SecAggServer(1, {i: (c.pk1, c.pk2) for i, c in clients.items()}, d, m, 3, 3)
            req, _ = server.share_keys_requests()
            server.receive_shares({i: clients[i].share_keys(1, k, 3) for i, k in req.items()})
            req = server.masked_vector_requests()
            draws.append(clients[100].masked_vector(1, *req[100]) / m)
        out[name] = np.concatenate(draws)
    assert stats.ks_2samp(out["zero"], out["large"]).pvalue > 1e-3
    assert stats.kstest(out["large"], "uniform").pvalue > 1e-3


def test_masks_come_from_the_whole_seed_unlike_flowers_32_bit_fold():
    """Flower's pseudo_rand_gen seeds numpy with the XOR of the seed's 4-byte words: seeds with the same
    fold give the same mask. Ours are SHAKE-256 of all 256 bits."""
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen

    a = bytes(range(32))
    b = bytes([a[i] ^ (0xFF if i in (0, 4) else 0) for i in range(32)])  # same XOR fold, another seed
    assert np.array_equal(pseudo_rand_gen(a, 2**32, [(8,)])[0], pseudo_rand_gen(b, 2**32, [(8,)])[0])
    assert not np.array_equal(mask(a, "pair", 1, 8, 2**32), mask(b, "pair", 1, 8, 2**32))


def _drop_stage(stage, round, node):
    def tamper(msg, reply):
        if (
            msg.metadata.message_type == f"train.{stage}"
            and msg.metadata.group_id == str(round - 1)
            and msg.metadata.dst_node_id == 100 + node
        ):
            return None
        return reply

    return tamper


def _expected_sum(rec, mech, t, survivors):
    """The decoded sum of the survivors' vectors (``P x M``), from the vectors the agents computed."""
    y = torch.stack([rec.vectors[(t, n)] for n in survivors])
    return mech.decode(mech.reduce(y.sum(0)))[0]


@pytest.mark.parametrize("stage", ["masked_vector", "unmask"])
def test_dropouts_up_to_the_tolerance_still_release_the_survivors_sum(monkeypatch, stage):
    """A node lost before its masked vector arrives (its pairwise masks are removed with its reconstructed
    key), or after it (its shares are not needed: three of four suffice)."""
    cfg = dict(RUN_CONFIG, **{"num-rounds": 2})
    coord, _, lines, rec = deploy(cfg, monkeypatch, tamper=_drop_stage(stage, 2, 2))
    assert [r.released for r in coord.logs] == [True, True]
    mech = coord.mechanism
    survivors = [0, 1, 3] if stage == "masked_vector" else [0, 1, 2, 3]
    assert coord.logs[1].num_reported == len(survivors) and coord.logs[1].secagg["out_of_range"] == 0
    W = coord.server.aggregator.weights(2)
    expected = _expected_sum(rec, mech, 2, survivors) * (float(W.max()) / coord.settings.sample_rate)
    assert torch.equal(rec.releases[1], expected)
    assert any("dropped: no masked vector" in line for line in lines) == (stage == "masked_vector")


def test_beyond_the_tolerance_a_round_releases_nothing_and_costs_nothing(monkeypatch):
    cfg = dict(RUN_CONFIG, **{"num-rounds": 2})
    drop_two = [_drop_stage("masked_vector", 2, n) for n in (1, 2)]

    def tamper(msg, reply):
        for f in drop_two:
            reply = reply if reply is None else f(msg, reply)
        return reply

    coord, _, lines, _ = deploy(cfg, monkeypatch, tamper=tamper)
    assert [r.released for r in coord.logs] == [True, False] and coord.logs[1].reason == "too few survivors"
    assert coord.ledger.rounds == 1 and coord.logs[1].epsilon == coord.logs[0].epsilon


def _hostile_masked(node, kind):
    def tamper(msg, reply):
        if msg.metadata.message_type == "train.masked_vector" and msg.metadata.dst_node_id == 100 + node:
            v = np.frombuffer(reply.content.config_records[SECAGG]["masked"], dtype="<i8")
            bad = v[:-1] if kind == "short" else np.random.default_rng(0).integers(0, 2**62, len(v)) % (1 << 62)
            if kind == "in-range":
                bad = (v + np.random.default_rng(1).integers(0, 2**20, len(v))) % _modulus()
            return Message(secagg_reply(masked=bad.astype("<i8").tobytes()), reply_to=msg)
        return reply

    return tamper


def _modulus():
    return SecureMechanism.from_settings(FlowerRunConfig.from_run_config(RUN_CONFIG).dp_settings(), N).modulus


@pytest.mark.parametrize("kind", ["short", "out-of-range", "in-range"])
def test_a_hostile_nodes_vector_harms_only_its_own_contribution(monkeypatch, kind):
    cfg = dict(RUN_CONFIG, **{"num-rounds": 2})
    coord, _, lines, rec = deploy(cfg, monkeypatch, tamper=_hostile_masked(3, kind))
    mech = coord.mechanism
    assert all(r.released for r in coord.logs) and all(torch.isfinite(b).all() for b in rec.releases)
    W = coord.server.aggregator.weights(2)
    scale = float(W.max()) / coord.settings.sample_rate
    honest = _expected_sum(rec, mech, 2, [0, 1, 2]) * scale
    if kind in ("short", "out-of-range"):  # refused: it is a dropout, the others' sum is released exactly
        assert coord.logs[1].num_reported == 3 and coord.invalid.get(3, 0) >= 1
        assert torch.equal(rec.releases[1], honest)
    else:  # in range: it enters the sum, shifting it by a bounded amount; nothing of the others is lost
        bound = 2 * mech.sum_bound * (mech.clip_norm / mech.scale) * scale
        assert coord.logs[1].num_reported == 4
        assert float((rec.releases[1] - honest).abs().max()) <= bound + 1e-9


def test_a_reconstruction_that_does_not_verify_fails_the_round_and_keeps_its_charge(monkeypatch):
    def tamper(msg, reply):  # node 1 sends garbage shares in the unmask stage of round 2
        if (
            msg.metadata.message_type == "train.unmask"
            and msg.metadata.dst_node_id == 101
            and msg.metadata.group_id == "1"
        ):
            r = reply.content.config_records[SECAGG]
            return Message(
                secagg_reply(
                    **{"node-ids": list(r["node-ids"]), "shares": [s[:4] + bytes(len(s) - 4) for s in r["shares"]]}
                ),
                reply_to=msg,
            )
        return reply

    cfg = dict(RUN_CONFIG, **{"num-rounds": 3, "dropout-tolerance": 0.0})  # t = 4: node 1's shares are needed
    coord, _, lines, _ = deploy(cfg, monkeypatch, tamper=tamper)
    assert [r.released for r in coord.logs] == [True, False, True] and coord.logs[1].reason == "unmask failed"
    assert coord.ledger.rounds == 3 and coord.logs[1].epsilon > coord.logs[0].epsilon  # charged all the same
    assert any("unmask failed" in line for line in lines)


def test_a_crash_between_the_charge_and_the_unmasking_never_under_counts(monkeypatch, tmp_path):
    class Crash(Exception):
        pass

    def crash(msg, reply):
        if msg.metadata.message_type == "train.unmask" and msg.metadata.group_id == "1":
            raise Crash
        return reply

    cfg = dict(RUN_CONFIG, **{"num-rounds": 3})
    folder = tmp_path / "server"
    grid = InProcessGrid(client_app.app, cfg, N, node_keys={n: PEM[n] for n in range(N)}, node_configs=NODE_CONFIGS)
    push = grid.push_messages

    def push_or_die(messages):
        messages = list(messages)
        for m in messages:
            crash(m, None)
        return push(messages)

    grid.push_messages = push_or_die
    with pytest.raises(Crash):
        server_app.run_federation(
            grid,
            FlowerRunConfig.from_run_config(cfg),
            echo=lambda _: None,
            poll_interval=0.0,
            secret=SECRET,
            roster=ROSTER,
            state=ServerState(folder),
        )
    saved = json.loads((folder / "server.json").read_text())
    assert saved["state"]["server"]["ledger"]["epsilons"][-1] == saved["epsilon"]  # round 2 charged, then the crash
    assert len(saved["state"]["server"]["ledger"]["epsilons"]) == 2
    coord, _, _, _ = deploy(cfg, state=ServerState(folder))  # a new Flower run: nodes start over
    assert [r.released for r in coord.logs] == [True, False, True] and coord.logs[1].reason == "unmask failed"
    assert coord.ledger.rounds == coord.server.server_ledger.rounds == 3


def test_a_secure_reply_carrying_omega_is_refused():
    cfg = FlowerRunConfig.from_run_config(RUN_CONFIG)
    obj = cfg.build_objective()
    c = Coordinator(cfg, obj.bounds, obj.dim)
    plan = c.plan()
    assert plan.omega_round == 1 and plan.coins is not None and plan.cohort_of(2)[1].shape == (2,)
    with pytest.raises(InvalidReply, match="sent ω in a secure round"):
        c.receive(1, c.fingerprint, torch.zeros(cfg.settings.num_features, dtype=torch.float64))


def test_a_node_never_reveals_both_secrets_of_one_node_nor_takes_stages_out_of_order():
    m, d = 2**16, 4
    clients = {100 + i: SecAggClient.setup(100 + i, 7, m, np.arange(d)) for i in range(3)}
    server = SecAggServer(7, {i: (c.pk1, c.pk2) for i, c in clients.items()}, d, m, 3, 2)
    req, _ = server.share_keys_requests()
    with pytest.raises(SecAggError, match="after stage"):
        clients[100].masked_vector(7, [], [])
    with pytest.raises(SecAggError, match="own public keys"):
        clients[101].share_keys(7, {100: req[100][100]}, 2)
    server.receive_shares({i: clients[i].share_keys(7, k, 2) for i, k in req.items() if i != 101})
    req = server.masked_vector_requests()
    clients[100].masked_vector(7, *req[100])
    with pytest.raises(SecAggError, match="after stage"):
        clients[100].unmask(7)  # before it signed a survivor set
    clients[100].consistency(7, [100, 102])  # 101 dropped before sharing: 100 holds no share of it
    owners, shares = clients[100].unmask(7)
    assert owners == [100, 102] and shares == [clients[100].seed_shares[100], clients[100].seed_shares[102]]
    with pytest.raises(SecAggError, match="after stage"):
        clients[100].unmask(7)  # once per round: no second set


def test_a_hostile_nodes_largest_shift_is_bounded_by_what_honest_sums_can_be(monkeypatch):
    """Before: the decoder clamped only to the worst case of every share at its truncation bound (±N·A): a
    node adding m/2 - 1 to its masked vector moved coordinates by ~N·A lattice units, 85 times the noise's
    std. Now by at most 2B per coordinate and 2R in norm (B, R: what an honest sum can be but for < 1e-30)."""
    m = _modulus()

    def tamper(msg, reply):
        if msg.metadata.message_type == "train.masked_vector" and msg.metadata.dst_node_id == 103:
            v = np.frombuffer(reply.content.config_records[SECAGG]["masked"], dtype="<i8")
            return Message(secagg_reply(masked=((v + m // 2 - 1) % m).astype("<i8").tobytes()), reply_to=msg)
        return reply

    cfg = dict(RUN_CONFIG, **{"num-rounds": 2})
    coord, _, _, rec = deploy(cfg, monkeypatch, tamper=tamper)
    mech = coord.mechanism
    W = coord.server.aggregator.weights(2)
    to_lattice = (mech.scale / mech.clip_norm) * coord.settings.sample_rate / float(W.max())
    honest = torch.stack([rec.vectors[(2, n)] for n in range(N)]).sum(0).to(torch.float64)  # node 3's true vector
    shift = rec.releases[1].reshape(-1) * to_lattice - honest
    assert coord.logs[1].secagg["out_of_range"] > 0  # flagged
    assert float(shift.abs().max()) <= 2 * mech.release_entry_bound + 1e-6
    assert float(shift.norm()) <= 2 * mech.release_norm_bound * (1 + 1e-9)
    assert float(shift.abs().max()) < mech.sum_bound / 2  # the old clamp let it reach about N·A


def test_epsilon_against_a_malicious_server_is_the_worst_case_and_reported(secure_run):
    """The worst case the protocol allows: every round asked, a sum of t vectors, nothing amplified."""
    (coord, _, lines, _), _ = secure_run
    cfg = FlowerRunConfig.from_run_config(RUN_CONFIG)
    mech = SecureMechanism.from_settings(cfg.settings, cfg.num_agents)
    t = cfg.secure_threshold()
    acc = DistributedDiscreteGaussianAccountant(mech.ddg_constants())
    for r, log in enumerate(coord.logs, start=1):
        z_t = math.sqrt(t * mech.local_variance) / mech.l2_sensitivity
        by_hand = get_epsilon(acc, cfg.ledger_delta, history=[(z_t, 1.0, r)])
        assert log.epsilon_malicious == pytest.approx(by_hand, rel=1e-12)
        assert log.epsilon_malicious >= log.epsilon_server  # t <= the survivors the honest ledger counts
    assert all("epsilon_malicious=" in line for line in lines if line.startswith("round ") and "released" in line)
    floor = PrivacyFloor(max_epsilon=1e9)
    assert floor.epsilon(cfg) == pytest.approx(
        max(worst_case_epsilons(mech, t, cfg.settings.sample_rate, cfg.num_rounds, cfg.ledger_delta)), rel=1e-12
    )
    assert worst_case_epsilons(mech, t, cfg.settings.sample_rate, cfg.num_rounds, cfg.ledger_delta)[0] == pytest.approx(
        coord.logs[-1].epsilon_malicious, rel=1e-12
    )
    with pytest.raises(SecAggError):
        SecAggClient.setup(1, 1, mech.modulus, np.zeros(2, dtype=np.int64)).consistency(1, [1])
