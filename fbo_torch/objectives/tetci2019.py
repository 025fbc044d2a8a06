r"""pyfmto's ``tetci2019`` many-task problem, ported: ten shifted classic functions, one per agent.

The benchmark of the peer library for federated many-task optimization, pyfmto
(problems and algorithms in the public repository Xiaoxu-Zhang/fmto,
``problems/tetci2019``), after Chen, Zhong, Feng et al., "An Adaptive
Archive-Based Evolutionary Framework for Many-Task Optimization", IEEE TETCI
2020. Task ``n`` minimizes ``f_n(x)`` over its own box ``[lb_n, ub_n]^d``:

====  ===========  ==============  =====================================
task  function     box             shift ``s_n``
====  ===========  ==============  =====================================
1     Sphere       [-100, 100]     0
2     Sphere       [-100, 100]     80
3     Sphere       [-100, 100]     -80
4     Weierstrass  [-0.5, 0.5]     -0.4
5     Rosenbrock   [-50, 50]       0
6     Ackley       [-50, 50]       40
7     Weierstrass  [-0.4, 0.4]     -0.4
8     Schwefel     [-500, 500]     0
9     Griewank     [-100, 100]     -80 on the first ``d // 2`` coordinates, 80 on the rest
10    Rastrigin    [-50, 50]       40 on the first ``d // 2`` coordinates, -40 on the rest
====  ===========  ==============  =====================================

For ``d > 25`` the two Weierstrass tasks (4 and 7) are left out, as in pyfmto
(8 tasks). The shift is applied as pyfmto's ``SingleTaskProblem`` applies it:
``f_n(x) = φ_n(clip(x - s_n, lb_n, ub_n))`` (its rotation is the identity here),
so the *shifted argument* is clipped to the box — a task whose shift moves part
of the box outside is flat there (e.g. task 2 for ``x_i < -20``), and task 7's
minimizer sits on its box's corner ``x = -0.4``.

The functions ``φ`` are pyfmto's, term by term (``problems/benchmarks``), which
is not always the textbook form:

* Sphere ``Σ z_i²``; Rastrigin ``Σ (z_i² - 10 cos 2πz_i + 10)``; Griewank
  ``Σ z_i²/4000 - Π cos(z_i/√i) + 1``; Ackley ``-20 exp(-0.2 √(Σz_i²/d)) -
  exp(Σ cos(2πz_i)/d) + 20 + e``; Schwefel ``418.9829 d - Σ z_i sin √|z_i|``.
* **Rosenbrock** is ``100 Σ_{i<d} (z_{i+1}² - z_i)² + Σ_{i<d} (z_i - 1)²`` —
  pyfmto squares the *next* coordinate (``x[1:]**2 - x[:-1]``), where the
  textbook form has ``(z_{i+1} - z_i²)²``. Its minimum is still 0 at ``(1, ..., 1)``.
* Weierstrass ``Σ_i Σ_{k=0}^{20} a^k cos(2π b^k (z_i + 0.5)) - d Σ_k a^k cos(π b^k)``,
  ``a = 0.5``, ``b = 3``.

fbo_torch's conventions: all agents share the unit box ``[0, 1]^d``, task
``n``'s box mapped affinely onto it (``x = lb_n + (ub_n - lb_n) u``), and values
are maximized: ``value_n(u) = -f_n(lb_n + (ub_n - lb_n) u)``. ``optimum`` is
``-y_global`` with pyfmto's ``y_global = f_n(x*_n)`` at its recorded optimizer
(``s_n`` plus 0, or 1 for Rosenbrock, or 420.9687 for Schwefel, whose true
minimum lies 2.7e-10 d lower), so :meth:`~fbo_torch.objectives.base.Objective.loss`
is the simple regret ``f_n(best) - y_global`` in ``f``'s units, as pyfmto
reports it (a regret can dip 2.7e-10 d below 0 on Schwefel). The values span
~10 (Weierstrass, Ackley) to ~1e9 (Rosenbrock at ``d = 3``; 6e9 at ``d = 10``)
and are not normalized. Evaluation is batched: one call per function family,
for all the agents of that family at once.

:func:`to_unit` maps pyfmto's recorded designs (original units) onto the unit
box, so a run of ours can start from pyfmto's initial design.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from fbo_torch.objectives.base import Objective
from fbo_torch.utils.validation import check_int, check_positive

#: The ten tasks: (function, lb, ub, shift); a shift ``(a, b)`` is ``a`` on the first ``d // 2``
#: coordinates and ``b`` on the rest.
TASKS: tuple[tuple[str, float, float, float | tuple[float, float]], ...] = (
    ("sphere", -100.0, 100.0, 0.0),
    ("sphere", -100.0, 100.0, 80.0),
    ("sphere", -100.0, 100.0, -80.0),
    ("weierstrass", -0.5, 0.5, -0.4),
    ("rosenbrock", -50.0, 50.0, 0.0),
    ("ackley", -50.0, 50.0, 40.0),
    ("weierstrass", -0.4, 0.4, -0.4),
    ("schwefel", -500.0, 500.0, 0.0),
    ("griewank", -100.0, 100.0, (-80.0, 80.0)),
    ("rastrigin", -50.0, 50.0, (40.0, -40.0)),
)
#: Where pyfmto records each function's minimizer (before the shift), per coordinate.
MINIMIZER = {"rosenbrock": 1.0, "schwefel": 420.9687}
#: The largest dimension with the Weierstrass tasks (pyfmto drops them above it).
MAX_WEIERSTRASS_DIM = 25


def _sphere(Z: Tensor) -> Tensor:
    return (Z**2).sum(-1)


def _weierstrass(Z: Tensor) -> Tensor:
    k = torch.arange(21, dtype=Z.dtype, device=Z.device)
    ak, bk = 0.5**k, 3.0**k
    cycles = 2 * math.pi * bk  # pyfmto's operation order: ((2π b^k) (z + 0.5))
    term1 = (ak * torch.cos(cycles * (Z.unsqueeze(-1) + 0.5))).sum(-1).sum(-1)
    term2 = (ak * torch.cos(cycles * 0.5)).sum()
    return term1 - Z.shape[-1] * term2


def _rosenbrock(Z: Tensor) -> Tensor:
    # pyfmto's form: the next coordinate squared, not the textbook (z_{i+1} - z_i^2)
    return 100 * ((Z[..., 1:] ** 2 - Z[..., :-1]) ** 2).sum(-1) + ((Z[..., :-1] - 1) ** 2).sum(-1)


def _ackley(Z: Tensor) -> Tensor:
    d = Z.shape[-1]
    sum1 = (Z**2).sum(-1)
    sum2 = torch.cos(2 * math.pi * Z).sum(-1)
    return -20 * torch.exp(-0.2 * torch.sqrt(sum1 / d)) - torch.exp(sum2 / d) + 20 + math.e


def _schwefel(Z: Tensor) -> Tensor:
    return 418.9829 * Z.shape[-1] - (Z * torch.sin(torch.sqrt(Z.abs()))).sum(-1)


def _griewank(Z: Tensor) -> Tensor:
    i = torch.arange(1, Z.shape[-1] + 1, dtype=Z.dtype, device=Z.device)
    return (Z**2 / 4000).sum(-1) - torch.cos(Z / torch.sqrt(i)).prod(-1) + 1


def _rastrigin(Z: Tensor) -> Tensor:
    return (Z**2 - 10 * torch.cos(2 * math.pi * Z) + 10).sum(-1)


#: pyfmto's functions ``φ`` (to minimize) on ``... x d`` arguments.
FUNCTIONS = {
    "sphere": _sphere,
    "weierstrass": _weierstrass,
    "rosenbrock": _rosenbrock,
    "ackley": _ackley,
    "schwefel": _schwefel,
    "griewank": _griewank,
    "rastrigin": _rastrigin,
}


def family_values(
    Z: Tensor, family: Tensor, names: Sequence[str], functions: Mapping[str, Callable[[Tensor], Tensor]] = FUNCTIONS
) -> Tensor:
    r"""Each row's function at its arguments, one call per function for all the rows that have it.

    Args:
        Z: ``k x q x d`` arguments.
        family: ``k`` indices into ``names``: row ``i`` goes through ``functions[names[family[i]]]``.
        names: Function names (keys of ``functions``).
        functions: Name -> function of ``... x d`` arguments (default: pyfmto's, :data:`FUNCTIONS`).

    Returns:
        ``k x q`` values.
    """
    values = Z.new_empty(Z.shape[:-1])
    for j, name in enumerate(names):
        rows = family == j
        if rows.any():
            values[rows] = functions[name](Z[rows])
    return values


def to_unit(X: Tensor, lb: Tensor, ub: Tensor) -> Tensor:
    r"""Points in a task's original units as points of the unit box: ``(X - lb) / (ub - lb)``.

    The inverse of the map every agent's values go through (``lb + (ub - lb) u``),
    up to rounding (one or two ulps of ``x``). Points outside ``[lb, ub]`` (which
    pyfmto's searches may propose; pyfmto then clips the *shifted* argument)
    map outside ``[0, 1]``: clamp them only if you mean to evaluate a different point.

    Args:
        X: ``... x d`` points in original units (e.g. a pyfmto run's ``X``).
        lb: ``d`` (or broadcastable) lower bounds of the task's box.
        ub: ``d`` (or broadcastable) upper bounds.

    Returns:
        ``... x d`` unit-box points, float64 unless ``X`` is another floating dtype.
    """
    X = torch.as_tensor(X)
    dtype = X.dtype if X.is_floating_point() else torch.float64
    X = X.to(dtype)
    lb = torch.as_tensor(lb, dtype=dtype, device=X.device)
    ub = torch.as_tensor(ub, dtype=dtype, device=X.device)
    if (ub <= lb).any():
        raise ValueError("`ub` must exceed `lb` in every coordinate.")
    return (X - lb) / (ub - lb)


class Tetci2019(Objective):
    r"""pyfmto's ``tetci2019``: 10 agents (8 when ``dim > 25``), each a shifted classic function.

    Agent ``n`` is pyfmto's task ``n + 1`` (module docstring); its value at
    ``u ∈ [0, 1]^d`` is ``-f_n(lb_n + (ub_n - lb_n) u)``. Every agent can be a
    target (``targets`` holds them all); there are no groups.

    Args:
        dim: ``d``, 1 to 50 (pyfmto's range; at ``d = 1`` Rosenbrock's sums are
            empty and it is constant 0, as in pyfmto).
        noise_variance: Variance of additive Gaussian observation noise, in ``f``'s
            units, the same for every agent (default 0: noiseless, as in pyfmto).
        seed: Seed of the observation-noise stream.

    Attributes:
        names: Each agent's function name. tasks: Each agent's pyfmto task number (1-based).
        lb, ub: ``N x d`` boxes in original units. shift: ``N x d`` shifts.
        y_global: ``N`` minimum values pyfmto reports; optimum: ``-y_global``.
    """

    def __init__(self, dim: int = 10, noise_variance: float = 0.0, seed: int = 0) -> None:
        dim = check_int("dim", dim, minimum=1)
        if dim > 50:
            raise ValueError(f"`dim` must lie in [1, 50] (pyfmto's tetci2019), got {dim}.")
        check_positive("noise_variance", noise_variance, allow_zero=True)
        tasks = [n for n in range(len(TASKS)) if dim <= MAX_WEIERSTRASS_DIM or TASKS[n][0] != "weierstrass"]
        self.tasks = [n + 1 for n in tasks]
        self.names = [TASKS[n][0] for n in tasks]
        self.num_agents = len(tasks)
        self.noise_variance = float(noise_variance)
        self.seed = int(seed)
        self.bounds = torch.tensor([[0.0] * dim, [1.0] * dim], dtype=torch.float64)
        self.targets = torch.arange(self.num_agents)

        def full(value: float | tuple[float, float]) -> list[float]:
            if isinstance(value, tuple):
                return [value[0]] * (dim // 2) + [value[1]] * (dim - dim // 2)
            return [value] * dim

        self.lb = torch.tensor([full(TASKS[n][1]) for n in tasks], dtype=torch.float64)
        self.ub = torch.tensor([full(TASKS[n][2]) for n in tasks], dtype=torch.float64)
        self.shift = torch.tensor([full(TASKS[n][3]) for n in tasks], dtype=torch.float64)
        self._families = tuple(dict.fromkeys(self.names))
        self._family_of_agent = torch.tensor([self._families.index(name) for name in self.names])
        # pyfmto's y_global: f at its recorded optimizer, whose shifted argument is the unshifted minimizer
        z_star = torch.tensor([[MINIMIZER.get(name, 0.0)] * dim for name in self.names], dtype=torch.float64)
        self.y_global = self._phi(z_star.unsqueeze(-2), torch.arange(self.num_agents)).squeeze(-1)
        self.optimum = -self.y_global
        self.noise_generator = torch.Generator().manual_seed(self.seed)

    def _phi(self, Z: Tensor, agents: Tensor) -> Tensor:
        """pyfmto's functions at shifted, clipped arguments ``Z`` (``k x q x d``) of agents ``agents``."""
        return family_values(Z, self._on(Z.device, "_family_of_agent")[agents], self._families)

    def evaluate_original(self, X: Tensor, agents: Tensor | None = None) -> Tensor:
        r"""pyfmto's ``f_n`` (to minimize) at points in the tasks' original units.

        Args:
            X: ``k x q x d`` points, row ``i`` in agent ``agents[i]``'s units (any
                values: the shifted argument is clipped to the box, as in pyfmto).
            agents: ``k`` agent indices (default: all agents, ``k = N``).

        Returns:
            ``k x q`` values of ``f``, as pyfmto's ``task.evaluate`` returns them.
        """
        agents = self._agents(X, agents).to(X.device)
        lb = self._on(X.device, "lb").to(X.dtype)[agents].unsqueeze(-2)
        ub = self._on(X.device, "ub").to(X.dtype)[agents].unsqueeze(-2)
        shift = self._on(X.device, "shift").to(X.dtype)[agents].unsqueeze(-2)
        Z = torch.minimum(torch.maximum(X - shift, lb), ub)
        return self._phi(Z, agents)

    def to_original(self, U: Tensor, agents: Tensor | None = None) -> Tensor:
        """Unit-box points ``k x q x d`` in the agents' original units: ``lb + (ub - lb) U``."""
        agents = self._agents(U, agents).to(U.device)
        lb = self._on(U.device, "lb").to(U.dtype)[agents].unsqueeze(-2)
        ub = self._on(U.device, "ub").to(U.dtype)[agents].unsqueeze(-2)
        return lb + (ub - lb) * U

    def to_unit(self, X: Tensor, agent: int) -> Tensor:
        """Agent ``agent``'s points in original units (``... x d``, e.g. pyfmto's design) on the unit box."""
        agent = check_int("agent", agent, minimum=0)
        if agent >= self.num_agents:
            raise ValueError(f"`agent` must lie in [0, {self.num_agents}), got {agent}.")
        return to_unit(X, self.lb[agent], self.ub[agent])

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        return self._add_noise(-self.evaluate_original(self.to_original(X, agents), agents), noise)

    def __repr__(self) -> str:
        return f"Tetci2019(dim={self.dim}, num_agents={self.num_agents}, noise_variance={self.noise_variance})"


__all__ = ["FUNCTIONS", "TASKS", "Tetci2019", "family_values", "to_unit"]
