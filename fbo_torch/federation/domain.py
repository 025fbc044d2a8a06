r"""Where a federation's agents search, and the batched maximizers they search with.

* :class:`Domain` — a box, optionally a finite candidate set (the papers' 1-D
  grid), with one batched maximizer for many agents.
* :func:`maximize_rff_samples` / :func:`maximize_broadcast` — maximize
  ``φ(x)ᵀω`` functions (messages, DP-FTS-DE broadcasts) for many problems at once.
* :func:`broadcast_queries` — where agents that follow a broadcast query.

Every maximizer takes ``keys`` (one int64 key per problem, see
:mod:`fbo_torch.utils.keyed_random`): a problem's result then depends only on
its key and its function, so a simulator batching many agents and a single
agent on its own device compute the same point.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.sampling.rff_paths import RFFSamplePaths
from fbo_torch.optim.batched import default_max_points, maximize_batched, maximize_discrete
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.validation import check_bounds


@dataclass
class Domain:
    r"""The search domain of a federation.

    Args:
        bounds: ``2 x d`` box.
        candidates: Optional ``C x d`` finite domain; maximization over it is exact.
        raw_samples, num_restarts, refine, maxiter, lr: Settings of
            :func:`~fbo_torch.optim.maximize_batched` for the agents' own GP
            samples on continuous domains.
        raw_samples_rff, num_restarts_rff, maxiter_rff: The same for the cheap
            ``φ(x)ᵀω`` functions (messages, server broadcasts), which are
            ``M``-feature dot products and afford a denser search.
        max_points: Memory cap on points per batched evaluation (``None``: by device).
        screen_dtype: Precision of the raw-point screening (``maximize_batched``'s
            ``screen_dtype``; ``None``: the bounds' dtype). float32 by default: the
            ranking feeds a randomized restart selection and everything after it runs
            in float64 (``benchmarks/maximizer_quality.py`` compares both).

    The defaults were chosen with ``benchmarks/maximizer_quality.py`` (mean and
    worst gap to a dense search over 64 sampled functions in 2-D and 5-D against
    per-agent ``optimize_acqf``; README has the table: as good or better on
    five families, tied on 5-D ``φᵀω`` at ℓ = 0.03). For ``φ(x)ᵀω`` at a short
    lengthscale (0.03 in 2-D) the restarts decide: 2048 raw points / 16
    restarts left a mean gap of 2.6e-3 (worst 0.12) against ``optimize_acqf``'s
    7.2e-4 (0.035) on the same budget; 4096 / 32 give 5.1e-4 (0.033) at
    twice the (small) cost, while more refinement iterations changed nothing.
    Likewise for GP Thompson samples in 5-D: 8 restarts left a mean gap of
    1.2e-2 (worst 0.41), 16 give 5.0e-3 (0.21) for 35% more time on a CPU, and
    doubling the iterations instead changed nothing (these gaps are from before
    the lengthscale-scaled line search of ``maximize_batched``, which took 5-D GP
    samples to 1.3e-5 against ``optimize_acqf``'s 4.0e-4).

    The iteration caps (25 for own samples, 30 for ``φ(x)ᵀω``; were 30 and 40) are what a
    GPU pays for in full (no early exit inside a CUDA graph; a CPU stops once all restarts
    have converged). Measured against the old caps on 15 held-out families (64 functions ×
    3 seeds each, d = 2, 3, 5; ``φᵀω`` at ℓ = 0.1, 0.03, 0.01 · √d and GP samples on 5d and
    20d points): no loss in d ≤ 3 beyond 2.4e-9 (GP samples) and 5e-14 (``φᵀω``); in 5-D one
    function of 192 per ``φᵀω`` family ends lower, by at most 7.9e-5, GP samples by at most
    1.4e-10 — for 17% and 25% fewer iterations.
    """

    bounds: Tensor
    candidates: Tensor | None = None
    raw_samples: int = 1024
    num_restarts: int = 16
    refine: str | None = "qn"
    maxiter: int = 25
    lr: float = 0.02
    max_points: int | None = None
    raw_samples_rff: int = 4096
    num_restarts_rff: int = 32
    maxiter_rff: int = 30
    screen_dtype: torch.dtype | None = torch.float32

    def __post_init__(self) -> None:
        check_bounds("bounds", self.bounds)

    @property
    def dim(self) -> int:
        return self.bounds.shape[-1]

    @property
    def is_discrete(self) -> bool:
        return self.candidates is not None

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float64) -> Domain:
        cands = None if self.candidates is None else self.candidates.to(device=device, dtype=dtype)
        return dataclasses.replace(self, bounds=self.bounds.to(device=device, dtype=dtype), candidates=cands)

    def random(self, batch: int, n: int, generator: torch.Generator | None = None, keys: Tensor | None = None) -> Tensor:
        r"""``batch x n x d`` uniform random points of the domain (from ``keys``: one stream per row)."""
        dev = self.bounds.device
        if self.candidates is not None:
            C = self.candidates.shape[0]
            if keys is not None:
                idx = (kr.uniform(keys.to(dev), n) * C).long().clamp_max(C - 1)
            elif generator is None:
                idx = torch.randint(C, (batch, n), device=dev)
            else:
                idx = torch.randint(C, (batch, n), generator=generator, device=generator.device).to(dev)
            return self.candidates[idx]
        shape = (batch, n, self.dim)
        if keys is not None:
            u = kr.uniform(keys.to(dev), n * self.dim, dtype=self.bounds.dtype).view(shape)
        elif generator is None:
            u = torch.rand(shape, dtype=self.bounds.dtype, device=dev)
        else:
            u = torch.rand(shape, dtype=self.bounds.dtype, device=generator.device, generator=generator).to(dev)
        return self.bounds[0] + u * (self.bounds[1] - self.bounds[0])

    def maximize(
        self,
        fn,
        batch: int,
        generator: torch.Generator | None = None,
        region_bounds: Tensor | None = None,
        raw_samples: int | None = None,
        maxiter: int | None = None,
        keys: Tensor | None = None,
        num_restarts: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        r"""Maximize ``batch`` functions ``fn: batch x C x d -> batch x C``.

        On a finite domain the maximization is exact. On a box it is
        multi-start with gradient refinement; ``region_bounds`` (``batch x 2 x d``)
        restricts each problem to its own box. ``keys`` (``batch`` int64) make
        each problem's randomness its own (else drawn from ``generator``).
        """
        if self.candidates is not None:
            if region_bounds is None:
                return maximize_discrete(fn, self.candidates, batch, self.max_points or default_max_points(self.bounds.device))
            inside = ((self.candidates.unsqueeze(0) >= region_bounds[:, 0:1]) & (
                self.candidates.unsqueeze(0) <= region_bounds[:, 1:2])).all(-1)  # batch x C

            def masked(X: Tensor) -> Tensor:  # called once on all candidates (no chunking below)
                return torch.where(inside, fn(X), -torch.inf)

            return maximize_discrete(masked, self.candidates, batch, max_points=batch * self.candidates.shape[0])
        bounds = self.bounds if region_bounds is None else region_bounds
        return maximize_batched(
            fn, bounds, batch_size=batch, raw_samples=raw_samples or self.raw_samples,
            num_restarts=num_restarts or self.num_restarts, refine=self.refine, maxiter=maxiter or self.maxiter,
            lr=self.lr, max_points=self.max_points, generator=generator, keys=keys, validate=False,
            screen_dtype=self.screen_dtype,
        )


def maximize_rff_samples(
    features: RandomFourierFeatures,
    omegas: Tensor,
    domain: Domain,
    generator: torch.Generator | None = None,
    keys: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Maximize ``x ↦ φ(x)ᵀω_b`` for ``B`` weight vectors ``omegas`` (``B x M``) at once."""
    return domain.maximize(
        RFFSamplePaths(features, omegas), omegas.shape[0], generator=generator, keys=keys,
        raw_samples=domain.raw_samples_rff, maxiter=domain.maxiter_rff, num_restarts=domain.num_restarts_rff,
    )


def maximize_broadcast(
    features: RandomFourierFeatures,
    broadcast: Tensor,
    region_bounds: Tensor,
    domain: Domain,
    generator: torch.Generator | None = None,
    keys: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Maximize the DP-FTS-DE agent function ``x ↦ φ(x)ᵀω^(i[x])`` for ``R`` problems.

    One bounded maximization of ``φᵀω^(i)`` over sub-region ``i`` per region
    and problem (all ``R·P`` at once), best region kept. In the simulator a
    problem is a repetition (the broadcast is the same for all its agents, so
    it is maximized once, with the repetition's key); a deployed agent, or the
    authors' per-agent randomized maximization, passes its own key.

    Args:
        features: The shared map.
        broadcast: ``R x P x M`` server output.
        region_bounds: ``P x 2 x d`` sub-region boxes.
        domain: The search domain.
        keys: Optional ``R`` int64 keys (region ``i`` of problem ``r`` uses ``fold(keys[r], i)``).

    Returns:
        ``(X, values)``: ``R x d`` maximizers and ``R`` values.
    """
    R, P, M = broadcast.shape
    paths = RFFSamplePaths(features, broadcast.reshape(R * P, M))
    rb = region_bounds.to(domain.bounds).repeat(R, 1, 1) if P > 1 else None
    sub_keys = None
    if keys is not None:
        sub_keys = kr.fold(keys.unsqueeze(-1), torch.arange(P, device=keys.device)).reshape(R * P)
    X, vals = domain.maximize(
        paths, R * P, generator=generator, region_bounds=rb, raw_samples=domain.raw_samples_rff,
        maxiter=domain.maxiter_rff, num_restarts=domain.num_restarts_rff, keys=sub_keys,
    )
    best_vals, best = vals.view(R, P).max(-1)
    return X.view(R, P, -1).gather(1, best.view(R, 1, 1).expand(R, 1, X.shape[-1])).squeeze(1), best_vals


def broadcast_queries(
    features: RandomFourierFeatures,
    broadcast: Tensor,
    region_bounds: Tensor,
    domain: Domain,
    round: int,
    keys: Tensor,
) -> Tensor:
    r"""Where agents that follow a DP-FTS-DE broadcast query in round ``round``: ``R x d``.

    ``keys`` are the keys of whoever maximizes: the federations' keys (the
    broadcast is the same for all agents of a federation, so one maximization
    serves them all — a deployed agent that uses its federation's key gets the
    same point), or each agent's own key with ``broadcast`` repeated per agent
    (the authors' per-agent randomized maximization).
    """
    X, _ = maximize_broadcast(features, broadcast, region_bounds, domain,
                              keys=kr.fold(kr.fold(keys, round), "broadcast-maximize"))
    return X
