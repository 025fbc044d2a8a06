r"""The paper-compatible moments accountant as an Opacus ``IAccountant``, registered with Opacus.

Importing this module imports Opacus and registers the mechanism
``"rdp-classic"`` in Opacus' accountant registry, so Opacus' own tools accept it:

    >>> import fbo_torch.privacy.opacus_accountants  # or any fbo_torch accountant use
    >>> from opacus.accountants import create_accountant
    >>> from opacus.accountants.utils import get_noise_multiplier
    >>> acc = create_accountant("rdp-classic")
    >>> z = get_noise_multiplier(target_epsilon=9.91, target_delta=200 ** -1.1,
    ...                          sample_rate=0.25, steps=40, accountant="rdp-classic")

and ``PrivacyEngine(accountant="rdp-classic")`` trains with it.
``import fbo_torch.privacy`` does not import Opacus; it registers the mechanism
when Opacus is already imported, and otherwise the first time an fbo_torch
accountant is created (:func:`fbo_torch.privacy.get_accountant`,
``compute_epsilon``, ``calibrate_noise``, a ``PrivacyLedger``) or when
:func:`fbo_torch.privacy.register_opacus_accountants` is called.
"""

from __future__ import annotations

from collections.abc import Sequence

from opacus.accountants import RDPAccountant, create_accountant, register_accountant

from fbo_torch.privacy.analysis.rdp_classic import (
    DEFAULT_ORDERS,
    compute_rdp_classic,
    get_privacy_spent_classic,
)

__all__ = ["OpacusClassicRDPAccountant", "register"]


class OpacusClassicRDPAccountant(RDPAccountant):
    r"""The moments accountant of Abadi et al. (2016), as DP-FTS-DE reports ε, for Opacus.

    Opacus' ``RDPAccountant`` (same run-length ``history``, ``step`` and
    ``len`` = number of history segments, as in Opacus) with the paper's
    analysis: RDP at the integer orders ``2..256`` and the classic conversion
    ``ε = min_α [RDP(α) + log(1/δ)/(α-1)]``
    (:mod:`fbo_torch.privacy.analysis.rdp_classic`). Looser than ``"rdp"``;
    use it to reproduce the papers' numbers. Its ``state_dict`` is
    interchangeable with :class:`fbo_torch.privacy.ClassicRDPAccountant`'s.
    """

    DEFAULT_ALPHAS = list(DEFAULT_ORDERS)

    @classmethod
    def mechanism(cls) -> str:
        return "rdp-classic"

    def get_privacy_spent(
        self, *, delta: float, alphas: Sequence[float] | None = None
    ) -> tuple[float, float]:
        r"""``(ε, best_order)`` for target ``δ``; ``(0, 0)`` with no steps, as Opacus' RDP accountant."""
        if not self.history:
            return 0, 0
        orders = self.DEFAULT_ALPHAS if alphas is None else list(alphas)
        rdp = compute_rdp_classic(self.history, orders)
        return get_privacy_spent_classic(orders=orders, rdp=rdp, delta=delta)


def register() -> None:
    r"""Register ``"rdp-classic"`` with Opacus (idempotent)."""
    mechanism = OpacusClassicRDPAccountant.mechanism()
    try:
        register_accountant(mechanism, OpacusClassicRDPAccountant)
    except ValueError:  # already registered: by us (a re-import), or by someone else
        existing = type(create_accountant(mechanism))
        if existing.__module__ != __name__ or existing.__qualname__ != OpacusClassicRDPAccountant.__qualname__:
            raise ValueError(
                f"Opacus already has a different accountant registered as {mechanism!r} ({existing.__module__}."
                f"{existing.__qualname__}); fbo_torch cannot register its moments accountant under that name."
            ) from None
        register_accountant(mechanism, OpacusClassicRDPAccountant, force=True)


register()
