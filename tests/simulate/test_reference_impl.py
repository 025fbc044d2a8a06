"""Tests of the NumPy/SciPy re-implementation of the authors' reference method (benchmarks/reference_impl.py)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "reference_impl.py"


def _load():
    name = "reference_impl"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


R = _load()


@pytest.fixture(autouse=True, scope="module")
def _single_blas_thread():
    """Small matrices only: one BLAS thread avoids OpenBLAS busy-waiting on a shared 2-core machine."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def test_no_torch_import():
    src = _PATH.read_text()
    assert "import torch" not in src


def test_features_normalized_and_from_arrays():
    rng = np.random.default_rng(0)
    f = R.ReferenceRFF(3, 50, 0.3, 2.5, rng)
    X = rng.uniform(size=(7, 3))
    Phi = f.phi_batch(X)
    assert Phi.shape == (7, 50)
    np.testing.assert_allclose(np.sum(Phi**2, axis=1), 2.5, rtol=1e-12)
    np.testing.assert_allclose(f.phi(X[2]), Phi[2], rtol=1e-12, atol=1e-14)
    # same map from the raw arrays, and the explicit formula
    g = R.ReferenceRFF.from_arrays(f.S, f.b, 2.5)
    np.testing.assert_allclose(g.phi_batch(X), Phi, rtol=1e-14)
    raw = math.sqrt(2 / 50) * np.cos(X[0] @ f.S.T + f.b)
    np.testing.assert_allclose(f.phi(X[0]), raw / np.linalg.norm(raw) * math.sqrt(2.5), rtol=1e-12)


def test_feature_spectral_distribution():
    rng = np.random.default_rng(1)
    f = R.ReferenceRFF(2, 20000, 0.5, 1.0, rng)
    assert abs(f.S.std() - 2.0) < 0.05  # s ~ N(0, l^-2 I)
    assert f.b.min() >= 0 and f.b.max() <= 2 * math.pi


def test_blr_posterior_matches_gp_form():
    rng = np.random.default_rng(2)
    n, M, noise = 15, 30, 0.01
    Phi = rng.normal(size=(n, M)) / math.sqrt(M)
    y = rng.normal(size=n)
    nu, cov = R.reference_blr_posterior(Phi, y, noise)
    Kn = Phi @ Phi.T + noise * np.eye(n)
    nu_gp = Phi.T @ np.linalg.solve(Kn, y)
    cov_gp = np.eye(M) - Phi.T @ np.linalg.solve(Kn, Phi)  # Woodbury of noise*(PhiᵀPhi + noise I)^-1
    np.testing.assert_allclose(nu, nu_gp, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(cov, cov_gp, rtol=1e-8, atol=1e-10)


def test_omega_draws_have_right_mean_and_cov():
    rng = np.random.default_rng(3)
    n, M, noise = 10, 8, 0.05
    Phi = rng.normal(size=(n, M))
    y = rng.normal(size=n)
    nu, cov = R.reference_blr_posterior(Phi, y, noise)
    draws = np.array([R.reference_sample_omega(nu, cov, rng) for _ in range(2000)])
    se = np.sqrt(np.diag(cov) / len(draws))
    assert np.all(np.abs(draws.mean(0) - nu) < 5 * se)
    np.testing.assert_allclose(np.cov(draws.T), cov, atol=0.15 * np.max(np.diag(cov)))


def test_maximize_finds_known_maximum():
    rng = np.random.default_rng(4)
    target = np.array([0.3, 0.7])
    bounds = np.array([[0.0, 1.0], [0.0, 1.0]])

    def score(x):
        return float(np.exp(-np.sum((x - target) ** 2) / 0.1) + 0.1 * np.sin(5 * x[0]))

    x, v = R.reference_maximize(score, bounds, rng, n_random=200, n_restarts=5)
    # maximum of the sum (shifted a little by the sine term): compare with a dense grid
    g = np.linspace(0, 1, 201)
    G = np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    vals = np.array([score(p) for p in G])
    assert v >= vals.max() - 1e-6
    np.testing.assert_allclose(x, G[vals.argmax()], atol=5e-3)
    assert np.all(x >= 0) and np.all(x <= 1)


def test_maximize_respects_bounds_and_best_mode():
    rng = np.random.default_rng(5)
    bounds = np.array([[-2.0, -1.0]])
    x, v = R.reference_maximize(lambda x: float(x[0]), bounds, rng, n_random=50, n_restarts=3, restart_from="best")
    assert x.shape == (1,) and -1.0 - 1e-12 <= x[0] <= -1.0 + 1e-6
    with pytest.raises(ValueError):
        R.reference_maximize(lambda x: 0.0, bounds, rng, restart_from="nope")


def test_gp_nll_gradient_matches_finite_differences():
    rng = np.random.default_rng(6)
    X = rng.uniform(size=(12, 2))
    y = rng.normal(size=12)
    p = np.log([0.7, 0.3, 0.05])
    _, g = R.gp_neg_log_marginal_likelihood(p, X, y)
    eps = 1e-6
    fd = [
        (
            R.gp_neg_log_marginal_likelihood(p + eps * e, X, y)[0]
            - R.gp_neg_log_marginal_likelihood(p - eps * e, X, y)[0]
        )
        / (2 * eps)
        for e in np.eye(3)
    ]
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-6)


