"""The package as a user gets it: ``python -m build`` makes an sdist and a wheel, and the wheel, installed
into a fresh virtual environment, runs the quickstart's smallest path from outside the repository, copies the
example configs and programs it ships (``fbo-torch examples DIR``) and runs one of them there, and looks for
data in the user's data folder, never in its own.

No network: the build runs without isolation (setuptools from the ``dev`` extra), the wheel is installed
with ``--no-index --no-deps``, and the fresh environment sees the test environment's dependencies
(torch, BoTorch, ...) through a ``.pth`` line, which adds their folder to ``sys.path`` without running
that folder's own ``.pth`` files, so an editable install of the source tree stays invisible. Every
command runs from a temporary folder with no ``PYTHON*`` variables, and the test checks that
``fbo_torch`` is imported from the fresh environment.
"""

import email
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
from test_cli import QUICKSTART, _tiny_quickstart

import fbo_torch

ROOT = Path(__file__).resolve().parents[1]
#: What the sdist may hold at its top level: the project's files, and what setuptools adds.
SDIST_TOP_LEVEL = {"fbo_torch", "pyproject.toml", "README.md", "CHANGELOG.md", "MANIFEST.in", "LICENSE"}
SDIST_TOP_LEVEL |= {"configs", "examples", "_build_examples.py"}  # the examples, and the hook that ships them
SDIST_TOP_LEVEL |= {"PKG-INFO", "setup.cfg", "fbo_torch.egg-info"}

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("build") is None,
    reason="needs the `build` package (the dev extra: pip install -c constraints.txt -e '.[dev]')",
)


