r"""Transfer through every channel a peer offers, learned per agent: ``algorithm: transfer``.

Peers can help an agent in three ways, each suited to another kind of
relatedness (``docs/design.md``, "Transfer that pays"):

* **where the optimum is** (``"optima"``): every peer shares its incumbent, the
  input of its best observation (``d`` numbers). Tasks that differ in shape and
  scale but are best in the same place — shifted, rescaled or rotated copies,
  related tuning problems — hand a newcomer a near-optimal query at once (the
  warm start of Feurer et al. 2015);
* **the function itself** (``"function"``): FTS's message, one draw ``ω_n`` of the
  peer's RFF posterior, whose maximizer the agent may query (near-copies);
* **the landscape's statistics** (``"landscape"``): every peer shares its GP's
  fitted lengthscales (``k`` numbers); the agent fits its own GP under a LogNormal
  prior centred on their ``P_N``-weighted log-mean, as wide as the peers disagree
  plus :attr:`~fbo_torch.federation.settings.FTSSettings.landscape_scale`
  (federated empirical Bayes: where tasks are shifted or rotated copies their
  lengthscales carry over even when their optima do not), and keeps that fit only
  where it predicts the agent's held-out observations better than the fit under the
  spec's prior (leave-one-out, :meth:`~fbo_torch.federation.agents.Agents.gp`).

Each iteration an agent has up to four candidates: its own proposal, the best
untried peer incumbent, the maximizer of the message of a peer drawn from
``P_N``, and its own exploring proposal. The own proposal exploits — LogEI over
the agent's plug-in incumbent
(:meth:`~fbo_torch.federation.agents.Agents.plug_in_incumbent`), since the
peers' arms explore — unless that returns a point the agent has already
observed; then it is LogEI over the best observation, as the local engine's.
The exploring proposal is the maximizer of the upper confidence bound
(``β = ucb_beta``) on the same GP: which of the two local engines (LogEI or UCB)
suits a task differs from suite to suite (``benchmarks/peers``), and where no
peer helps the bandit falls back to whichever of them pays on the agent's own
observations. (With ``own_acquisition: ucb`` the own proposal already is that
maximizer and the arm is not offered.)
A message's maximizer the agent has already queried (a message that has not
changed since) is not offered again. A peer's candidate must also look worth an
evaluation to the agent's own model — expected improvement at least a tenth of
its own proposal's — unless its channel has so far improved the agent's
incumbent more often than the agent's own proposals (:func:`channel_gate`): a
channel that does not pay stops costing evaluations after its first failures,
and one that carries near-copies stays open. Which one it queries is a bandit over
the channels that learns from the agent's own observations: each channel's
probability of improving the agent's incumbent has a Beta posterior (prior
``Beta(1, 1)``) updated whenever the channel is followed, and the channel whose
Thompson draw (a normal approximation of the Beta) is highest is followed. A
channel that stops paying is followed less and less, so an agent whose peers do
not help falls back to its local engine; one whose peers share its optimum keeps
following them while they improve it.

Peers are weighted by learned ``P_N`` (how well each peer's message ranks the
agent's observations, :mod:`~fbo_torch.protocol.fidelity`) and, for the
incumbents, by what following each of them has earned: a peer's candidate scores
``log EI(c_n) + log P_N(n) + (wins_n − losses_n)``, so weight grows only with
evidence the agent itself observed (sybils that agree with each other gain
nothing they did not earn). An incumbent is a candidate only while the agent's GP
still finds it plausible (its upper confidence bound ``μ + 2σ`` exceeds the agent's
best observation) and the agent has not queried it.

Free-riders (``free_riders``, :mod:`~fbo_torch.federation.free_riders`) send nothing useful on any
channel: besides their draw, their incumbent and lengthscales are replaced — ``constant``: the box's
centre and the spec prior's median lengthscale every round; ``noise``: a uniform point and a draw of
the spec's lengthscale prior; ``stale``: their first incumbent and fitted lengthscales; ``copied``: the
next honest agent's.

Privacy: an incumbent is one raw input of the sender (not its value); the
lengthscales are statistics of its data. Both are shared as they are: this
algorithm is for the FTS experiment kind, whose messages carry no differential
privacy (a DP-FTS-DE federation shares only its server's noisy release).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from fbo_torch.acquisition.batched import BatchedLogExpectedImprovement
from fbo_torch.acquisition.search import maximize_rff_samples
from fbo_torch.methods.base import register_method
from fbo_torch.methods.draws import DrawMethod
from fbo_torch.models.gp_spec import get_spec
from fbo_torch.protocol.fidelity import LEARNED_WEIGHTS, fidelity_weights, helpful_posterior
from fbo_torch.protocol.schedules import OWN, draw_sources
from fbo_torch.utils import keyed_random as kr

#: The channels, in the order of the bandit's arms after the agent's own (arm 0).
CHANNELS = ("optima", "function", "landscape")
#: Arms of the bandit: the agent's own proposal, a peer's incumbent, a peer's message, the agent's
#: own exploring (UCB) proposal.
OWN_ARM, OPTIMA_ARM, FUNCTION_ARM, UCB_ARM = 0, 1, 2, 3
#: The peers' arms (optima, function): gated by :func:`channel_gate` and barred by reciprocity.
PEER_ARMS = slice(OPTIMA_ARM, FUNCTION_ARM + 1)
#: The number of arms.
ARMS = 4
#: A proposal within this fraction of the box's width of an observed input, in every coordinate, is a repeat.
REPEAT_TOL = 1e-6
#: ``β`` of the plausibility screen of a peer's incumbent: ``μ + √β σ`` must exceed the best observation.
SCREEN_BETA = 4.0
#: The own-acquisition gate of the channels (:func:`channel_gate`): a channel's candidate whose expected
#: improvement, by the agent's own GP, is below this fraction of its own proposal's is not followed, unless
#: the channel has so far improved the agent's incumbent more often than the agent's own proposals.
GATE_RATIO = 0.1


def success_rate(wins: Tensor, losses: Tensor) -> Tensor:
    r"""Each arm's posterior mean probability of improving the incumbent under a ``Beta(1, 1)`` prior:
    ``(wins + 1) / (wins + losses + 2)``, the bandit's and :func:`channel_gate`'s record of an arm.

    Args:
        wins: Times each arm was followed and improved the incumbent.
        losses: Times each arm was followed and did not (the shape of ``wins``).

    Returns:
        The posterior means, the shape of ``wins``.
    """
    return (wins + 1) / (wins + losses + 2)


def channel_gate(log_ei: Tensor, wins: Tensor, losses: Tensor, ratio: float = GATE_RATIO) -> Tensor:
    r"""Which channels' candidates an agent may follow: ``R x 2`` booleans (optima, function).

    A peer's candidate costs the agent one evaluation, so it must either look worth it to the
    agent's own model — its expected improvement (LogEI over the agent's best observation) at
    least ``ratio`` times that of the agent's own proposal — or the channel must have earned the
    agent's trust: its posterior mean probability of improving the incumbent (``Beta(1, 1)``
    prior, as the bandit's) above that of the agent's own arm. Where no peer helps the gate
    closes after the channel's first failures and the agent spends its budget as the local
    engine would; where peers hold near-copies the channel wins early and stays open however
    little the agent's own model expects of its candidates.

    Args:
        log_ei: ``R x 3`` the agent's LogEI at its own proposal, the optima channel's and the
            function channel's candidates (one acquisition for all three).
        wins: ``R x 3`` times each arm (own, optima, function) was followed and improved the incumbent.
        losses: ``R x 3`` times each arm was followed and did not.
        ratio: The fraction of the own proposal's expected improvement a candidate must reach.

    Returns:
        ``R x 2`` booleans: may the optima / function channel's candidate be followed.
    """
    plausible = log_ei[:, 1:] >= log_ei[:, :1] + math.log(ratio)
    rate = success_rate(wins, losses)
    return plausible | (rate[:, 1:] > rate[:, :1])


@register_method
class Transfer(DrawMethod):
    r"""Multi-channel transfer for every run at once (module docstring).

    Attributes:
        wins / losses: ``R x 4`` times each arm (own, optima, function, own UCB) was followed
            and improved (did not improve) the run's incumbent.
        peer_wins / peer_losses: ``R x A`` the same per peer, over the optima and function arms.
    """

    name = "transfer"
    uses = (*DrawMethod.weight_fields, "channels", "landscape_scale")
    follows_peers = True
    channel_names: ClassVar[tuple[str, ...]] = CHANNELS

    @classmethod
    def check(cls, settings: Any) -> None:
        super().check(settings)
        channels = getattr(settings, "channels", CHANNELS)
        if not isinstance(channels, (list, tuple)) or not channels or any(c not in CHANNELS for c in channels):
            raise ValueError(f"`channels` must be a non-empty list of {list(CHANNELS)}, got {channels!r}.")
        if len(set(channels)) != len(channels):
            raise ValueError(f"`channels` lists a channel twice: {list(channels)}.")

    @classmethod
    def parameters_per_agent(cls, settings: Any, dim: int) -> int:
        """The draw (sent even without the function channel: ``P_N`` is learned from it), plus the
        incumbent (``d``) and the lengthscales (``d``; one shared: 1) of the other channels."""
        channels = getattr(settings, "channels", CHANNELS)
        ard = get_spec(settings.gp_kernel).ard
        return (
            super().parameters_per_agent(settings, dim)
            + dim * ("optima" in channels)
            + (dim if ard else 1) * ("landscape" in channels)
        )

    def __init__(self, runner: Any) -> None:
        super().__init__(runner)
        R, A = runner.num_runs, runner.objective.num_agents
        dev = runner.device
        self.channels = tuple(runner.settings.channels)
        self.wins = torch.zeros(R, ARMS, dtype=torch.float64, device=dev)
        self.losses = torch.zeros(R, ARMS, dtype=torch.float64, device=dev)
        self.peer_wins = torch.zeros(R, A, dtype=torch.float64, device=dev)
        self.peer_losses = torch.zeros(R, A, dtype=torch.float64, device=dev)
        self._arm = torch.zeros(R, dtype=torch.long, device=dev)
        self._before = torch.zeros(R, dtype=torch.float64, device=dev)
        #: Free-riders' first incumbents and lengthscales, what a ``stale`` rider sends.
        self._first: dict[str, Tensor] = {}

    # ------------------------------------------------------------ what peers share
    def _sent(
        self, values: Tensor, name: str, constant: Callable[[], Tensor], draw: Callable[[Tensor], Tensor]
    ) -> Tensor:
        r"""The senders' ``values`` (a row per sending agent: the runs' own agents together, else the
        peers) as sent (:meth:`~fbo_torch.methods.draws.DrawMethod.as_sent`; ``constant()``: what a
        ``constant`` rider sends, ``draw(keys)``: a ``noise`` rider's draws; both built only with free-riders)."""
        r = self.runner
        if r.free_riders is None:
            return values
        first = self._first.setdefault(name, values)
        keys = kr.fold(kr.fold((r.agents if r.together else r.others).keys, r.t), name)  # r.t: this round
        return self.as_sent(values, first, keys, constant=constant(), noise=draw(keys), round=r.t, name=name)

    def _peer_view(self, values: Tensor | None) -> Tensor | None:
        """``R x A x ...``: every agent's ``values`` (one row per sending agent) as each run sees them."""
        r = self.runner
        if values is None:
            return None
        if r.together:
            return values[r.peer_runs]
        return values.unsqueeze(0).expand(r.num_runs, *values.shape)

    def incumbents(self) -> Tensor:
        """``R x A x d``: the peers' incumbents (the optima channel's message)."""
        r = self.runner
        lo, hi = r.domain.bounds
        X = (r.agents if r.together else r.others).incumbents()
        X = self._sent(X, "incumbent", lambda: (lo + hi) / 2, lambda k: lo + (hi - lo) * kr.uniform(k, X.shape[-1]))
        out = self._peer_view(X)
        assert out is not None
        return out

    def landscape_prior(self) -> tuple[Tensor, Tensor] | None:
        r"""The runs' lengthscale priors from their peers' fitted GPs, ``(loc, scale)``, ``R x k`` each:
        the ``P_N``-weighted mean of the peers' log lengthscales, and the square root of their weighted
        variance plus ``landscape_scale²`` (``None`` before any peer has fitted a GP)."""
        r = self.runner
        assert r.dist is not None
        ll = (r.agents if r.together else r.others).log_lengthscales()
        if ll is None:
            return None
        # a constant rider sends the spec prior's median, a noise rider a draw of that prior
        prior_loc, prior_scale = get_spec(r.settings.gp_kernel).ls_prior(r.domain.bounds[0].numel())
        ll = self._sent(
            ll,
            "lengthscales",
            lambda: torch.full_like(ll[0], prior_loc),
            lambda k: prior_loc + prior_scale * kr.normal(k, ll.shape[-1]),
        )
        ll = self._peer_view(ll)
        assert ll is not None
        w = r.dist.probs.to(ll.dtype).unsqueeze(-1)  # R x A x 1: 0 for the run itself and non-peers
        loc = (w * ll).sum(1)
        var = (w * (ll - loc.unsqueeze(1)).square()).sum(1)
        return loc, (var + r.settings.landscape_scale**2).sqrt()

    # ------------------------------------------------------------------- round
    def step(self, t: int) -> tuple[Tensor, Tensor]:
        r = self.runner
        assert r.features is not None and r.dist is not None  # a draw method's runner has both
        R, dev = r.num_runs, r.device
        rows = torch.arange(R, device=dev)
        assert r.dist is not None
        scores, copies = self.peer_scores()
        if r.settings.agent_weights in LEARNED_WEIGHTS:
            r.dist.reweight(fidelity_weights(scores, r.dist.support, copies))
        helpful = helpful_posterior(scores, r.agents.mask.sum(-1))  # R x A
        if "landscape" in self.channels:
            r.agents.ls_prior = self.landscape_prior()
        X, mask = r.X, r.agents.mask
        X_own, _ = r.agents.own_proposals(t, incumbent="plug-in")
        # Exploiting can return a point the agent has already observed (LogEI over the plug-in
        # incumbent peaks at it): there the agent proposes by LogEI over its best observation instead.
        lo, hi = r.domain.bounds

        def observed_before(Q: Tensor) -> Tensor:
            """``R x K``: whether each run's queries ``Q`` (``R x K x d``) repeat one of its observed inputs."""
            near = ((Q.unsqueeze(-2) - X.unsqueeze(1)).abs() <= REPEAT_TOL * (hi - lo)).all(-1)  # R x K x n
            return (near & mask.unsqueeze(1)).any(-1)

        again = observed_before(X_own.unsqueeze(1)).squeeze(1)
        X_obs, _ = r.agents.own_proposals(t, which=again, refit=False)  # on the GPs just fitted
        X_own = torch.where(again.unsqueeze(-1), X_obs, X_own)
        y = torch.where(mask, r.Y.squeeze(-1), -torch.inf)
        self._before = y.amax(-1)
        probs = r.dist.probs
        available = torch.zeros(R, ARMS, dtype=torch.bool, device=dev)
        available[:, OWN_ARM] = True
        X_opt = X_own
        k_opt = torch.full((R,), OWN, dtype=torch.long, device=dev)
        peers = "optima" in self.channels or "function" in self.channels
        if peers:  # the agents' GPs as their own proposals saw them, built once for both channels
            model = r.agents.current_gp()
            posterior = model.posterior_moments()
            best = r.agents.best_observed(model)
        if "optima" in self.channels:
            C = self.incumbents()  # R x A x d
            mean, var, _, _ = posterior.moments(C)
            plausible = mean + (SCREEN_BETA * var.clamp_min(1e-12)).sqrt() > best.unsqueeze(-1)
            ok = (probs > 0) & ~observed_before(C) & plausible
            log_ei = BatchedLogExpectedImprovement(posterior, r.agents.plug_in_incumbent(model, posterior))(C)
            score = log_ei + probs.clamp_min(1e-300).log() + (self.peer_wins - self.peer_losses)
            score = torch.where(ok, score, -torch.inf)
            k_opt = score.argmax(-1)
            available[:, OPTIMA_ARM] = ok.any(-1)
            X_opt = C[rows, k_opt]
        X_msg = X_own
        k_msg = torch.full((R,), OWN, dtype=torch.long, device=dev)
        if "function" in self.channels:
            k_msg = draw_sources(0.0, r.dist, keys=kr.fold(r.agents.keys, t))  # a peer from P_N
            # a message is worth following only from a peer whose messages rank the agent's data
            available[:, FUNCTION_ARM] = (k_msg >= 0) & (helpful[rows, k_msg.clamp_min(0)] >= 0.5)
            omega = self.omegas[rows, k_msg.clamp_min(0)]
            X_msg, _ = maximize_rff_samples(
                r.features, omega, r.domain, keys=r.agents.round_keys(t, "message-maximize")
            )
            # a message that has not changed (one-shot communication) keeps its maximizer: query it once
            available[:, FUNCTION_ARM] &= ~observed_before(X_msg.unsqueeze(1)).squeeze(1)
        if peers:  # a candidate the agent's own model finds poor is followed only by a channel that has paid
            log_ei = BatchedLogExpectedImprovement(posterior, best)(torch.stack([X_own, X_opt, X_msg], 1))
            available[:, PEER_ARMS] &= channel_gate(log_ei, self.wins[:, :UCB_ARM], self.losses[:, :UCB_ARM])
        if r.may_follow is not None:  # reciprocity: an agent flagged as a free-rider follows no peer
            available[:, PEER_ARMS] &= r.may_follow.unsqueeze(-1)
        # Thompson sampling on each arm's probability of improving the incumbent (normal approximation)
        mean = success_rate(self.wins, self.losses)
        draw = mean + (mean * (1 - mean) / (self.wins + self.losses + 3)).sqrt() * kr.normal(
            r.agents.round_keys(t, "channel"), ARMS
        )
        X_ucb = X_own
        if r.settings.own_acquisition != "ucb":
            # the exploring proposal is needed only where its draw beats every other available arm's
            # (off the GPU path only those rows are maximized; the others' rows are NaN and unused)
            need = draw[:, UCB_ARM] > torch.where(available[:, :UCB_ARM], draw[:, :UCB_ARM], -torch.inf).amax(-1)
            X_ucb, _ = r.agents.own_proposals(t, which=need, refit=False, acquisition="ucb")
            available[:, UCB_ARM] = need & ~observed_before(X_ucb.unsqueeze(1)).squeeze(1)
        arm = torch.where(available, draw, -torch.inf).argmax(-1)
        self._arm = arm
        X_next = torch.where((arm == OPTIMA_ARM).unsqueeze(-1), X_opt, X_own)
        X_next = torch.where((arm == FUNCTION_ARM).unsqueeze(-1), X_msg, X_next)
        X_next = torch.where((arm == UCB_ARM).unsqueeze(-1), X_ucb, X_next)
        sources = torch.where(arm == OPTIMA_ARM, k_opt, torch.where(arm == FUNCTION_ARM, k_msg, OWN))
        return X_next, sources

    def observed(self, t: int, y: Tensor, ok: Tensor, sources: Tensor) -> None:
        win = (ok & (y > self._before)).to(self.wins.dtype)
        arm = torch.nn.functional.one_hot(self._arm, ARMS).to(self.wins.dtype)
        self.wins += arm * win.unsqueeze(-1)
        self.losses += arm * (1 - win).unsqueeze(-1)
        followed = (sources >= 0).to(self.wins.dtype)
        peer = torch.nn.functional.one_hot(sources.clamp_min(0), self.peer_wins.shape[-1]).to(self.wins.dtype)
        self.peer_wins += peer * (followed * win).unsqueeze(-1)
        self.peer_losses += peer * (followed * (1 - win)).unsqueeze(-1)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "wins": self.wins,
            "losses": self.losses,
            "peer_wins": self.peer_wins,
            "peer_losses": self.peer_losses,
            "first_sent": dict(self._first),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        dev = self.runner.device
        for name in ("wins", "losses", "peer_wins", "peer_losses"):
            setattr(self, name, state[name].to(dev))
        if self.wins.shape[-1] < ARMS:  # a checkpoint from before the exploring arm: it has not been followed
            pad = (0, ARMS - self.wins.shape[-1])
            self.wins = torch.nn.functional.pad(self.wins, pad)
            self.losses = torch.nn.functional.pad(self.losses, pad)
        self._first = {k: v.to(dev) for k, v in state.get("first_sent", {}).items()}


__all__ = ["ARMS", "CHANNELS", "Transfer", "channel_gate", "success_rate"]
