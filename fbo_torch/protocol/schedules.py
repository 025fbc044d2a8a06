r"""The two choices an FTS agent makes every iteration (FTS Algorithm 1, lines 2-6).

* ``p_t``: with probability ``p_t`` the agent maximizes a sample of its own GP,
  otherwise it uses another agent's message. :class:`PtSchedule` gives the
  papers' sequences (``1 - 1/√t``, ``1 - 1/t²``, ``1 - 1/t``), a constant, or any
  callable.
* ``P_N``: which agent's message to use. :class:`AgentDistribution` holds the
  probabilities for a batch of independent runs, supports stragglers (missing
  messages get probability 0) and the paper's one-shot communication (a used
  message is removed and ``P_N`` renormalized), and learned weights
  (:meth:`AgentDistribution.reweight`, from :mod:`fbo_torch.protocol.fidelity`).

:func:`draw_sources` combines both into one vectorized draw; the simulator, a
deployed agent and :class:`~fbo_torch.acquisition.FederatedThompsonSampling`
all make the choice through it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fbo_torch.sampling.draws import uniform
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.validation import check_int, check_probability, check_tensor

#: Source code meaning "the agent's own GP sample" in :func:`draw_sources` (a run's ``sources``: it followed its own
#: proposal).
OWN = -1
#: Source code of a round in which a DP-FTS-DE agent followed the server's broadcast (the accounting's records).
BROADCAST = -2

_NAMED: dict[str, Callable[[int], float]] = {
    "1-1/sqrt(t)": lambda t: 1.0 - 1.0 / math.sqrt(t),
    "1-1/t^2": lambda t: 1.0 - 1.0 / t**2,
    "1-1/t": lambda t: 1.0 - 1.0 / t,
}
_ALIASES = {
    "sqrt": "1-1/sqrt(t)",
    "1-1/t**2": "1-1/t^2",
    "square": "1-1/t^2",
    "inverse": "1-1/t",
}


class PtSchedule:
    r"""A sequence ``p_t`` (``t = 1, 2, ...``) of probabilities of using the own GP.

    Args:
        spec: One of ``"1-1/sqrt(t)"``, ``"1-1/t^2"``, ``"1-1/t"`` (the papers'
            sequences), a float in ``[0, 1]`` (constant), or a callable
            ``t -> p_t``.
        p1_equals_p2: For the named sequences, set ``p_1 = p_2`` as in the FTS
            paper (otherwise ``p_1 = 0``: the first iteration always uses the
            other agents, as DP-FTS-DE's "``1 - p_t = 1/√t`` for all t" reads).

    Example:
        >>> PtSchedule("1-1/sqrt(t)")(1)   # = p_2 = 1 - 1/√2
        0.2928932188134524
    """

    def __init__(self, spec: str | float | Callable[[int], float], p1_equals_p2: bool = True) -> None:
        self.p1_equals_p2 = bool(p1_equals_p2)
        if isinstance(spec, str):
            key = spec.replace(" ", "")
            key = _ALIASES.get(key, key)
            if key not in _NAMED:
                raise ValueError(
                    f"Unknown `p_t` schedule {spec!r}; expected one of {sorted(_NAMED)}, a number "
                    "in [0, 1], or a callable t -> p_t."
                )
            self.name = key
            self._fn = _NAMED[key]
        elif callable(spec):
            self.name = getattr(spec, "__name__", "callable")
            self._fn = spec
            self.p1_equals_p2 = False
        else:
            p = check_probability("p_t", spec)
            self.name = f"constant({p:g})"
            self._fn = lambda t: p
            self.p1_equals_p2 = False

    def __call__(self, t: int) -> float:
        t = check_int("t", t, minimum=1)
        if t == 1 and self.p1_equals_p2:
            t = 2
        p = float(self._fn(t))
        return check_probability(f"p_t at t={t}", p)

    def __repr__(self) -> str:
        return f"PtSchedule({self.name!r}, p1_equals_p2={self.p1_equals_p2})"


class AgentDistribution:
    r"""``P_N`` over ``N`` agents for a batch of independent runs.

    Args:
        num_agents: ``N``.
        probs: Optional ``batch_shape x N`` (or ``N``) non-negative preferences
            summing to 1 along the last dimension; uniform by default.
        batch_shape: Batch shape when ``probs`` is not given.
        device: Device of the internal tensors.

    The distribution actually sampled is ``probs`` restricted to the agents
    still *available* (not missing, not used up in one-shot mode),
    renormalized. A run with no available agent has ``is_empty`` true.
    The agents with positive ``probs`` at construction are the *support*:
    :meth:`reweight` (learned ``P_N``) redistributes probability among them only.
    """

    def __init__(
        self,
        num_agents: int,
        probs: Tensor | None = None,
        batch_shape: torch.Size = torch.Size(),
        device: torch.device | str | None = None,
    ) -> None:
        N = check_int("num_agents", num_agents, minimum=1)
        if probs is None:
            probs = torch.full((*batch_shape, N), 1.0 / N, dtype=torch.float64, device=device)
        else:
            check_tensor("agent_probs", probs)
            probs = probs.to(dtype=torch.float64, device=device)
            if probs.shape[-1] != N:
                raise ValueError(
                    f"`agent_probs` must have {N} entries in its last dimension, got {tuple(probs.shape)}."
                )
            if not torch.isfinite(probs).all() or (probs < 0).any():
                raise ValueError("`agent_probs` must be finite and non-negative.")
            sums = probs.sum(-1)
            if not torch.allclose(sums, torch.ones_like(sums), atol=1e-6):
                raise ValueError(f"`agent_probs` must sum to 1 over agents, got sums {sums.flatten()[:5].tolist()}.")
        self.num_agents = N
        self.base = probs
        self.support = probs > 0
        self.available = probs > 0

    @property
    def batch_shape(self) -> torch.Size:
        return self.base.shape[:-1]

    @property
    def probs(self) -> Tensor:
        """Renormalized probabilities over available agents (zeros for empty runs)."""
        w = torch.where(self.available, self.base, torch.zeros_like(self.base))
        total = w.sum(-1, keepdim=True)
        return torch.where(total > 0, w / total.clamp_min(1e-300), torch.zeros_like(w))

    @property
    def is_empty(self) -> Tensor:
        """``batch_shape`` booleans: no agent left to sample."""
        return ~(self.available & (self.base > 0)).any(-1)

    def reweight(self, weights: Tensor) -> AgentDistribution:
        r"""Replace the preferences by ``weights`` (``batch_shape x N``, non-negative), kept on the support.

        Used by learned ``P_N`` (:func:`~fbo_torch.protocol.fidelity.fidelity_weights`):
        agents outside the support (e.g. the target itself, another group) stay at
        probability 0, and missing or used agents stay unavailable.
        """
        w = torch.as_tensor(weights, dtype=torch.float64, device=self.base.device).expand_as(self.base)
        w = torch.where(self.support, w.clamp_min(0), torch.zeros_like(w))
        total = w.sum(-1, keepdim=True)
        # a row whose weights all vanish keeps its previous preferences
        self.base = torch.where(total > 0, w / total.clamp_min(1e-300), self.base)
        return self

    def mark_missing(self, agents: Tensor | list[int]) -> AgentDistribution:
        r"""Stragglers: give ``agents`` probability 0 (``agents`` may be an index
        list for every run, or a ``batch_shape x N`` boolean mask)."""
        mask = self._as_mask(agents)
        self.available = self.available & ~mask
        return self

    def remove(self, agents: Tensor) -> AgentDistribution:
        r"""One-shot communication: remove the used message of each run.

        Args:
            agents: ``batch_shape`` agent indices, one per run; entries equal to
                :data:`OWN` (``-1``) leave that run unchanged.

        Returns:
            The distribution itself, without the used messages (changed in place).
        """
        agents = torch.as_tensor(agents, device=self.base.device).reshape(self.batch_shape)
        valid = agents >= 0
        idx = agents.clamp_min(0).unsqueeze(-1)
        used = torch.zeros_like(self.available).scatter(-1, idx, valid.unsqueeze(-1))
        self.available = self.available & ~used
        return self

    def sample(self, generator: torch.Generator | None = None, keys: Tensor | None = None) -> Tensor:
        r"""Draw one agent per run (``batch_shape`` long tensor; ``-1`` for empty runs).

        With ``keys`` (``batch_shape`` int64, see :mod:`fbo_torch.utils.keyed_random`)
        each run draws from its own stream (Gumbel-max on the log-probabilities),
        with no host synchronization; otherwise ``torch.multinomial`` with ``generator``.
        """
        if keys is not None:
            p = self.probs
            g = kr.gumbel(kr.fold(keys.to(p.device), "P_N"), self.num_agents, dtype=p.dtype)
            logits = torch.where(p > 0, torch.log(p.clamp_min(1e-300)) + g, -torch.inf)
            draw = logits.argmax(-1)
            return torch.where((p > 0).any(-1), draw, torch.full_like(draw, OWN))
        p = self.probs.reshape(-1, self.num_agents)
        empty = p.sum(-1) <= 0
        safe = torch.where(empty.unsqueeze(-1), torch.ones_like(p), p)
        if generator is not None and generator.device != safe.device:
            draw = torch.multinomial(safe.to(generator.device), 1, generator=generator).to(safe.device)
        else:
            draw = torch.multinomial(safe, 1, generator=generator)
        draw = torch.where(empty.unsqueeze(-1), torch.full_like(draw, OWN), draw)
        return draw.reshape(self.batch_shape)

    def _as_mask(self, agents: Any) -> Tensor:
        if isinstance(agents, Tensor) and agents.dtype == torch.bool:
            return agents.to(self.base.device).expand_as(self.available)
        idx = torch.as_tensor(agents, dtype=torch.long, device=self.base.device).reshape(-1)
        if ((idx < 0) | (idx >= self.num_agents)).any():
            raise ValueError(f"agent indices must lie in [0, {self.num_agents}), got {idx.tolist()}.")
        mask = torch.zeros(self.num_agents, dtype=torch.bool, device=self.base.device)
        mask[idx] = True
        return mask.expand_as(self.available)

    def state_dict(self) -> dict[str, Tensor]:
        return {"base": self.base.clone(), "available": self.available.clone(), "support": self.support.clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.base = state["base"].to(self.base.device)
        self.available = state["available"].to(self.base.device)
        self.support = state.get("support", self.base > 0).to(self.base.device)


def draw_sources(
    p_t: float | Tensor,
    distribution: AgentDistribution | None,
    generator: torch.Generator | None = None,
    keys: Tensor | None = None,
) -> Tensor:
    r"""FTS Algorithm 1, lines 2-6, for every run of a batch at once: the one place the choice is made.

    Draws ``u ~ U(0, 1)``; if ``u < p_t`` the source is the agent's own GP
    sample (:data:`OWN`), else an agent ``n ~ P_N``. Runs whose ``P_N`` is empty
    (all messages used or missing) fall back to their own GP. With
    ``distribution=None`` there is one received function (DP-FTS-DE's
    broadcast), source ``0``.

    Args:
        p_t: Probability of using the own GP (float, or ``batch_shape`` tensor).
        distribution: ``P_N`` for the batch, or ``None`` for a single received function.
        generator: Optional generator (``u`` first, then the agent); used when ``keys`` is ``None``.
        keys: Optional ``batch_shape`` int64 keys, e.g. ``fold(agent_keys, round)``
            (:mod:`fbo_torch.utils.keyed_random`): ``u`` comes from ``fold(keys, "p_t")``
            and the agent from ``fold(keys, "P_N")``, with no host synchronization.

    Returns:
        ``batch_shape`` long tensor of sources (``-1`` = own, else agent index).
    """
    if keys is not None:
        device = keys.device
        batch_shape = keys.shape
    elif distribution is not None:
        device, batch_shape = distribution.base.device, distribution.batch_shape
    else:
        raise ValueError("`draw_sources` needs `keys` or a `distribution` to know the batch shape.")
    if not isinstance(p_t, Tensor):
        p_t = check_probability("p_t", p_t)
    elif ((p_t < 0) | (p_t > 1)).any() or not torch.isfinite(p_t).all():
        raise ValueError("`p_t` must lie in [0, 1].")
    else:
        p_t = p_t.to(device)
    if keys is not None:
        u = kr.uniform(kr.fold(keys, "p_t"), 1, dtype=torch.float64).squeeze(-1)
    else:
        u = uniform(batch_shape, torch.empty((), dtype=torch.float64, device=device), generator)
    if distribution is None:
        agents = torch.zeros(batch_shape, dtype=torch.long, device=device)
    elif keys is not None:
        agents = distribution.sample(keys=kr.fold(keys, "P_N"))
    else:
        agents = distribution.sample(generator)
    return torch.where(u < p_t, torch.full_like(agents, OWN), agents)
