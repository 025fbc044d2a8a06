"""Attacks on a deployed federation that must fail, and defects that must not come back.

Each test plays an attacker (or an accident) against the ServerApp's loop over
an in-process Grid (tests/flower_grid.py): Flower's messages, records and node
states, without a SuperLink.
"""

import json
import math
import os

import pytest
import torch

pytest.importorskip("flwr")

from flower_grid import InProcessGrid
from flwr.app import ArrayRecord, ConfigRecord, Message
from test_flower import RUN_CONFIG, SECRET, N, simulate

from fbo_torch.federation import clip_vectors
from fbo_torch.flower import client_app, client_round, server_app
from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.flower.coordinator import Coordinator
from fbo_torch.flower.records import OMEGA, REPLY, records_to_plan
from fbo_torch.flower.server_state import ServerState, ServerStateError
from fbo_torch.protocol.randomness import KeyedServerRandomness

CFG = FlowerRunConfig.from_run_config(RUN_CONFIG)


def _watch(server):
    """Record, for every release, the broadcast, what went in (ω, reported) and the mechanism's record."""
    out, release = [], server.release

    def wrapped(omegas, reported=None, num_valid=None):
        b = release(omegas, reported=reported, num_valid=num_valid)
        if b is not None:
            out.append((b.clone(), omegas.clone(), server.last_record, server.rounds[-1].round))
        return b

    server.release = wrapped
    return out


def _run(
    run_config=RUN_CONFIG, client=client_app.app, num_nodes=N, secret=None, state=None, on_push=None, **grid_kwargs
):
    cfg = FlowerRunConfig.from_run_config(run_config)
    seen, init = [], Coordinator.__init__

    def init_and_watch(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen.append(_watch(self.server))

    grid = InProcessGrid(client, run_config, num_nodes, **grid_kwargs)
    if on_push is not None:
        push = grid.push_messages
        grid.push_messages = lambda msgs: push([on_push([m]) or m for m in msgs])
    lines = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Coordinator, "__init__", init_and_watch)
        coord = server_app.run_federation(grid, cfg, echo=lines.append, poll_interval=0.0, secret=secret, state=state)
    return coord, seen[0], lines, grid


# ------------------------------------------------------------------ the noise is the server's alone
def test_an_agent_holding_the_run_config_cannot_remove_the_noise_or_learn_the_sample(tmp_path):
    """The attack: an agent derives the server's streams from the run config's seed, recomputes the noise
    and subtracts it (before: it recovered the noise-free aggregate to 1e-16 and the exact sample)."""
    pushed = []
    summary_path = tmp_path / "summary.json"
    cfg = dict(RUN_CONFIG, **{"summary-path": str(summary_path)})
    coord, releases, lines, grid = _run(run_config=cfg, state=ServerState(tmp_path / "server"), on_push=pushed.extend)
    server = coord.server
    guess = KeyedServerRandomness(CFG.federation_key())  # everything an agent knows
    like = torch.zeros((), dtype=torch.float64)
    q, S, z = CFG.settings.sample_rate, CFG.settings.clip_norm, CFG.settings.noise_multiplier
    same_sample = 0
    for broadcast, omegas, rec, t in releases:
        W = server.aggregator.weights(t)
        P = W.shape[0]
        noise_std = z * float(W.max()) * S / q
        clipped, _ = clip_vectors(torch.where(rec.valid.unsqueeze(-1), omegas, 0.0), S / math.sqrt(P))
        signal = (W @ (clipped * rec.sampled.unsqueeze(-1)))[0] / q  # the noise-free aggregate
        estimate = broadcast[0] - noise_std * guess.normals(t, torch.Size([1, broadcast[0].numel()]), like).view(P, -1)
        # what is left is the server's real noise minus the guess: of size noise_std * sqrt(2) per entry
        err = (estimate - signal).pow(2).mean().sqrt().item()
        assert err > 0.5 * noise_std, (t, err, noise_std)
        guessed_sample = guess.coins(t, torch.Size([1, N]), like) < q
        same_sample += bool(torch.equal(guessed_sample, rec.sampled))
    # each coin guessed right with probability q^2 + (1 - q)^2 = 0.625: all 12 with probability 0.0036
    assert same_sample < len(releases)
    # the secret the server drew is in no message, no agent's run config, no log line and no summary;
    # it is only in the server's own state file (0600)
    secret = coord.server.randomness._secret
    words = [secret, secret.hex().encode()]
    for msg in pushed:
        blob = json.dumps({k: str(dict(v)) for k, v in msg.content.config_records.items()}).encode()
        blob += b"".join(a.data for rec_ in msg.content.array_records.values() for a in rec_.values())
        assert not any(w in blob for w in words)
    for ctx in grid.contexts.values():
        assert not any(w in json.dumps(ctx.run_config).encode() for w in words)
    assert not any(secret.hex() in line for line in lines) and secret.hex() not in summary_path.read_text()
    state_file = tmp_path / "server" / "server.json"
    assert secret.hex() in state_file.read_text() and state_file.stat().st_mode & 0o777 == 0o600
    assert len(pushed) == N * (CFG.num_rounds + 1)