def test_gp_fit_recovers_lengthscale_order():
    rng = np.random.default_rng(7)
    n, ls, var, noise = 80, 0.2, 1.5, 1e-3
    X = rng.uniform(size=(n, 2))
    D2 = np.sum((X[:, None] - X[None]) ** 2, -1)
    K = var * np.exp(-0.5 * D2 / ls**2) + noise * np.eye(n)
    y = np.linalg.cholesky(K) @ rng.normal(size=n)
    v_hat, ls_hat, sn_hat = R.reference_gp_fit(X, y, rng, restarts=10)
    assert 0.1 < ls_hat < 0.4
    assert 0.2 < v_hat < 10
    assert sn_hat < 0.05


def test_partition_regions():
    p4 = R.BoxPartition(2, 4)
    assert [p4.region_of(np.array(x)) for x in [(0.1, 0.1), (0.1, 0.9), (0.9, 0.1), (0.9, 0.9), (0.5, 0.5)]] == [
        0,
        1,
        2,
        3,
        3,
    ]
    p3d = R.BoxPartition(3, 4)
    assert p3d.region_of(np.array([0.7, 0.2, 0.99])) == 2
    np.testing.assert_allclose(p3d.region_bounds(2), [[0.5, 1.0], [0.0, 0.5], [0.0, 1.0]])
    p2 = R.BoxPartition(2, 2)
    assert p2.region_of(np.array([0.49, 0.9])) == 0 and p2.region_of(np.array([0.5, 0.1])) == 1
    p1d = R.BoxPartition(1, 3)
    assert [p1d.region_of(np.array([v])) for v in (0.0, 0.34, 0.7, 1.0)] == [0, 1, 2, 2]
    rng = np.random.default_rng(8)
    for i in range(4):
        assert all(p4.region_of(x) == i for x in p4.sample(i, 20, rng))
    with pytest.raises(ValueError):
        R.BoxPartition(2, 3)


def test_server_noiseless_full_participation_is_weighted_average_of_clipped():
    rng = np.random.default_rng(9)
    M, P, S = 6, 4, 4.0
    omegas = [rng.normal(size=M) * s for s in (0.1, 1.0, 3.0, 0.5, 10.0)]
    W = R.de_weights([0, 1, 2, 3, 0], P, a=3.0)
    np.testing.assert_allclose(W.sum(1), 1.0)
    out = R.reference_server(omegas, q=1.0, S=S, z=0.0, weights=W, rng=rng)
    c = S / math.sqrt(P)
    clipped = np.array([w * min(1.0, c / np.linalg.norm(w)) for w in omegas])
    np.testing.assert_allclose(out, W @ clipped, rtol=1e-12)
    assert np.all(np.linalg.norm(clipped, axis=1) <= c + 1e-12)


