r"""Posterior gain: what each query told its agent, measured on one GP fitted after the run.

The accounting's *incumbent gain* (:func:`~fbo_torch.experiments.accounting.incumbent_gains`) is what a
round did to the agent's best noiseless value — a number only a simulator knows, and zero for every
query that was informative without being the best so far. The *posterior gain* is what the agent
itself could tell from its observations: each run is measured by one GP fitted to all its
observations (a fixed measuring stick, the same for a federated method and its local counterfactual),
and each round's query is credited with

* ``belief_gain``: the change of the agent's belief about its best value — the maximum of the GP's
  posterior mean over the inputs observed so far (BoTorch's in-sample recommendation, the plug-in
  incumbent), in the objective's units. It is signed: an observation can show that the agent's best
  guess was optimistic;
* ``information``: the information the observation carried about the agent's function,
  ``I(f; y_t | y_<t) = ½ log(1 + σ²_{t-1}(x_t) / σ²_n)`` nats — the term of GP-UCB's information-gain
  bound (Srinivas et al. 2010). A query next to what the agent has already seen carries little; one in
  unexplored space carries much, useful or not.

Both come from one Cholesky factorization per run: the leading ``m x m`` block of the Cholesky factor of
``K + σ²I`` over the run's inputs in query order is the factor of the first ``m`` observations, so its
diagonal gives every conditional variance (``L_mm² = σ²_{m-1}(x_m) + σ²_n``) and each prefix's
posterior mean is one back substitution. The measuring GP is BoTorch's ``SingleTaskGP`` model
(:class:`~fbo_torch.models.batched_gp.BatchedExactGP` with spec ``"botorch"``: Matérn-5/2 ARD,
``Normalize``\ d inputs over the objective's box, ``Standardize``\ d outcomes), its hyperparameters fitted
to the run's whole record — hindsight the agent did not have, so the numbers say what each query was worth
to the best model of the agent's data, not what the agent's own model made of it during the run.

Nothing here runs during a run: it reads the record's ``queries`` and ``observations``
(:func:`method_posterior_gains`), so ``fbo-torch report`` recomputes it for a finished run, and it costs
no privacy budget (the simulator's own records; no agent or server sees them).

Shapes: ``R`` runs, ``n = n_init + T`` observations per run, ``T`` rounds, ``d`` inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fbo_torch.models.batched_gp import BatchedExactGP

#: The GP spec of the measuring model (:data:`~fbo_torch.models.gp_spec.GP_SPECS`): BoTorch's ``SingleTaskGP``.
MEASURE_SPEC = "botorch"
#: Iteration cap of the measuring GP's fit (batched BFGS; every run stops on its own before).
MEASURE_MAXITER = 100


@dataclass
class PosteriorGains:
    r"""Per-run posterior gains of a method.

    Attributes:
        belief: ``R x (T+1)`` the maximum posterior mean over the inputs observed so far, after the initial
            points (column 0) and after each round, in the objective's units (NaN before any valid observation).
        belief_gain: ``R x T`` its change in each round (0 where it is undefined).
        information: ``R x T`` nats the round's observation carried about the function (0 for a failed evaluation).
    """

    belief: Tensor
    belief_gain: Tensor
    information: Tensor


def posterior_gains(queries: Tensor, observations: Tensor, rounds: int, bounds: Tensor | None = None) -> PosteriorGains:
    r"""Each round's posterior gain for every run (module docstring).

    Args:
        queries: ``R x n x d`` the runs' inputs in query order (the initial points first).
        observations: ``R x n`` what each query returned (NaN: a failed evaluation, left out of the GP).
        rounds: ``T``; the first ``n − T`` observations are the initial points.
        bounds: ``2 x d`` the objective's box (the GP's input normalization); default the box spanned by
            ``queries``.

    Returns:
        :class:`PosteriorGains`, float64 on ``queries``' device.
    """
    if queries.ndim != 3 or observations.shape != queries.shape[:2]:
        raise ValueError(
            f"`queries` and `observations` must be R x n x d and R x n, got {tuple(queries.shape)} and "
            f"{tuple(observations.shape)}."
        )
    R, n, d = queries.shape
    if not 0 <= rounds <= n:
        raise ValueError(f"`rounds` must be in [0, {n}] (the runs hold {n} observations), got {rounds}.")
    X = queries.to(torch.float64)
    y = observations.to(torch.float64)
    valid = y.isfinite() & X.isfinite().all(-1)
    X = torch.where(valid.unsqueeze(-1), X, 0.0)
    if bounds is None:
        big = torch.finfo(torch.float64).max
        lo = torch.where(valid.unsqueeze(-1), X, big).amin((0, 1))
        hi = torch.where(valid.unsqueeze(-1), X, -big).amax((0, 1))
        lo, hi = torch.where(hi > lo, lo, 0.0), torch.where(hi > lo, hi, 1.0)
        bounds = torch.stack([lo, hi])
    bounds = bounds.to(X)
    X = torch.where(valid.unsqueeze(-1), X, bounds[0])
    gp = BatchedExactGP(
        X, torch.where(valid, y, 0.0).unsqueeze(-1), bounds, spec=MEASURE_SPEC, mask=valid, validate=False
    ).fit(MEASURE_MAXITER)
    hp = gp.hyperparameters
    noise, c = hp["noise"].unsqueeze(-1), hp["mean"].unsqueeze(-1)  # R x 1, standardized units
    L = gp.cholesky  # R x n x n; a failed observation's row and column are the identity's
    n0 = n - rounds
    information = torch.where(valid, 0.5 * (L.diagonal(dim1=-2, dim2=-1).square() / noise).log(), 0.0)[:, n0:]
    r = torch.where(valid, gp.y - c, 0.0).unsqueeze(-1)
    z = torch.linalg.solve_triangular(L, r, upper=False)  # its first m entries are L_m⁻¹ r_m
    beliefs = []
    for m in range(n0, n + 1):  # rounds, not agents: every run at once
        if m == 0:
            beliefs.append(torch.full((R,), math.nan, dtype=X.dtype, device=X.device))
            continue
        Lm = L[:, :m, :m]
        alpha = torch.linalg.solve_triangular(Lm.mT, z[:, :m], upper=True).squeeze(-1)  # (K_m + σ²I)⁻¹ r_m
        mean = gp.y[:, :m] - noise * alpha  # the latent posterior mean at the first m inputs: y − σ² α
        best = torch.where(valid[:, :m], mean, -math.inf).amax(-1)
        beliefs.append(torch.where(best > -math.inf, gp.y_mean + gp.y_std * best, math.nan))
    belief = torch.stack(beliefs, -1)
    gain = (belief[:, 1:] - belief[:, :-1]).nan_to_num(0.0, posinf=0.0, neginf=0.0)
    return PosteriorGains(belief=belief, belief_gain=gain, information=information)


def method_posterior_gains(record: dict[str, Any], bounds: Any = None) -> PosteriorGains | None:
    r"""The posterior gains of a method record that holds its runs' ``queries`` and ``observations``.

    Args:
        record: A method's record of ``results.json``.
        bounds: The scenario's ``domain_bounds`` (``2 x d`` lists), if recorded.

    Returns:
        :func:`posterior_gains` of its runs, or ``None`` for a record without them (a run of an older
        version, or one too large to keep them) or whose shapes do not agree.
    """
    queries, observations, runs = record.get("queries"), record.get("observations"), record.get("runs")
    if not queries or not observations or not runs:
        return None
    X = torch.tensor(queries, dtype=torch.float64)
    # ``None`` (a failed evaluation, as :func:`~fbo_torch.experiments.report.none_if_nan` wrote it) read as NaN;
    # not through :func:`~fbo_torch.experiments.report.nan_for_none`: the report's tidy table names this module
    y = torch.tensor([[math.nan if v is None else float(v) for v in row] for row in observations], dtype=torch.float64)
    if X.ndim != 3 or y.shape != X.shape[:2] or X.shape[0] != len(runs):
        return None
    T = len(runs[0]) - 1
    if T > X.shape[1]:
        return None
    box = torch.tensor(bounds, dtype=torch.float64) if bounds is not None else None
    if box is not None and box.shape != (2, X.shape[-1]):
        box = None
    return posterior_gains(X, y, T, box)


__all__ = ["MEASURE_MAXITER", "MEASURE_SPEC", "PosteriorGains", "method_posterior_gains", "posterior_gains"]
