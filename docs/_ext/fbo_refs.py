"""Sphinx hooks that make the reference's cross-references resolve the way Python resolves names.

- A reference by a package's public path (``fbo_torch.federation.DPAggregator``) or by a name a module
  imports (``GPSpec`` in :mod:`fbo_torch.models.batched_gp`) resolves to the one place the object is
  documented: where it is defined. The name is looked up in Python (the module, class or package of
  the docstring, then as an absolute path) and must land on a documented object, else Sphinx warns.
- A name that Python resolves to another library's object (``Tensor`` imported from torch) is accepted
  unlinked, like the third-party names of ``nitpick_ignore_regex`` in conf.py (no inventories here).
- Private base classes that public classes inherit from are documented (their methods are the
  public classes' methods).
- Attribute docstrings are prose: a first line "Numbers sent: ..." is not napoleon's "type: text".

(A guide's links to repository files outside ``docs/`` are the business of ``repo_pages.py``.)
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.ext.napoleon.docstring import GoogleDocstring

PACKAGE = "fbo_torch"
_MISSING = object()


def _import_prefix(path: str) -> tuple[Any, list[str]]:
    """The longest importable module prefix of a dotted ``path`` and the remaining names."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        return module, parts[i:]
    return None, parts


def _walk(obj: Any, names: list[str]) -> tuple[Any, Any, str | None]:
    """``getattr`` along ``names``: (the object, its owner, the last name), or ``_MISSING``."""
    owner, last = None, None
    for name in names:
        owner, last = obj, name
        value = getattr(obj, name, _MISSING)
        annotated = inspect.isclass(obj) and any(name in getattr(c, "__annotations__", {}) for c in obj.__mro__)
        if value is _MISSING and annotated:  # a dataclass field without a default
            value = None
        if value is _MISSING:
            return _MISSING, None, None
        obj = value
    return obj, owner, last


def _lookup(target: str, modname: str | None, clsname: str | None) -> tuple[Any, Any, str | None]:
    """What Python names ``target`` from the docstring's class, then its module, then absolutely."""
    target = target.lstrip("~.")
    names = target.split(".")
    scopes = []
    if modname:
        module = sys.modules.get(modname) or _import_prefix(modname)[0]
        if module is not None and clsname:
            cls, _, _ = _walk(module, clsname.split("."))
            if cls is not _MISSING:
                scopes.append(cls)
        if module is not None:
            scopes.append(module)
    for scope in scopes:
        found = _walk(scope, names)
        if found[0] is not _MISSING:
            return found
    module, rest = _import_prefix(target)
    if module is None:
        return _MISSING, None, None
    if not rest:
        return module, None, None
    return _walk(module, rest)


def _defined_name(obj: Any) -> str | None:
    name = getattr(obj, "__qualname__", None)
    module = getattr(obj, "__module__", None)
    if inspect.ismodule(obj):
        return obj.__name__
    if isinstance(name, str) and isinstance(module, str) and "<" not in name:
        return f"{module}.{name}"
    return None


def _candidates(obj: Any, owner: Any, last: str | None) -> list[str]:
    """The documented names ``obj`` may have: where it is defined, in order of preference."""
    out = []
    if inspect.isclass(owner) and last:  # a method, property or attribute: the class that defines it
        for cls in owner.__mro__:
            if last in vars(cls) or last in getattr(cls, "__annotations__", {}):
                if (base := _defined_name(cls)) is not None:
                    out.append(f"{base}.{last}")
                break
    if (name := _defined_name(obj)) is not None:
        out.append(name)
    if last and (inspect.ismodule(owner) or owner is None):  # module data: every module that binds it
        for mod_name, module in list(sys.modules.items()):
            if mod_name.split(".")[0] == PACKAGE and getattr(module, last, _MISSING) is obj:
                out.append(f"{mod_name}.{last}")
    return out


def resolve_python_name(app: Sphinx, env: Any, node: addnodes.pending_xref, contnode: nodes.Element) -> Any:
    if node.get("refdomain") != "py":
        return None
    obj, owner, last = _lookup(node["reftarget"], node.get("py:module"), node.get("py:class"))
    if obj is _MISSING:
        return None
    domain = env.get_domain("py")
    for name in _candidates(obj, owner, last):
        if name.split(".")[0] != PACKAGE:
            return contnode  # another library's object: accepted unlinked (no inventory)
        if name in domain.objects and name != node["reftarget"]:
            return domain.resolve_any_xref(env, node["refdoc"], app.builder, name, node, contnode)[0][1]
    return None


def document_private_bases(app: Sphinx, what: str, name: str, obj: Any, skip: bool, options: Any) -> Any:
    """Document ``_Base`` when a public class of the package inherits from it."""
    private_class = skip and name.startswith("_") and not name.startswith("__") and inspect.isclass(obj)
    ours = private_class and obj.__module__.split(".")[0] == PACKAGE
    if ours and any(not sub.__name__.startswith("_") for sub in obj.__subclasses__()):
        return False
    return None


def _consume_prose_attribute(self: GoogleDocstring) -> tuple[str, list[str]]:
    """Napoleon's reading of an attribute docstring, except that "Words with spaces: text" is prose."""
    first = self._lines.get(0)  # a sentinel object when the docstring is empty
    first = first if isinstance(first, str) else ""
    head = first.split(":", 1)[0].strip() if ":" in first else ""
    if " " in head and not any(c in head for c in "[]|`"):  # words, not a type such as ``list[int] | None``
        return "", self.__class__(list(self._consume_to_end()), self._config).lines()
    return _consume_inline_attribute(self)


_consume_inline_attribute = GoogleDocstring._consume_inline_attribute


_IVAR_NAMES = re.compile(r"^(\s*:ivar )([^:]*\s[^:]*):")


def joined_attribute_names(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """An "Attributes:" entry for several names (``lb, ub:``, ``p_t / p1_equals_p2:``) stays one entry.

    Sphinx reads a field ``:ivar a / b:`` as the type ``a /`` of the name ``b``; without spaces it is a name.
    """
    for i, line in enumerate(lines):
        lines[i] = _IVAR_NAMES.sub(lambda m: m.group(1) + re.sub(r"\s+", "", m.group(2)) + ":", line)


_JOINT_PARAM = re.compile(r"^(\s*):param ([A-Za-z_]\w*(?:\s*[/,]\s*[A-Za-z_]\w*)+):(.*)$")


def split_joint_params(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """An "Args:" entry for several arguments (``num_restarts / raw_samples:``) documents each of them.

    Napoleon turns it into one field ``:param num_restarts / raw_samples:``, which Sphinx shows as one
    unknown name (and, with the type hints, both arguments again as undocumented); this gives each argument
    its own field with the entry's text.
    """
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = _JOINT_PARAM.match(lines[i])
        if m is None:
            out.append(lines[i])
            i += 1
            continue
        indent, names, first = m.group(1), re.split(r"\s*[/,]\s*", m.group(2)), m.group(3)
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) > len(indent):
            body.append(lines[i])
            i += 1
        for n in names:
            out += [f"{indent}:param {n}:{first}", *body]
    lines[:] = out


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("missing-reference", resolve_python_name, priority=900)  # after intersphinx (500)
    app.connect("autodoc-skip-member", document_private_bases)
    GoogleDocstring._consume_inline_attribute = _consume_prose_attribute  # Sphinx 8.2 (pinned)
    app.connect("autodoc-process-docstring", joined_attribute_names, priority=600)  # after napoleon (500)
    app.connect("autodoc-process-docstring", split_joint_params, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
