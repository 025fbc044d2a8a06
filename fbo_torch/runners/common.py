r"""Building blocks shared by the federated BO runners.

* :class:`Domain` — where agents search: a box, optionally a finite candidate
  set (the papers' 1-D grid), with one batched maximizer for many agents.
* :class:`AgentGPs` — the batched exact GPs of a set of agents, refitted on a
  schedule and warm-started in between.
* :func:`maximize_own_samples` / :func:`maximize_rff_samples` — every agent's
  Thompson-sample maximizer in one call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from botorch.models import SingleTaskGP
from gpytorch.constraints import GreaterThan
from gpytorch.kernels import RBFKernel, ScaleKernel
from torch import Tensor

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.models.agent_gp import HYPER_PREFIXES, build_single_gp, draw_thompson_paths, fit_agent_gps
from fbo_torch.optim.batched import DEFAULT_MAX_POINTS, maximize_batched, maximize_discrete
from fbo_torch.utils.validation import check_bounds


def derive_seed(generator: torch.Generator) -> int:
    """A fresh integer seed drawn from ``generator`` (for libraries that use the global RNG)."""
    return int(torch.randint(2**62, (1,), generator=generator, device=generator.device).item())


@dataclass
class Domain:
    r"""The search domain of a federation.

    Args:
        bounds: ``2 x d`` box.
        candidates: Optional ``C x d`` finite domain; maximization over it is exact.
        raw_samples, num_restarts, refine, maxiter, lr: Settings of
            :func:`~fbo_torch.optim.maximize_batched` for continuous domains.
        raw_samples_rff: Raw points for the cheap ``φ(x)ᵀω`` functions (messages,
            server broadcasts), which are ``M``-feature dot products and can
            afford a denser search than GP samples.
        maxiter_rff: Refinement steps for those functions (enough for Adam's
            decaying steps to match L-BFGS-B's precision).
        max_points: Memory cap on points per batched evaluation.
    """

    bounds: Tensor
    candidates: Tensor | None = None
    raw_samples: int = 512
    num_restarts: int = 4
    refine: str | None = "adam"
    maxiter: int = 30
    lr: float = 0.02
    max_points: int = DEFAULT_MAX_POINTS
    raw_samples_rff: int = 4096
    maxiter_rff: int = 200

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

    def random(self, batch: int, n: int, generator: torch.Generator | None = None) -> Tensor:
        r"""``batch x n x d`` uniform random points of the domain."""
        dev = self.bounds.device
        if self.candidates is not None:
            C = self.candidates.shape[0]
            if generator is None:
                idx = torch.randint(C, (batch, n), device=dev)
            else:
                idx = torch.randint(C, (batch, n), generator=generator, device=generator.device).to(dev)
            return self.candidates[idx]
        shape = (batch, n, self.dim)
        if generator is None:
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
    ) -> tuple[Tensor, Tensor]:
        r"""Maximize ``batch`` functions ``fn: batch x C x d -> batch x C``.

        On a finite domain the maximization is exact. On a box it is
        multi-start with gradient refinement; ``region_bounds`` (``batch x 2 x d``)
        restricts each problem to its own box.
        """
        if self.candidates is not None:
            if region_bounds is None:
                return maximize_discrete(fn, self.candidates, batch, self.max_points)
            inside = ((self.candidates.unsqueeze(0) >= region_bounds[:, 0:1]) & (
                self.candidates.unsqueeze(0) <= region_bounds[:, 1:2])).all(-1)  # batch x C

            def masked(X: Tensor) -> Tensor:  # called once on all candidates (no chunking below)
                return torch.where(inside, fn(X), -torch.inf)

            return maximize_discrete(masked, self.candidates, batch, max_points=batch * self.candidates.shape[0])
        bounds = self.bounds if region_bounds is None else region_bounds
        return maximize_batched(
            fn, bounds, batch_size=batch, raw_samples=raw_samples or self.raw_samples, num_restarts=self.num_restarts,
            refine=self.refine, maxiter=maxiter or self.maxiter, lr=self.lr, max_points=self.max_points, generator=generator,
        )


def maximize_rff_samples(
    features: RandomFourierFeatures, omegas: Tensor, domain: Domain, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    r"""Maximize ``x ↦ φ(x)ᵀω_b`` for ``B`` weight vectors ``omegas`` (``B x M``) at once."""
    def fn(X: Tensor) -> Tensor:
        return (features(X) * omegas.to(X).unsqueeze(-2)).sum(-1)

    return domain.maximize(fn, omegas.shape[0], generator=generator, raw_samples=domain.raw_samples_rff, maxiter=domain.maxiter_rff)


def maximize_broadcast(
    features: RandomFourierFeatures,
    broadcast: Tensor,
    region_bounds: Tensor,
    domain: Domain,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Maximize the DP-FTS-DE agent function ``x ↦ φ(x)ᵀω^(i[x])`` for ``R`` federations.

    One bounded maximization of ``φᵀω^(i)`` over sub-region ``i`` per region
    and federation (all ``R·P`` at once), best region kept. The broadcast is
    the same for every agent of a federation, so this is done once per
    federation, not once per agent.

    Args:
        features: The shared map.
        broadcast: ``R x P x M`` server output.
        region_bounds: ``P x 2 x d`` sub-region boxes.
        domain: The search domain.

    Returns:
        ``(X, values)``: ``R x d`` maximizers and ``R`` values.
    """
    R, P, M = broadcast.shape
    omegas = broadcast.reshape(R * P, M)

    def fn(X: Tensor) -> Tensor:
        return (features(X) * omegas.to(X).unsqueeze(-2)).sum(-1)

    rb = region_bounds.to(domain.bounds).repeat(R, 1, 1) if P > 1 else None
    X, vals = domain.maximize(fn, R * P, generator=generator, region_bounds=rb, raw_samples=domain.raw_samples_rff, maxiter=domain.maxiter_rff
    )
    best_vals, best = vals.view(R, P).max(-1)
    return X.view(R, P, -1)[torch.arange(R, device=X.device), best], best_vals


def maximize_own_samples(
    model: SingleTaskGP,
    domain: Domain,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    num_features: int | None = None,
) -> tuple[Tensor, Tensor]:
    r"""One Thompson sample per agent of a batched GP, and each sample's maximizer.

    Returns ``(X, values)`` with ``X`` of shape ``B x d``.
    """
    paths = draw_thompson_paths(model, seed=seed, num_features=num_features)
    B = model.batch_shape[0]

    def fn(X: Tensor) -> Tensor:
        return paths(X)

    return domain.maximize(fn, B, generator=generator)


def maximize_acquisition(acqf: Any, domain: Domain, generator: torch.Generator | None = None) -> Tensor:
    r"""Maximize one BoTorch acquisition function (``b x 1 x d -> b``) over ``domain``.

    Exact on a finite domain (scored in chunks); ``optimize_acqf`` on a box.
    Returns the ``d``-vector maximizer.
    """
    from botorch.optim import optimize_acqf

    if domain.candidates is not None:
        C = domain.candidates
        chunk = max(1, domain.max_points)
        with torch.no_grad():
            vals = torch.cat([acqf(C[s : s + chunk].unsqueeze(-2)) for s in range(0, C.shape[0], chunk)])
        return C[vals.argmax()]
    seed = derive_seed(generator) if generator is not None else None
    with torch.random.fork_rng(enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        X, _ = optimize_acqf(
            acqf, domain.bounds, q=1, num_restarts=domain.num_restarts, raw_samples=domain.raw_samples
        )
    return X.squeeze(0).detach()


def unbatch_gp(batched: SingleTaskGP, index: int, train_X: Tensor, train_Y: Tensor, bounds: Tensor, kernel: str) -> SingleTaskGP:
    r"""Agent ``index`` of a batched GP as an unbatched ``SingleTaskGP`` on its data.

    Hyperparameters are sliced from the batched model (no refit), so acquisition
    functions that need an unbatched model (RGPE, TAF) reuse one batched fit.
    """
    B = batched.batch_shape[0]
    covar = make_covar_module(kernel, train_X.shape[-1], None)
    model = build_single_gp(train_X, train_Y, bounds=bounds, covar_module=covar)
    target = model.state_dict()
    state = {}
    for k, v in batched.state_dict().items():
        if not k.startswith(HYPER_PREFIXES) or k not in target:
            continue
        t = target[k]
        if v.shape == t.shape:
            state[k] = v
        elif v.ndim >= 1 and v.shape[0] == B and v[index].numel() == t.numel():
            state[k] = v[index].reshape(t.shape)
    model.load_state_dict(state, strict=False)
    return model.eval()


def make_covar_module(kind: str, dim: int, batch: int | None) -> Any:
    r"""The agents' GP kernel.

    ``"botorch"``: BoTorch's default (RBF/ARD with a dimension-scaled LogNormal
    lengthscale prior, used with outcome standardization). ``"rbf"``: scaled
    RBF/ARD without priors, fitted by maximum likelihood like the authors' GPy
    models (lengthscales bounded below by 1e-3).
    """
    if kind == "botorch":
        return None
    if kind == "rbf":
        shape = torch.Size([batch]) if batch is not None else torch.Size([])
        base = RBFKernel(ard_num_dims=dim, batch_shape=shape, lengthscale_constraint=GreaterThan(1e-3))
        return ScaleKernel(base, batch_shape=shape)
    raise ValueError(f"Unknown GP kernel {kind!r}; expected 'botorch' or 'rbf'.")


@dataclass
class AgentGPs:
    r"""Batched exact GPs of ``B`` agents with a refit schedule.

    Hyperparameters are re-optimized on the first update and then every
    ``refit_every`` updates; in between, the model is rebuilt on the new data
    with the previous hyperparameters (cheap). ``refit_every = 0`` never refits
    after the first fit. Only the hyperparameters are state: the model is
    always rebuilt from the data it is given.
    """

    bounds: Tensor
    kernel: str = "botorch"
    refit_every: int = 1
    model: SingleTaskGP | None = None
    num_updates: int = 0
    hyper: dict[str, Tensor] | None = None

    def update(self, train_X: Tensor, train_Y: Tensor) -> SingleTaskGP:
        refit = self.hyper is None or (self.refit_every > 0 and self.num_updates % self.refit_every == 0)
        covar = make_covar_module(self.kernel, train_X.shape[-1], train_X.shape[0])
        self.model = fit_agent_gps(
            train_X, train_Y, bounds=self.bounds, covar_module=covar, previous=self.hyper, refit=refit
        )
        self.hyper = {
            k: v.detach().clone() for k, v in self.model.state_dict().items() if k.startswith(HYPER_PREFIXES)
        }
        self.num_updates += 1
        return self.model

    def state_dict(self) -> dict[str, Any]:
        return {"num_updates": self.num_updates, "hyper": self.hyper}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.num_updates = int(state["num_updates"])
        self.hyper = state["hyper"]
        self.model = None