def test_two_deployments_of_one_run_config_release_different_noise():
    (_, a, _, _), (_, b, _, _) = _run(), _run()
    assert len(a) == len(b) == CFG.num_rounds
    for (ba, *_), (bb, *_) in zip(a, b, strict=True):
        assert not torch.equal(ba, bb)
    # and two coordinators given the same messages release different broadcasts
    obj = CFG.build_objective()
    c1, c2 = Coordinator(CFG, obj.bounds, obj.dim), Coordinator(CFG, obj.bounds, obj.dim)
    omega = torch.ones(CFG.settings.num_features, dtype=torch.float64)
    for c in (c1, c2):
        c.plan()
        for n in range(N):
            c.receive(n, c.fingerprint, omega)
    p1, p2 = c1.plan(), c2.plan()
    assert p1.broadcast is not None and not torch.equal(p1.broadcast, p2.broadcast)


def test_the_server_secret_given_server_side_reproduces_the_simulator_bit_for_bit(tmp_path):
    """A deployment is reproduced in the simulator from its server's own state: the secret in server.json."""
    folder = tmp_path / "server"
    coord, releases, _, _ = _run(state=ServerState(folder))
    secret = bytes.fromhex(json.loads((folder / "server.json").read_text())["secret"])
    runner, sim = simulate(RUN_CONFIG, secret)
    assert len(sim) == len(releases) == CFG.num_rounds
    for (b, *_), s in zip(releases, sim, strict=True):
        assert torch.equal(b, s)
    assert [r.epsilon for r in coord.logs] == runner.epsilons


# ------------------------------------------------------------------ bad replies harm only their sender
def _hostile(kind, agent=1):
    """A ClientApp whose agent ``agent`` sends a bad reply of ``kind``; the others are honest."""

    def app(msg, ctx):
        reply = client_app.app(msg, ctx)
        if ctx.node_config["partition-id"] != agent or reply.has_error():
            return reply
        c = reply.content
        omega = c.array_records[OMEGA].to_torch_state_dict()["omega"] if OMEGA in c.array_records else None
        if kind == "nan" and omega is not None:
            omega = omega.clone()
            omega[2] = math.nan
            c[OMEGA] = ArrayRecord({"omega": omega})
        elif kind == "inf" and omega is not None:
            c[OMEGA] = ArrayRecord({"omega": torch.full_like(omega, math.inf)})
        elif kind == "shape" and omega is not None:
            c[OMEGA] = ArrayRecord({"omega": torch.zeros(omega.numel() + 1, dtype=torch.float64)})
        elif kind == "dtype" and omega is not None:
            c[OMEGA] = ArrayRecord({"omega": omega.to(torch.float32)})
        elif kind == "extra" and omega is not None:
            c[OMEGA] = ArrayRecord({"omega": omega, "more": omega})
        elif kind == "no-reply-record":
            del c[REPLY]
        elif kind == "agent-id-text":
            c[REPLY] = ConfigRecord({"agent-id": "one", "fingerprint": c.config_records[REPLY]["fingerprint"]})
        elif kind == "agent-id-out-of-range":
            c[REPLY] = ConfigRecord({"agent-id": 10**6, "fingerprint": c.config_records[REPLY]["fingerprint"]})
        elif kind == "no-omega" and omega is not None:
            del c[OMEGA]
        return Message(c, reply_to=msg)

    return app


