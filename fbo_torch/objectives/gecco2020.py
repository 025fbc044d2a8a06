r"""pyfmto's ``gecco2020`` many-task problem, ported: planar kinematic arms in four groups.

The real-world-like benchmark of the peer library for federated many-task
optimization, pyfmto (problems in the public repository Xiaoxu-Zhang/fmto,
``problems/gecco2020``; "Kinematic Arm 2020 Hetero V2", after Mouret &
Maguire, "Quality Diversity for Multi-task Optimization", GECCO 2020). Task
``n`` is a planar arm of ``d`` revolute joints with link lengths ``L_n``
(``d`` numbers), an angular factor ``a_n`` and a set of targets ``t_{n,j}``
(3 or 5 points of the plane); it minimizes the mean distance from the
end-effector to its targets over ``x ∈ [0, 1]^d``:

.. math::

    θ_i = 2π a_n (x_i - ½), \quad
    e(x) = \sum_{i=1}^d L_{n,i} (\cos, \sin)\Big(\sum_{l \le i} θ_l\Big), \quad
    f_n(x) = \frac{1}{m_n} \sum_{j=1}^{m_n} \lVert t_{n,j} - e(x) \rVert_2,

observed with additive Gaussian noise of the task's own standard deviation
``σ_n``. The tasks fall into four groups, related within a group and not across:

=====  ===================================  ==============  ================================  =============
group  link pattern (before jitter)         ``a_n``         targets                           ``σ_n``
=====  ===================================  ==============  ================================  =============
0      3 on the first ``d // 2`` links,      U(0.4, 0.9)     3 "front-far"                     U(0, 0.003)
       0.2 on the rest
1      0.2 on the first ``d - d // 2``,      U(0.9, 1.5)     3 "back-deep"                     U(0.01, 0.025)
       3 on the last ``d // 2``
2      3 on odd links (0-based), 0.3 else    U(0.3, 1.3)     1 front-far, 1 side-high,         U(0, 0.015)
                                                             1 back-deep
3      1 on every link                       U(0.5, 1.6)     2 front-far, 2 back-deep,         U(0.02, 0.04)
                                                             1 side-high
=====  ===================================  ==============  ================================  =============

with front-far ``[1.1, 1.8] × [-0.4, 0.4]``, back-deep ``[-1.6, -0.6] ×
[-1, -0.2]`` and side-high ``[-0.4, 0.4] × [0.8, 1.5]`` (uniform draws). A
task's link pattern is multiplied by log-normal jitter ``exp(0.35 N(0, 1))``
per link, floored at 0.05, normalized to sum 1 and scaled by a total length
``U(0.6, 1.6)``. Group sizes are ``task_num // 4`` (the first ``task_num % 4``
groups one more), the group labels shuffled.

**Generation.** Everything is drawn from one ``numpy.random.default_rng(seed)``
in pyfmto's order (the shuffle of the group labels, then per task: link jitter,
total length, angular factor, targets, noise σ), so ``seed`` gives pyfmto's
tasks for any ``d >= 2`` and ``task_num >= 1``; pyfmto's default seed is 123.

fbo_torch's conventions: pyfmto's box is already ``[0, 1]^d``; values are
maximized, ``value_n(x) = -f_n(x)``. The noise is per agent: ``observe`` adds
``σ_n N(0, 1)`` from each agent's keyed stream and ``__call__`` without keys
from ``noise_generator``; :meth:`~fbo_torch.objectives.base.Objective.evaluate_true` is noiseless. Evaluation is
batched over the agents (a loop over the ``d`` joints, pyfmto's order of
operations, so values agree with pyfmto's to the last bits).

**Optimum.** pyfmto records none (``x_global`` is ``None``). :attr:`~Gecco2020.optimum`
is each task's maximum of the noiseless value, computed in float64 on first
access and cached per ``(dim, task_num, seed)`` (:func:`arm_optimum`): the best
64 of 2048 scrambled-Sobol points per task refined by batched box-constrained
BFGS, then the best 8 of those refined to convergence (projected gradient
``1e-10``) with a longer line search, which a stretched arm needs (there the
function is badly conditioned, and a short line search stalls ``1e-6`` above the
minimum). Two checks, one exact and one empirical:

* The mean distance is convex in the end-effector's position ``e``, so its
  minimum over the whole plane (the targets' geometric median, by Weiszfeld's
  iteration) bounds every task's minimum from below. Where the arm reaches the
  median the computed minimum meets the bound: :attr:`~Gecco2020.optimum_certified` marks
  those tasks (within ``1e-9``), about half of them.
* The others' optima lie on the boundary of the reachable set. There, the 8
  polished restarts of a task end within ``1e-9`` of each other (at least 4 of 8
  for every task at ``d = 10``, ``task_num = 50``); at ``(d, task_num) = (5, 20)``
  and ``(10, 50)`` 4 times more restarts (8192 points, 256 restarts, 32 polished)
  improved no task by more than ``3e-13``, and SciPy's L-BFGS-B from random starts on
  pyfmto's own implementation found no lower value on any task
  (``benchmarks/peers/README.md``).

So :attr:`~Gecco2020.optimum` is the maximum to ``1e-9`` on the certified tasks, and on the
others the best of searches that agree to that.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from fbo_torch.objectives.base import Objective
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.validation import check_int

#: pyfmto's default problem seed.
PYFMTO_SEED = 123
#: Number of groups (link patterns, target regions, angular and noise ranges).
NUM_GROUPS = 4
#: The most targets a task has (group 3); the others have 3.
MAX_TARGETS = 5
#: Tolerance of :attr:`Gecco2020.optimum_certified`: the computed minimum within this of the
#: geometric median's value (a lower bound on the minimum).
CERTIFY_ATOL = 1e-9
#: Computed optima by ``(dim, task_num, seed)``: ``(optimum, optimizer, certified)``.
_OPTIMA: dict[tuple[int, int, int], tuple[Tensor, Tensor, Tensor]] = {}


def generate_tasks(dim: int, task_num: int, seed: int = PYFMTO_SEED) -> dict[str, np.ndarray]:
    r"""pyfmto's ``gecco2020`` task parameters, drawn exactly as pyfmto draws them.

    Args:
        dim: ``d >= 2`` joints.
        task_num: ``N >= 1`` tasks.
        seed: Seed of ``numpy.random.default_rng`` (pyfmto's default 123).

    Returns:
        ``{"group": N, "lengths": N x d, "angular_factor": N, "noise_sigma": N,
        "targets": N x 5 x 2, "num_targets": N}`` NumPy arrays (float64, groups and
        counts int64); a task with 3 targets has its last two rows zero.
    """
    dim = check_int("dim", dim, minimum=2)
    task_num = check_int("task_num", task_num, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    rng = np.random.default_rng(seed)
    half = dim // 2
    patterns = (
        np.concatenate([3.0 * np.ones(half), 0.2 * np.ones(dim - half)]),
        np.concatenate([0.2 * np.ones(dim - half), 3.0 * np.ones(half)]),
        np.array([3.0 if i % 2 == 1 else 0.3 for i in range(dim)]),
        np.ones(dim),
    )

    # the three target regions: x then y, each uniform (pyfmto's expressions, so the same rounding)
    def front_far(m: int) -> np.ndarray:
        xs = rng.random(m) * (1.8 - 1.1) + 1.1
        ys = rng.random(m) * (0.4 + 0.4) - 0.4
        return np.stack([xs, ys], axis=1)

    def back_deep(m: int) -> np.ndarray:
        xs = rng.random(m) * (-0.6 + 1.6) - 1.6
        ys = rng.random(m) * (-0.2 + 1.0) - 1.0
        return np.stack([xs, ys], axis=1)

    def side_high(m: int) -> np.ndarray:
        xs = rng.random(m) * (0.4 + 0.4) - 0.4
        ys = rng.random(m) * (1.5 - 0.8) + 0.8
        return np.stack([xs, ys], axis=1)

    sizes = np.full(NUM_GROUPS, task_num // NUM_GROUPS, dtype=int)
    sizes[: task_num % NUM_GROUPS] += 1
    group = np.concatenate([g * np.ones(s, dtype=int) for g, s in enumerate(sizes)])
    rng.shuffle(group)

    lengths = np.zeros((task_num, dim))
    angular = np.zeros(task_num)
    sigma = np.zeros(task_num)
    targets = np.zeros((task_num, MAX_TARGETS, 2))
    num_targets = np.zeros(task_num, dtype=np.int64)
    angular_range = ((0.4, 0.9), (0.9, 1.5), (0.3, 1.3), (0.5, 1.6))
    for k in range(task_num):
        g = int(group[k])
        pattern = np.maximum(patterns[g] * np.exp(0.35 * rng.standard_normal(dim)), 0.05)
        pattern = pattern / pattern.sum()
        lengths[k] = (0.6 + (1.6 - 0.6) * rng.random()) * pattern
        lo, hi = angular_range[g]
        angular[k] = lo + (hi - lo) * rng.random()
        if g == 0:
            t = front_far(3)
        elif g == 1:
            t = back_deep(3)
        elif g == 2:
            t = np.vstack([front_far(1), side_high(1), back_deep(1)])
        else:
            t = np.vstack([front_far(2), back_deep(2), side_high(1)])
        targets[k, : len(t)] = t
        num_targets[k] = len(t)
        if g == 0:
            sigma[k] = (0.003 - 0.0) * rng.random()
        elif g == 1:
            sigma[k] = 0.01 + (0.025 - 0.01) * rng.random()
        elif g == 2:
            sigma[k] = (0.015 - 0.0) * rng.random()
        else:
            sigma[k] = 0.02 + (0.04 - 0.02) * rng.random()
    return {
        "group": group.astype(np.int64),
        "lengths": lengths,
        "angular_factor": angular,
        "noise_sigma": sigma,
        "targets": targets,
        "num_targets": num_targets,
    }


def mean_distance(X: Tensor, lengths: Tensor, angular_factor: Tensor, targets: Tensor, weights: Tensor) -> Tensor:
    r"""The arms' mean distance to their targets (pyfmto's ``f``, to minimize), batched.

    Args:
        X: ``k x q x d`` joint settings in ``[0, 1]``.
        lengths: ``k x d`` link lengths.
        angular_factor: ``k`` angular factors.
        targets: ``k x m x 2`` targets (padded).
        weights: ``k x m`` ``1 / m_n`` for a task's targets, 0 for padding.

    Returns:
        ``k x q`` mean distances, differentiable in ``X``.
    """
    angles = (X - 0.5) * angular_factor.view(-1, 1, 1) * 2.0 * math.pi  # pyfmto's operation order
    theta = torch.zeros_like(X[..., 0])
    ex = torch.zeros_like(theta)
    ey = torch.zeros_like(theta)
    for i in range(X.shape[-1]):  # the joints, in order (cumulative angles as pyfmto sums them)
        theta = theta + angles[..., i]
        link = lengths[:, i : i + 1]
        ex = ex + link * torch.cos(theta)
        ey = ey + link * torch.sin(theta)
    total = torch.zeros_like(theta)
    for j in range(targets.shape[-2]):  # the targets in order (a padded one adds an exact 0)
        real = weights[:, j : j + 1] > 0
        dx = targets[:, j : j + 1, 0] - ex
        dy = targets[:, j : j + 1, 1] - ey
        # a padded target adds 0, with a finite gradient even where e sits on the padded point
        total = total + torch.where(real, torch.sqrt(torch.where(real, dx**2 + dy**2, 1.0)), 0.0)
    count = (weights > 0).sum(-1, keepdim=True).to(X.dtype)
    return total / count


def geometric_median_value(targets: Tensor, weights: Tensor, iterations: int = 200) -> Tensor:
    r"""``min_e Σ_j w_j ‖t_j - e‖`` over the whole plane: a lower bound on each arm's minimum.

    Weiszfeld's iteration (with Vardi & Zhang's correction when an iterate lands on a
    target), from the weighted centroid; the function is convex in ``e``, the value
    converges from above, and the smaller of the final iterate's value and the best
    target's value is returned.

    Args:
        targets: ``k x m x 2``.
        weights: ``k x m`` (rows sum to 1; 0 for padding).
        iterations: Weiszfeld steps.

    Returns:
        ``k`` values (float64 for float64 inputs).
    """

    def value(e: Tensor) -> Tensor:
        return (weights * (targets - e.unsqueeze(-2)).norm(dim=-1)).sum(-1)

    e = (weights.unsqueeze(-1) * targets).sum(-2)
    for _ in range(iterations):
        dist = (targets - e.unsqueeze(-2)).norm(dim=-1)
        at = (dist < 1e-300) & (weights > 0)
        inv = torch.where(at | (weights == 0), torch.zeros_like(dist), weights / dist.clamp_min(1e-300))
        step = (inv.unsqueeze(-1) * targets).sum(-2) / inv.sum(-1, keepdim=True).clamp_min(1e-300)
        # Vardi-Zhang: at a target, move only if the pull of the others exceeds its weight
        pull = (inv.unsqueeze(-1) * (targets - e.unsqueeze(-2))).sum(-2)
        w_at = (weights * at).sum(-1, keepdim=True)
        r = pull.norm(dim=-1, keepdim=True)
        eta = torch.where(at.any(-1, keepdim=True), (1 - w_at / r.clamp_min(1e-300)).clamp_min(0), torch.ones_like(r))
        e = e + eta * (step - e)
    at_targets = (weights.unsqueeze(-1) * (targets.unsqueeze(-2) - targets.unsqueeze(-3)).norm(dim=-1)).sum(-2)
    at_targets = torch.where(weights > 0, at_targets, torch.full_like(at_targets, math.inf))
    return torch.minimum(value(e), at_targets.amin(-1))


def arm_optimum(
    lengths: Tensor,
    angular_factor: Tensor,
    targets: Tensor,
    weights: Tensor,
    num_raw: int = 2048,
    num_restarts: int = 64,
    num_polish: int = 8,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Each arm's minimum of the mean distance over ``[0, 1]^d``, by multi-start batched BFGS.

    ``num_raw`` scrambled-Sobol points per task (the same for every task, seed 0); the
    ``num_restarts`` best of each task refined together by box-constrained BFGS in
    float64 (:func:`~fbo_torch.optim.quasi_newton.minimize_batched`, 100 iterations);
    then the ``num_polish`` best end points of each task refined to convergence (300
    iterations, 12 candidate steps per line search down to ``4^-11`` of the
    quasi-Newton step and up to 4 times it, projected gradient ``1e-10``). Where the arm is
    stretched (the optimum on the boundary of its reachable set) the function is badly
    conditioned: the first stage's 4-step line search can stall there ``1e-6`` above the
    minimum, the second's does not.

    Args:
        lengths: ``N x d``.
        angular_factor: ``N``.
        targets: ``N x m x 2``.
        weights: ``N x m``.
        num_raw: Sobol points per task.
        num_restarts: Restarts per task.
        num_polish: Restarts per task refined to convergence.

    Returns:
        ``(f_min, x_min, f_polished)``: ``N`` minima, ``N x d`` minimizers and the ``N x
        num_polish`` end values of the polished restarts, sorted ascending.
    """
    from fbo_torch.optim.quasi_newton import minimize_batched

    N, d = lengths.shape
    dtype = torch.float64
    L, a, T, W = (t.to(dtype) for t in (lengths, angular_factor, targets, weights))
    sobol = torch.quasirandom.SobolEngine(d, scramble=True, seed=0).draw(num_raw, dtype=dtype)
    raw = mean_distance(sobol.expand(N, -1, -1), L, a, T, W)  # N x num_raw
    k = min(num_restarts, num_raw)
    x = sobol[raw.topk(k, dim=-1, largest=False).indices]  # N x k x d

    def value_and_grad(x: Tensor) -> tuple[Tensor, Tensor]:  # (N m) x d -> (N m), (N m) x d
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            y = mean_distance(x.view(N, -1, d), L, a, T, W).reshape(-1)
            (g,) = torch.autograd.grad(y.sum(), x)
        return y.detach(), g

    x = minimize_batched(value_and_grad, x.reshape(-1, d), lower=0.0, upper=1.0, maxiter=100).x.view(N, k, d)
    m = min(num_polish, k)
    first = mean_distance(x, L, a, T, W)
    x = x.gather(1, first.topk(m, dim=-1, largest=False).indices.unsqueeze(-1).expand(N, m, d))
    x = minimize_batched(
        value_and_grad,
        x.reshape(-1, d),
        lower=0.0,
        upper=1.0,
        maxiter=300,
        num_steps=12,
        max_step=4.0,
        gtol=1e-10,
        ftol=1e-15,
    ).x.view(N, m, d)
    values = mean_distance(x, L, a, T, W)
    f_polished, order = values.sort(-1)
    return f_polished[:, 0], x[torch.arange(N), order[:, 0]], f_polished


