"""A server that deviates from SecAgg+ at will, against the real ClientApp handlers: attacks that must fail.

:class:`Adversary` plays the server: it builds the exchanges and the SecAgg+ stages itself (with the
protocol's own server object where it follows the protocol) and sends them to the nodes of an
in-process Grid (tests/flower_grid.py), whose nodes hold SuperNode keys and a roster like a deployment's.
"""

import math
import tempfile
from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flower_grid import InProcessGrid, node_identities
from flwr.app import Message
from test_flower_secagg import RUN_CONFIG

from fbo_torch.flower import client_app
from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.flower.coordinator import Coordinator
from fbo_torch.flower.records import reply_public_keys
from fbo_torch.flower.secagg import SecAggClient, SecAggServer
from fbo_torch.flower.secagg_records import AGENT_SECRET, SECAGG_STATE, parse_secagg, secagg_request
from fbo_torch.flower.server_app import _plan_content
from fbo_torch.utils.discrete_gaussian import WordStreams, discrete_gaussian

_KEYS = tempfile.TemporaryDirectory()
N = 5
PEM, SSH, NODE_CONFIGS = node_identities(_KEYS.name, N)
CONFIG5 = dict(RUN_CONFIG, **{"num-agents": N, "dropout-tolerance": 0.2})  # k_min = 4 of 5, t = 4
VICTIM = 0


class Adversary:
    """The server of a secure federation that sends what it likes: its exchanges carry the coins it chose."""

    def __init__(self, run_config, node_configs=NODE_CONFIGS):
        self.config = FlowerRunConfig.from_run_config(run_config)
        n = self.config.num_agents
        self.grid = InProcessGrid(client_app.app, run_config, n, node_configs=node_configs)
        self.secrets = {}
        objective = self.config.build_objective()
        self.coord = Coordinator(self.config, objective.bounds, objective.dim)
        self.mech = self.coord.mechanism
        self.plan = self.coord.plan()  # exchange 0: agents set up and send round 1's vectors
        self.nodes = sorted(self.grid.contexts)  # node 100 + n plays agent n

    def send(self, stage, payloads, group="0"):
        """``{node: reply}`` (a reply may be an error) to one message per node."""
        messages = [Message(c, dst_node_id=nid, message_type=stage, group_id=group) for nid, c in payloads.items()]
        ids = list(self.grid.push_messages(messages))
        node_of = dict(zip(ids, (m.metadata.dst_node_id for m in messages), strict=True))
        return {node_of[r.metadata.reply_to_message_id]: r for r in self.grid.pull_messages(ids)}

    def exchange(self, coins, round=0):
        """An exchange asking every node for round 1's vector with the given coins: the signed keys, or errors."""
        plan = replace(self.plan, round=round, coins=torch.tensor(coins))
        replies = self.send("train", {nid: _plan_content(plan, nid - 100) for nid in self.nodes})
        keys, errors = {}, {}
        for nid, rep in replies.items():
            if rep.has_error():
                errors[nid] = rep.error.reason
            else:
                keys[nid] = reply_public_keys(rep.content, nid - 100)
        return keys, errors

    def stage(self, name, payloads):
        replies = self.send(f"train.{name}", {nid: secagg_request(1, **p) for nid, p in payloads.items()})
        out, errors = {}, {}
        for nid, rep in replies.items():
            if rep.has_error():
                errors[nid] = rep.error.reason
            else:
                out[nid] = parse_secagg(f"{name}-reply", rep.content)
        return out, errors

    def share_keys(self, keys, threshold=None, substitute=None):
        """Stage 1 (``substitute``: ``{(receiver, owner): (pk1, pk2)}`` keys relayed in place of the owner's)."""
        server = SecAggServer(
            1,
            {nid: (a, b) for nid, (a, b, _) in keys.items()},
            self.mech.dim,
            self.mech.modulus,
            self.config.secagg_neighbours,
            threshold or self.config.secure_threshold(),
            agents={nid: nid - 100 for nid in keys},
            signatures={nid: sig for nid, (_, _, sig) in keys.items()},
        )
        requests, _ = server.share_keys_requests()
        payloads = {}
        for nid, ks in requests.items():
            ks = {j: (substitute or {}).get((nid, j), ks[j]) for j in ks}
            payloads[nid] = {
                "node-ids": list(ks),
                "agent-ids": [j - 100 for j in ks],
                "pk1": [ks[j][0] for j in ks],
                "pk2": [ks[j][1] for j in ks],
                "signatures": [server.signatures[j] for j in ks],
                "threshold": threshold or server.threshold,
            }
        replies, errors = self.stage("share_keys", payloads)
        server.receive_shares({n: (r["destinations"], r["ciphertexts"], r["commitment"]) for n, r in replies.items()})
        return server, errors

    def masked(self, server):
        replies, errors = self.stage(
            "masked_vector",
            {n: {"sources": s, "ciphertexts": c} for n, (s, c) in server.masked_vector_requests().items()},
        )
        server.receive_masked({n: np.frombuffer(r["masked"], dtype="<i8").astype(np.int64) for n, r in replies.items()})
        return errors

    def unmask(self, server, survivors_of=None):
        """Consistency (``survivors_of``: the set each node is told, default the true one), then unmask."""
        sets = server.consistency_requests()
        told = {nid: (survivors_of or {}).get(nid, surv) for nid, surv in sets.items()}
        replies, errors = self.stage("consistency", {n: {"survivors": s} for n, s in told.items()})
        signed = {n: (n - 100, r["signature"]) for n, r in replies.items()}
        replies, errors = self.stage(
            "unmask",
            {
                n: {
                    "signers": list(signed),
                    "signer-agents": [a for a, _ in signed.values()],
                    "signatures": [s for _, s in signed.values()],
                }
                for n in signed
            },
        )
        server.confirmations = {n: signed[n][1] for n in replies}
        total = server.unmask({n: (r["node-ids"], r["shares"]) for n, r in replies.items()}) if replies else None
        return total, errors


