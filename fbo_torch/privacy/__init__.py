r"""Differential-privacy accounting for DP-FTS-DE, on Opacus' accountants.

DP-FTS-DE (Dai et al., 2021) releases the server's aggregate once per round
through a Poisson-subsampled Gaussian mechanism (sampling rate ``q``, noise
multiplier ``z``). This package turns those releases into an (ε, δ) guarantee
with Opacus' accountants (``opacus.accountants.create_accountant(name)``):

* Importing it registers the papers' moments accountant,
  :class:`~fbo_torch.privacy.rdp_classic.ClassicRDPAccountant`, with Opacus as
  ``"rdp-classic"``, so ``create_accountant("rdp-classic")``,
  ``get_noise_multiplier(..., accountant="rdp-classic")`` and
  ``PrivacyEngine(accountant="rdp-classic")`` work. Its maths (which
  reproduces the papers' published ε exactly) is in :mod:`fbo_torch.privacy.analysis`.
* :data:`ACCOUNTANTS` names the accountants fbo_torch reports ε with:
  ``"rdp"`` (:data:`DEFAULT_ACCOUNTANT`), ``"prv"``, ``"gdp"``, ``"rdp-classic"``.
* :func:`get_epsilon` is the ε of any Opacus accountant with fbo_torch's
  guards (:mod:`fbo_torch.privacy.accountants`).
* :func:`compute_epsilon` / :func:`calibrate_noise` are the one-shot forms.
* :class:`PrivacyLedger` is the per-run record a server keeps.
* :class:`DistributedDiscreteGaussianAccountant` (``"ddg"``, registered with
  Opacus on import) accounts the releases of secure aggregation with
  distributed discrete Gaussian noise (:mod:`fbo_torch.privacy.ddg`).

Example:
    >>> from fbo_torch.privacy import compute_epsilon
    >>> N = 200
    >>> round(compute_epsilon(0.25, 1.0, steps=40, delta=N ** -1.1, accountant="rdp-classic"), 2)
    9.91
"""

from fbo_torch.privacy.accountants import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    append_release,
    check_accountant_name,
    get_epsilon,
    num_releases,
)
from fbo_torch.privacy.calibration import calibrate_noise, compute_epsilon
from fbo_torch.privacy.ddg import DDGConstants, DistributedDiscreteGaussianAccountant
from fbo_torch.privacy.ledger import PrivacyLedger, default_delta, deployment_delta
from fbo_torch.privacy.rdp_classic import ClassicRDPAccountant

__all__ = [
    "ACCOUNTANTS",
    "DEFAULT_ACCOUNTANT",
    "ClassicRDPAccountant",
    "DDGConstants",
    "DistributedDiscreteGaussianAccountant",
    "PrivacyLedger",
    "append_release",
    "calibrate_noise",
    "check_accountant_name",
    "compute_epsilon",
    "default_delta",
    "deployment_delta",
    "get_epsilon",
    "num_releases",
]