class Gecco2020(Objective):
    r"""pyfmto's ``gecco2020``: ``task_num`` planar-arm agents in four groups, noisy.

    Agent ``n`` is pyfmto's task ``n + 1`` (module docstring); its value at
    ``x ∈ [0, 1]^d`` is ``-f_n(x)``, observed with ``N(0, σ_n²)`` noise. Every agent
    can be a target (``targets`` holds them all); ``group_of_agent`` holds the four
    groups, so FTS experiments' default peers of an agent are the other agents of
    its group (give ``others`` explicitly to use every agent, as pyfmto's clients do).

    Args:
        dim: ``d``, at least 2 (pyfmto's range 2–50; larger works).
        task_num: ``N``, at least 1.
        seed: Seed of the task generator (``numpy.random.default_rng``); pyfmto's default 123.
        noise_seed: Seed of :attr:`noise_generator` (observations without keys).

    Attributes:
        group_of_agent: ``N`` groups in ``0..3``. lengths: ``N x d`` link lengths.
        angular_factor: ``N``. noise_sigma: ``N`` noise standard deviations ``σ_n``.
        arm_targets: ``N x 5 x 2`` targets (rows beyond ``num_targets`` are zero).
        num_targets: ``N`` (3 or 5). optimum: ``N`` maxima of ``-f_n`` (computed on
        first access, module docstring). optimum_certified: ``N`` booleans.
    """

    def __init__(self, dim: int = 10, task_num: int = 50, seed: int = PYFMTO_SEED, noise_seed: int = 0) -> None:
        params = generate_tasks(dim, task_num, seed)
        noise_seed = check_int("noise_seed", noise_seed, minimum=0)
        self.seed = int(seed)
        self.noise_seed = noise_seed
        self.num_agents = int(task_num)
        self.bounds = torch.tensor([[0.0] * dim, [1.0] * dim], dtype=torch.float64)
        self.targets = torch.arange(self.num_agents)
        self.group_of_agent = torch.from_numpy(params["group"])
        self.lengths = torch.from_numpy(params["lengths"])
        self.angular_factor = torch.from_numpy(params["angular_factor"])
        self.noise_sigma = torch.from_numpy(params["noise_sigma"])
        self.arm_targets = torch.from_numpy(params["targets"])
        self.num_targets = torch.from_numpy(params["num_targets"])
        idx = torch.arange(MAX_TARGETS)
        self._weights = torch.where(
            idx < self.num_targets.unsqueeze(-1), 1.0 / self.num_targets.unsqueeze(-1).double(), 0.0
        ).to(torch.float64)
        self.noise_generator = torch.Generator().manual_seed(noise_seed)
        self._optimum: Tensor | None = None
        self._certified: Tensor | None = None
        self._x_optimum: Tensor | None = None

    # ----------------------------------------------------------------- optimum
    @property
    def optimum(self) -> Tensor:
        """``N`` maxima of the noiseless values, ``-min f_n`` (computed once per problem and process, float64)."""
        if self._optimum is None:
            key = (self.dim, self.num_agents, self.seed)
            if key not in _OPTIMA:
                f_min, x_min, _ = arm_optimum(self.lengths, self.angular_factor, self.arm_targets, self._weights)
                bound = geometric_median_value(self.arm_targets, self._weights)
                _OPTIMA[key] = (-f_min, x_min, f_min - bound <= CERTIFY_ATOL)
            self._optimum, self._x_optimum, self._certified = (t.clone() for t in _OPTIMA[key])
        return self._optimum

    @optimum.setter
    def optimum(self, value: Tensor | None) -> None:
        self._optimum = value

    @property
    def optimizer(self) -> Tensor:
        """``N x d`` points where :attr:`optimum` is attained (unit box)."""
        self.optimum  # noqa: B018  (computes it)
        assert self._x_optimum is not None
        return self._x_optimum

    @property
    def optimum_certified(self) -> Tensor:
        """``N`` booleans: the task's computed optimum meets the geometric-median bound (exact to 1e-9)."""
        self.optimum  # noqa: B018
        assert self._certified is not None
        return self._certified

    # -------------------------------------------------------------- evaluation
    def _f(self, X: Tensor, agents: Tensor) -> Tensor:
        on = self._on
        return mean_distance(
            X,
            on(X.device, "lengths").to(X.dtype)[agents],
            on(X.device, "angular_factor").to(X.dtype)[agents],
            on(X.device, "arm_targets").to(X.dtype)[agents],
            on(X.device, "_weights").to(X.dtype)[agents],
        )

    def _sigma(self, values: Tensor, agents: Tensor) -> Tensor:
        return self._on(values.device, "noise_sigma").to(values.dtype)[agents].unsqueeze(-1)

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        values = -self._f(X, agents.to(X.device))
        if not noise:
            return values
        eps = torch.randn(values.shape, dtype=values.dtype, generator=self.noise_generator)
        return values + self._sigma(values, agents.to(X.device)) * eps.to(values.device)

    def observe(
        self, X: Tensor, keys: Tensor, agents: Tensor | None = None, validate: bool = True
    ) -> tuple[Tensor, Tensor]:
        r"""Keyed noisy observations ``-f_n + σ_n ε`` (``ε`` from agent ``n``'s key) and the noiseless values.

        Args:
            X: ``k x q x d``.
            keys: ``k`` int64 noise keys.
            agents: Optional ``k`` agent indices.
            validate: As in ``__call__``.

        Returns:
            ``(Y, F)``, both ``k x q``.
        """
        X, agents = self._check(X, agents) if validate else (X, self._agents(X, agents))
        values = -self._f(X, agents)
        eps = kr.normal(keys.to(X.device), X.shape[1], dtype=values.dtype)
        return values + self._sigma(values, agents) * eps, values

    def __repr__(self) -> str:
        return f"Gecco2020(dim={self.dim}, task_num={self.num_agents}, seed={self.seed})"


__all__ = ["Gecco2020", "arm_optimum", "generate_tasks", "geometric_median_value", "mean_distance"]