@pytest.mark.parametrize(
    "kind",
    ["nan", "inf", "shape", "dtype", "extra", "no-omega", "no-reply-record", "agent-id-text", "agent-id-out-of-range"],
)
def test_a_bad_reply_is_left_out_and_the_server_runs_to_the_end(kind):
    """Before: a NaN made every broadcast entry NaN (and was charged as 'reported 4/4'); a missing record or a
    non-integer agent-id raised outside the server's try (the ServerApp died without a summary)."""
    runner, _ = simulate(RUN_CONFIG)
    coord, releases, lines, _ = _run(client=_hostile(kind))
    assert coord.done and len(releases) == CFG.num_rounds
    assert all(torch.isfinite(b).all() for b, *_ in releases)
    assert [r.num_reported for r in coord.logs] == [N - 1] * CFG.num_rounds  # agent 1's ω never entered
    assert all(not rec.sampled[0, 1] for *_, rec, _ in releases)
    assert [r.epsilon for r in coord.logs] == runner.epsilons  # left out like a dropout: the same accounting
    assert sum(r.num_invalid for r in coord.logs) >= CFG.num_rounds
    assert any("invalid reply left out" in line for line in lines)
    if kind not in ("no-reply-record", "agent-id-text", "agent-id-out-of-range"):
        assert coord.invalid == {1: CFG.num_rounds}  # counted against its sender
    summary = server_app.summary(coord)
    assert summary["rounds"][-1]["num_invalid"] >= 1


def test_a_reply_flower_cannot_rebuild_costs_only_its_node_the_round():
    """A hostile node's reply whose objects do not inflate makes Flower's batch pull raise (before: out of
    the ServerApp, in every round after each restart). Its node is left out; the others' replies are kept."""
    grid = InProcessGrid(client_app.app, RUN_CONFIG, N)
    pull = grid.pull_messages
    bad = set()

    def pulling(ids):
        ids = list(ids)
        if any(i in bad for i in ids):
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return pull(ids)

    push = grid.push_messages

    def pushing(msgs):
        msgs = list(msgs)
        ids = push(msgs)
        bad.update(i for i, m in zip(ids, msgs, strict=True) if m.metadata.dst_node_id == 102)  # agent 2's node
        return ids

    grid.pull_messages, grid.push_messages = pulling, pushing
    lines = []
    coord = server_app.run_federation(grid, CFG, echo=lines.append, poll_interval=0.0, secret=SECRET)
    assert coord.done and [r.num_reported for r in coord.logs] == [N - 1] * CFG.num_rounds
    assert sum("unreadable reply left out" in line for line in lines) == CFG.num_rounds + 1
    assert coord.invalid == {} or set(coord.invalid) <= {2}  # counted against agent 2 once it is known


def test_without_a_roster_a_node_plays_only_the_agent_it_first_claimed():
    """Before: a node could claim agent 1, then agent 2, and the honest node of agent 2 was ignored for good."""

    def fickle(msg, ctx):
        reply = client_app.app(msg, ctx)
        if ctx.node_id == 100 and msg.metadata.group_id != "0":  # agent 1 in exchange 0, then it claims agent 2
            fp = reply.content.config_records[REPLY]["fingerprint"]
            reply.content[REPLY] = ConfigRecord({"agent-id": 2, "fingerprint": fp})
        return reply

    grid = InProcessGrid(fickle, RUN_CONFIG, N)
    grid.contexts[100].node_config["partition-id"] = 1
    grid.contexts[101].node_config["partition-id"] = 0  # the honest nodes: agents 0, 2, 3
    lines = []
    coord = server_app.run_federation(grid, CFG, echo=lines.append, poll_interval=0.0, secret=SECRET)
    assert any("node 100 plays agent 1 but claims agent 2" in line for line in lines)
    # agent 2's own node (102) is never ignored: rounds 2 and 3 have the honest agents 0, 2, 3 (round 1's
    # vectors came with exchange 0, when node 100 still spoke for agent 1)
    assert [r.num_reported for r in coord.logs] == [N, N - 1, N - 1]
    assert coord.invalid == {1: CFG.num_rounds}
    assert not any("node 102 claims agent 2" in line for line in lines)


def test_run_config_values_are_what_they_say_or_refused():
    assert FlowerRunConfig.from_run_config({"secure-mode": "false"}).secure_mode is False
    with pytest.raises(ValueError, match="`secure-mode` must be true or false, got 'on-ish'"):
        FlowerRunConfig.from_run_config({"secure-mode": "on-ish"})  # before: silently False
    with pytest.raises(ValueError, match="`num-agents` must be an integer"):
        FlowerRunConfig.from_run_config({"num-agents": 4.5})
    with pytest.raises(ValueError, match=r"unknown run config key\(s\) \['settings'\]"):
        FlowerRunConfig.from_run_config(dict(RUN_CONFIG, settings=json.dumps({"noise_multiplier": 0.0})))
    with pytest.raises(ValueError, match="`faults` must be a JSON object"):
        FlowerRunConfig.from_run_config({"faults": "[1]"})
    with pytest.raises(ValueError, match="`clip-norm` is required when `noise-multiplier` > 0"):
        FlowerRunConfig.from_run_config({"noise-multiplier": 1.0})


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("round-timeout", -1.0, "`round-timeout` must be a finite number of seconds > 0"),
        ("round-timeout", math.nan, "`round-timeout` must be a finite number of seconds > 0"),
        ("min-nodes-timeout", -1.0, "`min-nodes-timeout` must be a finite number of seconds >= 0"),
        ("seed", 2**64, r"`seed` must be an integer in \[0, 2\^63\)"),
    ],
)
def test_run_config_timeouts_and_seeds_out_of_range_are_refused(key, value, says):
    """Before: negative or NaN timeouts were accepted, and a seed >= 2^64 ran with the streams of seed mod 2^64."""
    with pytest.raises(ValueError, match=says):
        FlowerRunConfig.from_run_config(dict(RUN_CONFIG, **{key: value}))


