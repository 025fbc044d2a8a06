r"""A heterogeneous many-task federation: each agent's function from a different classic family.

Agent ``n`` minimizes a classic benchmark function ``φ_n`` (Sphere, Ackley,
Rastrigin, Rosenbrock, Griewank, Schwefel, Weierstrass by default; the families
cycle when there are more agents than families), shifted so that its minimizer
moves to an agent-specific point drawn from the seed. Like the many-task
benchmarks of evolutionary multitasking (Da et al., 2017, "Evolutionary
multitasking for single-objective continuous optimization: benchmark problems,
performance metric, and baseline results"), the tasks differ in landscape *and*
in output scale: from ~10 (Weierstrass, Ackley) to ~1e6 (Rosenbrock) in
``d = 3``. That is the point of the federation; values are not normalized unless
``normalize=True``.

Domain. All agents share the box ``[0, 1]^d``. Family ``φ`` has its standard
domain ``[lo, hi]^d`` (width ``w = hi - lo``) and minimizer ``z*``; agent ``n``
draws its optimizer ``u*_n ∈ [0, 1]^d`` and evaluates

.. math::

    g_n(u) = -φ(z^* + w (u - u^*_n)),

i.e. the box is mapped affinely onto the family's domain, shifted by
``s_n = lo + w u*_n - z*``, so ``g_n`` is maximized (fbo_torch maximizes) at
``u*_n`` with ``max g_n = -φ(z*)`` (0 for every family but Schwefel, whose
standard form has ``φ(z*) ≈ 1.27e-5 d``). ``u*_n`` is uniform on ``[0.1, 0.9]^d``
(inside, away from the edges) and, for Schwefel, on ``[0.76, 0.94]^d``: its
minimizer sits near the domain's corner (its deceptive feature) and the function
is unbounded below outside ``[-525.1, 666.3]`` per coordinate, so a larger shift
would move a deeper minimum into the box. Every other family has its global
minimum over all of ``R^d`` at ``z*`` (Weierstrass: at the integer points, one
period apart; the box spans one period), so ``optimum`` is exact.

The families from BoTorch (:mod:`botorch.test_functions.synthetic`: Ackley,
Rastrigin, Rosenbrock, Griewank, Levy) are evaluated by their own code; Sphere,
Schwefel and Weierstrass, which BoTorch lacks, are defined here in its
``SyntheticTestFunction`` form.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from botorch.test_functions.synthetic import Ackley, Griewank, Levy, Rastrigin, Rosenbrock, SyntheticTestFunction
from torch import Tensor

from fbo_torch.objectives.base import Objective, size_argument
from fbo_torch.utils.validation import check_int, check_positive


class _StandardFunction(SyntheticTestFunction):
    r"""A test function on a cube ``[lo, hi]^d`` with minimizer ``(z*, ..., z*)``."""

    _domain: tuple[float, float]
    _minimizer: float

    def __init__(
        self,
        dim: int = 2,
        noise_std: float | None = None,
        negate: bool = False,
        bounds: list[tuple[float, float]] | None = None,
        dtype: torch.dtype = torch.double,
    ) -> None:
        r"""The function on ``[lo, hi]^dim``, as BoTorch's test functions are built.

        Args:
            dim: The (input) dimension.
            noise_std: Standard deviation of the observation noise.
            negate: If True, negate the function.
            bounds: Custom bounds for the function specified as (lower, upper) pairs.
            dtype: The dtype that is used for the bounds of the function.
        """
        self.dim = dim
        self.continuous_inds = list(range(dim))
        self._optimizers = [tuple(self._minimizer for _ in range(dim))]
        super().__init__(noise_std=noise_std, negate=negate, bounds=bounds or [self._domain] * dim, dtype=dtype)


class Sphere(_StandardFunction):
    r"""Sphere function (De Jong's F1).

    d-dimensional function (usually evaluated on ``[-5.12, 5.12]^d``):

        f(x) = sum_{i=1}^d x_i^2

    f has one minimizer for its global minimum at ``z_1 = (0, ..., 0)`` with
    ``f(z_1) = 0``. Definition: Surjanovic & Bingham, "Virtual Library of
    Simulation Experiments: Test Functions and Datasets", Sphere Function.
    """

    _optimal_value = 0.0
    _domain = (-5.12, 5.12)
    _minimizer = 0.0

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return X.pow(2).sum(-1)


class Schwefel(_StandardFunction):
    r"""Schwefel function (Schwefel's problem 2.26, shifted to a minimum near 0).

    d-dimensional function (usually evaluated on ``[-500, 500]^d``)::

        f(x) = 418.9829 d - sum_{i=1}^d x_i sin(sqrt(|x_i|))

    The global minimum on ``[-500, 500]^d`` is at ``z_1 = (420.968746, ...)``
    near the domain's corner, with ``f(z_1) ≈ 1.2728e-5 d`` (the constant
    418.9829 is ``max_x x sin(sqrt|x|)`` rounded); f is unbounded below outside
    the domain. Definition: Surjanovic & Bingham, "Virtual Library of Simulation
    Experiments: Test Functions and Datasets", Schwefel Function.
    """

    _optimal_value = 0.0  # to 1.3e-5 d, see above
    _domain = (-500.0, 500.0)
    _minimizer = 420.96874635998216  # root of d/dx [x sin(sqrt x)]

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return 418.9829 * self.dim - (X * torch.sin(X.abs().sqrt())).sum(-1)


class Weierstrass(_StandardFunction):
    r"""Weierstrass function (CEC 2005, F11 without shift and rotation).

    d-dimensional function (usually evaluated on ``[-0.5, 0.5]^d``), with
    ``a = 0.5``, ``b = 3``, ``k_max = 20``:

        f(x) = sum_{i=1}^d sum_{k=0}^{k_max} a^k cos(2 pi b^k (x_i + 0.5))
               - d sum_{k=0}^{k_max} a^k cos(pi b^k)

    Continuous but nowhere differentiable (up to the truncation at ``k_max``),
    periodic with period 1 in every coordinate, ``f >= 0``; the minimum 0 is at
    ``z_1 = (0, ..., 0)`` (and at the integer points). Definition: Suganthan et
    al., "Problem Definitions and Evaluation Criteria for the CEC 2005 Special
    Session on Real-Parameter Optimization", 2005, F11.
    """

    _optimal_value = 0.0
    _domain = (-0.5, 0.5)
    _minimizer = 0.0
    _check_grad_at_opt = False
    a, b, k_max = 0.5, 3.0, 20

    def _evaluate_true(self, X: Tensor) -> Tensor:
        k = torch.arange(self.k_max + 1, dtype=X.dtype, device=X.device)
        ak, bk = self.a**k, self.b**k
        terms = (ak * torch.cos(2 * math.pi * bk * (X.unsqueeze(-1) + 0.5))).sum((-1, -2))
        return terms - X.shape[-1] * (ak * torch.cos(math.pi * bk)).sum()


#: The families by name: BoTorch's where it has one.
FAMILIES: dict[str, type[SyntheticTestFunction]] = {
    "sphere": Sphere,
    "ackley": Ackley,
    "rastrigin": Rastrigin,
    "rosenbrock": Rosenbrock,
    "griewank": Griewank,
    "schwefel": Schwefel,
    "weierstrass": Weierstrass,
    "levy": Levy,
}
#: The families agents cycle through by default.
DEFAULT_FAMILIES = ("sphere", "ackley", "rastrigin", "rosenbrock", "griewank", "schwefel", "weierstrass")
#: Where a family's optimizer ``u*`` may be drawn, per coordinate of ``[0, 1]^d``
#: (default: ``OPTIMIZER_RANGE[None]``); see the module docstring for Schwefel's.
OPTIMIZER_RANGE: dict[str | None, tuple[float, float]] = {None: (0.1, 0.9), "schwefel": (0.76, 0.94)}


#: Agents whose ranges are estimated at once when ``normalize=True``.
_NORMALIZE_CHUNK = 2048


class FunctionFamilyFederation(Objective):
    r"""``num_agents`` agents, each maximizing a shifted classic function of its own family.

    Agent ``n``'s family is ``families[n % len(families)]``; its optimizer
    ``optimizers[n]`` (in ``[0, 1]^d``) and its shift are drawn from
    ``seed``; its value at ``u ∈ [0, 1]^d`` is ``-φ(z* + w (u - u*_n))`` (module
    docstring). Every agent can be a target (``targets`` holds them all) and
    the peers of a target are all the other agents (there are no groups).

    Args:
        num_agents: Agents (7: one per default family).
        dim: ``d`` (any ``d >= 1``; Rosenbrock needs ``d >= 2``: in 1-D its sum is empty).
        families: Names of the families to cycle through (keys of :data:`FAMILIES`;
            repeats allowed); default :data:`DEFAULT_FAMILIES`.
        normalize: Divide each agent's values by its range (its optimum minus its
            lowest value on 1024 scrambled Sobol points of the box, seeded), so
            they lie in about ``[-1, 0]``. Default ``False``: the raw, wildly
            different scales.
        noise_variance: Variance ``σ²`` of the additive Gaussian observation noise,
            the same for every agent and in the units of the values (after
            ``normalize``); default 0 (noiseless). With raw scales a given ``σ²``
            is large for some families and negligible for others.
        seed: Seed for the optimizers' positions and the observation noise.

    Attributes:
        families: The ``families`` cycled through. family_of_agent: ``A``
        indices into ``families``. family_names: Each agent's family name.
        optimizers: ``A x d`` maximizers in ``[0, 1]^d``. optimum: ``A`` maxima.
        scale: ``A`` divisors of the values (ones unless ``normalize``).
    """

    @classmethod
    def memory_estimate(cls, **kwargs: Any) -> dict[str, float]:
        r"""The agents' shifts, widths and optimizers (``A x d``, a few copies) and the normalization's scoring
        of 1,024 points for ``_NORMALIZE_CHUNK`` agents at a time, by the larger of ``num_agents`` and ``dim``."""
        A, D = size_argument(cls, kwargs, "num_agents"), size_argument(cls, kwargs, "dim")
        return {"num_agents" if A >= D else "dim": 8.0 * D * (8 * A + 1024 * min(A, _NORMALIZE_CHUNK))}

    def __init__(
        self,
        num_agents: int = 7,
        dim: int = 3,
        families: Sequence[str] | None = None,
        normalize: bool = False,
        noise_variance: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.num_agents = check_int("num_agents", num_agents, minimum=1)
        dim = check_int("dim", dim, minimum=1)
        families = DEFAULT_FAMILIES if families is None else families
        if isinstance(families, str) or not families or any(f not in FAMILIES for f in families):
            raise ValueError(f"`families` must be a non-empty list of names from {sorted(FAMILIES)}, got {families!r}.")
        if dim == 1 and "rosenbrock" in families:
            raise ValueError(
                "`families`: rosenbrock needs `dim` >= 2 (in 1-D its sum is empty: constant 0); "
                "give `families` without it."
            )
        if not isinstance(normalize, bool):
            raise TypeError(f"`normalize` must be true or false, got {normalize!r}.")
        check_positive("noise_variance", noise_variance, allow_zero=True)
        self.families = tuple(families)
        self.noise_variance = float(noise_variance)
        self.seed = int(seed)
        self.normalize = normalize
        self.bounds = torch.tensor([[0.0] * dim, [1.0] * dim], dtype=torch.float64)
        # FAMILIES' classes all take `dim` (BoTorch's SyntheticTestFunction, their annotated type, does not)
        self._functions = [FAMILIES[name](dim=dim) for name in self.families]  # type: ignore[call-arg]
        self.family_of_agent = torch.arange(self.num_agents) % len(self.families)
        self.family_names = [self.families[j] for j in self.family_of_agent.tolist()]
        self.targets = torch.arange(self.num_agents)

        # BoTorch registers `bounds` and `optimizers` as buffers without declaring them: to mypy they are
        # nn.Module.__getattr__'s Tensor | Module
        fn_bounds = torch.stack([fn.bounds for fn in self._functions])  # type: ignore[misc]
        fn_bounds = fn_bounds[self.family_of_agent]  # A x 2 x d
        self._width = fn_bounds[:, 1] - fn_bounds[:, 0]  # A x d
        minimizers = torch.stack([fn.optimizers[0] for fn in self._functions])  # type: ignore[index]
        self._minimizer = minimizers[self.family_of_agent]  # A x d
        lo, hi = torch.tensor(
            [OPTIMIZER_RANGE.get(name, OPTIMIZER_RANGE[None]) for name in self.family_names], dtype=torch.float64
        ).unbind(-1)
        gen = torch.Generator().manual_seed(self.seed)
        U = torch.rand(self.num_agents, dim, generator=gen, dtype=torch.float64)
        self.optimizers = lo.unsqueeze(-1) + (hi - lo).unsqueeze(-1) * U  # A x d
        agents = torch.arange(self.num_agents)
        optimum = self.raw_values(self.optimizers.unsqueeze(-2), agents).squeeze(-1)
        self.scale = torch.ones(self.num_agents, dtype=torch.float64)
        if normalize:
            sobol = torch.quasirandom.SobolEngine(dim, scramble=True, seed=self.seed).draw(1024, dtype=torch.float64)
            # the range of each agent's function on 1,024 points, 2,048 agents at a time (a federation of
            # 100,000 agents would otherwise hold 100,000 x 1,024 points and the families' temporaries)
            low = torch.cat(
                [
                    self.raw_values(sobol.expand(len(chunk), -1, -1), chunk).amin(-1)
                    for chunk in agents.split(_NORMALIZE_CHUNK)
                ]
            )
            self.scale = optimum - low
        self.optimum = optimum / self.scale
        self.noise_generator = torch.Generator().manual_seed(self.seed + 1)

    def raw_values(self, X: Tensor, agents: Tensor) -> Tensor:
        r"""Noiseless values before ``normalize``: ``-φ_n(z* + w (u - u*_n))`` at ``k x q x d``
        points ``u`` for the ``k`` agents ``agents`` (``k x q``)."""
        agents = agents.to(X.device)
        family = self._on(X.device, "family_of_agent")[agents]  # k
        u_star = self._on(X.device, "optimizers").to(X.dtype)[agents].unsqueeze(-2)
        width = self._on(X.device, "_width").to(X.dtype)[agents].unsqueeze(-2)
        Z = self._on(X.device, "_minimizer").to(X.dtype)[agents].unsqueeze(-2) + width * (X - u_star)  # k x q x d
        values = X.new_empty(X.shape[:-1])
        for j, fn in enumerate(self._functions):  # one call per family, all its agents at once
            rows = family == j
            # `_evaluate_true`: BoTorch's `evaluate_true` refuses points outside the standard
            # domain, which the shifted argument leaves by design
            values[rows] = -fn._evaluate_true(Z[rows])
        return values

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        scale = self._on(X.device, "scale").to(X.dtype)[agents.to(X.device)].unsqueeze(-1)
        return self._add_noise(self.raw_values(X, agents) / scale, noise)


__all__ = [
    "DEFAULT_FAMILIES",
    "FAMILIES",
    "FunctionFamilyFederation",
    "OPTIMIZER_RANGE",
    "Schwefel",
    "Sphere",
    "Weierstrass",
]
