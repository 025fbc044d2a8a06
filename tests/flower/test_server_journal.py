"""The release journal against a hostile disk: it proves forward progress, commits to the secret, and records
one federation, held by one server."""

import json

import pytest

pytest.importorskip("flwr")

from test_flower import RUN_CONFIG
from test_flower_security import CFG, Crash, _crash_at, _journal, _resume

from fbo_torch.flower import server_app
from fbo_torch.flower.server_state import ReleaseJournal, ServerState, ServerStateError, secret_commitment


def _crashed_at_1_then_3(tmp_path):
    """A federation that crashed sending exchange 1, was restarted and crashed again sending exchange 3: its
    folder, and the state it had written after exchange 1."""
    folder = tmp_path / "server"
    with pytest.raises(Crash):
        server_app.run_federation(_crash_at(1), CFG, echo=lambda _: None, poll_interval=0.0, state=ServerState(folder))
    early = json.loads((folder / "server.json").read_text())
    with pytest.raises(Crash):
        server_app.run_federation(_crash_at(3), CFG, echo=lambda _: None, poll_interval=0.0, state=ServerState(folder))
    return folder, early


def _as_crash_entry(folder, data):
    """``data`` (a server.json) with an entry that chains to the journal's last one, as if the server had
    crashed between writing it and appending its entry — forged by someone who can write the folder."""
    last = ReleaseJournal(_journal(folder)).entries()[-1]
    data = dict(data)
    data["journal"] = ReleaseJournal.next_entry(
        last, data["federation"], data["state"], data["finished"], data["epsilon"], bytes.fromhex(data["secret"])
    )
    return data


def _write(folder, data):
    (folder / "server.json").write_text(json.dumps(data))
    (folder / "server.json").chmod(0o600)


def test_a_rolled_back_state_with_a_forged_crash_entry_is_refused(tmp_path):
    """Before: the state after release 1 plus a forged "crash" entry (in server.json, or appended to the
    append-only journal) was accepted: ε 4.38 reported where 7.92 was true, round 2 re-released with its noise."""
    folder, early = _crashed_at_1_then_3(tmp_path)
    late = json.loads((folder / "server.json").read_text())
    forged = _as_crash_entry(folder, early)
    _write(folder, forged)
    with pytest.raises(ServerStateError, match="not the last state this server wrote.*exchange 3, 3 release"):
        _resume(folder)
    with open(_journal(folder), "a") as journal:  # the same entry appended: the journal no longer proves progress
        journal.write(json.dumps(forged["journal"], sort_keys=True, separators=(",", ":")) + "\n")
    with pytest.raises(ServerStateError, match="entry 5 is malformed or does not follow.*moves a counter back"):
        _resume(folder)
    lines = _journal(folder).read_text().splitlines()
    _journal(folder).write_text("\n".join(lines[:-1]) + "\n")
    _write(folder, late)
    assert _resume(folder).ledger.rounds == CFG.num_rounds  # the true last state resumes


def test_a_state_whose_secret_was_replaced_is_refused(tmp_path):
    """Before: server.json with its secret replaced by a known one was accepted, and every later release's
    noise came from the attacker's secret."""
    folder, _ = _crashed_at_1_then_3(tmp_path)
    data = json.loads((folder / "server.json").read_text())
    known = bytes(range(32))
    _write(folder, dict(data, secret=known.hex()))
    with pytest.raises(ServerStateError, match="not the last state this server wrote"):
        _resume(folder)
    _write(folder, _as_crash_entry(folder, dict(data, secret=known.hex())))  # a "crash" entry committing to it
    with pytest.raises(ServerStateError, match="not the last state this server wrote"):
        _resume(folder)
    entries = ReleaseJournal(_journal(folder)).entries()
    assert {e["secret"] for e in entries} == {secret_commitment(bytes.fromhex(data["secret"]))}


def test_two_federations_cannot_share_one_journal(tmp_path, monkeypatch):
    """Before: two federations on one FBO_SERVER_JOURNAL broke its chain silently at save time, and both were
    refused at restart ("entry 3 is malformed")."""
    shared = tmp_path / "shared.journal"
    monkeypatch.setenv("FBO_SERVER_JOURNAL", str(shared))
    first = ServerState(tmp_path / "a")
    first.open(CFG.fingerprint())
    held = ServerState(tmp_path / "b")
    with pytest.raises(ServerStateError, match="shared.journal is in use by another server"):
        held.open("another federation")  # while the first runs
    first.release()
    folder = tmp_path / "a2"
    with pytest.raises(Crash):
        server_app.run_federation(_crash_at(2), CFG, echo=lambda _: None, poll_interval=0.0, state=ServerState(folder))
    other = dict(RUN_CONFIG, **{"num-rounds": 4})
    with pytest.raises(ServerStateError, match=r"records federation [0-9a-f]{16}, not this run's .* one federation"):
        _resume(tmp_path / "c", other)  # after it: refused, and the first federation's chain is intact
    assert _resume(folder).ledger.rounds == CFG.num_rounds
