r"""The package's import graph: no import cycle between files, no import up the layers of packages
(:data:`LAYERS`; the few that remain are named with their reason), the protocol below everything
that computes a round, and the deployment does not depend on the simulator.

The graphs are read from the source (:mod:`ast`, nothing is imported), one node per
file. An edge goes from a module to the deepest ``fbo_torch`` module an import names
(``from fbo_torch.a import b`` reaches ``fbo_torch.a.b`` when that is a module,
else ``fbo_torch.a``). Three graphs, each without a cycle:

* *module level*: the imports that run when the file is imported (those inside
  functions and under ``if TYPE_CHECKING:`` left out) — a cycle here is an import
  that can fail depending on which file is imported first;
* *run time*: also the imports inside functions (a function-local import hides a
  cycle, it does not remove it); the deployment check below reads this one;
* *every import*: also those under ``if TYPE_CHECKING:`` — the type checker and a
  reader follow them, so a cycle there still ties two concepts into one.

An import that runs also reaches the ``__init__`` of every package above its target
that does not hold the importing file (Python runs it first): ``sampling.gp_paths``
importing ``models.gp_posterior`` at run time would run ``models/__init__``, which
imports ``models.batched_gp``, which imports ``sampling.gp_paths``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fbo_torch

ROOT = Path(fbo_torch.__file__).parent


def _module_files() -> dict[str, Path]:
    mods = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("fbo_torch", *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


MODULES = _module_files()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, functions: bool = True, type_checking: bool = False) -> list[tuple[ast.stmt, bool]]:
    """The import statements of ``tree``, each with whether it runs: those inside functions with
    ``functions``, those under ``if TYPE_CHECKING:`` (which never run) with ``type_checking``."""
    found = []

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, runs)
            if type_checking:
                for child in node.body:
                    visit(child, False)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not functions:
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, runs))
        for child in ast.iter_child_nodes(node):
            visit(child, runs)

    visit(tree, True)
    return found


def _resolve(name: str) -> str | None:
    """The deepest module of the package that ``name`` lies in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


TREES = {module: ast.parse(path.read_text(), str(path)) for module, path in MODULES.items()}


def _import_graph(functions: bool = True, type_checking: bool = False) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node, runs in _imports(TREES[module], functions, type_checking):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]
            for name in names:
                if name == "fbo_torch" or name.startswith("fbo_torch."):
                    target = _resolve(name)
                    if target is None or target == module:
                        continue
                    graph[module].add(target)
                    if runs:  # importing fbo_torch.a.b first runs fbo_torch.a's __init__ (unless it is ours)
                        parts = target.split(".")
                        for k in range(2, len(parts)):
                            parent = ".".join(parts[:k])
                            if not (module == parent or module.startswith(parent + ".")):
                                graph[module].add(parent)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle through ``component`` (a strongly connected component), first module repeated at the end."""
    start, members = component[0], set(component)
    parent: dict[str, str] = {}
    todo = [start]
    while todo:  # breadth first: the shortest way back to ``start``
        v = todo.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if w not in parent:
                parent[w] = v
                todo.append(w)
    raise AssertionError(f"{component} is not strongly connected")


GRAPH = _import_graph()
GRAPHS = {
    "module level": _import_graph(functions=False),
    "run time": GRAPH,
    "every import": _import_graph(type_checking=True),
}


def test_the_graphs_see_the_right_imports():
    tree = ast.parse(
        "import fbo_torch.a\n"
        "def f():\n    from fbo_torch.privacy import ledger\n"
        "if TYPE_CHECKING:\n    import fbo_torch.cli\n"
        "class C:\n    import fbo_torch.b\n"
    )
    names = [ast.unparse(n) for n, _ in _imports(tree)]
    assert names == ["import fbo_torch.a", "from fbo_torch.privacy import ledger", "import fbo_torch.b"]
    assert [ast.unparse(n) for n, _ in _imports(tree, functions=False)] == ["import fbo_torch.a", "import fbo_torch.b"]
    assert [runs for _, runs in _imports(tree, type_checking=True)] == [True, True, False, True]
    # a function-local import (the CLI's lazy ones) is in the run-time graph only
    assert "fbo_torch.experiments.loop" in GRAPHS["run time"]["fbo_torch.cli"]
    assert "fbo_torch.experiments.loop" not in GRAPHS["module level"]["fbo_torch.cli"]
    # a submodule imported by name from its package is an edge to the submodule
    assert "fbo_torch.utils.keyed_random" in GRAPHS["module level"]["fbo_torch.models.batched_gp"]
    # an import under TYPE_CHECKING only: protocol.input_space names AgentMessage in annotations
    assert "fbo_torch.protocol.messages" in GRAPHS["every import"]["fbo_torch.protocol.input_space"]
    assert "fbo_torch.protocol.messages" not in GRAPHS["run time"]["fbo_torch.protocol.input_space"]
    # importing a module of another subpackage runs that subpackage's __init__ first: an edge to it
    assert "fbo_torch.optim" in GRAPHS["module level"]["fbo_torch.models.batched_gp"]
    assert "fbo_torch.models" not in GRAPHS["module level"]["fbo_torch.models.batched_gp"]


def test_cycles_are_found_and_printed():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "b"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycle_path(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert _cycles({"a": {"b"}, "b": set()}) == []


#: Cycles left, each with why (none): any cycle fails.
KNOWN_CYCLES: list[list[str]] = []


@pytest.mark.parametrize("kind", list(GRAPHS))
def test_no_import_cycle_between_files(kind):
    graph = GRAPHS[kind]
    cycles = [
        " -> ".join(_cycle_path(graph, c)) + (f" (all of {c})" if len(c) > 2 else "")
        for c in _cycles(graph)
        if c not in KNOWN_CYCLES
    ]
    assert not cycles, f"import cycles ({kind}): " + "; ".join(cycles)


def _reachable(start: str) -> set[str]:
    """Every module that importing ``start`` can import, its parent packages' imports included."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(GRAPH[module])
        parent = module.rpartition(".")[0]
        if parent:
            todo.append(parent)
    return seen


