r"""The distributed discrete Gaussian as an Opacus accountant, registered as ``"ddg"``.

With secure aggregation (:mod:`fbo_torch.federation.secure`) the release of a
round is the modular sum of the agents' integer vectors, each carrying its
own share of discrete Gaussian noise. :class:`DistributedDiscreteGaussianAccountant`
accounts such releases with the maths of :mod:`fbo_torch.privacy.analysis.ddg`
behind Opacus' ``IAccountant`` interface: its ``history`` is Opacus' run-length
list of ``(noise_multiplier, sample_rate, num_steps)``, where a release's
noise multiplier is ``z = √(n σ²) / Δ₂`` for the ``n`` noise shares that were
summed (:func:`~fbo_torch.privacy.analysis.ddg.noise_multiplier_of`), so a
:class:`~fbo_torch.privacy.PrivacyLedger` records, verifies and replays it
like any other. The mechanism's constants — the sensitivities ``Δ₂``, ``Δ₁``
in lattice units, each share's variance ``σ²`` and the dimension ``d`` — are
the accountant's own (a :class:`DDGConstants`); ``create_accountant("ddg")``
gives the continuous limit (``σ² = ∞``: ``τ = 0``, the Gaussian bound
``α/(2z²)`` amplified by Zhu & Wang's general bound).

ε is Opacus' ``get_privacy_spent`` (Balle et al. 2020's conversion) over the
orders :data:`DDG_ORDERS`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from opacus.accountants import IAccountant, RDPAccountant, create_accountant, register_accountant
from opacus.accountants.analysis.rdp import get_privacy_spent

from fbo_torch.privacy.analysis.ddg import compute_rdp_ddg_history

#: RDP orders of the ``"ddg"`` accountant: Opacus' default orders and the integers up to 256.
DDG_ORDERS: tuple[float, ...] = tuple(sorted(set(RDPAccountant.DEFAULT_ALPHAS) | set(range(2, 257))))


@dataclass(frozen=True)
class DDGConstants:
    r"""What the RDP of one distributed discrete Gaussian release depends on besides ``(z, q)``.

    Attributes:
        l2_sensitivity: ``Δ₂``, the L2 bound of one agent's integer vector.
        l1_sensitivity: ``Δ₁``, its L1 bound.
        local_variance: ``σ²`` of each agent's noise share (``inf``: the continuous limit).
        dim: ``d``, the length of the vector.
    """

    l2_sensitivity: float = 1.0
    l1_sensitivity: float = 1.0
    local_variance: float = math.inf
    dim: int = 1

    def __post_init__(self) -> None:
        for name in ("l2_sensitivity", "l1_sensitivity"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"`{name}` must be a finite number > 0, got {v!r}.")
        if not (isinstance(self.local_variance, (int, float)) and self.local_variance >= 0.25):
            raise ValueError(f"`local_variance` must be >= 1/4 (or inf), got {self.local_variance!r}.")
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 1:
            raise ValueError(f"`dim` must be an integer >= 1, got {self.dim!r}.")


class DistributedDiscreteGaussianAccountant(IAccountant):
    r"""Accountant of distributed discrete Gaussian releases (see the module docstring).

    Args:
        constants: The mechanism's :class:`DDGConstants` (default: the continuous limit).

    ``step(noise_multiplier=z, sample_rate=q)`` records one release of the sum of
    ``n = (zΔ₂)²/σ²`` shares, Poisson-subsampled with rate ``q`` as the observer
    sees it (``q = 1``: the observer knows the sample).
    """

    DEFAULT_ALPHAS = list(DDG_ORDERS)

    def __init__(self, constants: DDGConstants | None = None) -> None:
        super().__init__()
        self.constants = constants if constants is not None else DDGConstants()
        if not isinstance(self.constants, DDGConstants):
            raise TypeError(f"`constants` must be a DDGConstants, got {type(constants).__name__}.")

    @classmethod
    def mechanism(cls) -> str:
        return "ddg"

    def __len__(self) -> int:
        return len(self.history)

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        if self.history and tuple(self.history[-1][:2]) == (noise_multiplier, sample_rate):
            z, q, n = self.history.pop()
            self.history.append((z, q, n + 1))
        else:
            self.history.append((noise_multiplier, sample_rate, 1))

    def rdp(self, orders: Sequence[float] | None = None) -> np.ndarray:
        """The RDP of the history at ``orders`` (default :data:`DDG_ORDERS`)."""
        c = self.constants
        return compute_rdp_ddg_history(
            self.history,
            self.DEFAULT_ALPHAS if orders is None else orders,
            l2_sensitivity=c.l2_sensitivity,
            l1_sensitivity=c.l1_sensitivity,
            local_variance=c.local_variance,
            dim=c.dim,
        )

    def get_privacy_spent(self, *, delta: float, alphas: Sequence[float] | None = None) -> tuple[float, float]:
        r"""``(ε, best order)`` for target ``δ``; ``(0, 0)`` with no releases."""
        if not self.history:
            return 0, 0
        orders = self.DEFAULT_ALPHAS if alphas is None else list(alphas)
        eps, order = get_privacy_spent(orders=orders, rdp=self.rdp(orders), delta=delta)
        return float(eps), float(order)

    def get_epsilon(self, delta: float, alphas: Sequence[float] | None = None) -> float:
        return self.get_privacy_spent(delta=delta, alphas=alphas)[0]

    def __repr__(self) -> str:
        return f"DistributedDiscreteGaussianAccountant({self.constants})"


def _register() -> None:
    """Register the accountant with Opacus as ``"ddg"`` (idempotent; refuses another class under that name)."""
    name = DistributedDiscreteGaussianAccountant.mechanism()
    try:
        register_accountant(name, DistributedDiscreteGaussianAccountant)
    except ValueError:
        existing = type(create_accountant(name))
        if (existing.__module__, existing.__qualname__) != (
            __name__,
            DistributedDiscreteGaussianAccountant.__qualname__,
        ):
            raise ValueError(
                f"Opacus already has a different accountant registered as {name!r} "
                f"({existing.__module__}.{existing.__qualname__})."
            ) from None
        register_accountant(name, DistributedDiscreteGaussianAccountant, force=True)


_register()

__all__ = ["DDGConstants", "DDG_ORDERS", "DistributedDiscreteGaussianAccountant"]