def test_impossible_metrics_and_a_device_omega_are_invalid_replies():
    """Before: the server took best-value = inf and num-observations = 2**80, and an ω on the meta device
    raised RuntimeError (out of the reply's check) instead of InvalidReply."""
    from fbo_torch.flower.coordinator import InvalidReply

    obj = CFG.build_objective()
    coord = Coordinator(CFG, obj.bounds, obj.dim)
    coord.plan()
    M = CFG.settings.num_features
    omega = torch.zeros(M, dtype=torch.float64)
    most = CFG.settings.num_init + CFG.num_rounds
    for kwargs, says in (
        (dict(best_value=math.inf), "best value inf is not a finite number"),
        (dict(num_observations=2**80), f"observation count {2**80} is not an integer in 0..{most}"),
        (dict(num_observations=most + 1), "is not an integer in"),
        (dict(omega=torch.zeros(M, dtype=torch.float64, device="meta")), "on device 'meta'"),
    ):
        with pytest.raises(InvalidReply, match=says):
            coord.receive(0, coord.fingerprint, **{"omega": omega, **kwargs})
    coord.receive(0, coord.fingerprint, omega, best_value=0.5, num_observations=most)


def test_no_connected_node_means_no_release_and_no_epsilon():
    """Before: with zero nodes the server released pure noise every round and charged ε for it."""
    coord, releases, lines, _ = _run(num_nodes=0)
    assert releases == [] and coord.ledger.rounds == 0 and coord.epsilon == 0.0
    assert [(r.released, r.reason) for r in coord.logs] == [(False, "no valid message")] * CFG.num_rounds
    assert all("released=False (no valid message)" in line for line in lines if line.startswith("round "))


# ------------------------------------------------------------------ a durable ledger
class Crash(Exception):
    pass


def _crash_at(t, run_config=RUN_CONFIG):
    """A grid whose network dies when the server sends exchange ``t``."""
    grid = InProcessGrid(client_app.app, run_config, N)
    push = grid.push_messages

    def pushing(messages):
        messages = list(messages)
        if messages and int(messages[0].metadata.group_id) == t:
            raise Crash(f"the server died sending exchange {t}")
        return push(messages)

    grid.push_messages = pushing
    return grid


def test_a_crashed_server_resumes_its_ledger_and_never_under_reports(tmp_path):
    """Before: the ledger lived in memory: after a crash the agents held round 2's broadcast while the last
    ε logged was round 1's, and a restart began a fresh ledger at 0 with the same noise."""
    runner, sim = simulate(RUN_CONFIG)
    folder = tmp_path / "server"
    with pytest.raises(Crash):
        server_app.run_federation(
            _crash_at(2), CFG, echo=lambda _: None, poll_interval=0.0, secret=SECRET, state=ServerState(folder)
        )
    saved = json.loads((folder / "server.json").read_text())
    # round 2's broadcast was written, with its ε, before it was sent
    assert saved["epsilon"] == runner.epsilons[1] and saved["state"]["plan"]["round"] == 2
    assert torch.equal(torch.tensor(saved["state"]["plan"]["broadcast"], dtype=torch.float64), sim[1][0])
    assert (folder / "server.json").stat().st_mode & 0o777 == 0o600
    # a restarted server (a new Flower run: the nodes start over) resumes and re-sends exchange 2 unchanged
    coord, releases, lines, grid = _run(state=ServerState(folder))
    assert "resumed at round 2" in lines[0]
    assert [r.epsilon for r in coord.logs] == runner.epsilons and coord.ledger.rounds == CFG.num_rounds
    assert [t for *_, t in releases] == [3]  # round 2 was re-sent as written; only round 3 was drawn
    assert json.loads((folder / "server.json").read_text())["finished"] is True
    # the finished federation cannot run again on this folder
    with pytest.raises(ServerStateError, match="already finished"):
        _run(state=ServerState(folder))


