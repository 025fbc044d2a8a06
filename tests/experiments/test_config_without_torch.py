"""Config mistakes are found before torch is imported (within a second, not the 5-25 s an import of torch
costs), and each error names the right thing: the section a value is in, the experiment kind a key belongs
to, the flag, the input dimension."""

import dataclasses
import subprocess
import sys

import pytest
import torch

from fbo_torch.cli import main
from fbo_torch.experiments import schema
from fbo_torch.experiments.config import ConfigError, load_config

LIGHT = ("torch", "botorch", "gpytorch", "matplotlib", "opacus")

FTS = """
experiment: fts
objective: {type: gp_grid, num_groups: 1, agents_per_group: 3, grid_size: 50}
runs: {num_inits: 1}
history: {t_n: 4}
defaults: {num_iterations: 2, num_features: 10}
methods:
  - {name: TS, algorithm: ts}
  - {name: FTS, algorithm: fts}
"""


def _write(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_schema_read_from_source_is_the_settings_classes():
    from fbo_torch.federation.settings import DPFTSDESettings, FTSSettings, HistorySettings, PrivacySettings
    from fbo_torch.optim.domain import Domain

    def names(cls):
        return [f.name for f in dataclasses.fields(cls)]

    assert list(schema.settings_fields("fts")) == names(FTSSettings)
    assert list(schema.settings_fields("dp_fts_de")) == names(DPFTSDESettings)
    assert list(schema.history_fields()) == names(HistorySettings)
    assert list(schema.privacy_fields()) == names(PrivacySettings)
    assert list(schema.domain_options()) == list(Domain.option_defaults())
    assert schema.annotation_type("int | None") == (int | None)
    assert schema.annotation_type("list[str]") == list[str]
    assert schema.annotation_type("torch.dtype | str | None") is None and schema.annotation_type("Any") is None


@pytest.mark.parametrize(
    "old, new, says",
    [
        ("num_features: 10}", "num_feature: 10}", "defaults: unknown key 'num_feature' (did you mean 'num_features'?)"),
        (
            "{name: FTS, algorithm: fts}",
            "{name: FTS, algorithm: fts, peer_trust: 3}",
            "methods[1]: `peer_trust` must be true or false",
        ),
        ("{name: TS, algorithm: ts}", "{name: TS, algorithm: ts, num_init: two}", "methods[0]: `num_init` must be"),
        ("history: {t_n: 4}", "history: {t_n: 4, mode: random, tn: 3}", "history: unknown key 'tn'"),
        ("experiment: fts", "experiment: fts\nseed: -1", "`seed` must be an integer"),
        ("experiment: fts", "experiment: ftss", "`experiment` must be one of ['fts', 'dp_fts_de']"),
        ("runs: {num_inits: 1}", "runs: {num_inits: 0}", "runs: `num_inits` must be >= 1, got 0"),
        ("experiment: fts", "experiment: fts\ndomain: {raw_sample: 3}", "domain: unknown key 'raw_sample'"),
    ],
)
def test_mistakes_in_keys_structure_and_types_are_found_without_torch(tmp_path, old, new, says):
    assert old in FTS
    cfg = _write(tmp_path, FTS.replace(old, new))
    code = (
        "import sys\nfrom fbo_torch.cli import main\n"
        f"code = main(['run', {str(cfg)!r}, '--out', {str(tmp_path / 'out')!r}, '--threads', '1'])\n"
        f"print(code, sorted(m for m in {LIGHT!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2", "[]"], out.stdout  # refused, and nothing heavy was imported
    assert says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "out").exists()


def test_a_missing_config_file_is_said_without_torch(tmp_path):
    code = (
        "import sys\nfrom fbo_torch.cli import main\n"
        f"print(main(['run', 'nowhere.yaml', '--out', 'o']), [m for m in {LIGHT!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.split() == ["2", "[]"] and "'nowhere.yaml' does not exist" in out.stderr


def test_a_bad_value_in_defaults_is_reported_in_defaults(tmp_path):
    """Before: `defaults: {num_features: -1}` was reported as `methods[0]`."""
    with pytest.raises(
        ConfigError, match=r"cfg.yaml: defaults: `num_features` must be >= 1, got -1 \(in methods\[0\] 'TS'\)"
    ):
        load_config(_write(tmp_path, FTS.replace("num_features: 10}", "num_features: -1}")))
    scenario = FTS.replace(
        "methods:\n", "scenarios:\n  - name: a\n    defaults: {rff_lengthscale: -2.0}\n    methods:\n"
    ).replace("  - {name", "      - {name")
    with pytest.raises(ConfigError, match=r"scenarios\[0\]: defaults: `rff_lengthscale` must be a finite number > 0"):
        load_config(_write(tmp_path, scenario))
    # the method's own value is still the method's
    own = FTS.replace("{name: FTS, algorithm: fts}", "{name: FTS, algorithm: fts, num_features: 0}")
    with pytest.raises(ConfigError, match=r"cfg.yaml: methods\[1\]: `num_features` must be >= 1, got 0\.$"):
        load_config(_write(tmp_path, own))


def test_a_key_of_the_other_experiment_kind_is_named_as_such(tmp_path):
    """Before: `agent_weights` in a dp_fts_de config gave "did you mean 'weights'?"."""
    dp = FTS.replace("experiment: fts", "experiment: dp_fts_de").replace("history: {t_n: 4}\n", "")
    dp = dp.replace("{name: FTS, algorithm: fts}", "{name: FTS, algorithm: fts_de, agent_weights: learned}")
    with pytest.raises(ConfigError, match=r"methods\[1\]: `agent_weights` is a method key of `experiment: fts`, not"):
        load_config(_write(tmp_path, dp))
    fts = FTS.replace("{name: FTS, algorithm: fts}", "{name: FTS, algorithm: fts, num_regions: 2}")
    with pytest.raises(ConfigError, match=r"`num_regions` is a method key of `experiment: dp_fts_de`"):
        load_config(_write(tmp_path, fts))


def test_a_mistyped_flag_is_named_not_a_missing_one(tmp_path, capsys):
    """Before: `--outt DIR` said "the following arguments are required: --out"."""
    cfg = _write(tmp_path, FTS)
    with pytest.raises(SystemExit) as e:
        main(["run", str(cfg), "--outt", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "fbo-torch run: error: unrecognized option --outt (did you mean --out?)" in err
    with pytest.raises(SystemExit):
        main(["privacy", "-q", "0.5", "-z", "1", "-T", "3", "--detla", "1e-5"])
    assert "unrecognized option --detla (did you mean --delta?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a sub-command's own options are known to it (`data emnist --root`)
        main(["data", "emnist", "--rooot", str(tmp_path)])
    assert "fbo-torch data emnist: error: unrecognized option --rooot (did you mean --root?)" in capsys.readouterr().err


def test_bounds_of_another_dimension_name_the_inputs_dimension():
    """Before: BatchedExactGP with 2-D inputs and 3-D bounds said "`bounds` must have 2 columns, got 3"."""
    from fbo_torch import BatchedExactGP

    X = torch.rand(4, 5, 2, dtype=torch.float64)
    bounds = torch.tensor([[0.0] * 3, [1.0] * 3], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"`bounds` must be 2 x 2: a lower and an upper bound for each of the "):
        BatchedExactGP(X, X.sum(-1, keepdim=True), bounds)
