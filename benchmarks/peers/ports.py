r"""Benchmark-only ports of pyfmto's ``tevc2024`` and ``arxiv2017``, and every peer problem by name.

Both suites rotate and shift classic functions with matrices that fmto ships as
MATLAB files (``problems/tevc2024/composition_func_M_D10.mat``,
``problems/arxiv2017/datasets/*.mat``). Those files are not part of fbo_torch:
these ports read them at run time from a checkout of Xiaoxu-Zhang/fmto given
as ``fmto`` (``--fmto`` in the scripts), so they live here, beside the
benchmark scripts, not in the package.

How pyfmto transforms a task (``pyfmto.problem.SingleTaskProblem``, pyfmto
0.3.4): ``set_transform(rotation=R, shift=s)`` stores ``R.T``, and
``evaluate(x)`` computes ``φ(clip((x - s) @ R.T, lb, ub))`` — the
*transformed argument* ``z = R (x - s)`` clipped to the task's box, as for
``tetci2019`` (identity ``R`` and zero ``s`` where none is given). Its
``x_global`` is ``z* @ inv(R) + s`` with ``z*`` the base function's minimizer
(0; 1 for Rosenbrock; 420.9687 for Schwefel), and ``y_global = evaluate(x_global)``.
Two consequences, both reproduced by :attr:`TransformedTasks.y_global_pyfmto`:

* ``z* @ inv(R)`` is ``inv(R)ᵀ z*``, not the inverse ``inv(R) z*`` of the
  transform: right only for a symmetric ``R`` (or ``z* = 0``). Every task whose
  ``z* = 0`` (and every unrotated task) gets the right ``y_global``; a rotated
  Rosenbrock or Schwefel does not — ``tevc2024`` with ``src_problem`` Rosenbrock
  (``y_global`` 1.4e3–3.6e3 at ``d = 10`` where the minimum is 0) or Schwefel.
  In ``arxiv2017`` the Rosenbrock and Schwefel tasks are unrotated: all its
  ``y_global`` are right.
* pyfmto takes the leading ``d x d`` block of the stored ``50 x 50``
  (``arxiv2017``) or ``10 x 10`` (``tevc2024``) rotations: below the full size
  the "rotation" is a general linear map (``tevc2024`` at ``d = 5``: ``‖RRᵀ - I‖``
  up to 0.44, condition numbers up to 68). Ported as is.

:attr:`TransformedTasks.y_global` is the right value: ``φ(z*)``, a lower bound on
the task's minimum over its box, attained where the preimage ``s + inv(R) z*`` lies
in the box (:attr:`TransformedTasks.optimum_attained`: every task of ``arxiv2017``
and of ``tevc2024`` with its default Ackley; not most rotated Schwefels, nor
Rosenbrock's task 8 at ``d = 5``); ``optimum = -y_global``. Where pyfmto's ``y_global`` is the
larger, a regret against it can be negative.

fmto's own quirks, kept: ``arxiv2017`` task 17 (Rastrigin, rotation of ``NI_L``)
takes its shift from ``NI_M``'s ``GO_Task1`` (10 in every coordinate), not
``NI_L``'s (0); tasks 6 and 18 are the same function, and so are 10 and 13; for
``d > 25`` task 12 (Weierstrass) is left out (17 tasks). fmto's ``tevc2024`` looks
for its file under ``problems/datasets/tevc2024/``, where the checkout does not have
it (pyfmto cannot load the problem); it is read here from where fmto ships it.

fbo_torch's conventions, as in :class:`~fbo_torch.objectives.tetci2019.Tetci2019`:
agents share ``[0, 1]^d`` (``x = lb + (ub - lb) u``), values are maximized
(``-f``), noiseless; evaluation is batched over the agents (one call per function
family, one batched matrix product for the rotations).

:func:`build_objective` returns the fbo_torch objective for a pyfmto results
file's header, for every problem ported so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fbo_torch.objectives.base import Objective
from fbo_torch.objectives.tetci2019 import FUNCTIONS, MINIMIZER, family_values


def _ellipsoid(Z: Tensor) -> Tensor:
    i = torch.arange(1, Z.shape[-1] + 1, dtype=Z.dtype, device=Z.device)
    return (i * Z**2).sum(-1)


#: pyfmto's base functions ``φ`` (``problems/benchmarks``) on ``... x d`` arguments.
PHI = {**FUNCTIONS, "ellipsoid": _ellipsoid}
#: Each base function's default box ``[-b, b]`` in pyfmto (what ``tevc2024`` uses).
DEFAULT_HALF_WIDTH = {
    "ackley": 32.768,
    "griewank": 600.0,
    "rastrigin": 5.0,
    "schwefel": 500.0,
    "sphere": 100.0,
    "rosenbrock": 2.048,
    "weierstrass": 0.5,
    "ellipsoid": 5.12,
}
#: Where the file of ``tevc2024`` lies in fmto's checkout (fmto's own code looks in ``problems/datasets/tevc2024``).
TEVC2024_FILES = (
    "problems/tevc2024/composition_func_M_D10.mat",
    "problems/datasets/tevc2024/composition_func_M_D10.mat",
)
#: ``arxiv2017``'s 18 tasks: (function, half width of the box, file, rotation key, file, shift key); ``None``:
#: none. Task 17's shift comes from ``NI_M`` (fmto's code).
ARXIV2017: tuple[tuple[str, float, str | None, str | None, str | None, str | None], ...] = (
    ("griewank", 100.0, "CI_H", "Rotation_Task1", "CI_H", "GO_Task1"),
    ("rastrigin", 50.0, "CI_H", "Rotation_Task2", "CI_H", "GO_Task2"),
    ("ackley", 50.0, "CI_M", "Rotation_Task1", "CI_M", "GO_Task1"),
    ("rastrigin", 50.0, "CI_M", "Rotation_Task2", "CI_M", "GO_Task2"),
    ("ackley", 50.0, "CI_L", "Rotation_Task1", "CI_L", "GO_Task1"),
    ("schwefel", 500.0, None, None, None, None),
    ("rastrigin", 50.0, "PI_H", "Rotation_Task1", "PI_H", "GO_Task1"),
    ("sphere", 100.0, None, None, "PI_H", "GO_Task2"),
    ("ackley", 50.0, "PI_M", "Rotation_Task1", "PI_M", "GO_Task1"),
    ("rosenbrock", 50.0, None, None, None, None),
    ("ackley", 50.0, "PI_L", "Rotation_Task1", "PI_L", "GO_Task1"),
    ("weierstrass", 0.5, "PI_L", "Rotation_Task2", "PI_L", "GO_Task2"),
    ("rosenbrock", 50.0, None, None, None, None),
    ("rastrigin", 50.0, "NI_H", "Rotation_Task2", "NI_H", "GO_Task2"),
    ("griewank", 100.0, "NI_M", "Rotation_Task1", "NI_M", "GO_Task1"),
    ("weierstrass", 0.5, "NI_M", "Rotation_Task2", "NI_M", "GO_Task2"),
    ("rastrigin", 50.0, "NI_L", "Rotation_Task1", "NI_M", "GO_Task1"),
    ("schwefel", 500.0, None, None, None, None),
)
#: The minimum counts as attained where the value at the box point nearest ``z*``'s preimage is within
#: this (relative, at least absolute) of ``y_global``: the rounding of ``R inv(R) z*``.
ATTAINED_ATOL = 1e-9
#: ``tevc2024``'s base functions (``src_problem``), by pyfmto's class names.
TEVC2024_SOURCES = ("Ackley", "Griewank", "Rastrigin", "Rosenbrock", "Schwefel", "Sphere", "Weierstrass", "Ellipsoid")


def _loadmat(path: Path) -> dict[str, np.ndarray]:
    from scipy.io import loadmat

    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: `fmto` must be a checkout of Xiaoxu-Zhang/fmto.")
    return {k: np.asarray(v, dtype=np.float64) for k, v in loadmat(str(path)).items() if not k.startswith("__")}


class TransformedTasks(Objective):
    r"""Rotated and shifted classic functions, one per agent, as pyfmto evaluates them.

    Agent ``n``'s value at ``u ∈ [0, 1]^d`` is ``-φ_n(clip(R_n (x - s_n), lb_n, ub_n))``
    with ``x = lb_n + (ub_n - lb_n) u`` (module docstring).

    Args:
        names: ``N`` base functions (keys of :data:`PHI`).
        half_widths: ``N`` box half widths (every box is ``[-b, b]^d``).
        rotations: ``N`` ``d x d`` matrices ``R_n`` as given to pyfmto's ``set_transform``, or ``None``.
        shifts: ``N`` ``d`` shifts, or ``None``.
        labels: ``N`` task names for messages and reports.

    Attributes:
        lb, ub: ``N x d``. rotation_t: ``N x d x d`` ``R_nᵀ`` (identity where none). shift: ``N x d``.
        rotated: ``N`` booleans. y_global: ``N`` ``φ_n(z*)`` (right; a lower bound, attained where
        ``optimum_attained``, at ``optimizer_original``: ``N x d`` in original units).
        y_global_pyfmto: ``N`` pyfmto's ``y_global``. optimum: ``-y_global``.
    """

    def __init__(
        self,
        names: Sequence[str],
        half_widths: Sequence[float],
        rotations: Sequence[np.ndarray | None],
        shifts: Sequence[np.ndarray | None],
        labels: Sequence[str] | None = None,
    ) -> None:
        N = len(names)
        if not N or len(half_widths) != N or len(rotations) != N or len(shifts) != N:
            raise ValueError("`names`, `half_widths`, `rotations` and `shifts` must have the same, nonzero length.")
        unknown = sorted(set(names) - set(PHI))
        if unknown:
            raise ValueError(f"`names`: unknown base functions {unknown}; expected some of {sorted(PHI)}.")
        d = next((len(s) for s in shifts if s is not None), None) or next(
            (len(r) for r in rotations if r is not None), None
        )
        if d is None:
            raise ValueError("at least one task needs a rotation or a shift (they fix the dimension).")
        self.names = list(names)
        self.labels = list(labels) if labels is not None else [f"{n + 1}: {name}" for n, name in enumerate(names)]
        self.num_agents = N
        self.bounds = torch.tensor([[0.0] * d, [1.0] * d], dtype=torch.float64)
        self.targets = torch.arange(N)
        b = torch.tensor(half_widths, dtype=torch.float64).unsqueeze(-1).expand(N, d)
        self.lb, self.ub = (-b).contiguous(), b.contiguous()
        eye = np.eye(d)
        R = [eye if r is None else np.asarray(r, dtype=np.float64) for r in rotations]
        S = [np.zeros(d) if s is None else np.asarray(s, dtype=np.float64).reshape(-1) for s in shifts]
        if any(r.shape != (d, d) for r in R) or any(s.shape != (d,) for s in S):
            raise ValueError(f"every rotation must be {d} x {d} and every shift of length {d}.")
        self.rotated = torch.tensor([r is not None for r in rotations])
        self.rotation_t = torch.from_numpy(np.stack([r.T for r in R]).copy())
        self.shift = torch.from_numpy(np.stack(S))
        self._families = tuple(dict.fromkeys(self.names))
        self._family_of_agent = torch.tensor([self._families.index(name) for name in self.names])

        z_star = np.stack([np.full(d, MINIMIZER.get(name, 0.0)) for name in self.names])
        zs = torch.from_numpy(z_star)
        agents = torch.arange(N)
        self.y_global = self._phi(zs.unsqueeze(-2), agents).squeeze(-1)
        self.optimum = -self.y_global
        # the preimage of z*, x = s + inv(R) z*, moved into the box: attains y_global where it was inside
        # (or where φ is flat, as Rosenbrock at d = 1), up to the rounding of R inv(R) z*
        x_star = np.stack([s + np.linalg.solve(r, z) for r, s, z in zip(R, S, z_star, strict=True)])
        self.optimizer_original = torch.minimum(torch.maximum(torch.from_numpy(x_star), self.lb), self.ub)
        at = self.evaluate_original(self.optimizer_original.unsqueeze(-2), agents).squeeze(-1)
        self.optimum_attained = at - self.y_global <= ATTAINED_ATOL * self.y_global.abs().clamp_min(1.0)
        # pyfmto's x_global = z* @ inv(R) + s, and its value
        x_pyfmto = np.stack([z @ np.linalg.inv(r) + s for r, s, z in zip(R, S, z_star, strict=True)])
        self.y_global_pyfmto = self.evaluate_original(torch.from_numpy(x_pyfmto).unsqueeze(-2), agents).squeeze(-1)

    def _phi(self, Z: Tensor, agents: Tensor) -> Tensor:
        return family_values(Z, self._on(Z.device, "_family_of_agent")[agents], self._families, PHI)

    def transform(self, X: Tensor, agents: Tensor | None = None) -> Tensor:
        r"""The base functions' arguments ``clip((X - s_n) R_nᵀ, lb_n, ub_n)`` (pyfmto's ``before_eval``).

        Args:
            X: ``k x q x d`` points in the agents' original units. agents: ``k`` agents (default: all).

        Returns:
            ``k x q x d``.
        """
        agents = self._agents(X, agents).to(X.device)
        lb = self._on(X.device, "lb").to(X.dtype)[agents].unsqueeze(-2)
        ub = self._on(X.device, "ub").to(X.dtype)[agents].unsqueeze(-2)
        shift = self._on(X.device, "shift").to(X.dtype)[agents].unsqueeze(-2)
        Z = X - shift
        rotated = self._on(X.device, "rotated")[agents]
        # pyfmto multiplies by the identity where there is no rotation (exact): skipped there
        rotation_t = self._on(X.device, "rotation_t").to(X.dtype)[agents]
        Z = torch.where(rotated.view(-1, 1, 1), torch.matmul(Z, rotation_t), Z)
        return torch.minimum(torch.maximum(Z, lb), ub)

    def evaluate_base(self, Z: Tensor, agents: Tensor | None = None) -> Tensor:
        """The base functions ``φ_n`` at ``k x q x d`` arguments (as :meth:`transform` returns them): ``k x q``."""
        return self._phi(Z, self._agents(Z, agents).to(Z.device))

    def evaluate_original(self, X: Tensor, agents: Tensor | None = None) -> Tensor:
        r"""pyfmto's ``f_n`` (to minimize) at ``k x q x d`` points in the agents' original units.

        Returns:
            ``k x q`` values, as pyfmto's ``task.evaluate`` returns them.
        """
        agents = self._agents(X, agents).to(X.device)
        return self._phi(self.transform(X, agents), agents)

    def to_original(self, U: Tensor, agents: Tensor | None = None) -> Tensor:
        """Unit-box points ``k x q x d`` in the agents' original units: ``lb + (ub - lb) U``."""
        agents = self._agents(U, agents).to(U.device)
        lb = self._on(U.device, "lb").to(U.dtype)[agents].unsqueeze(-2)
        ub = self._on(U.device, "ub").to(U.dtype)[agents].unsqueeze(-2)
        return lb + (ub - lb) * U

    def to_unit(self, X: Tensor, agent: int) -> Tensor:
        """Agent ``agent``'s points in original units (``... x d``) on the unit box."""
        from fbo_torch.objectives.tetci2019 import to_unit

        return to_unit(X, self.lb[agent], self.ub[agent])

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        return -self.evaluate_original(self.to_original(X, agents), agents)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim}, num_agents={self.num_agents})"