def test_a_state_folder_that_does_not_verify_or_belongs_elsewhere_is_refused(tmp_path):
    folder = tmp_path / "server"
    with pytest.raises(Crash):
        server_app.run_federation(_crash_at(3), CFG, echo=lambda _: None, poll_interval=0.0, state=ServerState(folder))
    path = folder / "server.json"
    good = path.read_text()
    journal = _journal(folder).read_text() if _journal(folder).exists() else None

    def lower(saved):
        ledger = saved["state"]["server"]["ledger"]
        ledger["epsilons"] = [e / 10 for e in ledger["epsilons"]]

    _rewrite(folder, lower)  # the journal rewritten to match, as the server's own user could
    with pytest.raises(ServerStateError, match="does not verify"):
        _run(state=ServerState(folder))
    path.write_text(good)
    if journal is not None:
        _journal(folder).write_text(journal)
    other = dict(RUN_CONFIG, **{"num-rounds": 5})
    with pytest.raises(ServerStateError, match="another federation"):
        _run(run_config=other, state=ServerState(folder))
    path.write_text("{not json")
    with pytest.raises(ServerStateError, match="unreadable"):
        _run(state=ServerState(folder))


def _journal(folder):
    return folder.parent / f"{folder.name}.journal"


def _rewrite(folder, edit):
    """Edit ``server.json`` with ``edit(data)``, and rewrite its release journal to match (where there is one)
    as a journal of that state alone, as someone who can write both could."""
    path = folder / "server.json"
    data = json.loads(path.read_text())
    edit(data)
    journal = _journal(folder)
    if journal.exists() and data.get("journal") is not None:
        from fbo_torch.flower.server_state import ReleaseJournal

        data["journal"] = ReleaseJournal.next_entry(
            None, data["federation"], data["state"], data["finished"], data["epsilon"], bytes.fromhex(data["secret"])
        )
        journal.write_text(json.dumps(data["journal"], sort_keys=True, separators=(",", ":")) + "\n")
    path.write_text(json.dumps(data))


def _crashed(t, folder, run_config=RUN_CONFIG):
    """A federation whose server died sending exchange ``t``, its state in ``folder``."""
    with pytest.raises(Crash):
        server_app.run_federation(
            _crash_at(t, run_config),
            FlowerRunConfig.from_run_config(run_config),
            echo=lambda _: None,
            poll_interval=0.0,
            state=ServerState(folder),
        )


def _resume(folder, run_config=RUN_CONFIG):
    return _run(run_config=run_config, state=ServerState(folder))[0]


@pytest.mark.parametrize("edit", ["delta", "noise-multiplier"])
def test_a_state_edited_to_other_privacy_parameters_is_refused(tmp_path, edit):
    """Before: a server.json edited consistently (δ 1e-5 -> 0.2, or z 1.0 -> 5.0, the ε list recomputed) was
    accepted on restart and reported ε 2.23 or 1.12 instead of 7.92."""
    from fbo_torch.privacy import PrivacyLedger

    folder = tmp_path / "server"
    _crashed(3, folder)
    z, q = CFG.settings.noise_multiplier, CFG.settings.sample_rate
    delta, z_new = (0.2, z) if edit == "delta" else (CFG.ledger_delta, 5.0)

    def forge(saved):
        server = saved["state"]["server"]
        ledger = PrivacyLedger(CFG.privacy.accountant, delta=delta)
        eps = [ledger.record(z_new, q) for _ in server["ledger"]["epsilons"]]
        assert eps[-1] < saved["epsilon"]
        server["ledger"] = dict(ledger.state_dict(), num_agents=N)
        server.get("mechanism", {}).update(delta=delta, noise_multiplier=z_new)
        for r, e in zip(server["rounds"], eps, strict=True):
            r["epsilon"] = e
        saved["epsilon"] = eps[-1]

    _rewrite(folder, forge)
    with pytest.raises(ServerStateError, match="does not verify.*(delta|noise_multiplier)"):
        _resume(folder)


@pytest.mark.parametrize("budget", [1e9, None])
def test_the_run_configs_budget_bounds_a_resumed_run_whatever_the_state_says(tmp_path, budget):
    """Before: the ledger's `max_epsilon` in server.json (raised to 1e9 or None) replaced the run config's."""
    runner, _ = simulate(RUN_CONFIG)
    eps1, eps2, eps3 = runner.epsilons
    capped = dict(RUN_CONFIG, **{"max-epsilon": (eps2 + eps3) / 2})
    folder = tmp_path / "server"
    _crashed(1, folder, capped)
    _rewrite(folder, lambda saved: saved["state"]["server"]["ledger"].update(max_epsilon=budget))
    coord = _resume(folder, capped)
    assert coord.ledger.max_epsilon == (eps2 + eps3) / 2 and coord.epsilon == pytest.approx(eps2)
    assert [(r.released, r.reason) for r in coord.logs][-1] == (False, "budget")


