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

Opacus itself is imported when it is first needed (an accountant created, ε
computed, one of the two accountant classes above named) or when someone else
imports it, and fbo_torch's accountants join its registry then
(:func:`~fbo_torch.privacy.accountants.register_when_opacus_loads`): a process
that only checks privacy settings, as a Flower round's, never pays for it.

Example:
    >>> from fbo_torch.privacy import compute_epsilon
    >>> N = 200
    >>> round(compute_epsilon(0.25, 1.0, steps=40, delta=N ** -1.1, accountant="rdp-classic"), 2)
    9.91
"""

import importlib
from typing import TYPE_CHECKING, Any

from fbo_torch.privacy.accountants import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    append_release,
    check_accountant_name,
    get_epsilon,
    num_releases,
    register_when_opacus_loads,
)
from fbo_torch.privacy.calibration import calibrate_noise, compute_epsilon
from fbo_torch.privacy.ledger import PrivacyLedger, default_delta, deployment_delta

if TYPE_CHECKING:
    from fbo_torch.privacy.ddg import DDGConstants, DistributedDiscreteGaussianAccountant
    from fbo_torch.privacy.rdp_classic import ClassicRDPAccountant

#: The names defined in modules that import Opacus, and those modules: imported when a name is first read.
_WITH_OPACUS = {
    "ClassicRDPAccountant": "fbo_torch.privacy.rdp_classic",
    "DDGConstants": "fbo_torch.privacy.ddg",
    "DistributedDiscreteGaussianAccountant": "fbo_torch.privacy.ddg",
}


def __getattr__(name: str) -> Any:
    if name not in _WITH_OPACUS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WITH_OPACUS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WITH_OPACUS))


register_when_opacus_loads()

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