def _victim_signal(adv, coins):
    """The victim's noise-free lattice vector of round 1 (its sent vector minus its noise share)."""
    ctx = adv.grid.contexts[100 + VICTIM]
    secret = ctx.state.config_records[AGENT_SECRET]["secret"]
    state = SecAggClient.from_state(dict(ctx.state.config_records[SECAGG_STATE]))
    noise = discrete_gaussian(WordStreams([secret], ("secagg-noise", 1), adv.mech.dim), adv.mech.local_variance)
    return state.vector - noise.reshape(-1)


def test_a_replayed_round_is_refused_so_the_replay_attack_recovers_only_the_noisy_sum():
    """Before: the node's noise share and rounding coins depended only on (its secret, the round), and a node
    answered any number of exchanges for one round. Two SecAgg+ rounds for round 1 — the victim's coin up, then
    no coin up — subtracted to the victim's noise-free vector (error < 1 lattice unit against a noise std of
    thousands). Now the node answers round 1 once; the second exchange is refused by every node."""
    adv = Adversary(RUN_CONFIG)
    n = adv.config.num_agents
    coins = [a == VICTIM for a in range(n)]
    keys, errors = adv.exchange(coins)
    assert not errors and len(keys) == n
    signal = _victim_signal(adv, coins)
    server, _ = adv.share_keys(keys)
    adv.masked(server)
    total, errors = adv.unmask(server)
    assert not errors and total is not None
    first = adv.mech.decode(torch.from_numpy(total))[0].reshape(-1).numpy() * (adv.mech.scale / adv.mech.clip_norm)

    for round in (0, 1):  # the set-up exchange again, or the next exchange asking again for round 1
        keys, errors = adv.exchange([False] * n, round=round)
        assert not keys and len(errors) == n
        assert all("ReplayRefused" in why and "answers each round once" in why for why in errors.values())
    # what the attacker holds is the noisy sum: the victim's signal plus n noise shares (n σ² per entry)
    err = first - signal
    sigma = math.sqrt(n * adv.mech.local_variance)
    rms = float(np.sqrt(np.mean(err**2))) / sigma
    # RMS of d = 40 standard normals: 1 ± 0.11; the replay would have given < 1 / sigma ~ 1e-4
    assert 0.5 < rms < 1.5, rms


def test_a_round_past_the_last_is_refused():
    adv = Adversary(RUN_CONFIG)
    plan = replace(adv.plan, omega_round=adv.config.num_rounds + 1)
    replies = adv.send("train", {nid: _plan_content(plan, nid - 100) for nid in adv.nodes})
    assert all(r.has_error() and "ReplayRefused" in r.error.reason for r in replies.values())


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ({"secagg-threshold": 2}, "`secagg-threshold` = 2 with neighbourhoods of 5 nodes"),
        ({"dropout-tolerance": 0.6}, "`dropout-tolerance` = 0.6 lets a secure round release with 2 of 5"),
        ({"dropout-tolerance": 0.5, "num-agents": 4}, "with 2 of 4 agents"),
    ],
)
def test_thresholds_a_lying_server_could_exploit_are_refused(keys, says):
    """Before: `secagg-threshold = 2` (N = 5) or `dropout-tolerance = 0.5` were accepted; a server that told two
    nodes the victim survived and two others that it dropped got both of its secrets and its vector alone."""
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        FlowerRunConfig.from_run_config(dict(CONFIG5, **keys))


