r"""Algorithms by name: one :class:`~fbo_torch.methods.base.Method` class per algorithm.

=============  ===========================================================  ===================
name           what it is                                                   module
=============  ===========================================================  ===================
``ts``         standard TS / the local engine: no peers                     :mod:`.ts`
``fts``        federated Thompson sampling                                  :mod:`.fts`
``peer_prior`` the peers' optima as a πBO prior                             :mod:`.peer_prior`
``transfer``   multi-channel transfer (optima, function, landscape)         :mod:`.transfer`
``rgpe``       ranking-weighted GP ensemble (FTS paper's baseline)          :mod:`.rgpe`
``taf``        transfer acquisition function (FTS paper's baseline)         :mod:`.taf`
``fts_de``     DP-FTS-DE (a DP-FTS-DE experiment's federated method)        :mod:`.fts_de`
=============  ===========================================================  ===================

:func:`get_method` looks one up (loading the built-ins on first use);
:func:`register_method` adds your own.
"""

from fbo_torch.methods.base import (
    HISTORY_MODES,
    KINDS,
    MESSAGES,
    METHODS,
    OWN_ACQUISITIONS,
    Method,
    get_method,
    method_names,
    register_method,
    unregister_method,
)

__all__ = [
    "HISTORY_MODES",
    "KINDS",
    "MESSAGES",
    "METHODS",
    "OWN_ACQUISITIONS",
    "Method",
    "get_method",
    "method_names",
    "register_method",
    "unregister_method",
]
