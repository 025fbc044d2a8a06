r"""Settings declared once: each field of a settings dataclass carries its doc and its check.

A settings dataclass declares a field with :func:`setting`: its type (the annotation),
its default, a one-line doc and a :class:`Check` (the values it accepts)::

    @dataclass
    class Settings:
        num_init: int = setting(10, "Random initial points per agent.", Integer(minimum=1))

        def __post_init__(self) -> None:
            check_fields(self)  # every field's check; then the rules that involve several fields

The constructor is the one place a value is checked, so Python code, the YAML
experiment file (:mod:`fbo_torch.experiments.config`) and a Flower run config
(:mod:`fbo_torch.flower.config`), which all build the dataclass, refuse a value with
the same message; a reader only prefixes where the value came from. A value of the
wrong type is named with :func:`type_error`, the message the readers use too.

:func:`kind_defaults` gives a subclass other defaults of its base's fields (the
experiment kinds whose papers chose other values), declared in one table.

This module imports nothing heavy, so the YAML reader checks its top-level keys with it
before torch is imported; :mod:`fbo_torch.utils.validation` builds its checks of numbers
(and of one-element tensors) on :func:`check_integer` and :func:`check_fraction`.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import math
import numbers
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

#: The keys of a field's metadata that :func:`setting` fills.
DOC, CHECK = "doc", "check"


def type_error(key: str, expected: str, value: Any) -> str:
    r"""The message for a value of the wrong type: ```key` must be EXPECTED, got VALUE (TYPE).``.

    Args:
        key: The setting's name as the reader spells it.
        expected: What it must be (``"an integer"``, ``"true or false"``).
        value: The value given.

    Returns:
        The message (one line).
    """
    return f"`{key}` must be {expected}, got {value!r} ({type(value).__name__})."


def fits(value: Any, hint: Any) -> bool:
    r"""Whether ``value`` fits the type annotation ``hint`` (a bool is no number; unresolved hints fit anything).

    Classes a config file cannot express (a ``torch.device``, a path, a tensor) take their spelling too:
    a string, or a list for a tensor; any other class is checked by ``isinstance``.

    Args:
        value: The value, as a reader holds it.
        hint: The annotation (a class, a union, ``list[...]``, ``dict[...]``, ``Any``).

    Returns:
        Whether it fits.
    """
    if hint is Any or hint is inspect.Parameter.empty or isinstance(hint, (str, typing.TypeVar)):
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    base = origin or hint
    if base in (list, tuple, collections.abc.Sequence):
        if not isinstance(value, (list, tuple)):
            return False
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return len(args) != 1 or all(fits(v, args[0]) for v in value)
    if base in (dict, collections.abc.Mapping):
        return isinstance(value, dict)
    if base is os.PathLike or getattr(base, "__name__", "") == "device" and getattr(base, "__module__", "") == "torch":
        return isinstance(value, (str, base))
    if getattr(base, "__name__", "") == "Tensor":
        return isinstance(value, (list, base))
    return isinstance(base, type) and isinstance(value, base)


def expected(hint: Any) -> str:
    r"""What a value of type ``hint`` is, as a message says it (``"an integer or null"``, ``"a list of strings"``).

    Args:
        hint: The annotation.

    Returns:
        The words.
    """
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(expected(h) for h in typing.get_args(hint)))
    names: dict[Any, str] = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
        type(None): "null",
        dict: "a mapping",
    }
    if hint in names:
        return names[hint]
    base = origin or hint
    if base in (list, tuple, collections.abc.Sequence):
        args = typing.get_args(hint)
        return f"a list of {expected(args[0]).removeprefix('an ').removeprefix('a ')}s" if args else "a list"
    if base in (dict, collections.abc.Mapping):
        return "a mapping"
    if base is os.PathLike:
        return "a path"
    return f"a {getattr(base, '__name__', str(base))}"


#: The words a text value (TOML, a command line) may spell a flag with.
TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _from_text(value: Any, kind: type) -> Any:
    """``value`` (a string, or a TOML scalar) converted to ``kind``, or unchanged where it does not convert."""
    try:
        if kind is bool and not isinstance(value, bool):
            word = str(value).strip().lower()
            return word in TRUE_WORDS if word in TRUE_WORDS + FALSE_WORDS else value
        if kind is int and not isinstance(value, bool) and not (isinstance(value, float) and not value.is_integer()):
            return int(value)
        if kind is float and not isinstance(value, bool):
            return float(value)
        if kind is str:
            return value if isinstance(value, str) else str(value)
    except (TypeError, ValueError, OverflowError):
        pass
    return value


def read_typed(key: str, value: Any, hint: Any, text: bool = False) -> Any:
    r"""``value`` of the setting ``key``, annotated ``hint``, checked against its type: the one typed reader of
    the experiment file and of Flower's run and node configs.

    A YAML value comes typed (``text`` off) and must fit as it is; a Flower config's value (``text`` on:
    TOML scalars, or text from the command line) is first converted to the first of ``bool``, ``int``,
    ``float``, ``str`` that ``hint`` names (``"3"`` and ``3.0`` to ``3``, ``"yes"`` to ``True``, any
    scalar to its string). A value that does not fit is refused with :func:`type_error`, the expected
    type as :func:`expected` says it, wherever it came from.

    Args:
        key: The setting's name as the reader spells it.
        value: The value.
        hint: The setting's annotation.
        text: Convert text (and TOML's other scalars) first.

    Returns:
        The value (converted, with ``text``).

    Raises:
        ValueError: It does not fit ``hint``.
    """
    if text:
        args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        kind = next((k for k in (bool, int, float, str) if k in args), None)
        if kind is not None:
            value = _from_text(value, kind)
    if not fits(value, hint):
        raise ValueError(type_error(key, expected(hint), value))
    return value


def check_integer(name: str, value: Any, minimum: int | None = None) -> int:
    """``value`` as an ``int`` (not a bool), at least ``minimum`` if given.

    :func:`fbo_torch.utils.validation.check_int` takes one-element integer tensors too.

    Args:
        name: The key the message names.
        value: The value.
        minimum: The least value allowed.

    Returns:
        The integer.

    Raises:
        TypeError: Not an integer.
        ValueError: Below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an integer, got {type(value).__name__}.")
    if minimum is not None and value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value}.")
    return int(value)