def tevc2024(dim: int, fmto: Path | str, src_problem: str = "Ackley") -> TransformedTasks:
    r"""pyfmto's ``tevc2024``: 10 tasks, the base function ``src_problem`` on its default box,
    task ``i`` rotated by the leading ``d x d`` block of ``M{i}`` (no shift).

    Args:
        dim: ``d`` in ``[1, 10]``.
        fmto: A checkout of Xiaoxu-Zhang/fmto.
        src_problem: pyfmto's class name of the base function (:data:`TEVC2024_SOURCES`).
    """
    if not isinstance(dim, int) or not 1 <= dim <= 10:
        raise ValueError(f"`dim` must be an integer in [1, 10] (tevc2024's matrices are 10 x 10), got {dim!r}.")
    if src_problem not in TEVC2024_SOURCES:
        raise ValueError(f"`src_problem` must be one of {list(TEVC2024_SOURCES)}, got {src_problem!r}.")
    root = Path(fmto)
    path = next((root / p for p in TEVC2024_FILES if (root / p).is_file()), root / TEVC2024_FILES[0])
    mats = _loadmat(path)
    name = src_problem.lower()
    rotations = [mats[f"M{i + 1}"][:dim, :dim] for i in range(10)]
    return TransformedTasks(
        [name] * 10,
        [DEFAULT_HALF_WIDTH[name]] * 10,
        rotations,
        [None] * 10,
        labels=[f"{i + 1}: {src_problem} (M{i + 1})" for i in range(10)],
    )


