"""Output folders and resume: fingerprints, refusals, locks, atomic writes."""

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from fbo_torch.cli import main
from fbo_torch.experiments import outdir
from fbo_torch.experiments.config import load_config
from fbo_torch.experiments.outdir import OutputError, OutputFolder, fingerprint
from fbo_torch.experiments.report import write_json

DP = """
experiment: dp_fts_de
name: tiny-dp
seed: 3
checkpoint_every: 1
objective: {type: gp_grid, num_groups: 1, agents_per_group: 4, grid_size: 50, perturb_first: true}
runs: {num_inits: 2}
privacy: {accountant: rdp-classic, extra_accountants: [rdp]}
defaults: {num_iterations: 4, num_init: 2, num_features: 10, gp_refit_every: 0}
methods:
  - {name: TS, algorithm: ts, num_iterations: 2}
  - {name: DP-FTS-DE, algorithm: fts_de, num_regions: 2, sample_rate: 0.5, noise_multiplier: 1.0, clip_norm: 5.0}
  - {name: secure, algorithm: fts_de, num_regions: 2, sample_rate: 0.5, noise_multiplier: 1.0, clip_norm: 5.0,
     aggregation: secure}
"""

FTS = """
experiment: fts
name: tiny-fts
objective: {type: gp_grid, num_groups: 1, agents_per_group: 3, grid_size: 50}
runs: {num_inits: 1}
history: {t_n: 4}
defaults: {num_iterations: 2, num_features: 10, gp_refit_every: 0}
methods:
  - {name: TS, algorithm: ts}
"""


