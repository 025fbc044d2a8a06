r"""What the DP-FTS-DE server does in a round (DP-FTS-DE Algorithm 1, lines 5-12).

:class:`DPFTSDEServer` is the server's half of a round, written once: the
batched simulator calls it with ``R`` independent federations (repetitions)
at once, a deployment (:mod:`fbo_torch.flower`) with ``R = 1``. A round is two
calls, in this order for every round ``t``:

1. :meth:`DPFTSDEServer.plan` — decide whether round ``t`` releases (the
   schedule's ``p_t``, the local threshold, the privacy budget). A deployment
   decides one exchange ahead, so that it can ask the agents for ``ω`` in the
   same message that carries round ``t - 1``'s broadcast.
2. :meth:`DPFTSDEServer.release` — validate the messages, Poisson-sample,
   clip, weight, add noise (the release mechanism's
   :meth:`~fbo_torch.federation.release.ReleaseMechanism.release`), record the
   release in the :class:`~fbo_torch.privacy.PrivacyLedger` and in a
   :class:`ServerRound`, and only then return the broadcast.

The server holds the sub-region partition and the agents' assignment
(distributed exploration), the weight schedule, the release mechanism
(:mod:`fbo_torch.federation.release`, looked up by the settings' ``aggregation``:
what the server does with the messages and what the ledgers are told), the
ledgers, its randomness (:mod:`fbo_torch.protocol.randomness`: the federations' seeded
streams in research, a secret cryptographic stream in deployment) and the
record of every round: ε is kept in one place, the ledger, and each
:class:`ServerRound` carries the ledger's ε after it.

**Secure aggregation** (``settings.aggregation = "secure"``,
:mod:`fbo_torch.federation.secure`). The server never sees an ``ω``: it draws
the round's Poisson coins and weight ratios (:meth:`DPFTSDEServer.secure_cohort`:
each agent is told its own coin), the agents add their own noise shares, and
the server receives only the modular sum of the survivors' integer vectors.
A secure round is three calls after :meth:`~DPFTSDEServer.plan`:
:meth:`~DPFTSDEServer.secure_cohort`, :meth:`~DPFTSDEServer.commit_secure`
(the survivors are known, the sum is not yet: a round with fewer than
``min_survivors`` vectors is not released and costs nothing, since masked
vectors reveal nothing; otherwise both ledgers are charged *here*, before the
server can learn the sum) and :meth:`~DPFTSDEServer.reveal_secure` (decode,
clamp what only a hostile agent can send, broadcast; an unmasking that fails
after the charge releases nothing and keeps the charge: ε is never
under-counted). Two ledgers: ``DPFTSDEServer.ledger``, ε against other
agents and outsiders — the sum of ``k − 1`` shares (a curious agent knows its
own), amplified by the Poisson sample they do not know, with the budget
``max_epsilon`` — and ``DPFTSDEServer.server_ledger``, ε against the
server, which knows the sample: ``k`` shares, no amplification.

**A round without a valid message releases nothing and costs nothing.** When
the caller knows on the host how many valid messages arrived (a deployment,
``num_valid``) and none did, the round records ``released = False`` and the
ledger is not charged: the output would not depend on any agent's data. (The
batched simulator does not read device values inside a round; there a
federation without a valid message releases only noise, as the mechanism's
empty sample does, and the shared ledger is charged: an upper bound, never an
under-count.)
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from fbo_torch.federation.aggregator import AggregationRecord, DPAggregator
from fbo_torch.federation.release import ReleaseMechanism, get_release
from fbo_torch.federation.secure import SecureMechanism
from fbo_torch.privacy import DEFAULT_ACCOUNTANT, PrivacyLedger
from fbo_torch.protocol.partition import SubRegionPartition
from fbo_torch.protocol.randomness import KeyedServerRandomness, ServerRandomness
from fbo_torch.protocol.weights import ExplorationWeights
from fbo_torch.utils.validation import check_int, check_probability

#: Why a round released nothing.
NOT_RELEASED = ("schedule", "budget", "no valid message", "too few survivors", "unmask failed")
#: Reasons of rounds that were charged although nothing was released (a secure round that failed after
#: its commit), and of a committed round whose sum is not revealed yet.
CHARGED_WITHOUT_RELEASE = ("unmask failed",)
UNMASKING = "unmasking"


@dataclass
class ServerRound:
    r"""The server's record of one round.

    Attributes:
        round: ``t``.
        released: Whether a broadcast was released.
        epsilon: ε after the round (the ledger's; ``inf`` once a non-private
            release happened; ``0.0`` before any private release; NaN for a
            non-private server that has not released yet).
        reason: Why nothing was released (one of :data:`NOT_RELEASED`), ``""`` when released.
        record: The mechanism's statistics of a release (device tensors), else ``None``.
        epsilon_server: Secure aggregation: ε against the server after the round (NaN otherwise).
    """

    round: int
    released: bool
    epsilon: float
    reason: str = ""
    record: AggregationRecord | None = None
    epsilon_server: float = field(default=math.nan, kw_only=True)

    @property
    def charged(self) -> bool:
        """Whether the round was charged to the ledger (released, or a secure round that failed after its commit)."""
        return self.released or self.reason in CHARGED_WITHOUT_RELEASE + (UNMASKING,)

    def to_dict(self) -> dict[str, Any]:
        """The host part (no tensors), JSON-able."""

        def num(x: float) -> float | str:
            return x if math.isfinite(x) else str(x)

        out = {"round": self.round, "released": self.released, "epsilon": num(self.epsilon), "reason": self.reason}
        if not math.isnan(self.epsilon_server):
            out["epsilon_server"] = num(self.epsilon_server)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerRound:
        return cls(
            int(data["round"]),
            bool(data["released"]),
            float(data["epsilon"]),
            str(data.get("reason", "")),
            epsilon_server=float(data.get("epsilon_server", math.nan)),
        )


class DPFTSDEServer:
    r"""The server of ``R`` independent DP-FTS-DE federations of ``N`` agents.

    Args:
        num_agents: ``N`` agents per federation (agent ``n`` explores region ``n mod P``).
        bounds: ``2 x d`` domain (partitioned into ``settings.num_regions`` sub-regions).
        settings: DP-FTS-DE settings (``num_regions``, ``weights``, ``weight_a``,
            ``weight_b``, ``const_rounds``, ``decay_rounds``, ``sample_rate``,
            ``clip_norm``, ``noise_multiplier``, ``local_threshold``, ``max_epsilon``).
        randomness: Where the coins and noise come from: a
            :class:`~fbo_torch.protocol.randomness.ServerRandomness`, or ``R``
            int64 federation keys (the seeded streams, for research).
        accountant / delta: The privacy ledger's accountant and δ (default ``1/N^1.1``);
            only used when the settings are private (their algorithm's
            :meth:`~fbo_torch.methods.base.Method.is_private`). ``accountant=None`` runs the
            mechanism without a ledger (benchmarks of the mechanism only: no
            privacy claim is recorded). The release mechanism may use its own
            (secure rounds: ``"ddg"``, whatever ``accountant`` names).

    Attributes:
        release_mechanism: The settings' :class:`~fbo_torch.federation.release.ReleaseMechanism`.
    """

    def __init__(
        self,
        num_agents: int,
        bounds: Tensor,
        settings: Any,
        randomness: ServerRandomness | Tensor,
        accountant: str | None = DEFAULT_ACCOUNTANT,
        delta: float | None = None,
    ) -> None:
        N = check_int("num_agents", num_agents, minimum=1)
        self.num_agents, self.settings = N, settings
        if isinstance(randomness, Tensor):
            randomness = KeyedServerRandomness(randomness)
        if not isinstance(randomness, ServerRandomness):
            raise TypeError(
                "`randomness` must be a ServerRandomness or a tensor of int64 federation keys, "
                f"got {type(randomness).__name__}."
            )
        self.randomness = randomness
        P = settings.num_regions
        self.partition = SubRegionPartition(bounds, P)
        self.assignment = self.partition.assign_agents(N)
        self.region_bounds = self.partition.region_bounds()
        membership = self.partition.membership(self.assignment)
        weights = ExplorationWeights(
            membership,
            settings.weight_a,
            settings.weight_b,
            settings.const_rounds,
            settings.decay_rounds,
            mode=settings.weights if P > 1 else "uniform",
        )
        self.release_mechanism: ReleaseMechanism = get_release(getattr(settings, "aggregation", "central"))(
            settings, N, weights
        )
        self.ledger: PrivacyLedger | None = None
        self.server_ledger: PrivacyLedger | None = None  # ε against the server (a secure sum's)
        self.private = bool(settings.is_private)  # the algorithm's say (Method.is_private)
        if self.private and accountant is not None:
            self.ledger, self.server_ledger = self.release_mechanism.ledgers(accountant, delta, settings.max_epsilon)
        self._cohort: tuple[int, Tensor] | None = None  # (round, R x N sampled) of the planned secure round
        self._committed: tuple[int, Tensor, Tensor, int] | None = None  # (round, released, survivors, shares)
        self.stop_reason = ""  # why the server stopped releasing for good ("" while it has not)
        self.rounds: list[ServerRound] = []
        self._planned: int | None = None  # the round plan() said releases, until release() takes it

    @property
    def aggregator(self) -> DPAggregator:
        """The release mechanism's :class:`~fbo_torch.federation.aggregator.DPAggregator` (the weights)."""
        return self.release_mechanism.aggregator

    @property
    def secure(self) -> bool:
        """Whether the server sees only a secure sum of the agents' messages, never an ``ω``."""
        return not self.release_mechanism.sees_messages

    @property
    def mechanism(self) -> SecureMechanism | None:
        """The secure sum's lattice (:class:`~fbo_torch.federation.secure.SecureMechanism`); ``None`` when the
        server sees every message."""
        return self.release_mechanism.lattice

    @property
    def keys(self) -> Tensor | None:
        """The federations' keys of seeded randomness (``None`` with any other source)."""
        return getattr(self.randomness, "keys", None)

    @property
    def num_regions(self) -> int:
        return self.partition.num_regions

    @property
    def stopped(self) -> bool:
        """Whether the server has stopped releasing for good (schedule or budget)."""
        return bool(self.stop_reason)

    @property
    def planned(self) -> int | None:
        """The round :meth:`plan` said releases and :meth:`release` has not released yet, if any."""
        return self._planned

    # ------------------------------------------------------------------ a round
    def plan(self, round: int, p_t: float) -> bool:
        r"""Decide whether round ``round`` releases; rounds are planned once each, in order.

        The server stops for good once ``1 - p_t`` falls below ``local_threshold``
        (DP-FTS-DE footnote 13: agents switch to local TS) or once one more
        release would take ε above ``max_epsilon``. A round that will not
        release is recorded here; one that will is recorded by :meth:`release`.
        """
        round = check_int("round", round, minimum=1)
        p_t = check_probability("p_t", p_t)
        last = self.rounds[-1].round if self.rounds else 0
        if self._planned is not None or round != last + 1:
            expected = self._planned if self._planned is not None else last + 1
            raise RuntimeError(
                f"the server expected to {'release' if self._planned else 'plan'} round "
                f"{expected}, not plan round {round}."
            )
        reason = self.stop_reason
        if not reason:
            if 1.0 - p_t < self.settings.local_threshold:
                reason = "schedule"
            elif self.ledger is not None and not self.ledger.can_release(*self.release_mechanism.charge()):
                reason = "budget"
        if reason:
            self.stop_reason = reason
            self.rounds.append(ServerRound(round, False, self.epsilon, reason, epsilon_server=self.epsilon_server))
            return False
        self._planned = round
        return True

    def release(self, omegas: Tensor, reported: Tensor | None = None, num_valid: int | None = None) -> Tensor | None:
        r"""Release the planned round: validate, sample, clip, weight, noise, account, record.

        Args:
            omegas: ``R x N x M`` vectors (rows of agents that did not report may
                hold anything; non-finite rows are dropped as invalid).
            reported: Optional ``R x N`` booleans, agents whose vector arrived.
            num_valid: The number of valid messages when the caller knows it on
                the host (a deployment, ``R = 1``): with 0, nothing is released
                and the ledger is not charged.

        Returns:
            The ``R x P x M`` broadcast, or ``None`` when nothing was released.
            The ledger and the round's record are written before it is returned.
        """
        if self._planned is None:
            raise RuntimeError("release() without a planned round: call plan(round, p_t) first.")
        if self.secure:
            raise RuntimeError("a secure server never receives ω: use secure_cohort, commit_secure and reveal_secure.")
        t, self._planned = self._planned, None
        if num_valid is not None and int(num_valid) <= 0:
            self.rounds.append(ServerRound(t, False, self.epsilon, "no valid message"))
            return None
        out, record = self.release_mechanism.release(omegas, t, self.randomness, reported)
        eps = self.ledger.record(*self.release_mechanism.charge()) if self.ledger is not None else math.inf
        if not self.private:
            eps = math.inf
        self.rounds.append(ServerRound(t, True, eps, "", record))
        return out

    # ------------------------------------------------------------------ a secure round
    def secure_cohort(self, num_federations: int = 1, like: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""The planned secure round's ``R x N`` Poisson coins (agent ``n`` is told only its own) and
        ``P x N`` weight ratios ``w / w_max``, as float64 on ``like``'s device.

        The coins are the central mechanism's (:meth:`~fbo_torch.protocol.randomness.ServerRandomness.coins`
        of the round), so both modes sample the same agents given the same randomness.
        """
        if not self.secure or self._planned is None:
            raise RuntimeError("secure_cohort() needs a secure server with a planned round (plan(round, p_t) first).")
        t = self._planned
        like = torch.zeros((), dtype=torch.float64) if like is None else like.to(torch.float64)
        sampled, ratios = self.release_mechanism.cohort(t, self.randomness, num_federations, like)
        self._cohort = (t, sampled)
        return sampled, ratios

    def commit_secure(self, survivors: Tensor) -> Tensor:
        r"""Decide whether the planned secure round releases, and charge it, before the sum is revealed.

        Args:
            survivors: ``R x N`` booleans: the agents whose vector is in the sum.

        Returns:
            ``R`` booleans: the federations whose sum has at least ``min_survivors``
            vectors (the others release nothing). When any does, the ledgers are
            charged for the fewest shares among them (never an under-count).
        """
        if self._cohort is None or self._cohort[0] != self._planned:
            raise RuntimeError("commit_secure() needs the planned round's secure_cohort() first.")
        t, self._planned = self._planned, None
        released, k = self.release_mechanism.releases(survivors)
        if not bool(released.any()):
            self.rounds.append(
                ServerRound(t, False, self.epsilon, "too few survivors", epsilon_server=self.epsilon_server)
            )
            self._committed = None
            return released
        eps = eps_server = math.inf
        if self.ledger is not None:
            if self.server_ledger is None:  # a secure sum's mechanism makes both ledgers
                raise RuntimeError("a private secure server must have a ledger against the server.")
            eps = self.ledger.record(*self.release_mechanism.charge(k))
            eps_server = self.server_ledger.record(*self.release_mechanism.charge(k, server=True))
        self.rounds.append(ServerRound(t, False, eps, UNMASKING, epsilon_server=eps_server))
        self._committed = (t, released, survivors.to(torch.bool), k)
        return released

    def reveal_secure(self, total: Tensor | None) -> Tensor | None:
        r"""Release the committed round from the sum of its survivors' vectors.

        Args:
            total: ``R x d`` residues modulo ``m`` (what secure aggregation reveals), or
                ``None`` when the unmasking failed (nothing is released; the charge stays).

        Returns:
            The ``R x P x M`` broadcast (rows of federations that do not release are
            zero), or ``None``.
        """
        if self._committed is None or self._cohort is None:
            raise RuntimeError("reveal_secure() without a committed round: call commit_secure(survivors) first.")
        (t, released, survivors, k), self._committed = self._committed, None
        rec = self.rounds[-1]
        if total is None:
            rec.reason = "unmask failed"
            return None
        out, rec.record = self.release_mechanism.decode(total, t, released, self._cohort[1], survivors, k)
        rec.released, rec.reason = True, ""
        return out

    # ------------------------------------------------------------------ records
    @property
    def last_record(self) -> AggregationRecord | None:
        """The mechanism's record of the last release (device tensors)."""
        return self.aggregator.history[-1] if self.aggregator.history else None

    @property
    def epsilon(self) -> float:
        """ε after the last round (see :attr:`ServerRound.epsilon`)."""
        if self.rounds:
            return self.rounds[-1].epsilon
        return 0.0 if self.private else math.nan

    @property
    def epsilons(self) -> list[float]:
        """ε after each round so far."""
        return [r.epsilon for r in self.rounds]

    @property
    def epsilon_server(self) -> float:
        """Secure aggregation: ε against the server after the last round (NaN otherwise)."""
        if not self.secure:
            return math.nan
        if self.rounds:
            return self.rounds[-1].epsilon_server
        return 0.0 if self.private else math.nan

    @property
    def released(self) -> list[bool]:
        """Whether each round so far released."""
        return [r.released for r in self.rounds]

    def privacy_parameters(self) -> dict[str, Any]:
        r"""The parameters of the release a saved state must have been made with: ``N``, ``P``,
        ``q``, ``S``, ``z``, the aggregation (secure: its lattice scale, share variance and
        ``min_survivors``), the accountant and δ (``None`` without a ledger)."""
        s, ledger = self.settings, self.ledger
        return {
            "num_agents": self.num_agents,
            "num_regions": self.num_regions,
            "sample_rate": s.sample_rate,
            "clip_norm": s.clip_norm,
            "noise_multiplier": s.noise_multiplier,
            **self.release_mechanism.parameters(),
            "accountant": None if ledger is None else ledger.mechanism,
            "delta": None if ledger is None else ledger.delta,
        }

    def state_dict(self) -> dict[str, Any]:
        """The rounds, why it stopped, the planned round, the mechanism's parameters and the ledger
        (host data only; not the randomness)."""
        return {
            "stop_reason": self.stop_reason,
            "rounds": [r.to_dict() for r in self.rounds],
            "planned": self._planned,
            "mechanism": self.privacy_parameters(),
            "ledger": None if self.ledger is None else self.ledger.state_dict(),
            "server_ledger": None if self.server_ledger is None else self.server_ledger.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        r"""Restore a saved server after checking it against this server: the mechanism's
        parameters (``N``, ``P``, ``q``, ``S``, ``z``, the accountant, δ) must be this server's, every
        recorded release must have used this server's ``(z, q)``, the ledger's ε is recomputed from its
        recorded releases (:meth:`~fbo_torch.privacy.PrivacyLedger.load_state_dict`, strict: this
        server's budget stays in force) and must match the rounds' records, release for release.

        Raises:
            ValueError: The state is malformed, was made with other parameters, or its records
                disagree with its ledger.
        """
        try:
            rounds = [ServerRound.from_dict(r) for r in state["rounds"]]
            stop_reason = str(state["stop_reason"])
            ledger = state["ledger"]
            planned = None if state.get("planned") is None else int(state["planned"])
            mechanism = dict(state["mechanism"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"the saved server state is malformed ({type(err).__name__}: {err}).") from None
        mine = self.privacy_parameters()
        changed = [f"{k} {mechanism.get(k)!r} (this run: {v!r})" for k, v in mine.items() if mechanism.get(k) != v]
        if changed:
            raise ValueError(
                f"the saved server state was made with other privacy parameters: {', '.join(changed)}; refusing it."
            )
        if stop_reason and stop_reason not in NOT_RELEASED:
            raise ValueError(f"the saved server state's stop reason {stop_reason!r} is not one of {NOT_RELEASED}.")
        if [r.round for r in rounds] != list(range(1, len(rounds) + 1)):
            raise ValueError("the saved server state's rounds are not 1, 2, ... in order.")
        if planned is not None and planned != len(rounds) + 1:
            raise ValueError(f"the saved server state planned round {planned} after {len(rounds)} rounds.")
        for r in rounds:  # a commit whose reveal a crash interrupted: nothing was released, the charge stays
            if r.reason == UNMASKING:
                r.reason = "unmask failed"
        charged = [r for r in rounds if r.charged]
        restored: dict[str, PrivacyLedger] = {}  # this server's ledgers are replaced only once all checks pass
        for name, saved, attr in (
            ("ledger", ledger, "epsilon"),
            ("server_ledger", state.get("server_ledger"), "epsilon_server"),
        ):
            own = getattr(self, name)
            if own is None:
                continue
            if saved is None:
                raise ValueError("the saved server state has no privacy ledger, but this server is private.")
            new = copy.deepcopy(own)
            new.load_state_dict(saved)
            allowed = self.release_mechanism.recordable(server=name == "server_ledger")
            other = [(hz, hq) for hz, hq, _ in new.accountant.history if not allowed(hz, hq)]
            if other:
                raise ValueError(
                    f"the saved server state's ledger records releases with (z, q) = {other[0]}, which "
                    f"this run's mechanism (z = {self.settings.noise_multiplier}, q = "
                    f"{self.settings.sample_rate}) cannot make: refusing it."
                )
            if new.rounds != len(charged):
                raise ValueError(
                    f"the saved server state records {len(charged)} releases but its ledger "
                    f"{new.rounds}: refusing a state that cannot account for its releases."
                )
            for r, eps in zip(charged, new.epsilons, strict=True):
                if not math.isclose(getattr(r, attr), eps, rel_tol=1e-9, abs_tol=1e-12):
                    raise ValueError(
                        f"the saved server state says ε = {getattr(r, attr)} after round {r.round}, "
                        f"its ledger {eps}: refusing it."
                    )
            restored[name] = new
        for name, new in restored.items():
            setattr(self, name, new)
        self.rounds, self.stop_reason, self._planned = rounds, stop_reason, planned