def _run(cmd, cwd, env=None, **kwargs):
    env = {k: v for k, v in (os.environ if env is None else env).items() if not k.startswith("PYTHON")}
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """``python -m build``: the sdist, then the wheel built from the unpacked sdist (so the wheel also
    shows that the sdist holds everything a build needs)."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT], cwd=out)
    (sdist,), (wheel,) = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    return sdist, wheel


def test_version_has_one_source():
    """pyproject.toml reads the version from ``fbo_torch.__version__``; no literal copy is left there."""
    text = (ROOT / "pyproject.toml").read_text()
    project_table = text.split("\n[project]\n")[1].split("\n[")[0]
    assert 'dynamic = ["version"]' in project_table and "\nversion =" not in project_table
    assert 'version = { attr = "fbo_torch.__version__" }' in text.split("\n[tool.setuptools.dynamic]\n")[1]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{fbo_torch.__version__}]" in changelog and "## [Unreleased]" in changelog


def test_sdist_holds_the_package_and_no_tests_benchmarks_or_runs(dists):
    sdist, _ = dists
    top = f"fbo_torch-{fbo_torch.__version__}"
    assert sdist.name == f"{top}.tar.gz"
    with tarfile.open(sdist) as tar:
        names = {name.removeprefix(f"{top}/") for name in tar.getnames()}
    assert {"pyproject.toml", "README.md", "CHANGELOG.md", "PKG-INFO", "LICENSE"} <= names
    assert {"configs/fts_synthetic.yaml", "examples/custom_objective.py", "examples/flower_app/run_demo.sh"} <= names
    assert {"fbo_torch/py.typed", "fbo_torch/experiments/quickstart.yaml", "fbo_torch/cli.py"} <= names
    # Nothing beside the package and the project's files: no tests, benchmarks (or their results), runs, docs.
    top_level = {name.split("/")[0] for name in names if name != top}
    assert top_level <= SDIST_TOP_LEVEL, top_level - SDIST_TOP_LEVEL
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pt"))]


def test_wheel_installs_and_runs_the_quickstart_outside_the_repository(dists, tmp_path):
    _, wheel = dists
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta = email.message_from_bytes(zf.read(f"fbo_torch-{fbo_torch.__version__}.dist-info/METADATA"))
    assert meta["Version"] == fbo_torch.__version__
    assert {"fbo_torch/py.typed", "fbo_torch/experiments/quickstart.yaml"} <= names
    # the license the metadata names, and the examples as package data
    assert meta["License-Expression"] == "MIT" and meta["License-File"] == "LICENSE"
    assert f"fbo_torch-{fbo_torch.__version__}.dist-info/licenses/LICENSE" in names
    shipped = {n.removeprefix("fbo_torch/_examples/") for n in names if n.startswith("fbo_torch/_examples/")}
    repo = {p.relative_to(ROOT).as_posix() for d in ("configs", "examples") for p in (ROOT / d).rglob("*")}
    assert shipped == {n for n in repo if (ROOT / n).is_file() and "__pycache__" not in n}
    assert all(n.startswith(("fbo_torch/", "fbo_torch-")) for n in names), sorted(names)

    # A fresh environment (no pip inside: the test environment's pip installs into it).
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python, script = venv / "bin" / "python", venv / "bin" / "fbo-torch"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([python, "-I", "-c", purelib], cwd=tmp_path).strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_fbo_test_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check"]
    _run([*pip, "install", "-q", "--no-index", "--no-deps", "--ignore-installed", wheel], cwd=tmp_path)

    probe = (
        "import importlib.metadata as m, importlib.resources as r, json, sys, fbo_torch\n"
        "from packaging.requirements import Requirement\n"
        "def met(q):\n"
        "    try:\n"
        "        return m.version(q.name) in q.specifier\n"
        "    except m.PackageNotFoundError:\n"
        "        return False\n"
        "reqs = [Requirement(s) for s in m.requires('fbo_torch')]\n"
        "unmet = [str(q) for q in reqs if q.marker is None and not met(q)]  # extras have markers\n"
        "pkg = r.files('fbo_torch')\n"
        "print(json.dumps({'file': fbo_torch.__file__, 'version': fbo_torch.__version__,\n"
        "    'dist_version': m.version('fbo_torch'), 'unmet': unmet, 'torch': 'torch' in sys.modules,\n"
        "    'typed': pkg.joinpath('py.typed').is_file(),\n"
        "    'quickstart': pkg.joinpath('experiments', 'quickstart.yaml').read_text()}))\n"
    )
    info = json.loads(_run([python, "-I", "-c", probe], cwd=tmp_path))
    assert Path(info["file"]).is_relative_to(site), info["file"]  # the installed copy, not the source tree
    assert info["version"] == info["dist_version"] == fbo_torch.__version__
    assert info["unmet"] == []  # the wheel's dependencies are what the pinned environment holds
    assert info["torch"] is False  # `import fbo_torch` stays light
    assert info["typed"] and info["quickstart"] == QUICKSTART.read_text()

    # The console script the wheel declares: --version, then the quickstart shrunk as tests/test_cli.py does.
    assert _run([script, "--version"], cwd=tmp_path).strip() == f"fbo_torch {fbo_torch.__version__}"
    out = tmp_path / "out"
    _run([script, "run", _tiny_quickstart(tmp_path), "--out", out, "--quiet"], cwd=tmp_path, timeout=300)
    results = json.loads((out / "results.json").read_text())
    assert results["fbo_torch_version"] == fbo_torch.__version__
    written = {p.name for p in out.iterdir()}
    assert {"results.csv", "summary.txt", "simple_regret.png", "config.resolved.yaml"} <= written

    # A README command from outside the tree: the config is not there, and the error says where it is
    proc = subprocess.run(
        [script, "run", "configs/fts_synthetic.yaml", "--out", "o"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "fbo-torch examples DIR" in proc.stderr, proc.stderr
    # ... and `fbo-torch examples DIR` copies the configs and programs; the custom-objective example runs there
    mine = tmp_path / "mine"
    said = _run([script, "examples", mine], cwd=tmp_path)
    assert (
        "cd" in said
        and (mine / "configs" / "fts_synthetic.yaml").read_text()
        == (ROOT / "configs" / "fts_synthetic.yaml").read_text()
    )
    assert os.access(mine / "examples" / "flower_app" / "run_demo.sh", os.X_OK)
    cfg = mine / "examples" / "custom_objective.yaml"
    text = cfg.read_text()
    for old, new in (
        ("num_agents: 6", "num_agents: 3"),
        ("steps: 60", "steps: 5"),
        ("num_inits: 2", "num_inits: 1"),
        ("num_iterations: 12", "num_iterations: 2"),
        ("num_init: 3", "num_init: 2"),
    ):
        assert old in text
        text = text.replace(old, new)
    cfg.write_text(text)
    _run(
        [script, "run", "custom_objective.yaml", "--out", "../runs/custom", "--quiet"],
        cwd=mine / "examples",
        timeout=300,
    )
    assert json.loads((mine / "runs" / "custom" / "results.json").read_text())["name"] == "custom_objective"

    # Data is looked for in the user's data folder, never inside the installed package
    env = {"FBO_DATA_DIR": str(tmp_path / "my-data"), "FBO_LANDMINE_PATH": ""}
    probe = (
        "from fbo_torch.objectives.landmine import resolve_landmine_path\n"
        "try:\n    resolve_landmine_path()\nexcept FileNotFoundError as err:\n    print(err)\n"
    )
    said = _run([python, "-c", probe], cwd=tmp_path, env={**os.environ, **env})
    assert str(tmp_path / "my-data" / "LandmineData.mat") in said and "site-packages" not in said, said
