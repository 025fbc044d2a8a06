r"""The error every module of the Ax integration raises when the ``ax`` extra is missing."""

from __future__ import annotations


def ax_missing(module: str) -> ImportError:
    """The ``ImportError`` ``module`` raises when Ax cannot be imported (chain the original with ``from``)."""
    return ImportError(
        f"{module} needs Ax (ax-platform >= 1.3.1, Python >= 3.11): "
        "install the extra with `pip install 'fbo_torch[ax]'`."
    )
