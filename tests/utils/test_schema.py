"""The declaration of a setting (fbo_torch.utils.schema): its checks, messages and kind defaults."""

import dataclasses
import math
import subprocess
import sys

import pytest

from fbo_torch.federation.settings import MethodSettings
from fbo_torch.utils.schema import (
    Choice,
    Flag,
    Integer,
    Number,
    Optional,
    Probability,
    Rule,
    check_fields,
    doc,
    document,
    kind_defaults,
    setting,
    type_error,
)


@pytest.mark.parametrize(
    "check, good, message",
    [
        (Integer(minimum=1), 1, "`k` must be >= 1, got -1."),
        (Number(), 0.5, "`k` must be a finite number > 0, got -1.0."),
        (Number(strict=False), 0.0, "`k` must be a finite number >= 0, got -1.0."),
        (Number(minimum=None), -3.0, "`k` must be a finite number, got inf."),
        (Probability(open_left=True), 1.0, "`k` must lie in (0, 1], got 1.5."),
        (Flag(), False, "`k` must be true or false, got 'maybe' (str)."),
        (Choice(("a", "b")), "a", "`k` must be one of ('a', 'b'), got 'no-such-choice'."),
        (Choice(lambda: ["a"]), "a", "`k` must be one of ['a'], got 'no-such-choice'."),
        (Optional(Integer(minimum=0)), None, "`k` must be >= 0, got -1."),
    ],
)
def test_a_check_passes_good_values_and_names_the_key_in_one_line(check, good, message):
    check("k", good)
    with pytest.raises(ValueError) as info:
        check("k", check.refused())
    assert str(info.value) == message


def test_wrong_types_are_named_the_same_way():
    assert type_error("k", "an integer", "3") == "`k` must be an integer, got '3' (str)."
    with pytest.raises(ValueError, match=r"^`k` must be a finite number > 0, got 'x' \(str\)\.$"):
        Number()("k", "x")
    with pytest.raises(ValueError, match=r"got True \(bool\)"):
        Number()("k", True)
    with pytest.raises(TypeError, match="`k` must be an integer"):
        Integer()("k", 1.0)
    assert not math.isnan(Number(finite=False).refused())
    with pytest.raises(ValueError, match="`k` must be a number > 0"):
        Number(finite=False)("k", math.nan)
    Number(finite=False)("k", math.inf)


def test_a_rule_is_a_function_with_a_bad_value():
    def even(key, value):
        if value % 2:
            raise ValueError(f"`{key}` must be even, got {value}.")

    rule = Rule(even, 3)
    rule("k", 2)
    with pytest.raises(ValueError, match="`k` must be even, got 3."):
        rule("k", rule.refused())


def test_a_dataclass_declared_with_settings_checks_and_documents_its_fields():
    @document
    @dataclasses.dataclass
    class Example:
        """An example."""

        size: int = setting(2, "How many.", Integer(minimum=1))
        names: list = setting(None, "Which.", Rule(lambda k, v: None, None), factory=lambda: ["a"])

        def __post_init__(self):
            check_fields(self)

    assert Example().names == ["a"] and Example().names is not Example().names
    assert doc(Example, "size") == "How many."
    assert "Attributes:\n        size: How many.\n        names: Which." in Example.__doc__
    with pytest.raises(ValueError, match="`size` must be >= 1, got 0"):
        Example(size=0)


def test_kind_defaults_change_a_default_and_keep_the_declaration():
    class Other(MethodSettings):
        pass

    kind_defaults(Other, {"num_init": 4})
    Other = dataclasses.dataclass(Other)
    fields = {f.name: f for f in dataclasses.fields(Other)}
    base = {f.name: f for f in dataclasses.fields(MethodSettings)}
    assert Other().num_init == 4 and fields["num_init"].metadata == base["num_init"].metadata
    assert list(fields) == list(base)  # its place among the fields kept
    with pytest.raises(ValueError, match="`num_init` must be >= 1"):
        Other(num_init=0)


def test_kind_defaults_refuse_a_field_declared_twice_or_not_inherited():
    class Twice(MethodSettings):
        num_init: int = 3

    with pytest.raises(TypeError, match="`num_init` is not a field it inherits"):
        kind_defaults(Twice, {"num_init": 4})
    with pytest.raises(TypeError, match="`no_such` is not a field it inherits"):
        kind_defaults(type("Other", (MethodSettings,), {}), {"no_such": 4})


def test_the_module_imports_nothing_heavy():
    code = "import sys, fbo_torch.utils.schema; print(sorted(m for m in ('torch', 'yaml') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