def arxiv2017(dim: int, fmto: Path | str) -> TransformedTasks:
    r"""pyfmto's ``arxiv2017``: 18 rotated and shifted tasks (17 for ``d > 25``), see :data:`ARXIV2017`.

    Args:
        dim: ``d`` in ``[1, 50]``.
        fmto: A checkout of Xiaoxu-Zhang/fmto.
    """
    if not isinstance(dim, int) or not 1 <= dim <= 50:
        raise ValueError(f"`dim` must be an integer in [1, 50], got {dim!r}.")
    folder = Path(fmto) / "problems" / "arxiv2017" / "datasets"
    files: dict[str, dict[str, np.ndarray]] = {}

    def read(file: str | None, key: str | None, vector: bool) -> np.ndarray | None:
        if file is None or key is None:
            return None
        if file not in files:
            files[file] = _loadmat(folder / f"{file}.mat")
        a = files[file][key]
        return a.reshape(-1)[:dim] if vector else a[:dim, :dim]

    tasks = [(n, t) for n, t in enumerate(ARXIV2017) if dim <= 25 or n != 11]
    return TransformedTasks(
        [t[0] for _, t in tasks],
        [t[1] for _, t in tasks],
        [read(t[2], t[3], False) for _, t in tasks],
        [read(t[4], t[5], True) for _, t in tasks],
        labels=[f"{n + 1}: {t[0]}" for n, t in tasks],
    )


