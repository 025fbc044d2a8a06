r"""How the server releases a round: one interface, a registry by name (the settings' ``aggregation``).

A :class:`ReleaseMechanism` is everything a DP-FTS-DE server does with the
agents' clipped messages to form the ``P`` noisy per-sub-region weighted
averages of a round, and everything the privacy accountant is told about it:

* its parameter checks (:meth:`ReleaseMechanism.check_settings`, for settings
  alone; :meth:`ReleaseMechanism.check`, for ``N`` agents);
* the round: a mechanism whose server sees every message
  (:attr:`~ReleaseMechanism.sees_messages`) releases them in one call,
  :meth:`~ReleaseMechanism.release`; one whose server sees only their sum draws
  the cohort the agents are told (:meth:`~ReleaseMechanism.cohort`), decides
  from the survivors of the secure sum whether it releases
  (:meth:`~ReleaseMechanism.releases`) and decodes the sum
  (:meth:`~ReleaseMechanism.decode`);
* the accounting: the ledgers it is accounted in (:meth:`~ReleaseMechanism.ledgers`),
  the ``(z, q)`` each is told per release (:meth:`~ReleaseMechanism.charge`), the
  entries a saved ledger may hold (:meth:`~ReleaseMechanism.recordable`) and the
  parameters a saved state must match (:meth:`~ReleaseMechanism.parameters`).

:class:`~fbo_torch.federation.server.DPFTSDEServer` is the one caller: the
simulator (``R`` federations at once) and the Flower coordinator (``R = 1``)
both release through it, so both run the same mechanism object the same way.
It holds the schedule, the budget, the records and the saved state; it never
looks at a mechanism's name.

Built in, as Opacus registers its accountants:

* ``"central"`` (:class:`CentralGaussianRelease`): the papers' Poisson-subsampled
  Gaussian mechanism, the server sees every ``ω``
  (:class:`~fbo_torch.federation.aggregator.DPAggregator`);
* ``"secure"`` (:class:`SecureDiscreteGaussianRelease`): secure aggregation with
  distributed discrete Gaussian noise, the server sees only the sum
  (:class:`~fbo_torch.federation.secure.SecureMechanism`).

Adding one is a subclass registered under its name (``docs/design.md``, "Adding a
release mechanism")::

    @register_release
    class MyRelease(CentralGaussianRelease):
        name = "my-release"  # aggregation: my-release
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from torch import Tensor

from fbo_torch.federation.aggregator import AggregationRecord, DPAggregator, RegionWeights
from fbo_torch.federation.secure import SecureMechanism
from fbo_torch.privacy.accountants import check_noise_multiplier, check_sample_rate, get_epsilon, new_accountant
from fbo_torch.privacy.ledger import PrivacyLedger
from fbo_torch.protocol.randomness import ServerRandomness
from fbo_torch.utils.validation import add_to_registry, check_int

if TYPE_CHECKING:
    from opacus.accountants import IAccountant

    from fbo_torch.privacy.ddg import DistributedDiscreteGaussianAccountant

#: What a ledger is told of one release: ``(noise multiplier z, sampling rate q)``.
Charge = tuple[float, float]


class ReleaseMechanism:
    r"""The server's release of a round's noisy per-sub-region weighted averages, and its accounting.

    A subclass sets :attr:`name` and :attr:`sees_messages` and implements the round
    of its kind: :meth:`release` when the server sees every message; :meth:`cohort`,
    :meth:`releases` and :meth:`decode` (and a ``lattice``) when it sees only
    their secure sum.

    Args:
        settings: The DP-FTS-DE settings (``sample_rate``, ``clip_norm``,
            ``noise_multiplier``, and what the mechanism reads besides).
        num_agents: ``N`` agents per federation.
        weights: ``P x N`` region weights, or a callable ``round -> P x N``
            (:class:`~fbo_torch.protocol.weights.ExplorationWeights`).

    Attributes:
        aggregator: The :class:`~fbo_torch.federation.aggregator.DPAggregator` of
            ``(q, S, z)`` and the weights: the central arithmetic, and the weights'
            checks every mechanism uses.
        lattice: The integer vectors and modular sum the agents and the secure-sum
            protocol use (:class:`~fbo_torch.federation.secure.SecureMechanism`);
            ``None`` when the server sees every message.
    """

    #: The registry key (the settings' ``aggregation``).
    name: ClassVar[str] = ""
    #: Whether the server receives every agent's ``ω`` (else only their secure sum).
    sees_messages: ClassVar[bool] = True

    def __init__(self, settings: Any, num_agents: int, weights: RegionWeights) -> None:
        self.check_settings(settings)
        self.settings = settings
        self.num_agents = check_int("num_agents", num_agents, minimum=1)
        clip = settings.clip_norm if settings.clip_norm is not None else math.inf
        self.aggregator = DPAggregator(settings.sample_rate, clip, settings.noise_multiplier, weights)
        self.lattice: SecureMechanism | None = None

    @classmethod
    def accounting(cls, settings: Any, num_agents: int) -> ReleaseMechanism:
        r"""The mechanism of ``settings`` for ``num_agents`` agents as its ledgers see it (:meth:`charge`,
        :meth:`worst_case_epsilon`), without region weights: it cannot release.

        Args:
            settings: The settings.
            num_agents: ``N``.

        Returns:
            The mechanism.
        """
        return cls(settings, num_agents, _no_weights)

    # ------------------------------------------------------------------ checks
    @classmethod
    def check_settings(cls, settings: Any) -> None:
        """Refuse settings this mechanism cannot release with (``ValueError`` naming the key).

        Args:
            settings: The settings (``sample_rate``, ``noise_multiplier``, ...).
        """
        check_sample_rate(settings.sample_rate)
        check_noise_multiplier(settings.noise_multiplier)

    @classmethod
    def check(cls, settings: Any, num_agents: int) -> None:
        """Refuse settings this mechanism cannot release with for ``num_agents`` agents.

        Args:
            settings: The settings.
            num_agents: ``N``.
        """
        cls.check_settings(settings)

    # ------------------------------------------------------------------ accounting
    def ledgers(
        self, accountant: str, delta: float | None, max_epsilon: float | None
    ) -> tuple[PrivacyLedger, PrivacyLedger | None]:
        r"""The ledgers a private server keeps: against other agents and outsiders (with the budget), and
        against the server itself (``None`` when the server sees every message: no guarantee against it).

        Args:
            accountant: The accountant's name (a mechanism may use its own).
            delta: δ (``None``: the ledger's default).
            max_epsilon: The budget of the first ledger (``None``: none).

        Returns:
            ``(ledger, server_ledger)``.
        """
        ledger = PrivacyLedger(accountant=accountant, delta=delta, num_agents=self.num_agents, max_epsilon=max_epsilon)
        return ledger, None

    def charge(self, num_shares: int | None = None, server: bool = False) -> Charge:
        r"""``(z, q)`` a ledger records for one release.

        Args:
            num_shares: A secure sum's number of vectors ``k`` (default: the fewest a release has).
            server: The entry of the ledger against the server.

        Returns:
            ``(z, q)``.
        """
        return self.settings.noise_multiplier, self.settings.sample_rate

    def accountant(self, name: str) -> IAccountant:
        """A fresh accountant of the kind this mechanism's ledgers keep.

        Args:
            name: The settings' accountant (a mechanism may use its own).

        Returns:
            The accountant, with no releases recorded.
        """
        return new_accountant(name)

    def worst_case_epsilon(self, releases: int, delta: float, accountant: str, threshold: int) -> float:
        r"""The largest ε ``releases`` releases can cost an agent, at ``δ``: each charged :meth:`charge`.

        Args:
            releases: Releases the agent's message took part in.
            delta: ``δ``.
            accountant: The settings' accountant.
            threshold: The fewest vectors of a sum a deviating server can learn (only a mechanism whose
                server sees a secure sum reads it).

        Returns:
            ``ε`` (``0`` without releases, ``inf`` with ``z = 0``).
        """
        if releases <= 0:
            return 0.0
        return get_epsilon(self.accountant(accountant), delta, history=[(*self.charge(), int(releases))])

    def deviating_server_epsilon(self, releases: int, delta: float, threshold: int) -> float:
        r"""ε against a server that deviates from the protocol after ``releases`` releases: NaN when the
        server sees every message (it is trusted with them; :meth:`ledgers` keeps no ledger against it).

        Args:
            releases: Releases the agent's message took part in.
            delta: ``δ``.
            threshold: ``t``, the fewest vectors of a sum a deviating server can learn.

        Returns:
            ``ε``, or NaN.
        """
        return math.nan

    def recordable(self, server: bool = False) -> Callable[[float, float], bool]:
        r"""Whether a ledger entry ``(z, q)`` is one this mechanism records (a saved ledger's check).

        Args:
            server: The ledger against the server.

        Returns:
            A predicate of ``(z, q)``.
        """
        z0, q0 = self.charge()
        return lambda z, q: (z, q) == (z0, q0)

    def parameters(self) -> dict[str, Any]:
        """The mechanism's part of the parameters a saved server state must have been made with."""
        return {"aggregation": self.name, "secure": None}

    # ------------------------------------------------------------------ a round the server sees
    def release(
        self, omegas: Tensor, round: int, randomness: ServerRandomness, reported: Tensor | None = None
    ) -> tuple[Tensor, AggregationRecord]:
        r"""Release round ``round`` from every agent's message.

        Args:
            omegas: ``R x N x M`` vectors (non-finite rows are dropped as invalid).
            round: ``t``.
            randomness: The server's coins and noise.
            reported: Optional ``R x N`` booleans, agents whose vector arrived.

        Returns:
            ``(broadcast, record)``: the ``R x P x M`` release and its statistics.
        """
        raise RuntimeError(f"the {self.name!r} release never receives ω: its server sees only a secure sum.")

    # ------------------------------------------------------------------ a round of a secure sum
    def cohort(
        self, round: int, randomness: ServerRandomness, num_federations: int, like: Tensor
    ) -> tuple[Tensor, Tensor]:
        r"""What the agents are told before a secure round: their Poisson coins and weight ratios.

        Args:
            round: ``t``.
            randomness: The server's coins.
            num_federations: ``R``.
            like: A float64 tensor on the device of the result.

        Returns:
            ``(sampled, ratios)``: ``R x N`` booleans and ``P x N`` ratios ``w / w_max``.
        """
        raise RuntimeError(f"the {self.name!r} release sees every message: it has no secure cohort.")

    def releases(self, survivors: Tensor) -> tuple[Tensor, int]:
        r"""Whether each federation's secure sum may be released, and the shares it is charged for.

        Args:
            survivors: ``R x N`` booleans, the agents whose vector is in the sum.

        Returns:
            ``(released, k)``: ``R`` booleans and the fewest vectors in a released sum
            (0 when none releases).
        """
        raise RuntimeError(f"the {self.name!r} release sees every message: it has no secure sum.")

    def decode(
        self, total: Tensor, round: int, released: Tensor, sampled: Tensor, survivors: Tensor, num_shares: int
    ) -> tuple[Tensor, AggregationRecord]:
        r"""The release behind a secure sum.

        Args:
            total: ``R x d`` residues (what the secure sum reveals).
            round: ``t``.
            released: ``R`` booleans (:meth:`releases`).
            sampled: ``R x N`` coins of the round (:meth:`cohort`).
            survivors: ``R x N`` booleans, the agents whose vector is in the sum.
            num_shares: ``k``, the vectors the release was charged for.

        Returns:
            ``(broadcast, record)``: the ``R x P x M`` release (zero rows where a federation
            does not release) and its statistics.
        """
        raise RuntimeError(f"the {self.name!r} release sees every message: it has no secure sum.")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(N={self.num_agents}, {self.aggregator!r})"


def _no_weights(round: int) -> Tensor:
    raise RuntimeError("a release mechanism built for accounting has no region weights: it cannot release.")


_ReleaseT = TypeVar("_ReleaseT", bound=type[ReleaseMechanism])

#: Mechanism name -> its :class:`ReleaseMechanism` class.
RELEASES: dict[str, type[ReleaseMechanism]] = {}


def register_release(cls: _ReleaseT) -> _ReleaseT:
    r"""Register a :class:`ReleaseMechanism` subclass under its ``name`` (a class decorator).

    Args:
        cls: The class.

    Returns:
        ``cls``.

    Raises:
        ValueError: The class has no name, or its name is taken by another class.
    """
    if not (isinstance(cls, type) and issubclass(cls, ReleaseMechanism)):
        raise ValueError(f"`register_release` takes a ReleaseMechanism subclass, got {cls!r}.")
    if not cls.name or not isinstance(cls.name, str):
        raise ValueError(f"{cls.__name__}.name must be a non-empty string (the settings' `aggregation`).")
    add_to_registry(RELEASES, cls.name, cls, "release")
    return cls


def unregister_release(name: str) -> None:
    """Remove the mechanism ``name`` from the registry (e.g. one a test registered).

    Args:
        name: The registry key.
    """
    RELEASES.pop(name, None)


def get_release(name: Any) -> type[ReleaseMechanism]:
    """The mechanism registered as ``name``.

    Args:
        name: The settings' ``aggregation``.

    Returns:
        Its class.

    Raises:
        ValueError: No mechanism has that name (the message names ``aggregation`` and lists the names).
    """
    cls = RELEASES.get(name) if isinstance(name, str) else None
    if cls is None:
        close = difflib.get_close_matches(name, list(RELEASES), n=1) if isinstance(name, str) else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"`aggregation` must be one of {tuple(RELEASES)}, got {name!r}{hint}.")
    return cls


def check_aggregation(value: Any) -> str:
    """``value`` as a registered mechanism's name (``ValueError`` naming ``aggregation`` otherwise).

    Args:
        value: The settings' ``aggregation``.

    Returns:
        ``value``.
    """
    return get_release(value).name


@register_release
class CentralGaussianRelease(ReleaseMechanism):
    r"""The papers' release: the server sees every ``ω``, Poisson-samples, clips, weights and adds
    ``N(0, (z φ_max S / q)²)`` (:class:`~fbo_torch.federation.aggregator.DPAggregator`); one ledger,
    ``(z, q)`` per release, with the settings' accountant."""

    name = "central"
    sees_messages = True

    def release(
        self, omegas: Tensor, round: int, randomness: ServerRandomness, reported: Tensor | None = None
    ) -> tuple[Tensor, AggregationRecord]:
        r"""Release round ``round`` from every agent's message (see :meth:`ReleaseMechanism.release`).

        Args:
            omegas: ``R x N x M`` vectors.
            round: ``t``.
            randomness: The server's coins and noise.
            reported: Optional ``R x N`` booleans, agents whose vector arrived.

        Returns:
            ``(broadcast, record)``.
        """
        agg = self.aggregator
        out = agg.aggregate(omegas, round=round, reported=reported, randomness=randomness)
        del agg.history[:-1]
        return out, agg.history[-1]


def shares_charge(lattice: SecureMechanism, num_shares: int, server: bool, sample_rate: float) -> Charge:
    r"""``(z, q)`` of a secure sum of ``k`` discrete Gaussian shares: against the server ``z_k`` with
    ``q = 1`` (it drew the coins); against the other agents ``z_{k−1}`` with ``q`` (a curious agent knows
    its own share, not the sample).

    Args:
        lattice: The secure mechanism.
        num_shares: ``k``.
        server: The charge against the server.
        sample_rate: ``q``.

    Returns:
        ``(z, q)``.
    """
    if server:
        return lattice.noise_multiplier_of(num_shares), 1.0
    return lattice.noise_multiplier_of(max(num_shares - 1, 1)), sample_rate


def ddg_accountant(lattice: SecureMechanism) -> DistributedDiscreteGaussianAccountant:
    """A fresh ``"ddg"`` accountant of the secure mechanism's discrete Gaussian shares.

    Args:
        lattice: The secure mechanism (its :meth:`~fbo_torch.federation.secure.SecureMechanism.ddg_constants`).

    Returns:
        The accountant, with no releases recorded.
    """
    from fbo_torch.privacy.ddg import DistributedDiscreteGaussianAccountant  # imports Opacus

    return DistributedDiscreteGaussianAccountant(lattice.ddg_constants())


def secure_epsilons(
    lattice: SecureMechanism, threshold: int, sample_rate: float, releases: int, delta: float
) -> tuple[float, float]:
    r"""``(ε against a server that deviates from SecAgg+, ε against the other agents)`` after ``releases``
    secure releases, in the worst case the protocol allows: the server learns sums of ``threshold``
    vectors (:func:`shares_charge` against the server), the other agents sums of ``min_survivors``.

    Args:
        lattice: The federation's secure mechanism.
        threshold: ``t``, the fewest vectors of any sum the server can learn.
        sample_rate: ``q`` (amplifies the second figure only).
        releases: Secure releases this agent's vector took part in.
        delta: ``δ``.

    Returns:
        ``(ε against the server, ε against the other agents)``.
    """
    if releases <= 0:
        return 0.0, 0.0
    if lattice.local_variance == 0:
        return math.inf, math.inf
    accountant = ddg_accountant(lattice)
    server = get_epsilon(
        accountant, delta, history=[(*shares_charge(lattice, max(int(threshold), 1), True, sample_rate), int(releases))]
    )
    others = get_epsilon(
        accountant,
        delta,
        history=[(*shares_charge(lattice, lattice.min_survivors, False, float(sample_rate)), releases)],
    )
    return server, others


@register_release
class SecureDiscreteGaussianRelease(ReleaseMechanism):
    r"""Secure aggregation with distributed discrete Gaussian noise: the server draws and tells each
    agent its Poisson coin, the agents send integer vectors with their own noise shares, the server
    learns only their sum modulo ``m`` (:mod:`fbo_torch.federation.secure`); a sum of fewer than
    ``min_survivors`` vectors is not released. Two ledgers with the ``"ddg"`` accountant: against the
    other agents (``k − 1`` shares, amplified by ``q``, with the budget) and against the server
    (``k`` shares, ``q = 1``)."""

    name = "secure"
    sees_messages = False

    def __init__(self, settings: Any, num_agents: int, weights: RegionWeights) -> None:
        super().__init__(settings, num_agents, weights)
        self.lattice = SecureMechanism.from_settings(settings, self.num_agents)

    @classmethod
    def check_settings(cls, settings: Any) -> None:
        """The central checks, and a ``clip_norm`` (the integer vectors are bounded by it).

        Args:
            settings: The settings.
        """
        super().check_settings(settings)
        if settings.method.federated() and settings.clip_norm is None:
            raise ValueError("`aggregation: secure` needs `clip_norm` (the integer vectors are bounded by it).")

    @classmethod
    def check(cls, settings: Any, num_agents: int) -> None:
        """The settings' checks and the lattice's (:class:`~fbo_torch.federation.secure.SecureMechanism`).

        Args:
            settings: The settings.
            num_agents: ``N``.
        """
        cls.check_settings(settings)
        SecureMechanism.from_settings(settings, num_agents)

    @property
    def _lattice(self) -> SecureMechanism:
        if self.lattice is None:  # set in __init__
            raise RuntimeError("a secure release without its lattice.")
        return self.lattice

    def ledgers(
        self, accountant: str, delta: float | None, max_epsilon: float | None
    ) -> tuple[PrivacyLedger, PrivacyLedger | None]:
        """Two ``"ddg"`` ledgers whatever ``accountant`` names (see :meth:`ReleaseMechanism.ledgers`).

        Args:
            accountant: Ignored: the sum of discrete Gaussian shares has its own accountant.
            delta: δ.
            max_epsilon: The budget against the other agents.

        Returns:
            ``(ledger, server_ledger)``.
        """

        def ledger(budget: float | None) -> PrivacyLedger:
            return PrivacyLedger(
                self.accountant(accountant),
                delta=delta,
                num_agents=self.num_agents,
                max_epsilon=budget,
            )

        return ledger(max_epsilon), ledger(None)

    def charge(self, num_shares: int | None = None, server: bool = False) -> Charge:
        r"""A sum of ``k`` shares (``k_min`` by default): against the other agents ``z_{k−1}`` with ``q``
        (a curious agent knows its own share, not the sample); against the server ``z_k`` with ``q = 1``.

        Args:
            num_shares: ``k``.
            server: The entry of the ledger against the server.

        Returns:
            ``(z, q)``.
        """
        lattice = self._lattice
        return shares_charge(
            lattice, lattice.min_survivors if num_shares is None else num_shares, server, self.settings.sample_rate
        )

    def accountant(self, name: str) -> IAccountant:
        """The ``"ddg"`` accountant of the lattice, whatever ``name`` says (see :meth:`ReleaseMechanism.accountant`).

        Args:
            name: Ignored: the sum of discrete Gaussian shares has its own accountant.

        Returns:
            The accountant.
        """
        return ddg_accountant(self._lattice)

    def worst_case_epsilon(self, releases: int, delta: float, accountant: str, threshold: int) -> float:
        r"""The larger of :func:`secure_epsilons`: against a server that deviates from SecAgg+ (sums of
        ``threshold`` vectors) and against the other agents.

        Args:
            releases: Secure releases the agent's vector took part in.
            delta: ``δ``.
            accountant: Ignored (see :meth:`accountant`).
            threshold: ``t``, the fewest vectors of a sum a deviating server can learn.

        Returns:
            ``ε``.
        """
        return max(secure_epsilons(self._lattice, threshold, self.settings.sample_rate, releases, delta))

    def deviating_server_epsilon(self, releases: int, delta: float, threshold: int) -> float:
        r"""The first figure of :func:`secure_epsilons`: sums of ``threshold`` vectors, nothing amplified.

        Args:
            releases: Secure releases the agent's vector took part in.
            delta: ``δ``.
            threshold: ``t``.

        Returns:
            ``ε``.
        """
        return secure_epsilons(self._lattice, threshold, self.settings.sample_rate, releases, delta)[0]

    def recordable(self, server: bool = False) -> Callable[[float, float], bool]:
        r"""``z`` of a sum of ``k`` shares for a ``k`` from ``min_survivors`` to ``N`` (see :meth:`charge`).

        Args:
            server: The ledger against the server.

        Returns:
            A predicate of ``(z, q)``.
        """
        made = [self.charge(k, server=server) for k in range(self._lattice.min_survivors, self.num_agents + 1)]
        return lambda z, q: any(q == qk and math.isclose(z, zk, rel_tol=1e-12) for zk, qk in made)

    def parameters(self) -> dict[str, Any]:
        """The aggregation and the lattice: its scale, share variance and ``min_survivors``."""
        lattice = self._lattice
        return {
            "aggregation": self.name,
            "secure": {
                "scale": lattice.scale,
                "local_variance": int(lattice.local_variance),
                "min_survivors": lattice.min_survivors,
            },
        }

    def cohort(
        self, round: int, randomness: ServerRandomness, num_federations: int, like: Tensor
    ) -> tuple[Tensor, Tensor]:
        r"""The central mechanism's coins of the round (both sample the same agents given the same
        randomness) and the weight ratios (see :meth:`ReleaseMechanism.cohort`).

        Args:
            round: ``t``.
            randomness: The server's coins.
            num_federations: ``R``.
            like: A float64 tensor on the device of the result.

        Returns:
            ``(sampled, ratios)``.
        """
        R = check_int("num_federations", num_federations, minimum=1)
        sampled = randomness.coins(round, torch.Size([R, self.num_agents]), like) < self.settings.sample_rate
        W = self.aggregator.weights(round).to(like)
        return sampled, W / W.max()

    def releases(self, survivors: Tensor) -> tuple[Tensor, int]:
        r"""A federation's sum is released with at least ``min_survivors`` vectors; charged for the fewest.

        Args:
            survivors: ``R x N`` booleans.

        Returns:
            ``(released, k)``.
        """
        counts = survivors.to(torch.bool).sum(-1)
        released = counts >= self._lattice.min_survivors
        return released, int(counts[released].min()) if bool(released.any()) else 0

    def decode(
        self, total: Tensor, round: int, released: Tensor, sampled: Tensor, survivors: Tensor, num_shares: int
    ) -> tuple[Tensor, AggregationRecord]:
        r"""``(S/c) w_max Σ y / q`` with what only a hostile agent can send clamped (see
        :meth:`ReleaseMechanism.decode`).

        Args:
            total: ``R x d`` residues.
            round: ``t``.
            released: ``R`` booleans.
            sampled: ``R x N`` coins of the round.
            survivors: ``R x N`` booleans.
            num_shares: ``k``.

        Returns:
            ``(broadcast, record)``.
        """
        lattice = self._lattice
        vec, out_of_range = lattice.decode(total)
        W = self.aggregator.weights(round)
        q = self.settings.sample_rate
        out = torch.where(released.view(-1, 1, 1).to(vec.device), vec * (float(W.max()) / q), 0.0)
        took = sampled.to(survivors.device) & survivors
        num = took.sum(-1)
        zero = torch.zeros_like(num, dtype=torch.float64)
        std = float(W.max()) / q * (lattice.clip_norm / lattice.scale) * math.sqrt(num_shares * lattice.local_variance)
        record = AggregationRecord(
            round,
            took,
            num,
            torch.zeros_like(took),
            zero,
            std,
            num_reported=survivors.sum(-1),
            valid=survivors,
            num_invalid=torch.zeros_like(num),
            released=released,
            out_of_range=out_of_range,
        )
        self.aggregator.history[:] = [record]
        return out, record


__all__ = [
    "RELEASES",
    "CentralGaussianRelease",
    "ReleaseMechanism",
    "SecureDiscreteGaussianRelease",
    "check_aggregation",
    "ddg_accountant",
    "get_release",
    "register_release",
    "secure_epsilons",
    "shares_charge",
    "unregister_release",
]
