"""``benchmarks/maximizer_quality.py``'s extended-precision values and its reference search's points."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.models.batched_gp import BatchedExactGP
from fbo_torch.sampling.rff_paths import RFFSamplePaths
from fbo_torch.utils import keyed_random as kr

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from maximizer_quality import dense_max, exact_values

f64 = torch.float64
EPS = torch.finfo(f64).eps


def _functions(kind: str, d: int, K: int = 6):
    g = torch.Generator().manual_seed(d)
    if kind == "rff":
        rff = RandomFourierFeatures(d, 50, lengthscale=0.1 * d**0.5, seed=d)
        return RFFSamplePaths(rff, torch.randn(K, 50, generator=g, dtype=f64)), 50
    X = torch.rand(K, 10, d, generator=g, dtype=f64)
    Y = torch.sin(6 * X).sum(-1, keepdim=True)
    bounds = torch.tensor([[0.0] * d, [1.0] * d], dtype=f64)
    gp = BatchedExactGP(X, Y, bounds).fit(maxiter=20)
    return gp.draw_paths(kr.fold(kr.root_key(d, "exact"), torch.arange(K)), num_features=64), 64 + 10


@pytest.mark.parametrize("kind", ["rff", "gp_path"])
@pytest.mark.parametrize("d", [2, 3])
def test_extended_precision_values_are_the_functions_values(kind, d):
    fn, terms = _functions(kind, d)
    X = torch.rand(fn.batch_size, d, generator=torch.Generator().manual_seed(1), dtype=f64)
    exact = exact_values(fn, X)
    assert exact.dtype == np.longdouble and exact.shape == (fn.batch_size,)
    computed = fn(X.unsqueeze(1)).squeeze(1).numpy()
    # a float64 sum of `terms` products, each with its cosine's argument rounded: within
    # (terms + 8) ε of the sum of the terms' magnitudes, which is at most 4 |f|-scales here
    scale = np.abs(computed).max() + 1.0
    bound = (terms + 8) * EPS * 4 * scale
    assert np.abs(exact - computed).max() <= bound, (np.abs(exact - computed).max(), bound)
    # and it tells points apart: a step of 1e-6 changes the values by far more than that bound
    moved = exact_values(fn, X + 1e-6)
    assert (np.abs(moved - exact) > 10 * bound).all()


def test_exact_values_refuse_other_functions():
    with pytest.raises(TypeError, match="no exact evaluation"):
        exact_values(lambda X: X.sum(-1), torch.zeros(2, 2, dtype=f64))


def test_the_reference_search_returns_its_points():
    fn, terms = _functions("rff", 2, K=3)
    X, v = dense_max(fn, 3, 2, torch.device("cpu"))
    assert X.shape == (3, 2) and v.shape == (3,)
    # the value at the point, evaluated alone: the same up to the evaluations' rounding (as above)
    alone = fn(X.unsqueeze(1)).squeeze(1)
    assert ((alone - v).abs() <= (terms + 8) * EPS * 4 * (v.abs() + 1.0)).all()
    assert (v >= fn(torch.rand(3, 256, 2, dtype=f64)).max(-1).values).all()  # a maximum
