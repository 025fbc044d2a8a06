"""One typed reader (fbo_torch.utils.schema.read_typed) for the experiment file and Flower's run and node configs:
a value of the wrong type is refused with the same message wherever it comes from."""

import typing

import pytest

from fbo_torch.experiments.config import ConfigError, parse_config
from fbo_torch.federation.settings import DPFTSDESettings
from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.utils.schema import expected, fits, read_typed

HINTS = typing.get_type_hints(DPFTSDESettings)
KEYS = {name: key for key, (where, name) in FlowerRunConfig.keys().items() if where == "settings"}
#: Settings whose type a reader checks before the settings do: numbers and flags (a string is any TOML scalar).
TYPED = sorted(n for n in KEYS if HINTS[n] in (int, float, bool, int | None, float | None))


def _yaml(name, value):
    raw = {"experiment": "dp_fts_de", "objective": {"type": "gp_grid"}, "methods": [{"name": "m", name: value}]}
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "exp.yaml")
    return str(info.value).removeprefix("exp.yaml: methods[0]: ")


def _flower(name, value):
    with pytest.raises(ValueError) as info:
        FlowerRunConfig.from_run_config({KEYS[name]: value})
    return str(info.value).removeprefix("run config: ").replace(f"`{KEYS[name]}`", f"`{name}`")


@pytest.mark.parametrize("name", TYPED)
@pytest.mark.parametrize("value", ["not-a-value", [1.0]], ids=["text", "list"])
def test_a_value_of_the_wrong_type_gets_one_message_from_yaml_and_from_a_flower_run_config(name, value):
    message = _yaml(name, value)
    assert message == _flower(name, value)
    assert message == f"`{name}` must be {expected(HINTS[name])}, got {value!r} ({type(value).__name__})."


def test_the_messages_say_what_the_annotation_asks_for():
    assert (
        _yaml("clip_norm", "big")
        == _flower("clip_norm", "big")
        == ("`clip_norm` must be a number or null, got 'big' (str).")
    )
    assert _yaml("num_iterations", 2.5) == _flower("num_iterations", 2.5)
    assert _yaml("rff_normalize", "maybe") == _flower("rff_normalize", "maybe")


@pytest.mark.parametrize(
    "value, hint, text, out",
    [
        (3, int, False, 3),
        ("3", int, True, 3),
        (3.0, int, True, 3),
        ("yes", bool, True, True),
        (0, bool, True, False),
        ("1e-3", float | None, True, 1e-3),
        (7, str, True, "7"),
        ("x", typing.Any, False, "x"),
        (["a"], list[str], False, ["a"]),
    ],
)
def test_read_typed_keeps_or_converts_what_fits(value, hint, text, out):
    assert read_typed("k", value, hint, text=text) == out


@pytest.mark.parametrize(
    "value, hint, text, message",
    [
        ("3", int, False, "`k` must be an integer, got '3' (str)."),
        (2.5, int, True, "`k` must be an integer, got 2.5 (float)."),
        (True, float, True, "`k` must be a number, got True (bool)."),
        ("maybe", bool, True, "`k` must be true or false, got 'maybe' (str)."),
        ([1], list[str], False, "`k` must be a list of strings, got [1] (list)."),
        (1, dict | None, False, "`k` must be a mapping or null, got 1 (int)."),
    ],
)
def test_read_typed_refuses_what_does_not_fit_naming_the_key(value, hint, text, message):
    assert not fits(value, hint) or text
    with pytest.raises(ValueError) as info:
        read_typed("k", value, hint, text=text)
    assert str(info.value) == message
