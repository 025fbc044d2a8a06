"""examples/custom_objective.py: a user's own MLP objective on client shards of scikit-learn's digits, tuned
from Python with the DP-FTS-DE runner and from examples/custom_objective.yaml with `fbo-torch run`."""

import json
from pathlib import Path

import pytest
import torch

from fbo_torch.cli import main
from fbo_torch.experiments.config import load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def example(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import custom_objective

    return custom_objective


def _at(objective, lr, wd):
    """Every client's input for (learning rate, weight decay) = (lr, wd)."""
    H = torch.tensor([[lr, wd]], dtype=torch.float64)
    return objective.search_space.from_native(H).expand(objective.num_agents, 1, 2).contiguous()


def test_clients_have_disjoint_shards_and_the_value_depends_on_the_hyperparameters(example):
    f = example.DigitsMLP(num_agents=4, steps=60)
    shards = f.shards
    assert shards.shape == (4, 240) and shards.unique().numel() == shards.numel()  # no image shared
    good, tiny_lr = f(_at(f, 0.5, 1e-5)).squeeze(-1), f(_at(f, 1e-3, 1e-5)).squeeze(-1)
    # a well-chosen learning rate learns the digits; 1e-3 for 60 steps stays near chance (0.1)
    assert (good > 0.75).all() and (tiny_lr < 0.3).all(), (good, tiny_lr)
    torch.testing.assert_close(f(_at(f, 0.5, 1e-5)).squeeze(-1), good)  # deterministic per client
    assert f.loss_name == "validation error"


def test_tuning_across_clients_from_python(example, capsys):
    threads = str(torch.get_num_threads())  # the example sets torch's threads: keep this process's
    out = example.main(["--clients", "3", "--rounds", "2", "--steps", "10", "--threads", threads])
    assert set(out) == {"TS", "DP-FTS-DE"}
    for res in out.values():
        assert res["errors"].shape == (3,) and ((res["errors"] >= 0) & (res["errors"] <= 1)).all()
        for cfg in res["configs"]:
            assert 1e-3 <= cfg["learning_rate"] <= 1.0 and 1e-6 <= cfg["weight_decay"] <= 1e-1
    assert out["TS"]["epsilon"] is None and out["DP-FTS-DE"]["epsilon"] > 0
    printed = capsys.readouterr().out
    assert "DP-FTS-DE: mean validation error" in printed and "client 2: error" in printed


def test_the_yaml_example_names_the_class_and_runs(example, tmp_path):
    assert (
        load_config(EXAMPLES / "custom_objective.yaml").scenarios[0].objective["type"] == "custom_objective:DigitsMLP"
    )
    text = (EXAMPLES / "custom_objective.yaml").read_text()
    for old, new in (
        ("num_agents: 6", "num_agents: 3"),
        ("steps: 60", "steps: 10"),
        ("num_inits: 2", "num_inits: 1"),
        ("num_iterations: 12", "num_iterations: 2"),
    ):
        assert old in text
        text = text.replace(old, new)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(text)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    methods = json.loads((out / "results.json").read_text())["scenarios"][0]["methods"]
    assert [m["loss_name"] for m in methods] == ["validation error"] * 2
    assert (out / "validation_error.png").is_file()
