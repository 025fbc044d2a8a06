r"""The server's side of a deployment, as a sequence of exchanges.

A deployed round needs one exchange with the agents, not two: the reply to
exchange ``t`` carries the agent's round-``t`` results *and* its ``ω`` for the
release of round ``t + 1`` (drawn after it observed round ``t``'s point, as in
the simulator). So a run of ``T`` rounds is ``T + 1`` exchanges:

* exchange 0: agents set up (initial queries) and send ``ω`` for round 1;
* exchange ``t = 1..T``: the server releases round ``t``'s broadcast from the
  ``ω`` it received, sends it with ``p_t``; agents take round ``t`` and send
  ``ω`` for round ``t + 1`` when the server will release again.

:class:`Coordinator` holds the federation's server,
:class:`~fbo_torch.federation.server.DPFTSDEServer` with ``R = 1`` — the same
object, called the same way (``plan``, then ``release``), as in the simulator
— and adds what a network needs:

* **Server randomness no agent can reproduce**: the coins and noise come from
  the server's secret (:class:`~fbo_torch.protocol.randomness.SecretServerRandomness`,
  secure mode by default), never from the run config's seed.
* **Every reply validated**: :meth:`Coordinator.receive` checks the agent id,
  the feature map and ``ω`` (an ``M``-vector of finite float64); a bad reply is
  counted as invalid for its sender and left out like a dropout, and never
  stops the server.
* **A durable ledger**: with a :class:`~fbo_torch.flower.server_state.ServerState`,
  :meth:`Coordinator.plan` writes the ledger, the rounds and the exchange it is
  about to send *before* returning it; a restarted coordinator resumes from
  that file and first re-sends that exchange, unchanged.

**Agents that do not report, or report invalid messages** (a straggler past
the round's timeout, a node that went away, a refused node, a malformed or
non-finite ``ω``) are aggregated as the simulator aggregates dropped agents:
their rows are left out of the sum, nothing is renormalized, and the noise
keeps its scale ``z φ_max S / q``. The accounting with ``(z, q)`` stays valid
(see :mod:`fbo_torch.federation.aggregator`): an agent's vector enters a release
only if its Poisson coin (probability ``q``, drawn by the server) came up *and*
it arrived valid, each vector that enters is clipped to the same bound, and a
message left out contributes exactly what the null message of a zero-out
neighbour does. A round in which no valid message arrived releases nothing and
costs no ε. Nothing here imports ``flwr``.

**Secure aggregation** (``aggregation = "secure"``). The exchange that asks for
round ``t + 1``'s vectors carries each agent's own Poisson coin and its weight
ratios (:meth:`RoundPlan.cohort_of`); agents reply without ``ω`` (one that
sends it is refused) and the server runs SecAgg+ with them
(:mod:`fbo_torch.flower.secagg`, driven by the ServerApp) before the next
exchange: :meth:`Coordinator.commit_secure` charges both ledgers and writes
them down *before* the unmasking can reveal the sum (so a crash never
under-counts ε), :meth:`Coordinator.reveal_secure` keeps the decoded
broadcast for exchange ``t + 1``. A round whose SecAgg+ keeps fewer than
``min_survivors`` vectors releases nothing and costs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.federation.secure import SecureMechanism
from fbo_torch.federation.server import DPFTSDEServer, ServerRound
from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.flower.server_state import ServerState, ServerStateError
from fbo_torch.privacy.ledger import PrivacyLedger
from fbo_torch.protocol.randomness import SecretServerRandomness
from fbo_torch.protocol.schedules import PtSchedule
from fbo_torch.utils.secure_random import new_secret


class InvalidReply(ValueError):
    """A reply that cannot be used: the message says why; its sender is left out of the round."""


@dataclass(frozen=True)
class RoundPlan:
    r"""What the server sends every agent in one exchange.

    Attributes:
        round: ``t`` (0: set-up).
        p: ``p_t`` (0.0 in exchange 0).
        broadcast: ``P x M`` release of round ``t``, or ``None``.
        region_bounds: ``P x 2 x d`` sub-regions (``None`` for TS).
        omega_round: The round whose release the agents send ``ω`` for (0: none).
        fingerprint: The server's feature-map fingerprint (``""`` for TS).
        features: The feature map's constructor arguments (``{}`` for TS).
        coins: Secure aggregation: ``N`` Poisson coins of round ``omega_round`` (each agent
            is sent only its own), else ``None``.
        ratios: Secure aggregation: ``P x N`` weight ratios ``w / w_max`` of that round.
    """

    round: int
    p: float
    broadcast: Tensor | None
    region_bounds: Tensor | None
    omega_round: int
    fingerprint: str
    features: dict[str, Any] = field(default_factory=dict)
    coins: Tensor | None = None
    ratios: Tensor | None = None

    def cohort_of(self, agent: int) -> tuple[bool, Tensor] | None:
        """Agent ``agent``'s own coin and ``P`` ratios in a secure round (``None`` otherwise)."""
        if self.coins is None:
            return None
        if self.ratios is None:
            raise ValueError("a secure round's plan holds coins but no weight ratios.")
        return bool(self.coins[agent]), self.ratios[:, agent]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (floats kept exactly)."""
        return {
            "round": self.round,
            "p": self.p,
            "omega_round": self.omega_round,
            "fingerprint": self.fingerprint,
            "features": dict(self.features),
            "broadcast": None if self.broadcast is None else self.broadcast.tolist(),
            "region_bounds": None if self.region_bounds is None else self.region_bounds.tolist(),
            "coins": None if self.coins is None else self.coins.tolist(),
            "ratios": None if self.ratios is None else self.ratios.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoundPlan:
        def tensor(v: Any, dtype: torch.dtype = torch.float64) -> Tensor | None:
            return None if v is None else torch.tensor(v, dtype=dtype)

        return cls(
            int(data["round"]),
            float(data["p"]),
            tensor(data["broadcast"]),
            tensor(data["region_bounds"]),
            int(data["omega_round"]),
            str(data["fingerprint"]),
            dict(data["features"]),
            tensor(data.get("coins"), torch.bool),
            tensor(data.get("ratios")),
        )


@dataclass
class RoundLog(ServerRound):
    r"""The coordinator's record of one round: the server's :class:`ServerRound` and what the
    agents sent.

    Attributes:
        num_reported: Valid ``ω`` that entered the release.
        num_invalid: Replies left out as invalid (malformed, wrong shape or dtype, non-finite).
        num_replied: Replies from agents to the exchange that opened the round.
        best_values / num_observations: What agents reported after the round.
        secagg: Secure aggregation: the round's SecAgg+ statistics (``seconds``,
            ``bytes_sent``, ``bytes_received``, ``survivors``, ``out_of_range``).
        epsilon_malicious: Secure aggregation: ε against a server that deviates from SecAgg+
            after the round, in the worst case the protocol allows
            (:func:`~fbo_torch.federation.release.secure_epsilons`: every round so far, a sum of
            ``t`` vectors, no amplification); NaN otherwise.
    """

    num_reported: int = 0
    num_invalid: int = 0
    num_replied: int = 0
    best_values: dict[int, float] = field(default_factory=dict)
    num_observations: dict[int, int] = field(default_factory=dict)
    secagg: dict[str, Any] = field(default_factory=dict)
    epsilon_malicious: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        out = {
            **super().to_dict(),
            "num_reported": self.num_reported,
            "num_invalid": self.num_invalid,
            "num_replied": self.num_replied,
            "best_values": {str(k): v for k, v in sorted(self.best_values.items())},
            "num_observations": {str(k): v for k, v in sorted(self.num_observations.items())},
        }
        if self.secagg:
            out["secagg"] = dict(self.secagg)
        if not math.isnan(self.epsilon_malicious):
            out["epsilon_malicious"] = self.epsilon_malicious if math.isfinite(self.epsilon_malicious) else "inf"
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RoundLog:
        server = ServerRound.from_dict(d)
        return cls(
            server.round,
            server.released,
            server.epsilon,
            server.reason,
            None,
            int(d["num_reported"]),
            int(d["num_invalid"]),
            int(d["num_replied"]),
            {int(k): float(v) for k, v in d["best_values"].items()},
            {int(k): int(v) for k, v in d["num_observations"].items()},
            dict(d.get("secagg", {})),
            float(d.get("epsilon_malicious", math.nan)),
            epsilon_server=server.epsilon_server,
        )


def message_problem(omega: Any, num_features: int) -> str:
    r"""Why ``omega`` cannot enter a release (``""`` when it can): it must be an
    ``M``-vector of finite float64 numbers."""
    if not isinstance(omega, Tensor):
        return f"ω is {type(omega).__name__}, not a tensor"
    if omega.device.type != "cpu":
        return f"ω is on device {omega.device.type!r}, expected a CPU tensor"
    if omega.dtype != torch.float64:
        return f"ω has dtype {omega.dtype}, expected torch.float64"
    if tuple(omega.shape) != (num_features,):
        return f"ω has shape {tuple(omega.shape)}, expected ({num_features},)"
    bad = int((~torch.isfinite(omega)).sum())
    if bad:
        return f"ω holds {bad} non-finite value(s)"
    return ""


class Coordinator:
    r"""The DP-FTS-DE server of one deployed federation of ``N`` agents.

    Args:
        config: The run config.
        bounds: ``2 x d`` domain (from the objective).
        dim: ``d``.
        secret: The server's 32-byte secret (server-side only). Default: the
            ``state``'s, or a fresh one from the OS's generator.
        state: A :class:`~fbo_torch.flower.server_state.ServerState` to write
            the secret, ledger and rounds to before every exchange, and to resume
            from; held (locked) by this coordinator until :meth:`close`.

    Raises:
        ServerStateError: ``state`` holds another federation, a finished one, or
            a ledger that does not verify.
    """

    def __init__(
        self,
        config: FlowerRunConfig,
        bounds: Tensor,
        dim: int,
        secret: bytes | None = None,
        state: ServerState | None = None,
    ) -> None:
        self.config = config
        self.settings = s = config.dp_settings()
        self.N = int(config.num_agents)
        self.schedule = PtSchedule(s.p_t, s.p1_equals_p2)
        self.state = state
        self.federation = config.fingerprint()
        saved = None
        if state is not None:
            secret, saved = state.open(self.federation, secret)  # locks the folder for this process
        elif secret is None:
            secret = new_secret()
        self._secret = secret
        self.server: DPFTSDEServer | None = None
        self.features: RandomFourierFeatures | None = None
        if s.method.federated():
            self.features = s.features(dim)
            self.server = DPFTSDEServer(
                self.N,
                bounds.to(torch.float64),
                s,
                SecretServerRandomness(secret, secure_mode=config.secure_mode),
                config.privacy.accountant,
                config.ledger_delta,
            )
        self.secure = self.server is not None and self.server.secure
        self._secure_broadcast: Tensor | None = None  # the revealed release of the next exchange
        self._secagg_stats: dict[str, Any] = {}  # the SecAgg+ statistics of that round
        self._last_plan: RoundPlan | None = None
        M = s.num_features
        self._omegas = torch.zeros(1, self.N, M, dtype=torch.float64)
        self._reported = torch.zeros(1, self.N, dtype=torch.bool)
        self._num_invalid = 0  # replies of the current exchange left out as invalid
        self.round = -1
        self.logs: list[RoundLog] = []
        self.refused: dict[int, str] = {}  # agent -> why
        self.refused_nodes: dict[int, str] = {}  # transport peer (e.g. Flower node id) -> why
        self.invalid: dict[int, int] = {}  # agent -> invalid replies so far
        self._resend: RoundPlan | None = None
        self.resumed = saved is not None
        if state is not None and saved is not None:  # a saved state comes only from a state folder
            try:
                self._load(saved)
            except (KeyError, TypeError, ValueError) as err:
                state.release()
                raise ServerStateError(
                    f"{state.folder}: the saved server state does not verify ({err}); the server cannot account "
                    "for what it released: restore the folder, or start a new federation in a new state folder."
                ) from None

    @property
    def fingerprint(self) -> str:
        return "" if self.features is None else self.features.fingerprint

    @property
    def ledger(self) -> PrivacyLedger | None:
        return None if self.server is None else self.server.ledger

    @property
    def epsilon(self) -> float:
        """ε after the last round (NaN without DP, ``inf`` after a non-private release)."""
        if self.server is None:
            return math.nan
        return self.server.epsilon

    @property
    def _omega_round(self) -> int:
        """The round whose release the agents send ``ω`` for in this exchange (0: none): the server's planned one."""
        return 0 if self.server is None else (self.server.planned or 0)

    @property
    def done(self) -> bool:
        return self.round >= self.settings.num_iterations and self._resend is None

    @property
    def _secure_server(self) -> DPFTSDEServer:
        """The federation's server when it aggregates securely (only then are there SecAgg+ rounds)."""
        if self.server is None or not self.secure:
            raise RuntimeError("this coordinator does not aggregate securely (`aggregation` is not 'secure').")
        return self.server

    # ------------------------------------------------------------------ exchanges
    def plan(self) -> RoundPlan:
        r"""Open the next exchange: release the round's broadcast (if any) and decide the next.

        With a state folder, the ledger, the rounds and the plan are written
        before the plan is returned (the caller sends it after). After a
        restart the first plan is the last one written, unchanged.
        """
        if self._resend is not None:
            plan, self._resend = self._resend, None
            return plan
        s = self.settings
        server = self.server
        t = self.round + 1
        broadcast = None
        if t >= 1:
            num_reported = int(self._reported.sum())
            if server is not None and self._omega_round == t:
                if self.secure:  # its SecAgg+ never got to a commit: too few nodes took part
                    server.commit_secure(torch.zeros(1, self.N, dtype=torch.bool))
                else:
                    out = server.release(self._omegas, reported=self._reported.clone(), num_valid=num_reported)
                    broadcast = None if out is None else out[0]
            if self.secure:
                broadcast, self._secure_broadcast = self._secure_broadcast, None
                num_reported = int(self._secagg_stats.get("survivors", 0))
            rec = server.rounds[t - 1] if server is not None else None
            released = rec is not None and rec.released
            self.logs.append(
                RoundLog(
                    t,
                    released,
                    self.epsilon,
                    "" if rec is None else rec.reason,
                    num_reported=num_reported if released else 0,
                    num_invalid=self._num_invalid,
                    secagg=self._secagg_stats,
                    epsilon_malicious=self._malicious_epsilon(t),
                    epsilon_server=math.nan if rec is None else rec.epsilon_server,
                )
            )
            self._secagg_stats = {}
        coins = ratios = None
        if server is not None and t < s.num_iterations and server.plan(t + 1, self.schedule(t + 1)) and self.secure:
            sampled, ratios = server.secure_cohort(1)
            coins = sampled[0]
        self._omegas.zero_()
        self._reported.zero_()
        self._num_invalid = 0
        self.round = t
        plan = RoundPlan(
            t,
            float(self.schedule(t)) if t >= 1 else 0.0,
            broadcast,
            None if server is None else server.region_bounds,
            self._omega_round,
            self.fingerprint,
            {} if self.features is None else self.features.config(),
            coins,
            ratios,
        )
        self._last_plan = plan
        self._save(plan)
        return plan

    # ------------------------------------------------------------------ secure rounds
    def _malicious_epsilon(self, rounds: int) -> float:
        """ε against a server that deviates from SecAgg+ after ``rounds`` rounds (NaN unless secure): the release
        mechanism's (:meth:`~fbo_torch.federation.release.ReleaseMechanism.deviating_server_epsilon`)."""
        if self.server is None:
            return math.nan
        cfg = self.config
        return self.server.release_mechanism.deviating_server_epsilon(rounds, cfg.ledger_delta, cfg.secure_threshold())

    @property
    def mechanism(self) -> SecureMechanism | None:
        """The secure mechanism's constants (``None`` unless ``aggregation = "secure"``): the release's lattice."""
        return None if self.server is None else self.server.mechanism

    def commit_secure(self, survivors: list[int]) -> bool:
        r"""The SecAgg+ of the planned round kept ``survivors`` (agent ids): decide and charge it.

        With at least ``min_survivors`` the ledgers are charged and written to the
        state folder before this returns (the caller unmasks after); the written
        exchange no longer asks for vectors, so a server restarted before the
        reveal records the round as failed and moves on. Returns whether to unmask.
        """
        server = self._secure_server
        if self._last_plan is None:
            raise RuntimeError("commit_secure() before the exchange that opened the secure round (plan()).")
        mask = torch.zeros(1, self.N, dtype=torch.bool)
        mask[0, list(survivors)] = True
        released = bool(server.commit_secure(mask)[0])
        self._secagg_stats["survivors"] = len(survivors)
        if released:
            self._save(replace(self._last_plan, omega_round=0, coins=None, ratios=None))
        return released

    def reveal_secure(self, total: Tensor | None, stats: dict[str, Any] | None = None) -> None:
        """The unmasked sum (``d`` residues, or ``None``: the unmasking failed) of the committed round."""
        server = self._secure_server
        out = server.reveal_secure(None if total is None else total.view(1, -1))
        self._secure_broadcast = None if out is None else out[0]
        if out is not None:
            rec = server.last_record
            if rec is None or rec.out_of_range is None:
                raise RuntimeError("a secure release must leave its record with the out-of-range count.")
            self._secagg_stats["out_of_range"] = int(rec.out_of_range[0])
        self._secagg_stats.update(stats or {})

    def note_secagg(self, stats: dict[str, Any]) -> None:
        """SecAgg+ statistics of the planned round (time, bytes), logged with it."""
        self._secagg_stats.update(stats)

    def receive(
        self, agent_id: Any, fingerprint: Any, omega: Any, best_value: Any = None, num_observations: Any = None
    ) -> None:
        r"""Take an agent's reply to the current exchange.

        Raises:
            InvalidReply: The reply cannot be used (an unknown agent, a feature
                map that is not the server's — that agent is refused for the rest
                of the run —, a missing, malformed or non-finite ``ω``, bad
                metrics); it is left out of the round, like a dropout. The caller
                counts it against its sender with :meth:`reject`.
        """
        if isinstance(agent_id, bool) or not isinstance(agent_id, int) or not 0 <= agent_id < self.N:
            raise InvalidReply(f"reply from agent {agent_id!r}, not an agent id in 0..{self.N - 1}.")
        n = agent_id
        if fingerprint != self.fingerprint:
            self.refuse(n, f"feature map fingerprint {fingerprint!r} != the server's {self.fingerprint!r}")
            raise InvalidReply(f"agent {n} refused: {self.refused[n]}.")
        if n in self.refused:
            return
        problems = []
        if best_value is not None and not (isinstance(best_value, float) and math.isfinite(best_value)):
            problems.append(f"best value {best_value!r} is not a finite number")
        most = self.settings.num_init + self.settings.num_iterations  # an agent evaluates no more than this
        if num_observations is not None and (
            isinstance(num_observations, bool)
            or not isinstance(num_observations, int)
            or not 0 <= num_observations <= most
        ):
            problems.append(f"observation count {num_observations!r} is not an integer in 0..{most}")
        if self._omega_round and self.secure:
            if omega is not None:
                problems.append("it sent ω in a secure round (ω must never leave an agent when aggregation is secure)")
        elif self._omega_round:
            problem = (
                f"no ω for round {self._omega_round}"
                if omega is None
                else message_problem(omega, self._omegas.shape[-1])
            )
            if problem:
                problems.append(problem)
        if problems:
            self._reported[0, n] = False
            raise InvalidReply(
                f"agent {n}: {'; '.join(problems)}; left out of round {self._omega_round or self.round}."
            )
        if self.logs:
            self.logs[-1].num_replied += 1
            if num_observations is not None:
                self.logs[-1].num_observations[n] = num_observations
            if best_value is not None and self.config.report_best:
                self.logs[-1].best_values[n] = best_value
        if self._omega_round and not self.secure:
            self._omegas[0, n] = omega
        if self._omega_round:
            self._reported[0, n] = True

    def reject(self, agent_id: int | None = None) -> None:
        """Count a reply that could not be read at all (malformed) as invalid for its sender."""
        self._num_invalid += 1
        if agent_id is not None:
            self.invalid[agent_id] = self.invalid.get(agent_id, 0) + 1
            self._reported[0, agent_id] = False

    def refuse(self, agent_id: int, reason: str) -> None:
        """Leave agent ``agent_id`` out of every later release."""
        self.refused[int(agent_id)] = reason
        self._reported[0, int(agent_id)] = False

    def finish(self) -> None:
        """Mark the federation finished in the state folder (a restart is then refused)."""
        self._save(None, finished=True)

    def close(self) -> None:
        """Let go of the state folder (another server process may then take it)."""
        if self.state is not None:
            self.state.release()

    # ------------------------------------------------------------------ durability
    def _save(self, plan: RoundPlan | None, finished: bool = False) -> None:
        if self.state is None:
            return
        eps = self.epsilon if math.isfinite(self.epsilon) else str(self.epsilon)
        self.state.save(
            self.federation,
            self._secret,
            {
                "round": self.round,
                "plan": None if plan is None else plan.to_dict(),
                "server": None if self.server is None else self.server.state_dict(),
                "logs": [log.to_dict() for log in self.logs],
                "refused": {str(k): v for k, v in self.refused.items()},
                "invalid": {str(k): v for k, v in self.invalid.items()},
            },
            finished=finished,
            epsilon=eps,
        )

    def _load(self, saved: dict[str, Any]) -> None:
        if self.server is not None:
            self.server.load_state_dict(saved["server"])
        self.round = int(saved["round"])
        self.logs = [RoundLog.from_dict(d) for d in saved["logs"]]
        self.refused = {int(k): str(v) for k, v in saved["refused"].items()}
        self.invalid = {int(k): int(v) for k, v in saved["invalid"].items()}
        if self.secure and self._secure_server.planned is not None:
            self._secure_server.secure_cohort(1)  # the planned round's coins: the same secret redraws the same
        if saved["plan"] is not None:
            self._resend = RoundPlan.from_dict(saved["plan"])
            self._last_plan = self._resend
            if self._resend.omega_round != self._omega_round:
                raise ValueError(
                    f"the saved exchange asks for ω of round {self._resend.omega_round}, the server "
                    f"planned {self.server.planned if self.server is not None else None}"
                )
