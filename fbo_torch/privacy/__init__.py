r"""Differential-privacy accounting for DP-FTS-DE.

DP-FTS-DE (Dai et al., 2021) releases the server's aggregate once per round
through a Poisson-subsampled Gaussian mechanism (sampling rate ``q``, noise
multiplier ``z``). This package turns those releases into an (ε, δ) guarantee.

* :func:`get_accountant` creates an accountant shaped like Opacus'
  ``IAccountant`` (``step``, ``get_epsilon``, ``history``, ``state_dict``):
  ``"rdp"`` (default), ``"prv"``, ``"gdp"`` (all backed by Opacus) and
  ``"rdp-classic"`` (the papers' moments accountant, which reproduces their
  published ε exactly).
* :func:`compute_epsilon` / :func:`calibrate_noise` are the one-shot forms.
* :class:`PrivacyLedger` is the per-run record a server keeps.
* ``"rdp-classic"`` is also an Opacus ``IAccountant``
  (:class:`~fbo_torch.privacy.opacus_accountants.OpacusClassicRDPAccountant`)
  registered with Opacus, so ``opacus.accountants.create_accountant``,
  ``get_noise_multiplier`` and ``PrivacyEngine`` accept the name.

Opacus is imported lazily (only when an accountant is created or a function
called), so importing this package works on machines without it. The
registration with Opacus happens at that point, at import if Opacus is already
imported, or by calling :func:`register_opacus_accountants`.

Example:
    >>> from fbo_torch.privacy import compute_epsilon
    >>> N = 200
    >>> round(compute_epsilon(0.25, 1.0, steps=40, delta=N ** -1.1, accountant="rdp-classic"), 2)
    9.91
"""

import sys as _sys

from fbo_torch.privacy.accountants import (
    ACCOUNTANTS,
    ClassicRDPAccountant,
    GaussianDPAccountant,
    PRVAccountant,
    PrivacyAccountant,
    RDPAccountant,
    calibrate_noise,
    compute_epsilon,
    get_accountant,
    register_opacus_accountants,
)
from fbo_torch.privacy.ledger import PrivacyLedger, default_delta, deployment_delta

if "opacus.accountants" in _sys.modules:  # Opacus already loaded: registering costs nothing
    register_opacus_accountants()

__all__ = [
    "ACCOUNTANTS",
    "ClassicRDPAccountant",
    "GaussianDPAccountant",
    "PRVAccountant",
    "PrivacyAccountant",
    "PrivacyLedger",
    "RDPAccountant",
    "calibrate_noise",
    "compute_epsilon",
    "default_delta",
    "deployment_delta",
    "get_accountant",
    "register_opacus_accountants",
]
