r"""The keys of an experiment file, read without importing torch, so a config's mistakes are found at once.

The settings a YAML file fills in are dataclasses of modules that import torch
(:mod:`fbo_torch.federation.settings`, :mod:`fbo_torch.optim.domain`). Importing
them takes seconds, so :func:`~fbo_torch.experiments.config.load_config` first
checks what it can from their *source*: :func:`dataclass_fields` reads a
dataclass's fields (names and annotations, the inherited ones first, as
:func:`dataclasses.fields` orders them) from its module's file with :mod:`ast`,
without running it. The classes themselves stay the one source of the keys;
``tests/experiments/test_config_without_torch.py`` checks that this reading equals
:func:`dataclasses.fields` of each of them.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]

#: Where each experiment kind's method settings are defined (module path in the package, class name).
SETTINGS_SOURCE = {
    "fts": ("federation/settings.py", "FTSSettings"),
    "dp_fts_de": ("federation/settings.py", "DPFTSDESettings"),
}
HISTORY_SOURCE = ("federation/settings.py", "HistorySettings")
PRIVACY_SOURCE = ("federation/settings.py", "PrivacySettings")
DOMAIN_SOURCE = ("optim/domain.py", "Domain")
#: Fields of :class:`~fbo_torch.optim.domain.Domain` that are not YAML options.
DOMAIN_NOT_OPTIONS = ("bounds", "candidates")


@functools.cache
def _classes(module: str) -> dict[str, ast.ClassDef]:
    tree = ast.parse((_PACKAGE / module).read_text(encoding="utf-8"))
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def dataclass_fields(module: str, name: str) -> dict[str, str]:
    r"""The fields of the dataclass ``name`` defined in ``module`` (a path inside the package, e.g.
    ``"federation/settings.py"``): field name -> annotation source, the fields of its base classes (of the
    same module) first, a redeclared field where its base declared it.

    Raises:
        KeyError: ``module`` defines no class ``name``.
    """
    cls = _classes(module)[name]
    fields: dict[str, str] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in _classes(module):
            fields.update(dataclass_fields(module, base.id))
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            annotation = ast.unparse(stmt.annotation)
            if not annotation.startswith("ClassVar"):
                fields[stmt.target.id] = annotation
    return fields


def settings_fields(experiment: str) -> dict[str, str]:
    """The method keys of an experiment kind (``"fts"`` or ``"dp_fts_de"``) with their annotations."""
    return dataclass_fields(*SETTINGS_SOURCE[experiment])


def history_fields() -> dict[str, str]:
    """The keys of the ``history:`` section (:class:`~fbo_torch.federation.settings.HistorySettings`)."""
    return dataclass_fields(*HISTORY_SOURCE)


def privacy_fields() -> dict[str, str]:
    """The keys of the ``privacy:`` section (:class:`~fbo_torch.federation.settings.PrivacySettings`)."""
    return dataclass_fields(*PRIVACY_SOURCE)


def domain_options() -> dict[str, str]:
    """The keys of the ``domain:`` section (the fields of :class:`~fbo_torch.optim.domain.Domain` but the box)."""
    return {k: v for k, v in dataclass_fields(*DOMAIN_SOURCE).items() if k not in DOMAIN_NOT_OPTIONS}


#: The builtin YAML types an annotation may name for :func:`annotation_type` to read it.
_SIMPLE: dict[str, object] = {"int": int, "float": float, "str": str, "bool": bool, "dict": dict, "list": list}


def annotation_type(annotation: str) -> object | None:
    r"""The type an annotation names when it uses only builtin YAML types and ``None`` (``"int | None"``,
    ``"list[str]"``), as :func:`typing.get_type_hints` would give it; ``None`` for any other (``"Any"``,
    ``"torch.dtype | str | None"``), which is then not checked before torch is imported."""
    try:
        return _simple_type(ast.parse(annotation, mode="eval").body)
    except (SyntaxError, ValueError):
        return None


def _simple_type(node: ast.expr) -> object:
    if isinstance(node, ast.Constant) and node.value is None:
        return type(None)
    if isinstance(node, ast.Name) and node.id in _SIMPLE:
        return _SIMPLE[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _simple_type(node.left), _simple_type(node.right)
        return left | right  # type: ignore[operator]  # types and unions of them
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "list":
        return list[_simple_type(node.slice)]  # type: ignore[misc]  # a runtime alias, as get_type_hints gives
    raise ValueError(ast.unparse(node))
