r"""Privacy-analysis maths of :mod:`fbo_torch.privacy`: functions only, no accountants.

Mirrors ``opacus.accountants.analysis``: the accountants keep the history and
the interface, the functions here do the maths on a history of
``(noise_multiplier, sample_rate, num_steps)`` triples.

* :mod:`~fbo_torch.privacy.analysis.rdp` — the RDP of a history (Opacus'
  ``compute_rdp`` per segment, cached).
* :mod:`~fbo_torch.privacy.analysis.rdp_classic` — the papers' moments
  accountant: RDP at the integer orders 2..256 and the classic RDP → (ε, δ)
  conversion, which reproduce DP-FTS-DE's published ε exactly.
* :mod:`~fbo_torch.privacy.analysis.ddg` — the distributed discrete Gaussian
  (KLS 2021, Prop. 14) and Zhu & Wang's Poisson subsampling of any mechanism.
* :mod:`~fbo_torch.privacy.analysis.gdp` — Gaussian DP of a history whose
  ``(z, q)`` may change between segments.
"""

from fbo_torch.privacy.analysis.ddg import (
    compute_rdp_ddg,
    compute_rdp_ddg_history,
    compute_rdp_poisson_subsampled,
    ddg_tau,
)
from fbo_torch.privacy.analysis.gdp import compute_eps_history, compute_mu_history
from fbo_torch.privacy.analysis.rdp import check_orders, compute_rdp_history
from fbo_torch.privacy.analysis.rdp_classic import (
    DEFAULT_ORDERS,
    compute_rdp_classic,
    get_privacy_spent_classic,
)

__all__ = [
    "DEFAULT_ORDERS",
    "check_orders",
    "compute_eps_history",
    "compute_rdp_ddg",
    "compute_rdp_ddg_history",
    "compute_rdp_poisson_subsampled",
    "ddg_tau",
    "compute_mu_history",
    "compute_rdp_classic",
    "compute_rdp_history",
    "get_privacy_spent_classic",
]