def test_a_node_refuses_a_threshold_of_half_its_neighbourhood_whatever_the_run_config():
    adv = Adversary(CONFIG5)
    keys, _ = adv.exchange([True] * N)
    _, errors = adv.share_keys(keys, threshold=2)
    assert len(errors) == N
    assert all("threshold 2 with 5 neighbours" in why for why in errors.values())


def test_a_substituted_or_invented_public_key_is_refused():
    """Before: SecAgg+ keys were not signed: a server could relay its own keys as the victim's to another node
    and read what that node shares with the victim (a man in the middle), or invent nodes."""
    adv = Adversary(CONFIG5)
    keys, _ = adv.exchange([True] * N)
    mine = SecAggClient.setup(999, 1, adv.mech.modulus, np.zeros(adv.mech.dim, dtype=np.int64))
    _, errors = adv.share_keys(keys, substitute={(101, 100): (mine.pk1, mine.pk2)})
    assert list(errors) == [101]
    assert "the public keys of node 100 are not signed by agent 0's roster key" in errors[101]


def test_a_server_telling_nodes_different_survivor_sets_gets_no_share():
    """Two sets each need a majority of the agents' signatures, and a node signs one set per round: nodes told
    a set fewer than a majority confirmed reveal nothing, so the victim's seed and key are never both revealed."""
    adv = Adversary(CONFIG5)
    keys, _ = adv.exchange([True] * N)
    server, _ = adv.share_keys(keys)
    adv.masked(server)
    everyone = server.survivors
    without_victim = [n for n in everyone if n != 100 + VICTIM]
    told = {101: everyone, 102: everyone, 103: without_victim, 104: without_victim}  # the victim: everyone
    total, errors = adv.unmask(server, told)
    assert total is None and len(errors) == N  # nobody reveals: 3 and 2 signatures, 3 needed each
    assert all("confirmed the survivor set" in why for why in errors.values())


def test_with_one_survivor_set_the_round_unmasks_the_sum_and_nothing_else():
    adv = Adversary(CONFIG5)
    keys, _ = adv.exchange([True] * N)
    server, _ = adv.share_keys(keys)
    adv.masked(server)
    total, errors = adv.unmask(server)
    assert not errors
    states = [dict(c.state.config_records[SECAGG_STATE]) for c in adv.grid.contexts.values()]
    assert all(
        SecAggClient.from_state(s).vector.size == 0 for s in states
    )  # each node revealed once and dropped its vector


def test_a_node_without_an_identity_refuses_secure_rounds_unless_its_owner_trusts_the_server():
    adv = Adversary(RUN_CONFIG, node_configs={})
    keys, errors = adv.exchange([True] * 4)
    assert not keys and all("IdentityError" in why and "secagg.private-key" in why for why in errors.values())
    adv = Adversary(RUN_CONFIG, node_configs={n: {"secagg.trust-server": "true"} for n in range(4)})
    keys, errors = adv.exchange([True] * 4)
    assert not errors and all(sig == b"" for _, _, sig in keys.values())


def test_a_round_between_nodes_with_flowers_64_bit_node_ids_signs_and_checks():
    """Flower's node ids are unsigned 64-bit (>= 2**63 half the time): statements must encode them."""
    from fbo_torch.flower.identity import NodeIdentity

    ids = {2**64 - 1 - n: n for n in range(3)}
    who = {nid: NodeIdentity.from_node_config(NODE_CONFIGS[a], a) for nid, a in ids.items()}
    m, d = 2**16, 4
    clients = {
        nid: SecAggClient.setup(nid, 1, m, np.full(d, a), agent_id=a, federation="f", num_agents=N, identity=who[nid])
        for nid, a in ids.items()
    }
    server = SecAggServer(
        1,
        {i: (c.pk1, c.pk2) for i, c in clients.items()},
        d,
        m,
        3,
        2,
        agents=ids,
        signatures={i: c.signature for i, c in clients.items()},
    )
    req, _ = server.share_keys_requests()
    server.receive_shares({i: clients[i].share_keys(1, k, 2, ids, server.signatures, who[i]) for i, k in req.items()})
    server.receive_masked({i: clients[i].masked_vector(1, *r) for i, r in server.masked_vector_requests().items()})
    server.receive_consistency(
        {i: clients[i].consistency(1, s, who[i]) for i, s in server.consistency_requests().items()}
    )
    replies = {i: clients[i].unmask(1, sigs, who[i]) for i, sigs in server.unmask_requests().items()}
    assert np.array_equal(server.unmask(replies), np.full(d, 0 + 1 + 2))