def test_a_rolled_back_state_is_refused(tmp_path):
    """Before: a server.json copied back from an earlier exchange was accepted (ε 4.38 instead of 7.92)."""
    import shutil

    folder = tmp_path / "server"
    _crashed(1, folder)
    early = (folder / "server.json").read_text()
    backup = tmp_path / "backup"
    shutil.copytree(folder, backup)
    with pytest.raises(Crash):  # the restarted server gets to exchange 3 before it dies again
        server_app.run_federation(_crash_at(3), CFG, echo=lambda _: None, poll_interval=0.0, state=ServerState(folder))
    late = (folder / "server.json").read_text()
    (folder / "server.json").write_text(early)
    (folder / "server.json").chmod(0o600)
    with pytest.raises(ServerStateError, match="not the last state this server wrote.*exchange 3"):
        _resume(folder)
    shutil.rmtree(folder)
    shutil.copytree(backup, folder)  # a restored backup of the whole folder
    with pytest.raises(ServerStateError, match="rolled back, restored from a backup"):
        _resume(folder)
    (folder / "server.json").write_text(late)  # the latest state resumes
    assert _resume(folder).ledger.rounds == CFG.num_rounds


def test_a_state_without_rounds_never_brings_back_its_secret(tmp_path):
    """Before: a server.json whose "state" was null was a new federation with the old secret: round 1 was
    released again with the same noise and coins (two broadcasts 1.196 apart, against ~9.4 for fresh noise)."""
    folder = tmp_path / "server"
    _crashed(2, folder)
    old = json.loads((folder / "server.json").read_text())["secret"]

    saved = json.loads((folder / "server.json").read_text())
    (folder / "server.json").write_text(json.dumps(dict(saved, state=None, journal=None)))
    with pytest.raises(ServerStateError, match="empty, but the release journal .* records exchange 2"):
        _resume(folder)
    (folder / "server.json").unlink()  # a lost file: the same
    with pytest.raises(ServerStateError, match="missing, but the release journal"):
        _resume(folder)
    _journal(folder).unlink(missing_ok=True)  # nothing says anything was sent: a new federation, a new secret
    coord = _resume(folder)
    assert coord.ledger.rounds == CFG.num_rounds
    assert json.loads((folder / "server.json").read_text())["secret"] != old


# ------------------------------------------------------------------ code named in a run config
def test_a_run_config_cannot_make_nodes_or_the_server_import_code_they_did_not_allow(tmp_path, monkeypatch):
    """Before: `objective: {"type": "module:Class"}` in the run config, which the server sends to every node, was
    imported by every node and the server: the module's top-level code ran (it wrote a file)."""
    import sys

    from flwr.app import RecordDict

    marker = tmp_path / "ran"
    (tmp_path / "fbo_test_planted.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from fbo_torch.objectives.synthetic import GPSampleGridFederation as Planted\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("FBO_ALLOW_OBJECTIVES", raising=False)
    name = "fbo_test_planted:Planted"
    planted = dict(RUN_CONFIG, objective=json.dumps(dict(json.loads(RUN_CONFIG["objective"]), type=name)))
    cfg = FlowerRunConfig.from_run_config(planted)
    grid = InProcessGrid(client_app.app, planted, N)
    with pytest.raises(ValueError, match="allow-objectives"):
        server_app.run_federation(grid, cfg, echo=lambda _: None, poll_interval=0.0)
    with pytest.raises(ValueError, match="names 'fbo_test_planted:Planted'.*allow-objectives"):
        client_round.handle_round(grid.create_message(RecordDict(), "train", 100, "0"), grid.contexts[100])
    assert not marker.exists() and "fbo_test_planted" not in sys.modules
    # what a node's own configuration allows, it runs (here: the server's environment and every node's config)
    monkeypatch.setenv("FBO_ALLOW_OBJECTIVES", f"other.module:Thing, {name}")
    for ctx in grid.contexts.values():
        ctx.node_config["allow-objectives"] = name
    coord = server_app.run_federation(grid, cfg, echo=lambda _: None, poll_interval=0.0)
    assert coord.done and [r.num_reported for r in coord.logs] == [N] * CFG.num_rounds and marker.exists()


# ------------------------------------------------------------------ who plays which agent
def _keys(n):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    keys = [ec.generate_private_key(ec.SECP384R1()).public_key() for _ in range(n)]
    pem = [k.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo) for k in keys]
    ssh = [k.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode() for k in keys]
    return pem, ssh


