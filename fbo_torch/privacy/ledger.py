r"""The per-run privacy ledger of a DP-FTS-DE server.

A :class:`PrivacyLedger` wraps an Opacus accountant
(``opacus.accountants.create_accountant(name)``) with the run's ``δ`` and an
optional budget ``max_epsilon``. The server asks
:meth:`PrivacyLedger.can_release` before a round and calls
:meth:`PrivacyLedger.record` for **every** release of its (noised) output; the
ledger keeps ε after each round.

.. important:: ``record`` must be called for every release of the server's
   output, including non-private ones. A round with ``noise_multiplier = 0``
   (plain FTS-DE) has unbounded privacy loss: ε becomes ``+inf`` and stays so.
   The ledger cannot see releases it is not told about.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fbo_torch.privacy.accountants import (
    DEFAULT_ACCOUNTANT,
    History,
    append_release,
    check_accountant_state,
    check_delta,
    check_noise_multiplier,
    check_sample_rate,
    get_epsilon,
    is_accountant,
    new_accountant,
    num_releases,
)
from fbo_torch.utils.validation import check_int, check_positive

if TYPE_CHECKING:
    from opacus.accountants import IAccountant


def default_delta(num_agents: int) -> float:
    r"""The papers' ``δ = 1 / N^1.1`` for ``N`` agents (FTS / DP-FTS-DE experiments).

    Args:
        num_agents: Number of agents ``N ≥ 2`` (``N = 1`` would give ``δ = 1``).

    Returns:
        ``δ`` in ``(0, 1)``.
    """
    n = check_int("num_agents", num_agents, minimum=2)
    return 1.0 / n**1.1


def deployment_delta(num_agents: int) -> float:
    r"""A δ for deployments: ``min(1e-5, 0.01 / N)`` for ``N`` agents.

    The papers' ``1/N^1.1`` (:func:`default_delta`) is kept for reproducing
    their numbers, but it is close to ``1/N`` for small federations
    (``δ·N = N^-0.1``: 0.87 at ``N = 4``), and an (ε, δ) guarantee with ``δ``
    near ``1/N`` allows a mechanism that publishes one random agent's data in
    full. This default keeps ``δ·N ≤ 0.01`` and ``δ ≤ 1e-5`` for any ``N``.

    Args:
        num_agents: Number of agents ``N ≥ 1``.

    Returns:
        ``δ``.
    """
    n = check_int("num_agents", num_agents, minimum=1)
    return min(1e-5, 0.01 / n)


class PrivacyLedger:
    r"""Per-run record of the privacy spent by a DP-FTS-DE server.

    Args:
        accountant: Accountant name (one of :data:`~fbo_torch.privacy.ACCOUNTANTS`:
            ``"rdp"``, ``"prv"``, ``"gdp"``, ``"rdp-classic"``), created with
            ``opacus.accountants.create_accountant``, or an Opacus accountant
            with no steps.
        delta: Target ``δ ∈ (0, 1)``. Defaults to ``1 / num_agents**1.1``.
        num_agents: Number of agents ``N``; used for the default ``δ``, and to warn
            when ``δ ≥ 1/N`` (a guarantee that allows releasing one agent's data in full).
        max_epsilon: Privacy budget ``ε > 0``, or ``None`` for no limit (then
            :meth:`can_release` is always ``True``).

    Raises:
        ValueError: If neither ``delta`` nor ``num_agents`` is given, or an
            argument is out of range.

    Example:
        >>> ledger = PrivacyLedger("rdp-classic", num_agents=200, max_epsilon=10.0)
        >>> while ledger.can_release(noise_multiplier=1.0, sample_rate=0.25):
        ...     ledger.record(noise_multiplier=1.0, sample_rate=0.25)  # doctest: +SKIP
    """

    def __init__(
        self,
        accountant: str | IAccountant = DEFAULT_ACCOUNTANT,
        delta: float | None = None,
        num_agents: int | None = None,
        max_epsilon: float | None = None,
    ) -> None:
        if num_agents is not None:
            num_agents = check_int("num_agents", num_agents, minimum=1)
        if delta is None:
            if num_agents is None:
                raise ValueError("PrivacyLedger needs `delta` or `num_agents` (for the default delta = 1/N^1.1).")
            delta = default_delta(num_agents)
        self._delta = check_delta(delta)
        self._num_agents = num_agents
        if num_agents is not None and self._delta * num_agents >= 1.0:
            warnings.warn(
                f"delta = {self._delta:.3g} is >= 1/N = {1 / num_agents:.3g} for N = {num_agents} agents: an "
                "(epsilon, delta) guarantee with such a delta allows releasing one agent's data in full; "
                f"use delta << 1/N (e.g. fbo_torch.privacy.deployment_delta(N) = {deployment_delta(num_agents):.3g}).",
                UserWarning,
                stacklevel=2,
            )
        if max_epsilon is not None:
            check_positive("max_epsilon", max_epsilon)
            max_epsilon = float(max_epsilon)
        self._max_epsilon = max_epsilon
        if is_accountant(accountant):
            if accountant.history:
                raise ValueError(
                    f"`accountant` must have no recorded steps, got one with {num_releases(accountant.history)}; "
                    "use load_state_dict to resume a run."
                )
            self._accountant = accountant
        else:
            self._accountant = new_accountant(accountant)
        self._epsilons: list[float] = []
        # (history before the release, z, q, history after it, ε after it) of the last can_release query
        self._pending: tuple[tuple[tuple[float, float, int], ...], float, float, History, float] | None = None

    # -- properties -------------------------------------------------------- #

    @property
    def accountant(self) -> IAccountant:
        r"""The underlying Opacus accountant (do not step it directly; use :meth:`record`).

        :meth:`record` sets its ``history``, merged as Opacus' ``RDPAccountant.step``
        merges it (:func:`~fbo_torch.privacy.append_release`).
        """
        return self._accountant

    @property
    def mechanism(self) -> str:
        r"""Name of the accountant, e.g. ``"rdp"``."""
        return self._accountant.mechanism()

    @property
    def delta(self) -> float:
        r"""Target ``δ`` of the run."""
        return self._delta

    @property
    def num_agents(self) -> int | None:
        r"""Number of agents, if given."""
        return self._num_agents

    @property
    def max_epsilon(self) -> float | None:
        r"""The budget, or ``None`` for no limit."""
        return self._max_epsilon

    @property
    def epsilons(self) -> list[float]:
        r"""ε after each recorded round (a copy; length :attr:`rounds`)."""
        return list(self._epsilons)

    @property
    def epsilon(self) -> float:
        r"""ε spent so far (``0.0`` before the first release)."""
        return self._epsilons[-1] if self._epsilons else 0.0

    @property
    def rounds(self) -> int:
        r"""Number of recorded releases."""
        return len(self._epsilons)

    @property
    def remaining(self) -> float:
        r"""``max_epsilon - epsilon`` (``+inf`` without a budget; may be negative)."""
        if self._max_epsilon is None:
            return math.inf
        return self._max_epsilon - self.epsilon

    @property
    def exhausted(self) -> bool:
        r"""``True`` once ε has reached ``max_epsilon``, so no further release fits.

        (Every release with finite noise strictly increases ε.) Always ``False``
        without a budget.
        """
        return self._max_epsilon is not None and self.epsilon >= self._max_epsilon

    # -- main API ---------------------------------------------------------- #

    def peek_epsilon(self, noise_multiplier: float, sample_rate: float) -> float:
        r"""ε the run would have after one more release with ``(z, q)``; nothing is recorded.

        Args:
            noise_multiplier: ``z ≥ 0`` of the next release.
            sample_rate: ``q ∈ (0, 1]`` of the next release.

        Returns:
            The would-be ε (the accountant is not modified).
        """
        return self._next(noise_multiplier, sample_rate)[1]

    def _next(self, noise_multiplier: float, sample_rate: float) -> tuple[History, float]:
        """The history after one more release with ``(z, q)``, and its ε (kept for :meth:`record`)."""
        z = check_noise_multiplier(noise_multiplier)
        q = check_sample_rate(sample_rate)
        before = tuple(self._accountant.history)
        if self._pending is None or self._pending[:3] != (before, z, q):
            after = append_release(before, z, q)
            self._pending = (before, z, q, after, get_epsilon(self._accountant, self._delta, history=after))
        return self._pending[3], self._pending[4]

    def can_release(self, noise_multiplier: float, sample_rate: float) -> bool:
        r"""Whether one more release with ``(z, q)`` keeps ε within ``max_epsilon``.

        Computed without recording, with the same accountant as
        :meth:`record`, so ``can_release`` is ``False`` exactly when ``record``
        would push ε above the budget.

        Args:
            noise_multiplier: ``z ≥ 0`` of the next release (``z = 0`` never fits a budget).
            sample_rate: ``q ∈ (0, 1]`` of the next release.

        Returns:
            ``True`` if there is no budget or the next ε would be ``≤ max_epsilon``.
        """
        eps = self.peek_epsilon(noise_multiplier, sample_rate)
        return self._max_epsilon is None or eps <= self._max_epsilon

    def record(self, noise_multiplier: float, sample_rate: float) -> float:
        r"""Account for one release of the server's output (one round).

        Must be called for **every** release, private or not. Recording past
        the budget is still recorded (the release happened) and warns.

        Args:
            noise_multiplier: ``z ≥ 0`` used in this release; ``z = 0`` makes ε ``+inf``.
            sample_rate: ``q ∈ (0, 1]`` used in this release.

        Returns:
            ε after this release; also appended to :attr:`epsilons`.
        """
        after, eps = self._next(noise_multiplier, sample_rate)
        self._accountant.history = after
        self._pending = None
        self._epsilons.append(eps)
        if self._max_epsilon is not None and eps > self._max_epsilon:
            warnings.warn(
                f"Privacy budget exceeded: epsilon = {eps:.4g} > max_epsilon = {self._max_epsilon:.4g} "
                f"after round {self.rounds} (delta = {self._delta:.3g}).",
                RuntimeWarning,
                stacklevel=2,
            )
        return eps

    # -- persistence ------------------------------------------------------- #

    def state_dict(self) -> dict[str, Any]:
        r"""The ledger's state: accountant state, δ, N, budget and per-round ε.

        Returns:
            An ``OrderedDict`` with keys ``"accountant"``, ``"delta"``,
            ``"num_agents"``, ``"max_epsilon"`` and ``"epsilons"``.
        """
        return OrderedDict(
            accountant=self._accountant.state_dict(),
            delta=self._delta,
            num_agents=self._num_agents,
            max_epsilon=self._max_epsilon,
            epsilons=list(self._epsilons),
        )

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        r"""Restore a ledger saved by :meth:`state_dict`; recording then continues exactly.

        Args:
            state_dict: Output of :meth:`state_dict`.
            strict: The saved ledger must be *this* run's: its δ and ``num_agents``
                must equal this ledger's, and this ledger's ``max_epsilon`` (the
                run's configured budget) stays in force whatever the state says, so
                an edited state can neither change the guarantee it reports nor lift
                the budget. ``strict=False`` takes δ, ``num_agents`` and
                ``max_epsilon`` from the state (to read a saved ledger of unknown
                settings).

        The ledger is verified, not trusted: ε after every recorded release is
        recomputed from the accountant's history and must equal the recorded
        value (to float64 rounding), so a ledger edited to show a lower ε is
        refused.

        Raises:
            ValueError: If keys are missing, the accountant mechanism differs,
                the number of recorded ε does not match the accountant's steps,
                a recorded ε is not what the recorded steps give, or (``strict``)
                δ or ``num_agents`` differ from this ledger's.
        """
        keys = ("accountant", "delta", "num_agents", "max_epsilon", "epsilons")
        missing = [k for k in keys if k not in (state_dict or {})]
        if missing:
            raise ValueError(f"`state_dict` is missing key(s) {missing}; cannot load it into a PrivacyLedger.")
        delta = check_delta(state_dict["delta"])
        num_agents = state_dict["num_agents"]
        if num_agents is not None:
            num_agents = check_int("num_agents", num_agents, minimum=1)
        max_epsilon = state_dict["max_epsilon"]
        if max_epsilon is not None:
            check_positive("max_epsilon", max_epsilon)
            max_epsilon = float(max_epsilon)
        if strict:
            if delta != self._delta:
                raise ValueError(
                    f"`state_dict` has delta = {delta!r}, this run's is {self._delta!r}: refusing a "
                    "ledger of another guarantee."
                )
            if num_agents != self._num_agents:
                raise ValueError(
                    f"`state_dict` has num_agents = {num_agents!r}, this run's is "
                    f"{self._num_agents!r}: refusing a ledger of another federation."
                )
            max_epsilon = self._max_epsilon  # the run's budget, never the state's
        try:
            epsilons = [float(e) for e in state_dict["epsilons"]]
        except (TypeError, ValueError):
            raise ValueError("`state_dict['epsilons']` must be a list of numbers.") from None
        history = check_accountant_state(state_dict["accountant"], self.mechanism)
        if num_releases(history) != len(epsilons):
            raise ValueError(
                f"`state_dict` is inconsistent: {len(epsilons)} recorded epsilons but the accountant "
                f"holds {num_releases(history)} steps."
            )
        expected = self._replay(history, delta)
        for i, (got, want) in enumerate(zip(epsilons, expected, strict=True)):
            if not (got == want or math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)):
                raise ValueError(
                    f"`state_dict` says epsilon = {got!r} after release {i + 1}, but its recorded releases give "
                    f"{want!r} (delta = {delta:g}): refusing a ledger whose epsilons do not follow from its steps."
                )
        self._accountant.load_state_dict({"history": history, "mechanism": self.mechanism})
        self._delta, self._num_agents, self._max_epsilon = delta, num_agents, max_epsilon
        self._epsilons = epsilons
        self._pending = None

    def _replay(self, history: History, delta: float) -> list[float]:
        """ε after each release of ``history`` (run-length ``(z, q, steps)``), recomputed."""
        trial: History = []
        out = []
        for z, q, steps in history:
            for _ in range(int(steps)):
                trial = append_release(trial, z, q)
                out.append(get_epsilon(self._accountant, delta, history=trial))
        return out

    def __repr__(self) -> str:
        budget = "none" if self._max_epsilon is None else f"{self._max_epsilon:.4g}"
        return (
            f"PrivacyLedger(mechanism={self.mechanism!r}, rounds={self.rounds}, "
            f"epsilon={self.epsilon:.4g}, max_epsilon={budget}, delta={self._delta:.3g})"
        )


__all__ = ["PrivacyLedger", "default_delta", "deployment_delta"]