def _cfg(tmp_path, text=DP, name="cfg.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _run(*args):
    return main(["run", *map(str, args), "--no-progress"])


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished tiny DP run (copied by the tests that change it)."""
    tmp = tmp_path_factory.mktemp("finished")
    cfg = _cfg(tmp)
    out = tmp / "out"
    assert _run(cfg, "--out", out) == 0
    return tmp, cfg, out


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    "old, new, extra, named",
    [
        ("noise_multiplier: 1.0", "noise_multiplier: 2.0", [], "noise_multiplier ('tiny-dp', 'DP-FTS-DE'): 1.0 -> 2.0"),
        ("seed: 3", "seed: 4", [], "seed: 3 -> 4"),
        ("num_iterations: 4", "num_iterations: 5", [], "num_iterations ('tiny-dp', 'DP-FTS-DE'): 4 -> 5"),
        ("", "", ["--seeds", "3"], "runs.num_inits ('tiny-dp'): 2 -> 3"),
        ("accountant: rdp-classic", "accountant: rdp", [], 'privacy.accountant: "rdp-classic" -> "rdp"'),
    ],
)
def test_resume_with_a_changed_config_is_refused_and_names_the_key(finished, tmp_path, capsys, old, new, extra, named):
    _, cfg, src = finished
    out = _copy(src, tmp_path / "out")
    before = (out / "results.json").read_text()
    changed = _cfg(tmp_path, DP.replace(old, new), "changed.yaml")
    capsys.readouterr()
    assert _run(changed, "--out", out, "--resume", *extra) == 2
    err = capsys.readouterr().err
    assert "--resume refused" in err and named in err, err
    assert (out / "results.json").read_text() == before  # nothing was run or rewritten


def test_resume_into_another_experiments_folder_is_refused(finished, tmp_path, capsys):
    _, _, src = finished
    out = _copy(src, tmp_path / "out")
    capsys.readouterr()
    assert _run(_cfg(tmp_path, FTS, "fts.yaml"), "--out", out, "--resume") == 2
    err = capsys.readouterr().err
    assert 'experiment: "dp_fts_de" -> "fts"' in err and 'name: "tiny-dp" -> "tiny-fts"' in err


def test_fingerprint_is_stamped_everywhere_and_stable(finished, tmp_path):
    _, cfg, out = finished
    res = json.loads((out / "results.json").read_text())
    manifest = json.loads((out / "run.json").read_text())
    resolved = load_config(cfg).resolved()
    expected = fingerprint(resolved)
    assert res["fingerprint"] == manifest["fingerprint"] == expected and len(expected) == 64
    assert res["fbo_torch_version"] == manifest["fbo_torch_version"]
    for ckpt in (out / "checkpoints").glob("*.pt"):
        assert torch.load(ckpt, weights_only=False)["fingerprint"] == expected
    # the same config read again, checkpoint frequency and 1 vs 1.0 do not change it
    assert fingerprint(load_config(cfg).resolved()) == expected
    other = _cfg(
        tmp_path, DP.replace("checkpoint_every: 1", "checkpoint_every: 7").replace("clip_norm: 5.0", "clip_norm: 5")
    )
    assert fingerprint(load_config(other).resolved()) == expected
    assert fingerprint({**resolved, "device": "cuda"}) != expected


def test_resume_of_the_same_config_is_accepted_and_bit_identical(finished, tmp_path):
    _, cfg, src = finished
    out = _copy(src, tmp_path / "out")
    assert _run(cfg, "--out", out, "--resume") == 0
    a = json.loads((src / "results.json").read_text())["scenarios"][0]["methods"]
    b = json.loads((out / "results.json").read_text())["scenarios"][0]["methods"]
    assert [m["runs"] for m in a] == [m["runs"] for m in b] and a[1]["epsilon"] == b[1]["epsilon"]


@pytest.mark.parametrize("kind", ["dp_fts_de", "fts"])
def test_a_runs_resolved_config_runs_it_again_bit_for_bit(finished, tmp_path, kind):
    """What a run records as its configuration (``config.resolved.yaml``) is a config file that
    re-runs it: same curves, same ε."""
    if kind == "dp_fts_de":
        _, _, src = finished
    else:
        src = tmp_path / "fts"
        assert _run(_cfg(tmp_path, FTS, "fts.yaml"), "--out", src) == 0
    out = tmp_path / "again"
    assert _run(src / "config.resolved.yaml", "--out", out) == 0
    a = json.loads((src / "results.json").read_text())
    b = json.loads((out / "results.json").read_text())
    assert a["fingerprint"] == b["fingerprint"]
    for m, n in zip(a["scenarios"][0]["methods"], b["scenarios"][0]["methods"], strict=True):
        assert m["runs"] == n["runs"] and m.get("epsilon") == n.get("epsilon"), m["name"]


def test_interrupted_run_resumes_bit_identically_with_exact_epsilon(finished, tmp_path, monkeypatch):
    _, cfg, src = finished
    out = tmp_path / "out"
    from fbo_torch.experiments.checkpoints import Checkpoints

    saves = []
    real = Checkpoints.save

    def save_then_die(self, path, state):  # killed right after the 2nd checkpoint of the secure DP method
        real(self, path, state)
        saves.append(path.name)
        if saves.count("scenario0_method2.pt") == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(Checkpoints, "save", save_then_die)
    assert _run(cfg, "--out", out) == 130  # Ctrl-C: a one-line message, not a traceback
    monkeypatch.setattr(Checkpoints, "save", real)
    state = torch.load(out / "checkpoints" / "scenario0_method2.pt", weights_only=False)
    assert state["runner"]["t"] == 2 and len(state["runner"]["server"]["rounds"]) == 2  # mid-run, not finished
    assert _run(cfg, "--out", out, "--resume") == 0
    for i in (1, 2):  # the central DP method, and the secure one with its two ledgers
        a = json.loads((src / "results.json").read_text())["scenarios"][0]["methods"][i]
        b = json.loads((out / "results.json").read_text())["scenarios"][0]["methods"][i]
        assert a["runs"] == b["runs"] and a["epsilon"] == b["epsilon"] and a["released"] == b["released"]
        assert a["epsilon_server"] == b["epsilon_server"]


def test_a_secure_method_reports_both_epsilons(finished):
    _, _, src = finished
    methods = json.loads((src / "results.json").read_text())["scenarios"][0]["methods"]
    central, secure = methods[1], methods[2]
    assert (central["aggregation"], central["epsilon_server"]) == ("central", None)
    assert secure["aggregation"] == "secure" and secure["accountant"] == "ddg"
    assert len(secure["epsilon_server"]) == 4 and secure["epsilon_server_final"] > 0
    assert secure["epsilon_other_accountants"] == {}  # the central accountants do not describe it
    assert "eps(others)=" in (src / "summary.txt").read_text()


def test_truncated_checkpoint_is_named_with_what_to_do(finished, tmp_path, capsys, monkeypatch):
    _, cfg, src = finished
    out = _copy(src, tmp_path / "out")
    (out / "checkpoints" / "scenario0_method0.pt").unlink()  # TS would have to run again first
    ckpt = out / "checkpoints" / "scenario0_method1.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    import fbo_torch.experiments.loop as loop

    monkeypatch.setattr(loop, "build_objective", lambda spec, **kwargs: pytest.fail("work started"))
    capsys.readouterr()
    assert _run(cfg, "--out", out, "--resume") == 2
    err = capsys.readouterr().err
    assert str(ckpt) in err and "truncated or corrupt" in err and "delete that file" in err
    assert "Traceback" not in err


def test_corrupt_manifest_is_named(finished, tmp_path, capsys):
    _, cfg, src = finished
    out = _copy(src, tmp_path / "out")
    (out / "run.json").write_text('{"fingerpr')
    capsys.readouterr()
    assert _run(cfg, "--out", out, "--resume") == 2
    assert str(out / "run.json") in capsys.readouterr().err


def test_non_empty_out_needs_resume_or_overwrite_and_overwrite_clears(finished, tmp_path, capsys):
    _, cfg, src = finished
    out = _copy(src, tmp_path / "out")
    before = (out / "results.json").read_text()
    capsys.readouterr()
    assert _run(_cfg(tmp_path, FTS, "fts.yaml"), "--out", out) == 2
    err = capsys.readouterr().err
    assert "is not empty" in err and "--resume" in err and "--overwrite" in err
    assert (out / "results.json").read_text() == before
    # --overwrite deletes the old files, so the DP run's epsilon.png does not outlive it
    assert _run(_cfg(tmp_path, FTS, "fts.yaml"), "--out", out, "--overwrite") == 0
    assert not (out / "epsilon.png").exists() and not (out / "privacy_utility.png").exists()
    assert json.loads((out / "results.json").read_text())["experiment"] == "fts"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["scenario0_method0.pt"]


def test_overwrite_refuses_a_folder_no_run_wrote(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    assert _run(_cfg(tmp_path, FTS), "--out", out, "--overwrite") == 2
    assert "only clears folders an fbo-torch run wrote" in capsys.readouterr().err
    assert (out / "thesis.tex").read_text() == "precious"
    assert _run(_cfg(tmp_path, FTS), "--out", out, "--resume") == 2  # nothing to check the config against
    assert "no run.json" in capsys.readouterr().err
    # without a flag: not told to --overwrite (or --resume) a folder no run wrote, such as `--out /`
    assert _run(_cfg(tmp_path, FTS), "--out", out) == 2
    err = capsys.readouterr().err
    assert "holds files that no fbo-torch run wrote (thesis.tex)" in err and "choose an empty or new folder" in err
    assert "--overwrite" not in err and "--resume" not in err


def test_resume_and_overwrite_exclude_each_other(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", _cfg(tmp_path, FTS), "--out", str(tmp_path / "o"), "--resume", "--overwrite"])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_unusable_out_is_a_one_line_error_before_any_work(tmp_path, capsys, monkeypatch):
    import fbo_torch.experiments.loop as loop

    monkeypatch.setattr(loop, "build_objective", lambda spec, **kwargs: pytest.fail("work started"))
    a_file = tmp_path / "results"
    a_file.write_text("x")
    cfg = _cfg(tmp_path, FTS)
    for out, says in ((a_file, "is a file, not a folder"), (a_file / "sub", "cannot create the folder")):
        capsys.readouterr()
        assert _run(cfg, "--out", out) == 2
        captured = capsys.readouterr()
        assert says in captured.err and len(captured.err.strip().splitlines()) == 1
        assert "# resolved config" not in captured.out
    if os.geteuid() != 0:  # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert _run(cfg, "--out", ro) == 2
        assert "no permission" in capsys.readouterr().err


HOLD_LOCK = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, str(os.getpid()).encode())
    print("locked", flush=True)
    time.sleep(120)
""")


