"""Sphinx configuration: the API reference (autodoc + napoleon) and the guides in docs/*.md (MyST).

Built by ``make docs`` as ``sphinx-build -W --keep-going -n``: every warning is an error and every
cross-reference must resolve (nitpicky).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # document this checkout, not an installed copy
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import fbo_torch  # noqa: E402

project = "fbo_torch"
author = "fbo_torch developers"
copyright = "fbo_torch developers"
release = version = fbo_torch.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "myst_parser",
    "fbo_refs",  # docs/_ext/fbo_refs.py: names resolved as Python resolves them
    "repo_pages",  # docs/_ext/repo_pages.py: the repository files the guides link to, copied into the site
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
templates_path = ["_templates"]
root_doc = "index"

# -- API reference ------------------------------------------------------------------------------
# One page per module (autosummary, recursive from the package): a table of its public names, then
# each one documented where it is defined (a re-export in a package's __init__ links there).
autosummary_generate = True
autosummary_imported_members = False
autosummary_ignore_module_all = True  # a module's page lists what it defines; re-exports link to it
autodoc_default_options = {
    "members": True,
    "undoc-members": True,
    "show-inheritance": True,
    "member-order": "bysource",
    "ignore-module-all": True,
}
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autoclass_content = "class"

# The docstrings are Google style (Args:, Returns:, Raises:, Example:).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_preprocess_types = True
napoleon_attr_annotations = True
napoleon_use_ivar = True  # "Attributes:" as a field list: the attributes themselves are documented once, by autodoc

# -- Guides (docs/*.md) ------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 4  # the guides link to each other's sections by GitHub-style anchors

# -- Cross-references ----------------------------------------------------------------------------
nitpicky = True
# Inventories of the libraries we build on. The machines this project is built on reach package
# registries only, not the documentation hosts, so they are fetched only when asked
# (FBO_DOCS_INTERSPHINX=1); without them, references into those libraries are accepted unresolved by
# ``nitpick_ignore_regex`` below. Our own names are never ignored: each must resolve.
intersphinx_mapping = {}
if os.environ.get("FBO_DOCS_INTERSPHINX") == "1":
    intersphinx_mapping = {
        "python": ("https://docs.python.org/3", None),
        "numpy": ("https://numpy.org/doc/stable", None),
        "torch": ("https://docs.pytorch.org/docs/stable", None),
        "botorch": ("https://botorch.readthedocs.io/en/stable", None),
        "gpytorch": ("https://docs.gpytorch.ai/en/stable", None),
    }
_THIRD_PARTY = (
    "torch",
    "botorch",
    "gpytorch",
    "linear_operator",
    "opacus",
    "numpy",
    "np",
    "scipy",
    "sklearn",
    "matplotlib",
    "yaml",
    "flwr",
    "ax",
    "pyre_extensions",
    "torchvision",
    "cryptography",
)
# The standard library's names (annotations such as ``collections.abc.Sequence``, ``pathlib.Path``)
# are accepted for the same reason: no inventory of docs.python.org here.
nitpick_ignore_regex = [(r"py:.*", rf"{name}(\..*)?") for name in (*_THIRD_PARTY, *sorted(sys.stdlib_module_names))]
# Opacus' IAccountant, which fbo_torch.privacy and the release mechanisms import only under TYPE_CHECKING
# (Opacus is imported when first needed), stands in annotations by its bare name: an Opacus name as above.
nitpick_ignore_regex.append((r"py:class", r"IAccountant"))
# A module's private type variables (``_MethodT`` of a class decorator's signature) have no page:
# they are an annotation's placeholder, not a name a user imports.
nitpick_ignore_regex.append((r"py:(class|obj)", r"fbo_torch(\.\w+)*\._\w+T"))  # obj: a Generic base

# -- HTML ----------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"fbo_torch {release}"
