r"""Privacy-analysis maths behind :mod:`fbo_torch.privacy.accountants`.

Mirrors ``opacus.accountants.analysis``: the accountants keep the history and
the interface, the functions here do the maths. Only the paper-compatible
moments accountant (:mod:`~fbo_torch.privacy.analysis.rdp_classic`) lives here;
the other accountants call Opacus' own analysis code.

Nothing in this package imports Opacus at import time; :func:`require_opacus`
imports it on first use and turns a missing install into a clear error.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from fbo_torch.privacy.analysis.rdp_classic import (
    DEFAULT_ORDERS,
    compute_rdp_classic,
    compute_rdp_history,
    get_privacy_spent_classic,
)

OPACUS_MISSING = (
    "Privacy accounting in fbo_torch is backed by Opacus, which is not installed. "
    "Install it with `pip install opacus` (or `pip install fbo_torch`, which depends on it)."
)


def require_opacus(module: str = "opacus.accountants") -> ModuleType:
    r"""Import an Opacus module on demand.

    ``import fbo_torch.privacy`` never imports Opacus (machines that only run the
    non-private FTS may not have it); accountants call this when created.

    Args:
        module: Dotted name of the Opacus module to import, e.g.
            ``"opacus.accountants.analysis.rdp"``.

    Returns:
        The imported module.

    Raises:
        ImportError: If Opacus is not installed; the message says ``pip install opacus``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"{OPACUS_MISSING} (failed to import `{module}`: {err})") from err


__all__ = [
    "DEFAULT_ORDERS",
    "OPACUS_MISSING",
    "compute_rdp_classic",
    "compute_rdp_history",
    "get_privacy_spent_classic",
    "require_opacus",
]