def test_second_run_into_a_locked_out_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        cfg = _cfg(tmp_path, FTS)
        assert _run(cfg, "--out", out) == 2
        err = capsys.readouterr().err
        assert "in use by another fbo-torch run" in err and f"pid {holder.pid}" in err
        assert not (out / "results.json").exists()
        with pytest.raises(OutputError, match="in use"):
            OutputFolder(out, resume=True).open()
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: the kernel released its lock; the stale .lock alone does not make the folder "used"
    assert _run(cfg, "--out", out) == 0 and (out / "results.json").is_file()


def test_lock_is_held_for_the_run_and_released_after(tmp_path):
    out = tmp_path / "out"
    with OutputFolder(out), pytest.raises(OutputError, match="in use"):
        OutputFolder(out).open()
    with OutputFolder(out):  # released
        pass


def test_writes_are_atomic(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    write_json(path, {"a": 1})

    def crash(src, dst, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(outdir.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temporary file left behind


def test_report_redraws_a_finished_run_but_not_while_one_runs(finished, tmp_path, capsys):
    _, _, src = finished
    out = _copy(src, tmp_path / "out")
    (out / "epsilon.png").unlink()
    assert main(["report", str(out)]) == 0 and (out / "epsilon.png").is_file()
    with OutputFolder(out, resume=True):  # a run holds the folder
        assert main(["report", str(out)]) == 2
    assert "in use by another fbo-torch run" in capsys.readouterr().err
    (out / "results.json").write_text('{"scenarios": [')
    assert main(["report", str(out)]) == 2
    assert "results.json is unreadable or incomplete" in capsys.readouterr().err


# ------------------------------------------------------------ nothing lost on disk


def _mine(out):
    """A user's files in an output folder: what --overwrite must keep."""
    (out / "src").mkdir()
    (out / "src" / "main.py").write_text("print('mine')")
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main")
    (out / "notes.txt").write_text("precious")
    (out / "checkpoints" / "mine.txt").write_text("also mine")
    return ["src/main.py", ".git/HEAD", "notes.txt", "checkpoints/mine.txt"]


def test_overwrite_deletes_only_the_files_runs_wrote(finished, tmp_path, capsys):
    _, cfg, src = finished
    out = _copy(src, tmp_path / "out")
    listed = json.loads((out / "run.json").read_text())["files"]
    assert {"run.json", "results.json", "checkpoints/", "epsilon.png", "summary.txt"} <= set(listed)
    mine = _mine(out)
    (out / "checkpoints" / ".scenario0_method1.pt.x1y2.tmp").write_bytes(b"cut short by a kill")
    capsys.readouterr()
    assert _run(_cfg(tmp_path, FTS, "fts.yaml"), "--out", out, "--overwrite") == 0
    said = capsys.readouterr().out
    assert "--overwrite: deleted" in said and "kept 4 it did not write: .git/, checkpoints/, notes.txt, src/" in said
    assert [(out / m).read_text() for m in mine] == ["print('mine')", "ref: refs/heads/main", "precious", "also mine"]
    assert not (out / "epsilon.png").exists() and not (out / "privacy_utility.png").exists()
    # a temporary file cut short by a kill does not hold what the run recorded: kept, like the user's
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        ".scenario0_method1.pt.x1y2.tmp",
        "mine.txt",
        "scenario0_method0.pt",
    ]
    files = json.loads((out / "run.json").read_text())["files"]
    assert not set(files) & {"notes.txt", "src/main.py", "checkpoints/mine.txt", "epsilon.png"}


def test_overwrite_deletes_only_files_that_hold_what_the_run_wrote(finished, tmp_path):
    """Before: a run.json whose file list was forged to name src/ and .git/ made --overwrite delete them."""
    _, _, src = finished
    out = _copy(src, tmp_path / "out")
    mine = _mine(out)
    manifest = json.loads((out / "run.json").read_text())
    forged = ["src/main.py", ".git/HEAD", "notes.txt", "src/", ".git/"]
    manifest["files"] = sorted(manifest["files"] + forged)
    manifest["written"]["notes.txt"] = {"size": 8, "sha256": "0" * 64}  # a made-up record does not match
    (out / "run.json").write_text(json.dumps(manifest))
    (out / "summary.txt").write_text("edited by the user")  # no longer what the run wrote: kept
    with OutputFolder(out, overwrite=True) as folder:
        assert "results.json" in folder.deleted and not set(forged) & set(folder.deleted)
    assert [(out / m).read_text() for m in mine] == ["print('mine')", "ref: refs/heads/main", "precious", "also mine"]
    assert (out / "summary.txt").read_text() == "edited by the user" and not (out / "results.json").exists()


def test_overwrite_never_writes_over_a_file_it_kept(finished, tmp_path, capsys):
    """Before: an edited summary.txt was kept by --overwrite ("kept 2 it did not write: ..., summary.txt") and
    then written over by the new run. Each file the run wrote, edited in turn, survives --overwrite: the run is
    refused with one line and deletes nothing."""
    _, cfg, src = finished
    written = [f for f in json.loads((src / "run.json").read_text())["files"] if not f.endswith("/")]
    assert {"summary.txt", "results.csv", "epsilon.png", "config.resolved.yaml", "run.json"} <= set(written)
    assert any(f.startswith("checkpoints/") for f in written)
    for i, name in enumerate(written):
        out = _copy(src, tmp_path / f"out{i}")
        with open(out / name, "ab") as f:
            f.write(b"\nmy note\n")
        edited = (out / name).read_bytes()
        results = (out / "results.json").read_bytes()
        capsys.readouterr()
        assert _run(cfg, "--out", out, "--overwrite") == 2, name
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "nothing was deleted" in err, (name, err)
        assert (out / name).read_bytes() == edited, name
        if name != "results.json":
            assert (out / "results.json").read_bytes() == results, name
    # a file of yours that no run wrote but whose name the run writes: the same
    out = _copy(src, tmp_path / "foreign")
    (out / "epsilon.png").unlink()
    (out / "epsilon.svg").write_text("my drawing")
    assert _run(cfg, "--out", out, "--overwrite", "--plot-format", "png,svg") == 2
    assert "epsilon.svg" in capsys.readouterr().err and (out / "epsilon.svg").read_text() == "my drawing"
    # what --overwrite kept is never written over, even by a write the run's plan did not foresee
    out = _copy(src, tmp_path / "guard")
    (out / "notes.txt").write_text("mine")
    with OutputFolder(out, overwrite=True) as folder:
        assert "notes.txt" in folder.kept
        with pytest.raises(OutputError, match="notes.txt was kept by --overwrite"):
            outdir.atomic_write_text(out / "notes.txt", "the run's")
    assert (out / "notes.txt").read_text() == "mine"


def test_a_file_holding_its_previous_recorded_contents_counts_as_written(tmp_path):
    """A run killed between recording a write in run.json and finishing it leaves the earlier contents: still
    the run's, so --overwrite deletes it (and does not refuse the folder as if the user had edited it)."""
    out = tmp_path / "out"
    with OutputFolder(out) as folder:
        folder.write_manifest({"experiment": "fts"})
        outdir.atomic_write_text(out / "summary.txt", "first")
        folder.record(out / "summary.txt", data=b"second")  # recorded, then killed before the write
    folder = OutputFolder(out, overwrite=True).open(create=False)
    try:
        folder.refuse_overwriting({"summary.txt"})  # the run writes a summary.txt: not refused
        folder.open()
    finally:
        folder.close()
    assert "summary.txt" in folder.deleted and not (out / "summary.txt").exists()


def _linked_checkpoints(src, tmp_path):
    """A copy of a finished run whose checkpoints/ is a symbolic link to a folder outside it."""
    import shutil

    out = _copy(src, tmp_path / "out")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "scenario0_method0.pt").write_text("not the run's")
    shutil.rmtree(out / "checkpoints")
    (out / "checkpoints").symlink_to(elsewhere)
    return out, elsewhere


def test_nothing_is_written_through_a_link_inside_out(finished, tmp_path):
    """Before: a checkpoints/ inside --out replaced by a symbolic link made the run overwrite a file outside."""
    out, elsewhere = _linked_checkpoints(finished[2], tmp_path)
    with OutputFolder(out, resume=True) as folder:
        with pytest.raises(OutputError, match="checkpoints inside it is a symbolic link"):
            outdir.atomic_write_bytes(out / "checkpoints" / "scenario0_method0.pt", b"overwritten")
        with pytest.raises(OutputError, match="checkpoints inside it is a symbolic link"):
            folder.make_dir("checkpoints")
    assert [p.name for p in elsewhere.iterdir()] == ["scenario0_method0.pt"]
    assert (elsewhere / "scenario0_method0.pt").read_text() == "not the run's"
    (out / ".lock").unlink()
    (out / ".lock").symlink_to(elsewhere / "scenario0_method0.pt")  # the pid is not written through it either
    with pytest.raises(OutputError, match="cannot create the lock file"):
        OutputFolder(out, resume=True).open()
    assert (elsewhere / "scenario0_method0.pt").read_text() == "not the run's"


def test_a_refused_out_is_left_as_it_was_and_tilde_is_home(tmp_path, monkeypatch, capsys):
    """Before: a refused --out ($HOME, /) was left with a .lock in it; --out '~' made a folder named '~'."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path, FTS)
    for flags in ((), ("--overwrite",), ("--resume",)):
        assert _run(cfg, "--out", "~", *flags) == 2
        assert str(home) in capsys.readouterr().err
        assert sorted(p.name for p in home.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "~").exists()
    assert _run(cfg, "--out", "~/runs/a") == 0 and (home / "runs" / "a" / "results.json").is_file()


@pytest.mark.parametrize(
    "files, says",
    [
        (None, "does not list the files its run wrote"),  # run.json of an older fbo_torch
        (["results.json", "../victim.txt"], "which is not a file inside"),
        ("results.json", "is not a list of names"),
    ],
)
def test_overwrite_deletes_nothing_it_cannot_prove_a_run_wrote(finished, tmp_path, files, says):
    _, _, src = finished
    out = _copy(src, tmp_path / "out")
    (tmp_path / "victim.txt").write_text("outside")
    manifest = json.loads((out / "run.json").read_text())
    if files is None:
        del manifest["files"]
    else:
        manifest["files"] = files
    (out / "run.json").write_text(json.dumps(manifest))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(OutputError, match=says) as err:
        OutputFolder(out, overwrite=True).open()
    assert "nothing was deleted" in str(err.value) or "deletes nothing" in str(err.value)
    assert len(str(err.value).splitlines()) == 1
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert (tmp_path / "victim.txt").read_text() == "outside"


def test_overwrite_does_not_follow_a_linked_folder(finished, tmp_path):
    out, elsewhere = _linked_checkpoints(finished[2], tmp_path)
    with OutputFolder(out, overwrite=True) as folder:
        assert "checkpoints/" in folder.kept and "results.json" not in folder.kept
    assert (elsewhere / "scenario0_method0.pt").read_text() == "not the run's"


def _fail_fsync(monkeypatch, name, code):
    """os.fsync fails with ``code`` while a temporary file of ``name`` is written (disk full, ...)."""
    real = os.fsync

    def fsync(fd):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(f".{name}."):
            raise OSError(code, os.strerror(code))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.parametrize(
    "name, code",
    [
        ("results.json", errno.ENOSPC),
        ("scenario0_method0.pt", errno.EACCES),
        ("simple_regret.png", errno.EROFS),
    ],
)
def test_a_failed_write_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch, name, code):
    cfg = _cfg(tmp_path, FTS)
    out = tmp_path / "out"
    _fail_fsync(monkeypatch, name, code)
    assert _run(cfg, "--out", out) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    target = out / "checkpoints" / name if name.endswith(".pt") else out / name
    assert f"cannot write {target}: {os.strerror(code)} ({errno.errorcode[code]})" in err, err
    assert f"resume with: fbo-torch run {cfg} --out {out} --resume" in err
    assert not list(out.rglob("*.tmp"))  # no temporary file left behind
    if code == errno.ENOSPC:  # space freed: the run resumes from its intact checkpoints
        monkeypatch.undo()
        assert _run(cfg, "--out", out, "--resume") == 0


def test_ctrl_c_prints_one_line_and_exits_130_with_valid_checkpoints(tmp_path):
    import signal
    import time

    from fbo_torch.experiments.checkpoints import Checkpoints

    cfg = _cfg(tmp_path, DP.replace("num_iterations: 2", "num_iterations: 400"))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # the run starts as from a terminal, with Ctrl-C's default action: an ignored SIGINT (left by a
    # library in this pytest worker, or by a shell that started the suite in the background) is
    # inherited across exec, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen(
        [sys.executable, "-m", "fbo_torch.cli", "run", cfg, "--out", str(out), "--no-progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        while not (out / "checkpoints" / "scenario0_method0.pt").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [f"interrupted; resume with: fbo-torch run {cfg} --out {out} --resume"], err
    resolved = load_config(cfg).resolved()
    with OutputFolder(out, resume=True) as folder:  # what --resume checks first: all accepted
        folder.check_resume(resolved)
        Checkpoints(out / "checkpoints", fingerprint(resolved), resume=True).verify_all()


def test_interrupt_before_anything_is_written_says_so(tmp_path, capsys, monkeypatch):
    import fbo_torch.experiments.loop as loop

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "build_objective", interrupted)
    out = tmp_path / "out"
    assert _run(_cfg(tmp_path, FTS), "--out", out) == 130
    assert (
        capsys.readouterr().err.strip() == f"interrupted; nothing was written to {out}; run the same command "
        "again to start"
    )
    assert not out.exists()


@pytest.fixture
def umask():
    """Set the process umask for a test (restored after)."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


def test_files_respect_the_umask_unless_a_mode_is_given(tmp_path, umask, monkeypatch):
    path = tmp_path / "f"
    for mask, expected in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664), (0o000, 0o666)):
        umask(mask)
        assert outdir.current_umask() == mask and outdir.current_umask() == mask  # read, not changed
        write_json(path, {"a": 1})
        assert path.stat().st_mode & 0o777 == expected, oct(mask)
    for mask, mode in ((0o000, 0o600), (0o077, 0o640)):  # an explicit mode, exactly
        umask(mask)
        outdir.atomic_write_text(path, "secret", mode=mode)
        assert path.stat().st_mode & 0o777 == mode and path.read_text() == "secret"

    def no_proc(*args, **kwargs):  # no /proc: read by setting and restoring the umask
        raise OSError("no /proc")

    monkeypatch.setattr(outdir, "open", no_proc, raising=False)
    umask(0o027)
    assert outdir.current_umask() == 0o027 and outdir.current_umask() == 0o027