def test_server_noise_scale_and_subsampling():
    rng = np.random.default_rng(10)
    N, M, P = 4, 2000, 2
    W = np.full((P, N), 1 / N)
    zeros = [np.zeros(M) for _ in range(N)]
    out = R.reference_server(zeros, q=0.5, S=3.0, z=2.0, weights=W, rng=rng)
    assert abs(out.std() / (2.0 * 0.25 * 3.0 / 0.5) - 1) < 0.05
    # with z = 0 the kept fraction is about q
    ones = [np.ones(1) for _ in range(2000)]
    Wu = np.full((1, 2000), 1 / 2000)
    kept = R.reference_server(ones, q=0.3, S=10.0, z=0.0, weights=Wu, rng=rng)[0, 0] * 0.3
    assert abs(kept - 0.3) < 0.04


def test_adaptive_a_schedule():
    # thesis C.2, synthetic: a = 16 for t = 1..5, then 16, 12.25, 8.5, 4.75, 1 for t = 6..10
    assert [R.adaptive_a(t, hold=5, decay=5) for t in range(1, 12)] == [16] * 5 + [16, 12.25, 8.5, 4.75, 1, 1]
    # real-world: 16 for 10 rounds, uniform (a = b = 1) after round 40
    assert R.adaptive_a(10) == 16 and R.adaptive_a(11) == 16 and R.adaptive_a(40) == 1 and R.adaptive_a(100) == 1
    assert 1 < R.adaptive_a(25) < 16


def test_reference_round_tiny_problem():
    rng = np.random.default_rng(11)
    D, M, N, P = 2, 20, 3, 2

    def obj(n, x):
        return float(-np.sum((x - 0.2 * (n + 1)) ** 2))

    part = R.BoxPartition(D, P)
    agents = R.make_agents(
        [lambda x, n=n: obj(n, x) for n in range(N)], part, 4, rng, M_own=M, n_random=100, n_restarts=3
    )
    assert [a.region for a in agents] == [0, 1, 0]
    assert all(part.region_of(x) == a.region for a in agents for x in a.X)
    feats = R.ReferenceRFF(D, M, 0.01, 1.0, rng)
    seen = set()
    for t in (1, 2):
        sa = R.ServerArgs(q=0.5, S=22.0, z=1.0, weights=R.de_weights([a.region for a in agents], P, R.adaptive_a(t)))
        res = R.reference_round(agents, feats, obj, t, None if t > 1 else 0.5, sa, rng, part)
        assert res.server_vectors.shape == (P, M)
        assert set(R.PHASES) | {"total"} == set(res.timings)
        assert all(v >= 0 for v in res.timings.values())
        assert res.timings["total"] >= res.timings["acquisition"] > 0
        assert len(res.branches) == N and len(res.x_new) == N
        seen.update(res.branches)
        for x, y, n in zip(res.x_new, res.y_new, range(N), strict=True):
            assert np.all((x >= 0) & (x <= 1)) and y == pytest.approx(obj(n, x))
    assert all(a.X.shape == (6, D) and a.y.shape == (6,) and a.n_iter == 2 for a in agents)
    # round 1 re-fits on schedule (n_iter 0); round 2 does not
    assert all(a.gp_params != (1.0, 1.0, 1.0) for a in agents)


def test_agent_branches_directly():
    rng = np.random.default_rng(12)
    part = R.BoxPartition(2, 4)
    feats = R.ReferenceRFF(2, 30, 0.2, 1.0, rng)
    a = R.make_agents([lambda x: float(x.sum())], part, 5, rng, M_own=30, n_random=100, n_restarts=2)[0]
    tm = {k: 0.0 for k in R.PHASES}
    vectors = np.zeros((4, 30))
    vectors[3] = feats.phi(np.array([0.8, 0.8]))  # bump in region 3
    x, _ = a.step_from_server(vectors, part, feats, lambda x: 0.0, rng, refit=False, timings=tm)
    assert part.region_of(x) == 3 and tm["gp_refit"] == 0.0 and tm["acquisition"] > 0
    x, _ = a.step_own_ts(lambda x: 0.0, rng, refit=True, timings=tm)
    assert tm["gp_refit"] > 0 and tm["own_ts_sample"] > 0
    assert a.n_iter == 2 and len(a.y) == 7
    omega = a.send_omega(feats, 1e-6, rng)
    assert omega.shape == (30,) and np.all(np.isfinite(omega))
