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

Opacus is imported lazily (only when an accountant is created or a function
called), so importing this package works on machines without it.

Example:
    >>> from fbo_torch.privacy import compute_epsilon
    >>> N = 200
    >>> round(compute_epsilon(0.25, 1.0, steps=40, delta=N ** -1.1, accountant="rdp-classic"), 2)
    9.91
"""

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
)
from fbo_torch.privacy.ledger import PrivacyLedger, default_delta

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
    "get_accountant",
]
