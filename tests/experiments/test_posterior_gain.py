"""Posterior gain: the prefix-Cholesky computation against direct solves on the same GP, and its invariants
(what a run's accounting, CSV and report make of it: ``tests/report/test_accounting.py``)."""

import math

import pytest
import torch

from fbo_torch.experiments.posterior_gain import MEASURE_MAXITER, MEASURE_SPEC, method_posterior_gains, posterior_gains
from fbo_torch.models.batched_gp import BatchedExactGP

# Direct solves of (K_m + σ²I) with condition numbers ≤ 1 + s²/σ²_min ≈ 10⁴ (outputscale s² ≈ 1 after
# standardization, the spec's noise floor 10⁻⁴) lose at most ~10⁴ · n · ε₆₄ ≈ 3·10⁻¹⁰ relative to the prefix
# Cholesky route; the quantities are O(1).
TOL = 1e-9


def _data(R: int = 3, n: int = 14, d: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(R, n, d, generator=g, dtype=torch.float64) * 4 - 2
    y = torch.sin(3 * X).sum(-1) + 0.1 * torch.randn(R, n, generator=g, dtype=torch.float64)
    bounds = torch.tensor([[-2.0] * d, [2.0] * d], dtype=torch.float64)
    return X, y, bounds


def _reference(X: torch.Tensor, y: torch.Tensor, bounds: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Beliefs and information by solving each prefix's system anew with the exported BoTorch kernel."""
    valid = y.isfinite()
    gp = BatchedExactGP(
        torch.where(valid.unsqueeze(-1), X, bounds[0]),
        torch.where(valid, y, 0.0).unsqueeze(-1),
        bounds,
        spec=MEASURE_SPEC,
        mask=valid,
    ).fit(MEASURE_MAXITER)
    R, n, _ = X.shape
    beliefs, infos = torch.zeros(R, T + 1, dtype=torch.float64), torch.zeros(R, T, dtype=torch.float64)
    for r in range(R):
        model = gp.to_botorch(r)
        idx = torch.nonzero(valid[r]).squeeze(-1)
        with torch.no_grad():
            Kf = model.covar_module((X[r, idx] - bounds[0]) / (bounds[1] - bounds[0])).to_dense()
        s2 = gp.hyperparameters["noise"][r]
        c = gp.hyperparameters["mean"][r]
        ys = (y[r, idx] - gp.y_mean[r]) / gp.y_std[r]
        for k, m in enumerate(range(n - T, n + 1)):
            sel = idx < m
            A = Kf[sel][:, sel] + s2 * torch.eye(int(sel.sum()), dtype=torch.float64)
            mu = c + Kf[sel][:, sel] @ torch.linalg.solve(A, ys[sel] - c)
            beliefs[r, k] = gp.y_mean[r] + gp.y_std[r] * mu.max()
            if m < n and bool(valid[r, m]):
                j = int((idx == m).nonzero())
                kv = Kf[sel][:, j]
                var = Kf[j, j] - kv @ torch.linalg.solve(A, kv)
                infos[r, k] = 0.5 * torch.log1p(var / s2)
    return beliefs, infos


def test_matches_direct_solves_with_a_failed_evaluation() -> None:
    X, y, bounds = _data()
    y[1, 7] = math.nan  # a failed evaluation: out of the GP, no information, the belief unchanged
    T = 9
    pg = posterior_gains(X, y, T, bounds)
    assert pg.belief.shape == (3, T + 1) and pg.belief_gain.shape == pg.information.shape == (3, T)
    assert pg.belief.dtype == torch.float64
    ref_belief, ref_info = _reference(X, y, bounds, T)
    torch.testing.assert_close(pg.belief, ref_belief, rtol=0, atol=TOL)
    torch.testing.assert_close(pg.information, ref_info, rtol=0, atol=TOL)
    assert pg.information[1, 7 - (14 - T)] == 0 and pg.belief_gain[1, 7 - (14 - T)] == pytest.approx(0, abs=TOL)
    # the belief gains telescope to the change of belief over the rounds
    torch.testing.assert_close(pg.belief_gain.sum(-1), pg.belief[:, -1] - pg.belief[:, 0], rtol=0, atol=TOL)
    assert bool((pg.information >= 0).all())


def test_a_repeated_query_carries_less_information_than_a_new_one() -> None:
    X, y, bounds = _data(R=1, n=12)
    X[0, -1] = X[0, -2]  # the last query repeats the one before
    y[0, -1] = y[0, -2]
    pg = posterior_gains(X, y, 4, bounds)
    # a repeat's variance is at most the noise left after one observation there: I ≤ ½ log 2
    assert float(pg.information[0, -1]) <= 0.5 * math.log(2) + TOL
    assert float(pg.information[0, :-1].max()) > float(pg.information[0, -1])


def test_bad_shapes_are_refused() -> None:
    X, y, bounds = _data()
    with pytest.raises(ValueError, match="`queries` and `observations`"):
        posterior_gains(X, y[:, :-1], 3, bounds)
    with pytest.raises(ValueError, match="`rounds`"):
        posterior_gains(X, y, 15, bounds)


def test_a_record_without_observations_has_none() -> None:
    assert method_posterior_gains({"runs": [[1.0, 0.5]], "queries": [[[0.1], [0.2]]]}) is None
