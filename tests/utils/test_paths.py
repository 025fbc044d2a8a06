"""The user's data folder and the shipped examples (``fbo-torch examples DIR``) work the same from a checkout
as from the wheel (tests/test_packaging.py runs them from an installed wheel)."""

import os
from pathlib import Path

import pytest

from fbo_torch.cli import main
from fbo_torch.experiments.config import ConfigError, load_config
from fbo_torch.objectives.landmine import resolve_landmine_path
from fbo_torch.utils.paths import example_files, shipped_example, user_data_dir

ROOT = Path(__file__).resolve().parents[2]


def test_the_user_data_folder_comes_from_the_environment_and_is_searched_first(tmp_path, monkeypatch):
    monkeypatch.setenv("FBO_DATA_DIR", str(tmp_path / "data"))
    assert user_data_dir() == tmp_path / "data"
    monkeypatch.delenv("FBO_DATA_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert user_data_dir() == tmp_path / "xdg" / "fbo_torch"
    monkeypatch.delenv("FBO_LANDMINE_PATH", raising=False)
    (tmp_path / "xdg" / "fbo_torch").mkdir(parents=True)
    (tmp_path / "xdg" / "fbo_torch" / "LandmineData.mat").write_bytes(b"")
    assert resolve_landmine_path() == tmp_path / "xdg" / "fbo_torch" / "LandmineData.mat"


def test_examples_copies_every_config_and_program_and_overwrites_nothing(tmp_path, capsys):
    files = example_files()
    assert "configs/fts_synthetic.yaml" in files and "examples/flower_app/run_demo.sh" in files
    assert not [f for f in files if "__pycache__" in f]
    assert main(["examples", str(tmp_path / "ex")]) == 0
    said = capsys.readouterr().out
    assert "fbo-torch run configs/fts_synthetic.yaml" in said
    for rel in files:
        assert (tmp_path / "ex" / rel).read_bytes() == (ROOT / rel).read_bytes(), rel
    assert os.access(tmp_path / "ex" / "examples" / "flower_app" / "run_demo.sh", os.X_OK)
    mine = tmp_path / "ex" / "configs" / "fts_synthetic.yaml"
    mine.write_text("edited")
    assert main(["examples", str(tmp_path / "ex")]) == 2
    err = capsys.readouterr().err
    assert "exists" in err and "nothing was copied" in err and len(err.strip().splitlines()) == 1
    assert mine.read_text() == "edited"


def test_a_missing_config_that_ships_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"ships it as configs/fts_synthetic.yaml: `fbo-torch examples DIR`"):
        load_config("configs/fts_synthetic.yaml")
    assert shipped_example("peers/tetci2019_d3.yaml") == "configs/peers/tetci2019_d3.yaml"
    assert shipped_example("nothing.yaml") is None
    with pytest.raises(ConfigError, match=r"'nothing.yaml' does not exist\.$"):
        load_config("nothing.yaml")
