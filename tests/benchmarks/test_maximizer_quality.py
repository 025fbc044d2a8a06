"""``benchmarks/maximizer_quality.py``'s extended-precision values and its reference search's points."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.models.batched_gp import BatchedExactGP
from fbo_torch.sampling.gp_paths import GPThompsonPaths
from fbo_torch.sampling.rff_paths import RFFSamplePaths
from fbo_torch.utils import keyed_random as kr

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from maximizer_quality import dense_max, exact_values

f64 = torch.float64
EPS = torch.finfo(f64).eps
LO, HI = -1.0, 2.0  # not the unit box: the paths' input transforms are exercised


def _functions(kind: str, d: int, K: int = 6):
    g = torch.Generator().manual_seed(d)
    box = torch.tensor([[LO] * d, [HI] * d], dtype=f64)
    if kind == "rff":  # the senders' input bounds folded into the feature map
        rff = RandomFourierFeatures(d, 50, lengthscale=0.1 * d**0.5, seed=d)
        return RFFSamplePaths(rff, torch.randn(K, 50, generator=g, dtype=f64), input_bounds=box)
    X = LO + (HI - LO) * torch.rand(K, 10, d, generator=g, dtype=f64)
    Y = torch.sin(2 * X).sum(-1, keepdim=True)
    gp = BatchedExactGP(X, Y, box).fit(maxiter=20)
    return gp.draw_paths(kr.fold(kr.root_key(d, "exact"), torch.arange(K)), num_features=64)


def _rounding_bound(fn, X: torch.Tensor) -> np.ndarray:
    """A bound on a float64 evaluation's error: ``(k + d + 8) ε Σ|term| (1 + |argument|)`` over the
    ``k`` summed terms (each term's transcendental argument rounded relative to its size, then a
    sum of ``k`` products), from the functions' parameters, in long double."""
    ld = np.longdouble
    x = X.numpy().astype(ld)
    d = x.shape[-1]
    if isinstance(fn, RFFSamplePaths):
        S, phase, om = (t.numpy().astype(ld) for t in (fn.spectral, fn.phase, fn.omegas))
        z = x @ S.T + phase
        c = np.cos(z)
        norm = np.sqrt((c * c).sum(-1)) if fn.normalize else np.sqrt(ld(S.shape[0]) / 2)
        terms = np.sqrt(fn.outputscale.item()) * (np.abs(om) * (1 + np.abs(z))).sum(-1) / norm
        return (S.shape[0] + d + 8) * EPS * terms
    assert isinstance(fn, GPThompsonPaths)
    W, w, amp, Xt, v, ls, os_, y_std = (
        getattr(fn, f).numpy().astype(ld) for f in ("W", "w", "amp", "Xt", "v", "ls", "os", "y_std")
    )
    lo, width = fn.lo.numpy().astype(ld), fn.width.numpy().astype(ld)
    u = (x - lo) / width
    z = np.einsum("bd,bfd->bf", u, W)
    half = W.shape[1]
    prior = ((np.abs(w[:, :half]) + np.abs(w[:, half:])) * (1 + np.abs(z))).sum(-1) * amp
    sq = (((u / ls)[:, None, :] - Xt / ls[:, None, :]) ** 2).sum(-1)
    data = (np.abs(v) * os_[:, None] * np.exp(-sq / 2) * (1 + sq)).sum(-1)
    k = w.shape[-1] + v.shape[-1]
    return (k + d + 8) * EPS * (y_std * (prior + data) + np.abs(fn.y_mean.numpy()) + 1.0)


@pytest.mark.parametrize("kind", ["rff", "gp_path"])
@pytest.mark.parametrize("d", [2, 3])
def test_extended_precision_values_are_the_functions_values(kind, d):
    fn = _functions(kind, d)
    gen = torch.Generator().manual_seed(1)
    X = LO + (HI - LO) * torch.rand(fn.batch_size, d, generator=gen, dtype=f64)
    exact = exact_values(fn, X)
    assert exact.dtype == np.longdouble and exact.shape == (fn.batch_size,)
    computed = fn(X.unsqueeze(1)).squeeze(1).numpy()
    bound = _rounding_bound(fn, X)
    assert (np.abs(exact - computed) <= bound).all(), np.abs(exact - computed) / bound
    # and it tells points apart: moving by 1e-6 changes the values by far more than that bound
    moved = exact_values(fn, X + 1e-6 * torch.randn(X.shape, generator=gen, dtype=f64))
    assert (np.abs(moved - exact) > 10 * bound).all()


def test_exact_values_refuse_other_functions():
    with pytest.raises(TypeError, match="no exact evaluation"):
        exact_values(lambda X: X.sum(-1), torch.zeros(2, 2, dtype=f64))


def test_the_reference_search_returns_its_points():
    fn = _functions("rff", 2, K=3)
    X, v = dense_max(fn, 3, 2, torch.device("cpu"))  # over the unit box
    assert X.shape == (3, 2) and v.shape == (3,)
    # the value at the point, evaluated alone: the same up to the evaluations' rounding
    alone = fn(X.unsqueeze(1)).squeeze(1)
    assert ((alone - v).abs().numpy() <= 2 * _rounding_bound(fn, X)).all()
    samples = torch.rand(3, 256, 2, generator=torch.Generator().manual_seed(2), dtype=f64)
    assert (v >= fn(samples).max(-1).values).all()  # a maximum