def test_a_run_writes_its_files_with_the_umask(tmp_path, umask):
    umask(0o027)
    out = tmp_path / "out"
    assert _run(_cfg(tmp_path, FTS), "--out", out) == 0
    modes = {p.relative_to(out).as_posix(): p.stat().st_mode & 0o777 for p in out.rglob("*")}
    assert modes["results.json"] == modes["run.json"] == modes["checkpoints/scenario0_method0.pt"] == 0o640
    assert modes["simple_regret.png"] == modes["results.csv"] == modes["summary.txt"] == modes[".lock"] == 0o640
    assert modes["checkpoints"] == 0o750


def test_a_memory_budget_chunks_agents_without_changing_results_and_a_resume_may_change_it(finished, tmp_path):
    _, cfg, src = finished
    out = tmp_path / "chunked"
    assert _run(cfg, "--out", out, "--max-memory", "1") == 0  # chunks of two agents
    a = json.loads((src / "results.json").read_text())["scenarios"][0]["methods"]
    b = json.loads((out / "results.json").read_text())["scenarios"][0]["methods"]
    assert [m["runs"] for m in a] == [m["runs"] for m in b] and a[1]["epsilon"] == b[1]["epsilon"]
    again = _copy(src, tmp_path / "again")
    assert _run(cfg, "--out", again, "--resume", "--max-memory", "2GiB") == 0  # not part of the fingerprint


@pytest.mark.parametrize("value", ["lots", "-2G", "0", "[1]"])
def test_a_bad_memory_budget_is_one_line_naming_the_key_or_flag(tmp_path, capsys, value):
    assert _run(_cfg(tmp_path, DP + f"max_memory: {value}\n"), "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "max_memory" in err and len(err.splitlines()) == 1
    with pytest.raises(SystemExit):
        _run(_cfg(tmp_path), "--out", tmp_path / "o2", "--max-memory", value)
    assert "--max-memory" in capsys.readouterr().err