def test_with_a_roster_an_agent_is_the_node_holding_its_key_and_no_one_else():
    """Before: any SuperNode could claim any partition-id; the first claim won (a rogue that connects first
    takes the agent's place) and the run config and every broadcast went to whoever connected."""
    from fbo_torch.flower.roster import AgentRoster

    pem, ssh = _keys(N + 1)
    roster = AgentRoster({n: ssh[n] for n in range(N)}, N)
    # nodes 100..103 hold keys 0..3; node 103 claims agent 1 (another's partition id); node 104 has a key
    # that is not on the roster and claims agent 0
    grid_keys = {n: pem[n] for n in range(N)} | {N: pem[N]}
    grid = InProcessGrid(client_app.app, RUN_CONFIG, N + 1, node_keys=grid_keys)
    grid.contexts[103].node_config["partition-id"] = 1
    grid.contexts[104].node_config["partition-id"] = 0
    contacted = []
    push = grid.push_messages
    grid.push_messages = lambda msgs: push([contacted.append(m.metadata.dst_node_id) or m for m in msgs])
    lines = []
    coord = server_app.run_federation(grid, CFG, echo=lines.append, poll_interval=0.0, secret=SECRET, roster=roster)
    assert 104 not in contacted and coord.refused_nodes == {104: "its key is not on the agent roster"}
    assert [r.num_reported for r in coord.logs] == [N - 1] * CFG.num_rounds  # agent 3's node lied: left out
    assert coord.invalid == {3: CFG.num_rounds + 1}  # every reply of node 103 counts against agent 3's key
    assert sum("holds agent 3's key but claims agent 1" in line for line in lines) == CFG.num_rounds + 1
    assert not any("no agent roster" in line for line in lines)
    # the roster refuses what it cannot bind
    with pytest.raises(ValueError, match="same key"):
        AgentRoster({0: ssh[0], 1: ssh[0]})
    with pytest.raises(ValueError, match="agent 1's key is not a public key"):
        AgentRoster({0: ssh[0], 1: "ssh-rsa garbage"})
    with pytest.raises(ValueError, match="outside 0..3"):
        AgentRoster({7: ssh[0]}, N)


def test_without_a_roster_the_server_says_agents_are_whoever_claims_them():
    _, _, lines, _ = _run()
    assert any("no agent roster" in line and "FBO_AGENT_ROSTER" in line for line in lines)


# ------------------------------------------------------------------ safe defaults
def test_agents_send_no_best_value_unless_asked_and_large_deltas_are_refused():
    assert FlowerRunConfig().report_best is False
    quiet = {k: v for k, v in RUN_CONFIG.items() if k != "report-best"}
    coord, *_ = _run(run_config=quiet)
    assert all(r.best_values == {} for r in coord.logs) and all(r.num_observations for r in coord.logs)
    assert FlowerRunConfig().ledger_delta == 1e-5
    with pytest.raises(ValueError, match="allow-large-delta"):
        FlowerRunConfig.from_run_config(dict(RUN_CONFIG, delta=0.3))
    allowed = FlowerRunConfig.from_run_config(dict(RUN_CONFIG, **{"delta": 0.3, "allow-large-delta": True}))
    obj = allowed.build_objective()
    with pytest.warns(UserWarning, match="one agent's data in full"):
        Coordinator(allowed, obj.bounds, obj.dim)


def test_an_agent_refuses_a_malformed_plan():
    from flwr.app import RecordDict

    from fbo_torch.flower.records import BROADCAST, plan_to_records

    obj = CFG.build_objective()
    coord = Coordinator(CFG, obj.bounds, obj.dim)
    plan = coord.plan()
    content = plan_to_records(plan)
    assert records_to_plan(content).round == 0
    bad = RecordDict()
    for k in list(content.keys()):
        bad[k] = content[k]
    bad[BROADCAST] = ArrayRecord(
        {
            "broadcast": torch.full((2, CFG.settings.num_features), math.nan, dtype=torch.float64),
            "region-bounds": plan.region_bounds,
        }
    )
    with pytest.raises(ValueError, match="broadcast"):
        records_to_plan(bad)


