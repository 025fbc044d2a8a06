"""The documentation site leads and stays whole: a getting-started page first, a snippet that runs, no link
that leaves the site (``make docs`` runs ``docs/check_links.py`` after Sphinx; ``docs/_ext/repo_pages.py``
copies the repository files the guides link to into the site), and every argument of the public API
documented."""

import ast
import importlib
import inspect
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS))
sys.path.insert(0, str(DOCS / "_ext"))

import check_links
import repo_pages


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_link_checker_reports_every_link_that_leaves_the_site(tmp_path, capsys):
    site = tmp_path / "html"
    _write(site / "index.html", '<a href="guide.html#x">g</a><a href="https://example.org">web</a><a href="#top">t</a>')
    _write(site / "_downloads" / "f.json", "{}")
    _write(
        site / "guide.html",
        '<a href="../../../configs/x.yaml">out</a> <img src="missing.png"> <a href="_downloads/f.json">ok</a>'
        '<link href="index.html"><a href="/index.html">root</a><a href="mailto:a@b.c">mail</a>',
    )
    assert check_links.broken_links(site) == [
        "guide.html: ../../../configs/x.yaml (leaves the site)",
        "guide.html: missing.png (no such file in the site)",
    ]
    assert check_links.main([str(site)]) == 1
    assert "2 link(s) of the site" in capsys.readouterr().err
    (site / "guide.html").write_text('<a href="index.html">back</a>')
    assert check_links.main([str(site)]) == 0


def test_make_docs_fails_on_a_link_that_leaves_the_site():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ndocs: ")[1].split("\n\n")[0]
    assert "sphinx" in recipe and "docs/check_links.py docs/_build/html" in recipe
    assert recipe.index("sphinx") < recipe.index("check_links")  # on the site Sphinx just built


def test_repository_files_the_guides_link_to_are_copied_into_the_site(tmp_path):
    repo = tmp_path / "repo"
    docs = repo / "docs"
    _write(docs / "guide.md", "[configs](../configs/) [study](../results/a/README.md#numbers) [web](https://x.org)\n")
    _write(docs / "other.md", "# other\n")
    _write(repo / "configs" / "one.yaml", "a: 1\n")
    _write(repo / "configs" / "sub" / "two.yaml", "b: 2\n")
    _write(
        repo / "results" / "a" / "README.md",
        "# A\n## Numbers\n[data](results.json) ![plot](plot.png) [guide](../../docs/other.md)\n"
        "```\n[not a link](../../nowhere.md)\n```\n",
    )
    _write(repo / "results" / "a" / "results.json", "{}")
    _write(repo / "results" / "a" / "plot.png", "png")
    mirror = repo_pages.Mirror(docs)
    mirror.collect()
    mirror.write()
    copied = sorted(p.relative_to(docs / "_repo").as_posix() for p in (docs / "_repo").rglob("*") if p.is_file())
    assert copied == [
        "configs/index.md",
        "configs/one.yaml",
        "configs/sub/index.md",
        "configs/sub/two.yaml",
        "results/a/README.md",
        "results/a/plot.png",
        "results/a/results.json",
    ]
    guide = mirror.rewrite(docs / "guide.md", (docs / "guide.md").read_text())
    assert guide == (
        "[configs](_repo/configs/index.md) [study](_repo/results/a/README.md#numbers) [web](https://x.org)\n"
    )
    study = docs / "_repo" / "results" / "a" / "README.md"
    text = mirror.rewrite(study, study.read_text())
    assert text.startswith("---\norphan: true\n---\n")  # reached by links, not the table of contents
    assert "[data](results.json) ![plot](plot.png) [guide](../../../other.md)" in text
    assert "[not a link](../../nowhere.md)" in text  # code is left as it is
    listing = (docs / "_repo" / "configs" / "index.md").read_text()
    assert "[`one.yaml`](one.yaml)" in listing and "[`sub/`](sub/index.md)" in listing


def test_the_index_leads_to_getting_started_and_the_readme():
    index = (DOCS / "index.md").read_text()
    toctree = index.split("```{toctree}")[1].split("```")[0]
    entries = [line for line in toctree.splitlines()[1:] if line and not line.startswith(":")]
    assert entries[0] == "getting-started"
    assert "[Getting started](getting-started.md)" in index and "[README](../README.md)" in index
    assert index.index("getting-started.md") < index.index("README")