@pytest.mark.parametrize("deployment", ["fbo_torch.flower", "fbo_torch.federation"])
def test_deployment_imports_nothing_of_the_simulator(deployment):
    modules = [m for m in MODULES if m == deployment or m.startswith(deployment + ".")]
    assert len(modules) > 1
    for module in modules:
        bad = sorted(m for m in _reachable(module) if m.split(".")[1:2] in (["simulate"], ["experiments"]))
        assert not bad, f"{module} imports {bad}"


def test_the_package_imports_no_private_name_of_another_library():
    """A private name (``_x``, or a module ``_x``) of BoTorch, GPyTorch, Opacus or Flower may change in any
    release; the package uses their public API only (the tests may compare with a private helper)."""
    found = []
    for name, path in MODULES.items():
        for node, _ in _imports(ast.parse(path.read_text()), type_checking=True):
            if not isinstance(node, ast.ImportFrom) or node.module is None or node.module.startswith("fbo_torch"):
                continue
            if node.module.split(".")[0] not in ("botorch", "gpytorch", "opacus", "flwr"):
                continue
            private = [a.name for a in node.names if a.name.startswith("_")]
            private += [p for p in node.module.split(".") if p.startswith("_")]
            if private:
                found.append(f"{name}: from {node.module} import {private}")
    assert not found, found


#: The packages from the ground up: a module imports only from its own layer and the layers below.
#: ``protocol`` (what agents and server exchange) lies under everything that computes a round.
LAYERS = [
    {"utils"},
    {"features", "privacy", "optim", "report"},  # report: HTML pieces, imports nothing of the package
    {"sampling", "kernels", "objectives", "fit"},
    {"protocol"},
    {"models"},
    {"acquisition"},
    {"methods"},
    {"federation"},
    {"simulate", "flower", "integrations"},
    {"experiments"},
    {"cli"},
]
LAYER = {package: level for level, packages in enumerate(LAYERS) for package in packages}

#: The imports that run up the layers, each with why it stays. Any other, in any of the three graphs, fails.
KNOWN_UPWARD = {
    ("fbo_torch.sampling.gp_paths", "fbo_torch.models.gp_posterior"): "type annotations only (under "
    "TYPE_CHECKING): GPThompsonPaths.from_draws takes the FactoredGPs the exact-GP model computes",
}


def _package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_every_package_has_a_layer():
    packages = {_package(m) for m in MODULES} - {""}
    assert packages == set(LAYER), f"unlayered: {sorted(packages - set(LAYER))}, gone: {sorted(set(LAYER) - packages)}"


@pytest.mark.parametrize("kind", list(GRAPHS))
def test_no_import_runs_up_the_layers(kind):
    """The package's ``__init__`` (the public face: it may import from anywhere) and imports of it are not layered."""
    upward = [
        f"{a} -> {b}"
        for a, targets in GRAPHS[kind].items()
        for b in sorted(targets)
        if _package(a) and _package(b) and LAYER[_package(b)] > LAYER[_package(a)] and (a, b) not in KNOWN_UPWARD
    ]
    assert not upward, f"imports up the layers ({kind}): " + "; ".join(upward)


def test_the_known_upward_imports_still_exist():
    edges = {(a, b) for graph in GRAPHS.values() for a, targets in graph.items() for b in targets}
    assert not set(KNOWN_UPWARD) - edges, f"gone, remove from KNOWN_UPWARD: {sorted(set(KNOWN_UPWARD) - edges)}"


def test_the_protocol_imports_nothing_above_it():
    """What agents and server exchange depends on no model, acquisition function, agent, server or runner."""
    protocol = [m for m in MODULES if _package(m) == "protocol"]
    assert len(protocol) > 1
    allowed = {p for p, level in LAYER.items() if level <= LAYER["protocol"]}
    for module in protocol:
        imported = _reachable(module) | GRAPHS["every import"][module]
        bad = sorted(m for m in imported if _package(m) and _package(m) not in allowed)
        assert not bad, f"{module} imports {bad}"