def test_an_agent_without_a_feature_map_refuses_a_broadcast():
    """A TS agent sent a broadcast (its fingerprint ``""`` matches a server's without a feature map) refuses
    it with the reason, before touching its state (before: an AttributeError inside ``broadcast_points``)."""
    from fbo_torch.flower.agent_node import AgentNode

    node = AgentNode(FlowerRunConfig.from_run_config(dict(RUN_CONFIG, method="ts")), 0)
    M = CFG.settings.num_features
    broadcast, region_bounds = torch.zeros(2, M, dtype=torch.float64), torch.zeros(2, 2, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match="without a shared feature map"):
        node.step(1, 0.5, broadcast, region_bounds, 0)
    assert node.round == 0
    assert node.step(1, 0.5, None, None, 0).num_observations == CFG.settings.num_init + 1


def test_the_server_state_folder_is_server_side_per_federation_and_held_by_one_server(tmp_path, monkeypatch):
    monkeypatch.delenv("FBO_SERVER_STATE", raising=False)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))
    a = ServerState.for_federation(CFG.fingerprint())
    other = FlowerRunConfig.from_run_config(dict(RUN_CONFIG, seed=4))
    assert a.folder == tmp_path / "flwr" / "fbo_torch" / "server" / CFG.fingerprint()[:16]
    assert ServerState.for_federation(other.fingerprint()).folder != a.folder
    assert a.folder.stat().st_mode & 0o777 == 0o700
    # what does not change the federation (timeouts, where the summary goes) does not change the folder
    quick = FlowerRunConfig.from_run_config(dict(RUN_CONFIG, **{"round-timeout": 1.0, "summary-path": "x.json"}))
    assert quick.fingerprint() == CFG.fingerprint()
    monkeypatch.setenv("FBO_SERVER_STATE", str(tmp_path / "mine"))
    assert ServerState.for_federation(CFG.fingerprint()).folder == tmp_path / "mine"
    # the secret is drawn with the federation's record, in one 0600 file
    secret, saved = a.open(CFG.fingerprint())
    assert saved is None and len(secret) == 32 and (a.folder / "server.json").stat().st_mode & 0o777 == 0o600
    # a second server on the same folder would release other data with the same noise: refused while held
    with pytest.raises(ServerStateError, match="in use by another server process"):
        ServerState(a.folder).open(CFG.fingerprint())
    a.release()
    b = ServerState(a.folder)
    again, _ = b.open(CFG.fingerprint())
    assert again != secret  # nothing was sent with it, but a secret is never taken back from a state without rounds
    b.save(CFG.fingerprint(), again, {"round": 0})  # a state with rounds keeps its secret
    b.release()
    with pytest.raises(ServerStateError, match="another secret"):
        ServerState(a.folder).open(CFG.fingerprint(), bytes(32))
    c = ServerState(a.folder)
    assert c.open(CFG.fingerprint()) == (again, {"round": 0})
    c.release()


def test_a_second_server_on_a_folder_in_use_is_refused_and_the_first_runs_on(tmp_path):
    folder = tmp_path / "server"
    obj = CFG.build_objective()
    first = Coordinator(CFG, obj.bounds, obj.dim, state=ServerState(folder))
    with pytest.raises(ServerStateError, match="in use"):
        Coordinator(CFG, obj.bounds, obj.dim, state=ServerState(folder))
    first.plan()
    first.close()


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_a_state_folder_or_file_others_could_replace_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(ServerStateError, match="mode 777"):
        ServerState(shared)
    real = tmp_path / "real"
    ServerState(real)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ServerStateError, match="symbolic link"):
        ServerState(tmp_path / "link")
    state = ServerState(real)
    state.open(CFG.fingerprint())
    state.release()
    (real / "server.json").chmod(0o644)
    with pytest.raises(ServerStateError, match="mode 644"):
        ServerState(real).open(CFG.fingerprint())


def test_the_attack_script_reports_every_attack_failing(tmp_path):
    """benchmarks/attacks.py (what the closing notes quote) reports the outcomes these tests assert."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "attacks.py"
    spec = importlib.util.spec_from_file_location("attacks", path)
    attacks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(attacks)
    assert attacks.main(["--json", str(tmp_path / "a.json")]) == 0
    out = json.loads((tmp_path / "a.json").read_text())["attacks"]
    assert out["noise"]["error_over_noise_std"] > 0.5 and out["same-config"]["identical_broadcasts"] is False
    assert out["nan"]["non_finite_broadcast_entries"] == 0 and out["malformed"]["raises"] == "InvalidReply"
    assert out["no-node"] == {"releases": 0, "epsilon": 0.0} and out["forged-ledger"]["accepted"] is False
    assert out["large-delta"]["accepted"] is False and out["report-best"]["sent_by_default"] is False