def test_the_getting_started_snippet_runs(capsys):
    text = (DOCS / "getting-started.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    assert max(len(line) for line in code.splitlines()) <= 88  # fits the page
    exec(compile(code, "getting-started.md", "exec"), {})
    assert re.search(r"agent 3's message peaks at \[[-0-9., e]+\], value [-0-9.]+", capsys.readouterr().out)
    for section in ("## Install", "## A first YAML experiment", "## A first BoTorch loop", "## A first Flower"):
        assert section in text
    assert "fbo_torch/experiments/quickstart.yaml" in text  # the YAML shown is the file the package runs


# ------------------------------------------------------------------ every public argument documented

#: The public API: what the README's "What is in the box" names, with the packages' exports.
PUBLIC_MODULES = (
    "fbo_torch",
    "fbo_torch.acquisition",
    "fbo_torch.models",
    "fbo_torch.optim",
    "fbo_torch.kernels",
    "fbo_torch.sampling",
    "fbo_torch.privacy",
    "fbo_torch.objectives",
    "fbo_torch.protocol",
    "fbo_torch.federation",
)
PUBLIC_NAMES = ("fbo_torch.experiments.loop:run_experiment", "fbo_torch.experiments.loop:render_reports")


def _documented(doc: str | None) -> set[str]:
    """The names an ``Args:`` (or a dataclass's ``Attributes:``) section documents; ``a / b:`` documents both."""
    names, inside, indent = set(), False, None
    for line in inspect.cleandoc(doc or "").splitlines():
        if re.match(r"^(Args|Arguments|Parameters|Attributes):\s*$", line):
            inside, indent = True, None
            continue
        if inside and line and not line.startswith(" "):
            inside = False
        found = re.match(r"^(\s+)([\w*][\w, /*]*?)(\s*\(.*?\))?:(\s|$)", line) if inside else None
        if found and (indent is None or len(found.group(1)) == indent):
            indent = len(found.group(1))
            names |= {n.strip().lstrip("*") for n in re.split(r"[,/]", found.group(2))}
    return names


def _public_callables():
    objs = {}
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", [a for a in vars(module) if not a.startswith("_")]):
            objs[f"{name}.{attr}"] = getattr(module, attr)
    for spec in PUBLIC_NAMES:
        module, attr = spec.split(":")
        objs[spec] = getattr(importlib.import_module(module), attr)
    pytest.importorskip("ax")
    from fbo_torch.integrations import ax

    objs.update({f"fbo_torch.integrations.ax.{n}": getattr(ax, n) for n in ax.__all__})
    seen = set()
    for qual, obj in objs.items():
        if id(obj) in seen or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        seen.add(id(obj))
        if inspect.isclass(obj):
            if "__init__" in vars(obj) or hasattr(obj, "__dataclass_fields__"):
                yield qual, obj.__init__, obj.__doc__
        else:
            yield qual, obj, obj.__doc__


def test_every_argument_of_the_public_api_is_documented():
    """Each argument of every public function and class is in its docstring's ``Args:`` (a dataclass's fields
    in its ``Attributes:``). Before: e.g. FederatedThompsonSampling's ``train_X`` and ``train_Y`` only as
    ``train_X / train_Y``, which the site showed as one unknown name and two undocumented arguments."""
    missing = {}
    for qual, fn, doc in _public_callables():
        params = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        undocumented = [p for p in params if p not in _documented(doc)]
        if undocumented:
            missing[qual] = undocumented
    assert not missing, missing


def _sections(doc: str) -> set[str]:
    return set(re.findall(r"^\s*(\w+):\s*$", doc, re.M))


def _docstring_gaps(tree: ast.Module) -> list[str]:
    """Public functions and methods (and classes, for ``__init__``) whose ``Args:`` section leaves out an
    argument, and public functions with an ``Args:`` section that return a value but have no ``Returns:``."""
    gaps: list[str] = []

    def arguments(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
        a = fn.args
        return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]

    def visit(body: list[ast.stmt], owner: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                doc = ast.get_docstring(node) or ""
                init = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
                if init and "Args" in _sections(doc):
                    missing = [p for p in arguments(init[0]) if p not in _documented(doc)]
                    gaps.extend([f"{owner}{node.name}: Args leaves out {missing}"] if missing else [])
                visit(node.body, f"{owner}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                doc = ast.get_docstring(node) or ""
                if "Args" not in _sections(doc):
                    continue  # a one-line docstring says what it takes and returns in its sentence
                missing = [p for p in arguments(node) if p not in _documented(doc)]
                gaps.extend([f"{owner}{node.name}: Args leaves out {missing}"] if missing else [])
                returns = node.returns is not None and ast.unparse(node.returns) not in ("None", "NoReturn")
                is_property = any(ast.unparse(d).endswith("property") for d in node.decorator_list)
                if returns and not is_property and not {"Returns", "Yields"} & _sections(doc):
                    gaps.append(f"{owner}{node.name}: Args but no Returns")

    visit(tree.body, "")
    return gaps


def test_docstring_gaps_are_found():
    tree = ast.parse(
        "def f(a, b) -> int:\n"
        '    """F.\n\n    Args:\n        a: A. b: B.\n    """\n'
        "def g(a, b):\n"
        '    """G.\n\n    Args:\n        a / b: Both.\n    """\n'
        "class C:\n"
        '    """C.\n\n    Args:\n        x: X.\n    """\n'
        "    def __init__(self, x, y): ...\n"
        "    def h(self) -> int:\n"
        '        """The value, in one line."""\n'
    )
    assert _docstring_gaps(tree) == ["f: Args leaves out ['b']", "f: Args but no Returns", "C: Args leaves out ['y']"]


@pytest.mark.parametrize("path", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "fbo_torch").rglob("*.py")))
def test_every_public_function_documents_its_arguments_and_what_it_returns(path):
    """A docstring with an ``Args:`` section names every argument on its own entry (``a / b:`` for two, as
    ``docs/_ext/fbo_refs.py`` renders them; ``a: ... b: ...`` on one line shows ``b`` nowhere) and, if the
    function returns a value, says what in ``Returns:``. One-line docstrings, which say both in their
    sentence, are left to ruff's pydocstyle rules (pyproject.toml)."""
    assert not _docstring_gaps(ast.parse((ROOT / path).read_text()))


def test_an_args_entry_for_several_arguments_documents_each_in_the_site():
    import fbo_refs

    lines = [":param a: first", ":param num_restarts / raw_samples: Options of", "   optimize_acqf.", ":param b: x"]
    fbo_refs.split_joint_params(None, "function", "f", None, None, lines)
    assert lines == [
        ":param a: first",
        ":param num_restarts: Options of",
        "   optimize_acqf.",
        ":param raw_samples: Options of",
        "   optimize_acqf.",
        ":param b: x",
    ]
