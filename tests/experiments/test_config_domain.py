"""The `domain:` options (the fields of fbo_torch.optim.Domain) walked like the other settings: each is declared
once with a doc, a check and a default it passes, and a value its check refuses is refused with the same message
from Python, the YAML `domain:` section and a Flower run config's `domain` key."""

import dataclasses

import pytest
import torch

from fbo_torch.experiments.config import ConfigError, parse_config
from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.optim.domain import Domain
from fbo_torch.utils.schema import CHECK, DOC, Check, declared

OPTIONS = declared(Domain)
BOUNDS = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)


def test_every_option_is_declared():
    assert [f.name for f in OPTIONS] == list(Domain.option_defaults())
    assert [f.name for f in dataclasses.fields(Domain) if f not in OPTIONS] == ["bounds", "candidates"]


@pytest.mark.parametrize("f", OPTIONS, ids=lambda f: f.name)
def test_every_option_has_a_doc_a_check_and_a_default_it_passes(f):
    assert set(f.metadata) == {DOC, CHECK} and isinstance(f.metadata[CHECK], Check)
    assert f.metadata[DOC].strip().endswith(".")
    assert f"        {f.name}: " in Domain.__doc__
    f.metadata[CHECK](f.name, f.default)


@pytest.mark.parametrize("f", OPTIONS, ids=lambda f: f.name)
def test_a_refused_option_gets_the_python_message_from_yaml_and_from_a_flower_run_config(f):
    bad = f.metadata[CHECK].refused()
    with pytest.raises(ValueError) as python:
        Domain(BOUNDS, **{f.name: bad})
    assert f"`{f.name}`" in str(python.value)
    raw = {"experiment": "fts", "objective": {"type": "gp_grid"}, "methods": [{"name": "m"}], "domain": {f.name: bad}}
    with pytest.raises(ConfigError) as yaml:
        parse_config(raw, "exp.yaml")
    assert str(yaml.value) == f"exp.yaml: domain: {python.value}"
    with pytest.raises(ValueError) as flower:
        FlowerRunConfig(domain={f.name: bad})
    assert str(flower.value) == f"run config: `domain`: {python.value}"


def test_dtypes_by_name_and_null_options_still_pass():
    domain = Domain(BOUNDS, screen_dtype="float64", refine_dtype=None, refine=None, max_points=10)
    assert domain.screen_dtype is torch.float64 and domain.refine_dtype is None
    assert domain.options()["screen_dtype"] == "float64"