def _problem_name(meta: dict[str, Any]) -> str:
    problem = meta.get("problem")
    if not isinstance(problem, str):
        raise ValueError(f"`meta['problem']` must be a problem name, got {problem!r}.")
    # run_pyfmto.py accepts fmto's folder name (tetci2019) or class name (Tetci2019, SvmLandmine)
    return {"svmlandmine": "svm_landmine"}.get(problem.lower(), problem.lower())


def build_objective(meta: dict[str, Any], fmto: Path | None) -> Objective:
    r"""The fbo_torch objective that evaluates the same functions as a pyfmto results file's problem.

    Args:
        meta: The header of a results file (``benchmarks/results/peers/pyfmto/*.json``):
            ``problem``, ``dim`` and optionally ``problem_kwargs`` (e.g. ``task_num`` and
            ``seed`` for ``gecco2020``, ``src_problem`` for ``tevc2024``).
        fmto: A checkout of Xiaoxu-Zhang/fmto (needed by ``tevc2024`` and ``arxiv2017``,
            whose matrices are read from it; ignored by the others).

    Returns:
        ``tetci2019``: :class:`~fbo_torch.objectives.tetci2019.Tetci2019`;
        ``svm_landmine``: :class:`~fbo_torch.objectives.landmine.LandmineSVM` on pyfmto's linear
        box with Platt scoring; ``gecco2020``: :class:`~fbo_torch.objectives.gecco2020.Gecco2020`;
        ``tevc2024``, ``arxiv2017``: :class:`TransformedTasks`.

    Raises:
        ValueError: An unknown problem, a missing or bad ``dim``, unknown ``problem_kwargs``,
            or no ``fmto`` for a problem that needs it.
    """
    problem = _problem_name(meta)
    dim = meta.get("dim")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise ValueError(f"`meta['dim']` must be an integer, got {dim!r}.")
    kwargs = dict(meta.get("problem_kwargs") or {})

    def only(*allowed: str) -> None:
        extra = sorted(set(kwargs) - set(allowed))
        if extra:
            raise ValueError(f"`meta['problem_kwargs']`: {problem} takes {list(allowed)}, got {extra}.")

    def need_fmto() -> Path:
        if fmto is None:
            raise ValueError(f"{problem} reads its matrices from fmto's checkout: pass `fmto` (--fmto).")
        return Path(fmto)

    if problem == "tetci2019":
        from fbo_torch.objectives.tetci2019 import Tetci2019

        only()
        return Tetci2019(dim=dim)
    if problem == "svm_landmine":
        from fbo_torch.objectives.landmine import LandmineSVM
        from fbo_torch.objectives.search_space import Real, SearchSpace

        only()
        if dim != 2:
            raise ValueError(f"svm_landmine has 2 dimensions (C, gamma), got `meta['dim']` = {dim}.")
        return LandmineSVM(
            search_space=SearchSpace([Real("C", 1e-4, 10.0), Real("gamma", 1e-2, 10.0)]), scoring="platt"
        )
    if problem == "gecco2020":
        from fbo_torch.objectives.gecco2020 import PYFMTO_SEED, Gecco2020

        only("task_num", "seed")
        # pyfmto's defaults: 50 tasks, seed 123
        return Gecco2020(dim=dim, task_num=kwargs.get("task_num", 50), seed=kwargs.get("seed", PYFMTO_SEED))
    if problem == "tevc2024":
        only("src_problem")
        return tevc2024(dim, need_fmto(), src_problem=kwargs.get("src_problem", "Ackley"))
    if problem == "arxiv2017":
        only()
        return arxiv2017(dim, need_fmto())
    raise ValueError(
        f"unknown problem {meta.get('problem')!r}; expected tetci2019, svm_landmine, gecco2020, tevc2024 or arxiv2017."
    )


__all__ = ["ARXIV2017", "PHI", "TransformedTasks", "arxiv2017", "build_objective", "tevc2024"]
