r"""Synthetic federations of GP-sampled functions (FTS App. D.1, DP-FTS-DE App. C.2.1).

A *group* is one federation: a function ``f`` sampled from a GP with an SE
kernel and normalized to ``[0, 1]``, and agents whose functions are perturbed
copies ``g_n = f ± d_n`` (FTS: agent 0 of each group is the target and keeps
``f`` itself; DP-FTS-DE: every agent is perturbed). Several groups (different
sampled ``f``) live in one objective so that independent repetitions run as one
batch; ``group_of_agent`` and ``targets`` describe the layout.

* :class:`GPSampleGridFederation` — the papers' setting: a 1-D grid of
  ``|X| = 1000`` points in ``[0, 1]``; ``g_n(x) = f(x) + s_n(x) d_n`` with an
  independent fair coin ``s_n(x) ∈ {-1, +1}`` per input, so
  ``max_x |f - g_n| = d_n`` exactly.
* :class:`GPSampleContinuousFederation` — a continuous ``[0, 1]^D`` version
  (D = 2, 5, ...), so that the continuous maximization path is exercised:
  ``f`` is a GP sample represented with many random Fourier features (a
  different, private map; not the one agents share), and
  ``g_n = f + d_n h_n`` with ``h_n`` a smooth random function scaled to
  ``max |h_n| ≈ 1``.

Observations add ``N(0, σ²)`` noise (``σ² = 0.01`` in the papers).

Unhelpful peers (for studies of which peers an agent should follow): with
``useless_fraction`` and ``adversarial_fraction``, some agents of every group
start from another function before their perturbation is added:

* *useless*: an independent GP sample ``u_n``, drawn and normalized to
  ``[0, 1]`` exactly as ``f`` is (unrelated to ``f``), so ``g_n = u_n ± d_n``;
* *adversarial*: ``1 - f`` (``-f`` rescaled into ``f``'s range ``[0, 1]``), so
  ``g_n = 1 - f ± d_n`` peaks where ``f`` is lowest.

Each group has ``round(fraction x pool)`` agents of each kind (rounded half up;
adversarial ones capped by what the useless ones leave), where the pool is the
group's agents other than its target (``agents_per_group - 1``) in FTS mode
(``perturb_first=False``: the target keeps ``f``), and all ``agents_per_group``
agents in DP-FTS-DE mode (``perturb_first=True``: no agent is special, so agent
0 may be useless or adversarial too). Which agents: a seeded random ranking of
each group's pool (different per group); the first ``n_useless`` of the ranking
are useless and the last ``n_adversarial`` adversarial, so raising a fraction only
adds agents to its kind. ``kind_of_agent`` holds each agent's kind (an index
into :data:`AGENT_KINDS`). All of it is drawn from generators of its own, so the
helpful agents' functions, the coin flips and the noise do not depend on the
fractions (at ``0.0``, the default, every value is as without them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.objectives.base import Objective, size_argument
from fbo_torch.optim.batched import DEFAULT_MAX_POINTS, maximize_batched
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.validation import check_int, check_positive, check_probability

#: Names of the agent kinds; ``kind_of_agent`` holds indices into it.
AGENT_KINDS = ("helpful", "useless", "adversarial")
HELPFUL, USELESS, ADVERSARIAL = range(3)


def _agents_key(num_groups: float, agents_per_group: float) -> str:
    """The argument to blame for memory that grows with the number of agents ``G x P``."""
    return "num_groups" if num_groups >= agents_per_group else "agents_per_group"


class _GroupedSynthetic(Objective):
    """Shared layout and noise handling of the synthetic federations."""

    def _setup_groups(
        self,
        num_groups: int,
        agents_per_group: int,
        perturbation: float | Tensor,
        perturb_first: bool,
        noise_variance: float,
        seed: int,
        useless_fraction: float = 0.0,
        adversarial_fraction: float = 0.0,
    ) -> Tensor:
        self.num_groups = check_int("num_groups", num_groups, minimum=1)
        self.agents_per_group = check_int("agents_per_group", agents_per_group, minimum=1)
        self.num_agents = self.num_groups * self.agents_per_group
        check_positive("noise_variance", noise_variance, allow_zero=True)
        self.noise_variance = float(noise_variance)
        self.seed = int(seed)
        d = torch.as_tensor(perturbation, dtype=torch.float64).reshape(-1)
        if d.numel() == 1:
            d = d.expand(self.agents_per_group).clone()
        if d.numel() != self.agents_per_group:
            raise ValueError(
                f"`perturbation` must be a number or {self.agents_per_group} values (one per agent of a group), "
                f"got {d.numel()}."
            )
        if (d < 0).any() or not torch.isfinite(d).all():
            raise ValueError("`perturbation` values d_n must be finite and >= 0.")
        if not perturb_first:
            d = d.clone()
            d[0] = 0.0
        self.perturbation = d.repeat(self.num_groups)  # A
        self.group_of_agent = torch.arange(self.num_groups).repeat_interleave(self.agents_per_group)
        self.targets = torch.arange(self.num_groups) * self.agents_per_group
        self.noise_generator = torch.Generator().manual_seed(self.seed + 1)
        self.kind_of_agent = self._draw_kinds(useless_fraction, adversarial_fraction, perturb_first)
        return self.perturbation

    def _draw_kinds(self, useless_fraction: float, adversarial_fraction: float, perturb_first: bool) -> Tensor:
        r"""``A`` kinds (indices into :data:`AGENT_KINDS`), the same counts in every group."""
        fu = check_probability("useless_fraction", useless_fraction)
        fa = check_probability("adversarial_fraction", adversarial_fraction)
        if fu + fa > 1.0:
            raise ValueError(
                f"`useless_fraction` + `adversarial_fraction` must be <= 1, got {useless_fraction} + "
                f"{adversarial_fraction}."
            )
        start = 0 if perturb_first else 1  # FTS: the target (agent 0 of a group) stays helpful
        pool = self.agents_per_group - start
        n_u = int(math.floor(fu * pool + 0.5))
        n_a = min(int(math.floor(fa * pool + 0.5)), pool - n_u)
        by_rank = torch.full((pool,), HELPFUL, dtype=torch.long)
        by_rank[:n_u] = USELESS
        by_rank[pool - n_a :] = ADVERSARIAL
        gen = torch.Generator().manual_seed(self.seed + 404)
        order = torch.rand(self.num_groups, pool, generator=gen, dtype=torch.float64).argsort(-1)  # G x pool
        kinds = torch.full((self.num_groups, self.agents_per_group), HELPFUL, dtype=torch.long)
        kinds[:, start:] = torch.empty_like(order).scatter_(1, order, by_rank.expand_as(order))
        return kinds.reshape(-1)

    def agents_of_kind(self, kind: str) -> Tensor:
        """Indices of the agents of ``kind`` (one of :data:`AGENT_KINDS`)."""
        if kind not in AGENT_KINDS:
            raise ValueError(f"`kind` must be one of {AGENT_KINDS}, got {kind!r}.")
        return (self.kind_of_agent == AGENT_KINDS.index(kind)).nonzero().reshape(-1)

    def members(self, group: int) -> Tensor:
        """Agent indices of ``group``."""
        return torch.arange(self.agents_per_group) + group * self.agents_per_group


class GPSampleGridFederation(_GroupedSynthetic):
    r"""GP-sampled functions on a 1-D grid and their perturbed copies.

    Args:
        num_groups: Independent sampled functions ``f`` (e.g. 5).
        agents_per_group: Agents per group, including the target (FTS: N + 1 = 51;
            DP-FTS-DE: N = 200).
        perturbation: ``d_n``, a number or one value per agent of a group.
        perturb_first: Whether agent 0 of a group is perturbed too (False: it is
            the FTS target and keeps ``f``; True: DP-FTS-DE, every agent perturbed).
        grid_size: ``|X|``, grid points in ``[0, 1]`` (1000 in the papers).
        lengthscale: SE lengthscale of the GP ``f`` is drawn from (0.03).
        noise_variance: Observation noise ``σ²`` (0.01).
        seed: Seed for the functions, coin flips and observation noise.
        useless_fraction: Fraction of each group's non-target agents (all agents
            with ``perturb_first``) whose function is an independent GP sample
            (see the module docstring).
        adversarial_fraction: Fraction of them whose function is ``1 - f``.
    """

    #: The ``grid_size x 1`` grid, the finite domain.
    candidates: Tensor

    def __init__(
        self,
        num_groups: int = 1,
        agents_per_group: int = 51,
        perturbation: float | Tensor = 0.02,
        perturb_first: bool = False,
        grid_size: int = 1000,
        lengthscale: float = 0.03,
        noise_variance: float = 0.01,
        seed: int = 0,
        useless_fraction: float = 0.0,
        adversarial_fraction: float = 0.0,
    ) -> None:
        check_int("grid_size", grid_size, minimum=2)
        check_positive("lengthscale", lengthscale)
        d = self._setup_groups(
            num_groups,
            agents_per_group,
            perturbation,
            perturb_first,
            noise_variance,
            seed,
            useless_fraction,
            adversarial_fraction,
        )
        gen = torch.Generator().manual_seed(self.seed)
        grid = torch.linspace(0.0, 1.0, grid_size, dtype=torch.float64)
        K = torch.exp(-0.5 * ((grid.unsqueeze(-1) - grid.unsqueeze(-2)) / lengthscale) ** 2)
        K.diagonal().add_(1e-8)  # the SE matrix on a fine grid is numerically singular
        L = psd_safe_cholesky(K, max_tries=6)

        def draw(n: int, generator: torch.Generator) -> Tensor:  # n x C, normalized to [0, 1]
            f = (L @ torch.randn(grid_size, n, generator=generator, dtype=torch.float64)).T
            return (f - f.amin(-1, keepdim=True)) / (f.amax(-1, keepdim=True) - f.amin(-1, keepdim=True))

        f = draw(self.num_groups, gen)  # G x C
        signs = torch.randint(0, 2, (self.num_agents, grid_size), generator=gen).to(torch.float64) * 2 - 1
        self.functions = f
        base = f[self.group_of_agent]  # A x C
        kind = self.kind_of_agent.unsqueeze(-1)
        if (kind == USELESS).any():  # agent n's own sample is row n of one draw, whatever the fractions
            own = draw(self.num_agents, torch.Generator().manual_seed(self.seed + 505))
            base = torch.where(kind == USELESS, own, base)
        base = torch.where(kind == ADVERSARIAL, 1.0 - base, base)
        self.values = base + signs * d.unsqueeze(-1)  # A x C
        self.candidates = grid.unsqueeze(-1)
        self.bounds = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
        self.optimum = self.values.amax(-1)
        self.lengthscale = float(lengthscale)

    @classmethod
    def memory_estimate(cls, **kwargs: Any) -> dict[str, float]:
        r"""The grid's kernel matrix and its Cholesky factor (``2 C²`` float64) and the agents' values and signs
        (``A x C``, a few copies), by ``grid_size`` and by the larger of ``num_groups`` and ``agents_per_group``."""
        C = size_argument(cls, kwargs, "grid_size")
        G, P = size_argument(cls, kwargs, "num_groups"), size_argument(cls, kwargs, "agents_per_group")
        return {"grid_size": 8.0 * 3 * C * C, _agents_key(G, P): 8.0 * 5 * G * P * C}

    def grid_index(self, X: Tensor) -> Tensor:
        """Nearest grid index of each point (``... x 1`` → ``...``)."""
        C = self.candidates.shape[0]
        return torch.round(X[..., 0].detach() * (C - 1)).long().clamp(0, C - 1)

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        idx = self.grid_index(X)  # k x q
        vals = self._on(X.device, "values")[agents.to(X.device).unsqueeze(-1), idx].to(X.dtype)
        return self._add_noise(vals, noise)


class GPSampleContinuousFederation(_GroupedSynthetic):
    r"""GP-sampled functions on ``[0, 1]^D`` and smooth perturbed copies.

    ``f`` of each group is a draw from a GP with an SE kernel (lengthscale
    ``lengthscale``), represented by ``num_basis`` random Fourier features; it
    is normalized to ``[0, 1]`` with its range estimated by a dense batched
    search. Agent ``n`` has ``g_n = f + d_n h_n`` where ``h_n`` is an independent
    smooth draw (lengthscale ``perturbation_lengthscale``) scaled so that its
    estimated ``max |h_n| = 1`` (a useless agent: its own sample ``u_n`` with the
    same features, normalized the same way, in place of ``f``; an adversarial
    one: ``1 - f``). ``optimum`` is estimated the same way (dense
    random search refined by gradient ascent) and is therefore a numerical
    estimate, accurate to the refinement tolerance.

    Args:
        dim: ``D``.
        num_groups: Independent sampled functions ``f`` (as in :class:`GPSampleGridFederation`).
        agents_per_group: Agents per group, including the target.
        perturbation: ``d_n``, a number or one value per agent of a group.
        perturb_first: Whether agent 0 of a group is perturbed too.
        lengthscale: SE lengthscale of ``f``.
        perturbation_lengthscale: SE lengthscale of the perturbations ``h_n`` (``None``: ``lengthscale``).
        num_basis: Random features representing each sampled function.
        noise_variance: Observation noise ``σ²``.
        seed: Seed for the functions, perturbations and observation noise.
        useless_fraction: Fraction of the non-target agents whose function is an independent sample.
        adversarial_fraction: Fraction of them whose function is ``1 - f``.
    """

    def __init__(
        self,
        dim: int = 2,
        num_groups: int = 1,
        agents_per_group: int = 51,
        perturbation: float | Tensor = 0.02,
        perturb_first: bool = False,
        lengthscale: float = 0.1,
        perturbation_lengthscale: float | None = None,
        num_basis: int = 1024,
        noise_variance: float = 0.01,
        seed: int = 0,
        useless_fraction: float = 0.0,
        adversarial_fraction: float = 0.0,
    ) -> None:
        dim = check_int("dim", dim, minimum=1)
        check_positive("lengthscale", lengthscale)
        num_basis = check_int("num_basis", num_basis, minimum=16)
        self._setup_groups(
            num_groups,
            agents_per_group,
            perturbation,
            perturb_first,
            noise_variance,
            seed,
            useless_fraction,
            adversarial_fraction,
        )
        self.bounds = torch.tensor([[0.0] * dim, [1.0] * dim], dtype=torch.float64)
        self.lengthscale = float(lengthscale)
        gen = torch.Generator().manual_seed(self.seed)
        self._basis_f = RandomFourierFeatures(dim, num_basis, lengthscale, seed=self.seed + 101, normalize=False)
        pl = perturbation_lengthscale or lengthscale
        self._basis_h = RandomFourierFeatures(dim, num_basis, pl, seed=self.seed + 202, normalize=False)
        w_f = torch.randn(self.num_groups, num_basis, generator=gen, dtype=torch.float64)
        w_h = torch.randn(self.num_agents, num_basis, generator=gen, dtype=torch.float64)
        opt_gen = torch.Generator().manual_seed(self.seed + 303)

        def raw_f(X: Tensor, w: Tensor) -> Tensor:
            return (self._basis_f(X) * w.unsqueeze(-2)).sum(-1)

        # normalize f to [0, 1] over the domain (range estimated numerically)
        fmax = self._extreme(lambda X: raw_f(X, w_f), self.num_groups, opt_gen)
        fmin = -self._extreme(lambda X: -raw_f(X, w_f), self.num_groups, opt_gen)
        self._f_shift, self._f_scale = fmin, fmax - fmin
        self._w_f = w_f
        # scale each perturbation function to max |h_n| = 1
        hmax = self._extreme(lambda X: (self._basis_h(X) * w_h.unsqueeze(-2)).sum(-1), self.num_agents, opt_gen)
        hmin = -self._extreme(lambda X: -(self._basis_h(X) * w_h.unsqueeze(-2)).sum(-1), self.num_agents, opt_gen)
        self._w_h = w_h / torch.maximum(hmax.abs(), hmin.abs()).unsqueeze(-1)
        # each agent's base function: its group's f, its own sample (useless) or 1 - f (adversarial)
        g = self.group_of_agent
        self._w_base, self._base_shift, self._base_scale = w_f[g], self._f_shift[g], self._f_scale[g]
        useless = self.agents_of_kind("useless")
        if useless.numel():  # agent n's own sample: row n of one draw, its range from a stream keyed by n
            u_gen = torch.Generator().manual_seed(self.seed + 505)
            w_u = torch.randn(self.num_agents, num_basis, generator=u_gen, dtype=torch.float64)[useless]
            keys = kr.fold(kr.root_key(self.seed, "useless-range"), useless)
            umax = self._extreme(lambda X: raw_f(X, w_u), useless.numel(), keys=keys)
            umin = -self._extreme(lambda X: -raw_f(X, w_u), useless.numel(), keys=kr.fold(keys, "min"))
            self._w_base[useless], self._base_shift[useless], self._base_scale[useless] = w_u, umin, umax - umin
        self.optimum = self._extreme(lambda X: self._true(X, torch.arange(self.num_agents)), self.num_agents, opt_gen)

    @classmethod
    def memory_estimate(cls, **kwargs: Any) -> dict[str, float]:
        r"""The agents' and groups' feature weights (``A x B``, a few copies) and one scoring call of the
        range search (``DEFAULT_MAX_POINTS x B`` features), by ``num_basis`` and by the larger of
        ``num_groups`` and ``agents_per_group``."""
        B, D = size_argument(cls, kwargs, "num_basis"), size_argument(cls, kwargs, "dim")
        G, P = size_argument(cls, kwargs, "num_groups"), size_argument(cls, kwargs, "agents_per_group")
        return {"num_basis": 8.0 * B * (DEFAULT_MAX_POINTS + 4 * D), _agents_key(G, P): 8.0 * 4 * G * P * B}

    def _extreme(
        self, fn: Callable[[Tensor], Tensor], batch: int, gen: torch.Generator | None = None, keys: Tensor | None = None
    ) -> Tensor:
        raw = 4096 if self.dim <= 2 else 8192
        _, vals = maximize_batched(
            fn,
            self.bounds,
            batch,
            raw_samples=raw,
            num_restarts=8,
            refine="adam",
            maxiter=150,
            lr=0.005,
            generator=gen,
            keys=keys,
        )
        return vals

    def f(self, X: Tensor, groups: Tensor) -> Tensor:
        """Normalized group functions ``f_g`` at ``k x q x D`` points (``k`` groups)."""
        w = self._on(X.device, "_w_f").to(X.dtype)[groups]
        raw = (self._module_on(X.device, "_basis_f")(X) * w.unsqueeze(-2)).sum(-1)
        shift = self._on(X.device, "_f_shift").to(X.dtype)[groups].unsqueeze(-1)
        return (raw - shift) / self._on(X.device, "_f_scale").to(X.dtype)[groups].unsqueeze(-1)

    def base(self, X: Tensor, agents: Tensor) -> Tensor:
        """Agents' unperturbed functions at ``k x q x D`` points (``k`` agents): their group's
        ``f``, a useless agent's own sample ``u_n`` or an adversarial agent's ``1 - f``."""
        agents = agents.to(X.device)
        w = self._on(X.device, "_w_base").to(X.dtype)[agents]
        raw = (self._module_on(X.device, "_basis_f")(X) * w.unsqueeze(-2)).sum(-1)
        shift = self._on(X.device, "_base_shift").to(X.dtype)[agents].unsqueeze(-1)
        b = (raw - shift) / self._on(X.device, "_base_scale").to(X.dtype)[agents].unsqueeze(-1)
        adversarial = self._on(X.device, "kind_of_agent")[agents].unsqueeze(-1) == ADVERSARIAL
        return torch.where(adversarial, 1.0 - b, b)

    def _true(self, X: Tensor, agents: Tensor) -> Tensor:
        agents = agents.to(X.device)
        w = self._on(X.device, "_w_h").to(X.dtype)[agents]
        h = (self._module_on(X.device, "_basis_h")(X) * w.unsqueeze(-2)).sum(-1)
        return self.base(X, agents) + self._on(X.device, "perturbation").to(X.dtype)[agents].unsqueeze(-1) * h

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        return self._add_noise(self._true(X, agents), noise)