def check_fraction(name: str, value: Any, open_left: bool = False, open_right: bool = False) -> float:
    """``value`` (a real number, not a bool) as a float in ``[0, 1]``, open at 0 or 1 as asked.

    :func:`fbo_torch.utils.validation.check_probability` takes one-element tensors too.

    Args:
        name: The key the message names.
        value: The value.
        open_left: Refuse 0.
        open_right: Refuse 1.

    Returns:
        The float.

    Raises:
        TypeError: Not a real number.
        ValueError: Outside the interval.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(number_error(name, value))
    v = float(value)
    lo_ok = v > 0 if open_left else v >= 0
    hi_ok = v < 1 if open_right else v <= 1
    if not (math.isfinite(v) and lo_ok and hi_ok):
        interval = ("(" if open_left else "[") + "0, 1" + (")" if open_right else "]")
        raise ValueError(f"`{name}` must lie in {interval}, got {value}.")
    return v


def number_error(name: str, value: Any) -> str:
    """The message for a value that is no number (text, a bool): ```name` must be a number, got TYPE VALUE.``.

    Args:
        name: The key the message names.
        value: The value given.

    Returns:
        The message.
    """
    return f"`{name}` must be a number, got {type(value).__name__} {value!r}."


class Check:
    """The values one setting accepts: calling it refuses any other with a message naming the key."""

    def __call__(self, key: str, value: Any) -> None:
        """Refuse ``value`` (``ValueError``, or ``TypeError`` for the wrong type) naming ``key``.

        Args:
            key: The setting's name as the reader spells it.
            value: The value to check.
        """
        raise NotImplementedError

    def refused(self) -> Any:
        """A value this check refuses (the schema's tests give it to every reader).

        Returns:
            The value.
        """
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Integer(Check):
    """An integer (not a bool), at least ``minimum`` when it is given."""

    minimum: int | None = None

    def __call__(self, key: str, value: Any) -> None:
        check_integer(key, value, self.minimum)

    def refused(self) -> Any:
        return min(self.minimum - 1, -1) if self.minimum is not None else 0.5


@dataclasses.dataclass(frozen=True)
class Number(Check):
    """A real number (not a bool), finite unless ``finite`` is off, above (or at) ``minimum``."""

    minimum: float | None = 0.0
    strict: bool = True
    finite: bool = True
    #: What the message says the value must be (default: from the fields above).
    what: str = ""

    def _what(self) -> str:
        if self.what:
            return self.what
        bound = "" if self.minimum is None else f" {'>' if self.strict else '>='} {self.minimum:g}"
        return ("a finite number" if self.finite else "a number") + bound

    def __call__(self, key: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(type_error(key, self._what(), value))
        low = self.minimum
        ok = not math.isnan(value) and (not self.finite or math.isfinite(value))
        ok = ok and (low is None or (value > low if self.strict else value >= low))
        if not ok:
            raise ValueError(f"`{key}` must be {self._what()}, got {value!r}.")

    def refused(self) -> Any:
        return math.inf if self.minimum is None else self.minimum - 1.0


@dataclasses.dataclass(frozen=True)
class Probability(Check):
    """A number in ``[0, 1]``, open at 0 with ``open_left`` and at 1 with ``open_right``."""

    open_left: bool = False
    open_right: bool = False

    def __call__(self, key: str, value: Any) -> None:
        check_fraction(key, value, self.open_left, self.open_right)

    def refused(self) -> Any:
        return 1.5


@dataclasses.dataclass(frozen=True)
class Flag(Check):
    """``True`` or ``False``."""

    def __call__(self, key: str, value: Any) -> None:
        if not isinstance(value, bool):
            raise ValueError(type_error(key, "true or false", value))

    def refused(self) -> Any:
        return "maybe"


@dataclasses.dataclass(frozen=True)
class Seed(Check):
    """A random seed: an integer in ``[0, 2^63)``."""

    def __call__(self, key: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise ValueError(
                f"`{key}` must be an integer in [0, 2^63), got {value!r}; larger seeds would repeat smaller "
                "ones' streams."
            )

    def refused(self) -> Any:
        return 2**63


@dataclasses.dataclass(frozen=True)
class Text(Check):
    """A string (any: a path, a name the setting's user checks)."""

    def __call__(self, key: str, value: Any) -> None:
        if not isinstance(value, str):
            raise ValueError(type_error(key, "a string", value))

    def refused(self) -> Any:
        return 1


@dataclasses.dataclass(frozen=True)
class Choice(Check):
    """One of ``choices`` (a sequence, or a function returning one: a registry read when the check runs)."""

    choices: Sequence[Any] | Callable[[], Sequence[Any]]

    def __call__(self, key: str, value: Any) -> None:
        choices = self.choices() if callable(self.choices) else self.choices
        if value not in choices:
            raise ValueError(f"`{key}` must be one of {choices}, got {value!r}.")

    def refused(self) -> Any:
        return "no-such-choice"


@dataclasses.dataclass(frozen=True)
class Optional(Check):
    """``None``, or a value ``inner`` accepts."""

    inner: Check

    def __call__(self, key: str, value: Any) -> None:
        if value is not None:
            self.inner(key, value)

    def refused(self) -> Any:
        return self.inner.refused()


@dataclasses.dataclass(frozen=True)
class Rule(Check):
    """A check written as a function ``fn(key, value)`` (a registry's lookup, a structured value's parser)."""

    fn: Callable[[str, Any], object]
    #: A value ``fn`` refuses.
    bad: Any

    def __call__(self, key: str, value: Any) -> None:
        self.fn(key, value)

    def refused(self) -> Any:
        return self.bad


def setting(default: Any, doc: str, check: Check, *, factory: Callable[[], Any] | None = None) -> Any:
    r"""A dataclass field declared with its default, its doc and its check.

    Args:
        default: The default (ignored when ``factory`` is given).
        doc: One line: what the setting is.
        check: The values it accepts.
        factory: Builds a mutable default (a list) for each instance.

    Returns:
        The :func:`dataclasses.field`.
    """
    metadata = {DOC: doc, CHECK: check}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def declared(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields of a settings dataclass that :func:`setting` declared.

    Args:
        cls: The dataclass.

    Returns:
        Its fields with a doc and a check, in field order.
    """
    return [f for f in dataclasses.fields(cls) if CHECK in f.metadata]


def doc(cls: type, name: str) -> str:
    """The doc of field ``name`` of ``cls``.

    Args:
        cls: The dataclass.
        name: The field.

    Returns:
        Its one-line doc.
    """
    return str({f.name: f for f in dataclasses.fields(cls)}[name].metadata[DOC])


def check_fields(obj: Any, spell: Callable[[str], str] | None = None) -> None:
    """Run every declared field's check on ``obj``'s value, in field order.

    Args:
        obj: A settings dataclass instance.
        spell: The key a field's name is shown as (a Flower run config's kebab-case); default: the name.
    """
    for f in declared(type(obj)):
        f.metadata[CHECK](spell(f.name) if spell is not None else f.name, getattr(obj, f.name))


def check_value(cls: type, name: str, value: Any, key: str | None = None) -> None:
    """Run the check of field ``name`` of ``cls`` on ``value`` (a value a reader needs before it builds ``cls``).

    Args:
        cls: The settings dataclass.
        name: The field.
        value: The value.
        key: The key the message names (default: ``name``).
    """
    check = {f.name: f for f in dataclasses.fields(cls)}[name].metadata[CHECK]
    check(key if key is not None else name, value)


_ClassT = TypeVar("_ClassT", bound=type)


def document(cls: _ClassT) -> _ClassT:
    r"""Append an ``Attributes:`` section to ``cls``'s docstring: each declared field and its doc.

    The docs live in the fields (:func:`setting`), once; help() and the API pages read them here.

    Args:
        cls: A settings dataclass.

    Returns:
        ``cls``.
    """
    lines = [f"        {f.name}: {f.metadata[DOC]}" for f in declared(cls)]
    text = (cls.__doc__ or cls.__name__).rstrip()
    last = text.rsplit("\n\n", 1)[-1].lstrip("\n")
    if lines:  # an Attributes section of the fields that are no settings, if last, takes the entries
        heading = "" if last.startswith("    Attributes:") else "\n\n    Attributes:"
        cls.__doc__ = text + heading + "\n" + "\n".join(lines) + "\n"
    return cls


def kind_defaults(cls: _ClassT, defaults: Mapping[str, Any]) -> _ClassT:
    r"""Give the subclass ``cls`` other defaults of fields its dataclass base declares (before ``@dataclass``).

    Each field keeps its annotation, doc and check (and its place among the fields); only
    its default changes.

    Args:
        cls: The subclass, not yet a dataclass.
        defaults: ``{field: default}``.

    Returns:
        ``cls``.
    """
    base = {f.name: f for f in dataclasses.fields(cls)}
    annotations = cls.__dict__.get("__annotations__")
    if annotations is None:
        annotations = {}
        cls.__annotations__ = annotations
    hints = {k: v for c in reversed(cls.__mro__) for k, v in c.__dict__.get("__annotations__", {}).items()}
    for name, value in defaults.items():
        if name in annotations or name not in base:
            raise TypeError(f"{cls.__name__}: `{name}` is not a field it inherits, so it has no default to change.")
        annotations[name] = hints[name]
        setattr(cls, name, dataclasses.field(default=value, metadata=base[name].metadata))
    return cls


__all__ = [
    "CHECK",
    "DOC",
    "FALSE_WORDS",
    "TRUE_WORDS",
    "Check",
    "Choice",
    "Flag",
    "Integer",
    "Number",
    "Optional",
    "Probability",
    "Rule",
    "Seed",
    "Text",
    "check_fields",
    "check_fraction",
    "check_integer",
    "check_value",
    "declared",
    "doc",
    "document",
    "expected",
    "fits",
    "kind_defaults",
    "number_error",
    "read_typed",
    "setting",
    "type_error",
]
