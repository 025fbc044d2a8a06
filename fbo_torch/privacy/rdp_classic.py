r"""The papers' moments accountant as an Opacus accountant, registered as ``"rdp-classic"``.

Importing :mod:`fbo_torch.privacy` registers :class:`ClassicRDPAccountant` in
Opacus' accountant registry, so Opacus' own tools accept the name:

    >>> import fbo_torch.privacy
    >>> from opacus.accountants import create_accountant
    >>> from opacus.accountants.utils import get_noise_multiplier
    >>> acc = create_accountant("rdp-classic")
    >>> z = get_noise_multiplier(target_epsilon=9.91, target_delta=200 ** -1.1,
    ...                          sample_rate=0.25, steps=40, accountant="rdp-classic")

and ``PrivacyEngine(accountant="rdp-classic")`` trains with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from opacus.accountants import RDPAccountant, create_accountant, register_accountant

from fbo_torch.privacy.analysis.rdp_classic import (
    DEFAULT_ORDERS,
    compute_rdp_classic,
    get_privacy_spent_classic,
)


class ClassicRDPAccountant(RDPAccountant):
    r"""The moments accountant of Abadi et al. (2016), as DP-FTS-DE reports ε.

    Opacus' ``RDPAccountant`` (same run-length ``history``, ``step``,
    ``state_dict`` and ``len`` = number of history segments) with the papers'
    analysis: RDP at the integer orders ``2..256`` and the classic conversion
    ``ε = min_α [RDP(α) + log(1/δ)/(α-1)]``
    (:mod:`fbo_torch.privacy.analysis.rdp_classic`). Looser than ``"rdp"``;
    use it to reproduce the papers' numbers. ``get_epsilon(delta, alphas=...)``
    optimises over other orders.
    """

    DEFAULT_ALPHAS = list(DEFAULT_ORDERS)

    @classmethod
    def mechanism(cls) -> str:
        return "rdp-classic"

    def get_privacy_spent(self, *, delta: float, alphas: Sequence[float] | None = None) -> tuple[float, float]:
        r"""``(ε, best_order)`` for target ``δ``; ``(0, 0)`` with no steps, as Opacus' RDP accountant.

        Args:
            delta: Target ``δ ∈ (0, 1)``.
            alphas: RDP orders ``α > 1`` to optimise over; the integers 2..256 if ``None``.

        Returns:
            ``(ε, best_order)``.
        """
        if not self.history:
            return 0, 0
        orders = self.DEFAULT_ALPHAS if alphas is None else list(alphas)
        rdp = compute_rdp_classic(self.history, orders)
        return get_privacy_spent_classic(orders=orders, rdp=rdp, delta=delta)


def _register() -> None:
    r"""Register :class:`ClassicRDPAccountant` with Opacus as ``"rdp-classic"`` (idempotent).

    Raises:
        ValueError: If Opacus already has another accountant under that name.
    """
    mechanism = ClassicRDPAccountant.mechanism()
    try:
        register_accountant(mechanism, ClassicRDPAccountant)
    except ValueError:  # already registered: by a re-import of this module, or by someone else
        existing = type(create_accountant(mechanism))
        if (existing.__module__, existing.__qualname__) != (__name__, ClassicRDPAccountant.__qualname__):
            raise ValueError(
                f"Opacus already has a different accountant registered as {mechanism!r} ({existing.__module__}."
                f"{existing.__qualname__}); fbo_torch cannot register its moments accountant under that name."
            ) from None
        register_accountant(mechanism, ClassicRDPAccountant, force=True)


_register()

__all__ = ["ClassicRDPAccountant"]
