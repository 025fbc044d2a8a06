import pytest
import torch
from botorch.optim import optimize_acqf

from fbo_torch.acquisition import RFFThompsonSample
from fbo_torch.acquisition.search import maximize_rff_samples
from fbo_torch.features import RandomFourierFeatures
from fbo_torch.optim import maximize_batched, maximize_discrete, score_chunked
from fbo_torch.optim.batched import boltzmann_restarts, raw_points, sobol_points
from fbo_torch.optim.domain import Domain
from fbo_torch.sampling.rff_paths import RFFSamplePaths
from fbo_torch.utils import keyed_random as kr

f64 = torch.float64
BOUNDS = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64)


@pytest.fixture(scope="module")
def problem():
    rff = RandomFourierFeatures(2, 60, lengthscale=0.15, seed=4)
    omegas = torch.randn(6, 60, generator=torch.Generator().manual_seed(0), dtype=f64)

    def fn(X):
        return (rff(X) * omegas.unsqueeze(-2)).sum(-1)

    return rff, omegas, fn


def test_chunked_scoring_equals_unchunked(problem):
    _, _, fn = problem
    X = torch.rand(6, 1000, 2, dtype=f64)
    full = fn(X)
    for cap in (6, 60, 600, 10**6):
        # equal up to round-off (matmul blocking differs with the chunk shape)
        torch.testing.assert_close(score_chunked(fn, X, max_points=cap), full, atol=1e-13, rtol=1e-12)


def test_discrete_maximization_is_exact(problem):
    _, _, fn = problem
    C = torch.rand(500, 2, dtype=f64)
    X, v = maximize_discrete(fn, C, 6, max_points=100)
    vals = fn(C.expand(6, -1, -1))
    torch.testing.assert_close(v, vals.max(-1).values)
    torch.testing.assert_close(X, C[vals.argmax(-1)])


@pytest.mark.parametrize("refine", ["qn", "adam", "lbfgsb"])
def test_batched_maximizer_matches_optimize_acqf(problem, refine):
    # each of the 6 problems solved at once reaches what optimize_acqf reaches one by one
    rff, omegas, fn = problem
    X, v = maximize_batched(
        fn,
        BOUNDS,
        6,
        raw_samples=2048,
        num_restarts=6,
        refine=refine,
        maxiter=200,
        generator=torch.Generator().manual_seed(1),
    )
    assert X.shape == (6, 2) and ((X >= 0) & (X <= 1)).all()
    torch.testing.assert_close(v, fn(X.unsqueeze(1)).squeeze(1))
    for b in range(6):
        torch.manual_seed(b)
        _, ref = optimize_acqf(RFFThompsonSample(rff, omegas[b]), BOUNDS, q=1, num_restarts=10, raw_samples=1024)
        assert v[b] >= ref - 1e-6 * ref.abs().clamp_min(1)


def test_per_problem_boxes(problem):
    _, _, fn = problem
    boxes = torch.tensor([[[0.0, 0.0], [0.5, 0.5]], [[0.5, 0.0], [1.0, 0.5]]], dtype=f64).repeat(3, 1, 1)
    X, _ = maximize_batched(fn, boxes, raw_samples=256, num_restarts=2, maxiter=20)
    assert ((X >= boxes[:, 0]) & (X <= boxes[:, 1])).all()


def test_rff_domain_maximizer_uses_dense_search(problem):
    rff, omegas, fn = problem
    dom = Domain(BOUNDS)
    X, v = maximize_rff_samples(rff, omegas, dom, generator=torch.Generator().manual_seed(0))
    g = torch.linspace(0, 1, 201, dtype=f64)
    G = torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    dense = fn(G.expand(6, -1, -1)).max(-1).values
    assert (v >= dense - 1e-9).all()


def test_validation():
    with pytest.raises(ValueError, match="batch_size"):
        maximize_batched(lambda X: X.sum(-1), BOUNDS)
    with pytest.raises(ValueError, match="upper bound"):
        maximize_batched(lambda X: X.sum(-1), BOUNDS.flip(0), 2)
    with pytest.raises(ValueError, match="refine"):
        maximize_batched(lambda X: X.sum(-1), BOUNDS, 2, refine="newton")


def test_rff_sample_paths_values_and_closed_form_gradient(problem):
    rff, omegas, fn = problem
    paths = RFFSamplePaths(rff, omegas)
    X = torch.rand(6, 9, 2, dtype=f64, requires_grad=True)
    f, g = paths.value_and_grad(X.detach())
    torch.testing.assert_close(f, fn(X.detach()), atol=1e-13, rtol=1e-12)
    (g_ref,) = torch.autograd.grad(fn(X).sum(), X)
    torch.testing.assert_close(g, g_ref, atol=1e-12, rtol=1e-10)
    plain = RFFSamplePaths(RandomFourierFeatures(2, 60, lengthscale=0.15, seed=4, normalize=False), omegas)
    f2, g2 = plain.value_and_grad(X.detach())
    (g2_ref,) = torch.autograd.grad(plain(X).sum(), X)
    torch.testing.assert_close(g2, g2_ref, atol=1e-12, rtol=1e-10)
    with pytest.raises(ValueError, match="omegas"):
        RFFSamplePaths(rff, omegas[:, :10])


def test_rff_sample_paths_differentiate_in_their_weights_on_every_call(problem):
    # the per-batch constants are cached after the first evaluation, except where the weights
    # record gradients: then every evaluation builds its own graph (two backward passes work)
    rff, omegas, _ = problem
    om = omegas.clone().requires_grad_(True)
    paths = RFFSamplePaths(rff, om)
    X = torch.rand(6, 9, 2, dtype=f64)
    with torch.no_grad():
        paths(X)
    (g1,) = torch.autograd.grad(paths(X).sum(), om)
    (g2,) = torch.autograd.grad(paths.value_and_grad(X)[0].sum(), om)
    torch.testing.assert_close(g1, g2, atol=1e-12, rtol=1e-12)
    assert g1.abs().sum() > 0


def test_keyed_maximization_of_one_problem_does_not_depend_on_the_batch(problem):
    rff, omegas, _ = problem
    keys = kr.fold(kr.root_key(0, "test"), torch.arange(6))
    X, v = maximize_batched(RFFSamplePaths(rff, omegas), BOUNDS, 6, raw_samples=256, num_restarts=4, keys=keys)
    X3, v3 = maximize_batched(
        RFFSamplePaths(rff, omegas[3:4]), BOUNDS, 1, raw_samples=256, num_restarts=4, keys=keys[3:4]
    )
    torch.testing.assert_close(X3[0], X[3], atol=1e-12, rtol=0)
    torch.testing.assert_close(v3[0], v[3], atol=1e-12, rtol=0)


class _NoTake:
    """The same functions without ``take``: the maximizer keeps every restart in the batch."""

    def __init__(self, fn):
        self.fn, self.value_and_grad, self.lengthscales = fn, fn.value_and_grad, fn.lengthscales
        if hasattr(fn, "product_values"):
            self.product_values = fn.product_values
        self.extrapolate = getattr(fn, "extrapolate", "always")

    def __call__(self, X):
        return self.fn(X)


def test_dropping_converged_functions_changes_no_maximizer(problem, monkeypatch):
    # on a CPU the BFGS drops functions whose restarts have all converged (RFF paths and GP samples
    # have `take`); a function keeps its k restarts together, so its evaluations are the same
    # operations as in the full batch: the same maximizers as keeping everyone to the end
    from fbo_torch.models.batched_gp import BatchedExactGP

    rff, omegas, _ = problem
    g = torch.Generator().manual_seed(3)
    X = torch.rand(6, 12, 2, generator=g, dtype=f64)
    gp = BatchedExactGP(X, torch.sin(6 * X).sum(-1, keepdim=True), BOUNDS).fit(maxiter=40)
    paths = gp.draw_paths(kr.fold(kr.root_key(1, "own"), torch.arange(6)), 64)
    taken = []
    for fn in (RFFSamplePaths(rff, omegas), paths):
        orig = type(fn).take
        monkeypatch.setattr(
            type(fn), "take", lambda self, index, orig=orig: (taken.append(index.numel()), orig(self, index))[1]
        )
        keys = kr.fold(kr.root_key(0, "drop"), torch.arange(6))
        Xa, va = maximize_batched(fn, BOUNDS, 6, raw_samples=128, num_restarts=4, keys=keys, maxiter=60)
        Xb, vb = maximize_batched(_NoTake(fn), BOUNDS, 6, raw_samples=128, num_restarts=4, keys=keys, maxiter=60)
        torch.testing.assert_close(Xa, Xb, atol=1e-12, rtol=0)
        torch.testing.assert_close(va, vb, atol=1e-12, rtol=0)
        assert taken and all(m < 6 for m in taken), taken  # functions did leave the batch
        taken.clear()


#: The own-sample search's settings: 16 restarts, climbed in float32 and finished in float64.
OWN_SEARCH = dict(raw_samples=256, num_restarts=16, refine_dtype=torch.float32, screen_dtype=torch.float32)


def _own_search_setup(monkeypatch, B, freq, seed):
    """``B`` GP samples (2-D, 128 features) with their keys, and the keyword arguments of every
    ``minimize_batched`` call the maximizer makes afterwards (recorded)."""
    from fbo_torch.models.batched_gp import BatchedExactGP
    from fbo_torch.optim import batched

    g = torch.Generator().manual_seed(seed)
    X = torch.rand(B, 15, 2, generator=g, dtype=f64)
    gp = BatchedExactGP(X, torch.sin(freq * X).sum(-1, keepdim=True), BOUNDS).fit(maxiter=40)
    paths = gp.draw_paths(kr.fold(kr.root_key(seed, "own"), torch.arange(B)), 128)
    calls = []
    orig = batched.minimize_batched

    def spy(*args, **options):
        calls.append(options)
        return orig(*args, **options)

    monkeypatch.setattr(batched, "minimize_batched", spy)
    return paths, kr.fold(kr.root_key(seed, "search"), torch.arange(B)), calls


def test_a_gp_sample_maximized_alone_or_in_any_batch_gives_the_same_bits(monkeypatch):
    # on a CPU the BFGS drops functions whose restarts have all converged and evaluates a function
    # whose few restarts still need a step in a block of those (batched.SUB_GROUP); both depend on
    # the function's own restarts only, so its maximizer is the same bits in any batch (the
    # simulator's chunks of agents, one agent on its own device)
    from fbo_torch.optim import batched

    paths, keys, calls = _own_search_setup(monkeypatch, 8, 9.0, 8)
    Xa, va = maximize_batched(paths, BOUNDS, 8, keys=keys, **OWN_SEARCH)
    assert batched.SUB_GROUP is not None and calls[0]["sub_group"] == batched.SUB_GROUP
    for idx in (torch.tensor([3]), torch.tensor([1, 2, 6]), torch.arange(4, 8)):
        Xs, vs = maximize_batched(paths.take(idx), BOUNDS, idx.numel(), keys=keys[idx], **OWN_SEARCH)
        assert torch.equal(Xs, Xa[idx]) and torch.equal(vs, va[idx])


def test_restarts_that_stop_on_the_same_maximum_are_finished_once(monkeypatch):
    # with refine_dtype the best POLISH_RESTARTS restarts of a function are finished in full
    # precision; those the lower precision left within POLISH_TWIN lengthscales of a better one are
    # on the same maximum and are not: the maxima are those of finishing all of them
    from fbo_torch.optim import batched

    paths, keys, calls = _own_search_setup(monkeypatch, 12, 4.0, 9)
    Xa, va = maximize_batched(paths, BOUNDS, 12, keys=keys, **OWN_SEARCH)
    polish = calls[-1]["active"]
    assert polish is not None and not polish.all() and polish.view(12, -1)[:, 0].all()  # the best always finished
    monkeypatch.setattr(batched, "POLISH_TWIN", 0.0)
    Xb, vb = maximize_batched(paths, BOUNDS, 12, keys=keys, **OWN_SEARCH)
    assert calls[-1]["active"] is None
    # the same maxima: values to float64 rounding of the paths' scale, points to the gradient tolerance
    torch.testing.assert_close(va, vb, atol=64 * torch.finfo(f64).eps * vb.abs().max().item(), rtol=0)
    torch.testing.assert_close(Xa, Xb, atol=1e-6, rtol=0)


def test_take_selects_functions(problem):
    from fbo_torch.models.batched_gp import BatchedExactGP

    rff, omegas, _ = problem
    g = torch.Generator().manual_seed(4)
    X = torch.rand(6, 10, 2, generator=g, dtype=f64)
    paths = BatchedExactGP(X, X.sum(-1, keepdim=True), BOUNDS).draw_paths(
        kr.fold(kr.root_key(2, "own"), torch.arange(6)), 32
    )
    index = torch.tensor([4, 1, 1, 5])
    pts = torch.rand(6, 3, 2, generator=g, dtype=f64)
    for fn in (RFFSamplePaths(rff, omegas), paths):
        sub = fn.take(index)
        torch.testing.assert_close(sub(pts[index]), fn(pts)[index], atol=1e-12, rtol=0)
        for a, b in zip(sub.value_and_grad(pts[index]), fn.value_and_grad(pts), strict=True):
            torch.testing.assert_close(a, b[index], atol=1e-12, rtol=0)
        torch.testing.assert_close(sub.lengthscales().expand(4, 2), fn.lengthscales().expand(6, 2)[index])


def test_raw_points_are_shifted_sobol_sets():
    keys = kr.fold(kr.root_key(1, "raw"), torch.arange(3))
    U = raw_points(keys, 64, 2, f64)
    assert U.shape == (3, 64, 2) and ((U >= 0) & (U < 1)).all()
    assert not torch.equal(U[0], U[1])
    # the unrotated set is a (0, 6, 2)-net: one point in each cell of an 8 x 8 grid
    base = sobol_points(64, 2, f64, torch.device("cpu"))
    cells = (base * 8).floor()
    assert torch.unique(cells[:, 0] * 8 + cells[:, 1]).numel() == 64
    # each problem's set is that net rotated modulo 1 by its own shift
    shift = torch.remainder(U[:, :1] - base[:1], 1.0)
    torch.testing.assert_close(torch.remainder(base + shift, 1.0), U, atol=1e-15, rtol=0)


def test_boltzmann_restarts_follow_botorchs_distribution():
    # C = 5 values; the best is always kept, the other pick ~ exp(eta z) over the rest
    vals = torch.tensor([0.0, 1.0, 2.0, 0.5, 3.0], dtype=f64)
    S = 20000
    keys = kr.fold(kr.root_key(2, "bz"), torch.arange(S))
    idx = boltzmann_restarts(vals.expand(S, 5), 2, keys, eta=1.0)
    assert (idx == 4).any(-1).all()  # the best
    other = torch.where(idx[:, 0] == 4, idx[:, 1], idx[:, 0])
    z = (vals - vals.mean()) / vals.std()
    p = torch.exp(z[:4]) / torch.exp(z[:4]).sum()
    freq = torch.bincount(other, minlength=5)[:4].to(f64) / S
    se = (p * (1 - p) / S).sqrt()
    assert ((freq - p).abs() / se).max() < 4.5
    # constant values: uniform choice; non-finite values are not chosen
    # values whose squared deviations underflow (a tiny float32 scale) are as flat: not a greedy top-k
    tiny = boltzmann_restarts(torch.arange(64, dtype=torch.float32).mul(1e-25).unsqueeze(0), 5, keys[:1])
    assert 63 in tiny.tolist()[0] and set(tiny.tolist()[0]) != set(range(59, 64))
    values = torch.tensor([[1.0, 1.0, float("nan"), 1.0]], dtype=f64)
    flat = boltzmann_restarts(values, 3, keys[:1])
    assert 2 not in flat.tolist()[0]
    assert torch.equal(values.isnan(), torch.tensor([[False, False, True, False]]))  # the caller's values kept
    assert torch.equal(values.nan_to_num(), torch.tensor([[1.0, 1.0, 0.0, 1.0]], dtype=f64))


def test_rff_paths_report_the_feature_maps_lengthscales():
    # the maximizer scales its line search to these (first step = the shortest lengthscale)
    rff = RandomFourierFeatures(3, 40, lengthscale=[0.2, 0.5, 1.0], seed=1)
    paths = RFFSamplePaths(rff, torch.randn(2, 40, dtype=f64))
    want = torch.tensor([0.2, 0.5, 1.0], dtype=f64)
    torch.testing.assert_close(paths.lengthscales(), want, atol=0, rtol=0)
    again = RFFSamplePaths.from_graph_state(*paths.graph_state())
    torch.testing.assert_close(again.lengthscales(), want, atol=0, rtol=0)
    X = torch.rand(2, 5, 3, dtype=f64)
    torch.testing.assert_close(again(X), paths(X), atol=0, rtol=0)


def test_a_domain_of_no_or_non_finite_candidates_is_refused():
    """Before: Domain accepted NaN candidates (every score NaN) and an empty candidate set."""
    bounds = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="`candidates` must be finite; it holds 1 NaN"):
        Domain(bounds, torch.tensor([[0.2], [float("nan")]], dtype=torch.float64))
    with pytest.raises(ValueError, match="`candidates` is empty"):
        Domain(bounds, torch.empty(0, 1, dtype=torch.float64))


def _gp_paths(d, B=4, F=64, seed=0):
    from fbo_torch.models.batched_gp import BatchedExactGP

    g = torch.Generator().manual_seed(seed)
    X = 2 * torch.rand(B, 6 * d, d, generator=g, dtype=f64) - 1
    bounds = torch.tensor([[-1.0] * d, [1.0] * d], dtype=f64)
    gp = BatchedExactGP(X, torch.sin(4 * X).sum(-1, keepdim=True), bounds).fit(maxiter=30)
    return gp.draw_paths(kr.fold(kr.root_key(seed, "product"), torch.arange(B)), F), bounds


@pytest.mark.parametrize("d", [2, 3, 5])
def test_product_values_are_the_paths_values_on_every_pair(d):
    paths, _ = _gp_paths(d)
    g = torch.Generator().manual_seed(d)
    dA = (d + 1) // 2
    XA = 2 * torch.rand(4, 5, dA, generator=g, dtype=f64) - 1
    XB = 2 * torch.rand(4, 7, d - dA, generator=g, dtype=f64) - 1
    pairs = torch.cat([XA.unsqueeze(2).expand(4, 5, 7, dA), XB.unsqueeze(1).expand(4, 5, 7, d - dA)], -1)
    direct = paths(pairs.reshape(4, 35, d)).view(4, 5, 7)
    scale = direct.abs().max()
    # the same sums of F features and n kernel terms, in another order (angle sums, products of
    # exponentials): agreement to a few hundred float64 roundings of the largest term
    torch.testing.assert_close(paths.product_values(XA, XB), direct, atol=1e-13 * 64 * scale, rtol=0)
    low = paths.astype(torch.float32).product_values(XA.float(), XB.float())
    torch.testing.assert_close(low.double(), direct, atol=1e-6 * 64 * scale, rtol=0)


def test_product_raw_points_pair_two_rotated_sobol_sets():
    from fbo_torch.optim.batched import product_points

    keys = kr.fold(kr.root_key(3, "raw"), torch.arange(2))
    UA, UB = product_points(keys, 1024, 3, f64)
    assert UA.shape == (2, 32, 2) and UB.shape == (2, 32, 1)
    for U, d in ((UA, 2), (UB, 1)):
        base = sobol_points(32, d, f64, torch.device("cpu"))
        shift = torch.remainder(U[:, :1] - base[:1], 1.0)
        torch.testing.assert_close(torch.remainder(base + shift, 1.0), U, atol=1e-15, rtol=0)
    # a 1-D factor of 32 Sobol points is stratified (one point in each 1/32 of the line), so after
    # its rotation no two neighbours on the circle are more than 2/32 apart
    base = sobol_points(32, 1, f64, torch.device("cpu"))
    assert torch.unique((base[:, 0] * 32).floor()).numel() == 32
    pts = UB[0, :, 0].sort().values
    gaps = torch.cat([pts.diff(), (1 + pts[:1] - pts[-1:])])
    assert gaps.max() <= 2 / 32


@pytest.mark.parametrize("d,expect", [(1, False), (2, True), (3, True), (4, False)])
def test_auto_screens_the_product_set_where_it_was_measured_as_good(d, expect, monkeypatch):
    paths, bounds = _gp_paths(d)
    calls = []
    orig = type(paths).product_values
    monkeypatch.setattr(type(paths), "product_values", lambda self, a, b: (calls.append(1), orig(self, a, b))[1])
    keys = kr.fold(kr.root_key(5, "auto"), torch.arange(4))
    maximize_batched(paths, bounds, 4, raw_samples=256, num_restarts=4, keys=keys, maxiter=10)
    assert bool(calls) == expect
    calls.clear()
    maximize_batched(paths, bounds, 4, raw_samples=256, num_restarts=4, keys=keys, maxiter=10, screen="sobol")
    assert not calls


@pytest.mark.parametrize("d", [2, 3])
def test_the_product_screen_finds_the_maxima_the_sobol_screen_finds(d):
    # 16 sample paths, the engine's default budget (1024 raw points, 16 restarts): the product
    # screen reaches the dense search's maximum as the Sobol screen does (gaps at float64 rounding)
    paths, bounds = _gp_paths(d, B=16, F=128, seed=1)
    keys = kr.fold(kr.root_key(6, "screens"), torch.arange(16))
    out = {
        s: maximize_batched(paths, bounds, 16, raw_samples=1024, num_restarts=16, maxiter=25, keys=keys, screen=s)
        for s in ("product", "sobol")
    }
    _, dense = maximize_batched(
        paths, bounds, 16, raw_samples=2**14, num_restarts=64, maxiter=200, keys=keys + 1, screen="sobol"
    )
    best = torch.maximum(dense, torch.maximum(out["product"][1], out["sobol"][1]))
    tol = 1e-9 * best.abs().max()
    for s, (X, v) in out.items():
        assert ((bounds[0] <= X) & (X <= bounds[1])).all()
        torch.testing.assert_close(paths(X.unsqueeze(1)).squeeze(1), v, atol=1e-12, rtol=0)  # exact values
        assert (best - v <= tol).all(), (s, (best - v).max())
    with pytest.raises(ValueError, match="screen"):
        maximize_batched(paths, bounds, 16, screen="grid")
    with pytest.raises(ValueError, match="screen"):
        Domain(bounds, screen="grid")


@pytest.mark.parametrize("d", [3, 5])
def test_float32_refinement_finds_the_float64_maxima(d, monkeypatch):
    # 16 sample paths at the engine's budget: climbing in float32 and finishing the best restarts in
    # float64 reaches the maxima of the all-float64 refinement; the points and values are float64
    # (the values are the paths' at the points, to a float64 rounding of the largest term)
    paths, bounds = _gp_paths(d, B=16, F=128, seed=2)
    keys = kr.fold(kr.root_key(7, "refine"), torch.arange(16))
    kw = dict(raw_samples=1024, num_restarts=16, maxiter=25, keys=keys)
    X64, v64 = maximize_batched(paths, bounds, 16, **kw)
    X32, v32 = maximize_batched(paths, bounds, 16, refine_dtype=torch.float32, **kw)
    assert X32.dtype == v32.dtype == f64 and ((bounds[0] <= X32) & (X32 <= bounds[1])).all()
    torch.testing.assert_close(paths(X32.unsqueeze(1)).squeeze(1), v32, atol=1e-12, rtol=0)
    assert (v64 - v32 <= 1e-9 * v64.abs().max()).all(), (v64 - v32).max()
    # not a float64 refinement in disguise: float32 paths were evaluated, and their points moved
    calls = []
    orig = type(paths).astype
    monkeypatch.setattr(type(paths), "astype", lambda self, dt: (calls.append(dt), orig(self, dt))[1])
    maximize_batched(paths, bounds, 16, refine_dtype=torch.float32, **kw)
    assert calls == [torch.float32]  # the refinement's (the screen's precision is another option)
    with pytest.raises(ValueError, match="refine_dtype"):
        maximize_batched(paths, bounds, 16, refine_dtype="float32")


def test_float32_refinement_polishes_only_the_best_restarts(monkeypatch):
    import fbo_torch.optim.batched as batched

    paths, bounds = _gp_paths(3, B=8, F=128, seed=3)
    seen = []
    orig = batched.minimize_batched
    monkeypatch.setattr(
        batched, "minimize_batched", lambda vg, x0, **kw: (seen.append((x0.dtype, x0.shape[0])), orig(vg, x0, **kw))[1]
    )
    maximize_batched(paths, bounds, 8, num_restarts=16, keys=torch.arange(8), refine_dtype=torch.float32)
    assert seen == [(torch.float32, 8 * 16), (f64, 8 * batched.POLISH_RESTARTS)]


def test_domain_takes_refine_dtype_by_name():
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64)
    assert Domain(bounds).refine_dtype is torch.float32
    assert Domain(bounds, refine_dtype="float64").refine_dtype is torch.float64
    assert Domain(bounds, refine_dtype=None).options()["refine_dtype"] is None
    assert Domain(bounds).options()["refine_dtype"] == "float32"
    with pytest.raises(ValueError, match="refine_dtype"):
        Domain(bounds, refine_dtype="half")


def test_taken_paths_keep_their_folded_constants_and_values():
    paths, bounds = _gp_paths(3, B=6, F=64, seed=4)
    X = torch.rand(6, 5, 3, generator=torch.Generator().manual_seed(0), dtype=f64)
    full = paths(X)  # prepares the paths
    index = torch.tensor([4, 1, 1])
    sub = paths.take(index)
    assert sub._ready
    fresh = type(paths).from_graph_state(sub.graph_state()[0], ())  # folds its own constants
    for a, b in zip(sub.value_and_grad(X[index]), fresh.value_and_grad(X[index]), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(sub(X[index]), full[index])


def test_the_line_search_is_the_functions_choice_unless_given(monkeypatch):
    import fbo_torch.optim.batched as batched

    seen = []
    real = batched.minimize_batched

    def recording(*args, **kwargs):
        seen.append(kwargs["line_search"])
        return real(*args, **kwargs)

    monkeypatch.setattr(batched, "minimize_batched", recording)
    rff = RandomFourierFeatures(2, 60, lengthscale=0.1, seed=3)
    omegas = torch.randn(5, 60, generator=torch.Generator().manual_seed(1), dtype=f64)
    keys = kr.fold(kr.root_key(0, "line-search"), torch.arange(5))
    found = {}
    for ls in ("auto", "sequential"):
        seen.clear()
        found[ls] = maximize_batched(
            RFFSamplePaths(rff, omegas), BOUNDS, 5, raw_samples=256, num_restarts=8, keys=keys, line_search=ls
        )
        # RFF paths state "parallel" (cheap to evaluate); a given line search wins
        assert seen == (["parallel"] if ls == "auto" else ["sequential"])
    # both searches climb to the same maxima, to the float64 tolerance of the refinement
    scale = found["auto"][1].abs().max()
    torch.testing.assert_close(found["auto"][1], found["sequential"][1], atol=1e-10 * scale, rtol=0)
    paths, bounds = _gp_paths(2)
    seen.clear()
    maximize_batched(paths, bounds, 4, raw_samples=64, num_restarts=4, keys=keys[:4], refine_dtype=torch.float32)
    assert seen == ["auto", "auto"]  # GP paths leave it to the device, in both phases of the refinement
    with pytest.raises(ValueError, match="`line_search` must be"):
        maximize_batched(paths, bounds, 4, raw_samples=64, num_restarts=4, line_search="fast")


class _EnteredInference:
    """``torch.inference_mode`` that counts its entries (``enabled=False``: autograd's bookkeeping kept)."""

    def __init__(self, enabled: bool = True):
        self.entries, self.enabled, self._real = 0, enabled, torch.inference_mode

    def __call__(self, mode: bool = True):
        self.entries += mode  # inference_mode(False) (a cache's ordinary tensors) is not an entry
        return self._real(mode and self.enabled)


class _AutogradOnly(RFFSamplePaths):
    value_and_grad = None  # gradients by autograd (inference_safe inherited: the maximizer must not trust it)


def test_a_cpu_maximization_skips_autograd_bookkeeping_and_returns_ordinary_tensors(monkeypatch):
    from fbo_torch.models.batched_gp import BatchedExactGP

    real_inference_mode = torch.inference_mode
    g = torch.Generator().manual_seed(5)
    X = torch.rand(5, 12, 2, generator=g, dtype=f64)
    gp = BatchedExactGP(X, torch.sin(5 * X).sum(-1, keepdim=True), BOUNDS).fit(maxiter=20)
    paths = gp.draw_paths(kr.fold(kr.root_key(0, "inference"), torch.arange(5)), 64)
    opts = dict(keys=torch.arange(5), raw_samples=128, num_restarts=4)
    searches = {
        "float64": lambda: maximize_batched(paths, BOUNDS, 5, **opts),
        "engine default (float32 screen and climb)": lambda: Domain(BOUNDS).maximize(paths, 5, **opts),
    }
    for name, search in searches.items():
        runs = {}
        for enabled in (True, False):
            mode = _EnteredInference(enabled)
            monkeypatch.setattr(torch, "inference_mode", mode)
            runs[enabled] = search()
            assert mode.entries == 1, name
        (X1, v1), (X0, v0) = runs[True], runs[False]
        assert torch.equal(X1, X0) and torch.equal(v1, v0), name  # the same operations, without the bookkeeping
        assert not X1.is_inference() and not v1.is_inference()
    # the caller's paths were not touched (rebuilt from their tensors inside) and differentiate
    assert not any(t.is_inference() for t in paths.graph_state()[0])
    Xg = X1.clone().requires_grad_(True)
    paths(Xg.unsqueeze(1)).sum().backward()
    assert Xg.grad is not None and torch.isfinite(Xg.grad).all()
    # functions that do not declare themselves inference-safe (gradients by autograd, other libraries'
    # caches) keep autograd's bookkeeping
    mode = _EnteredInference()
    monkeypatch.setattr(torch, "inference_mode", mode)
    rff = RandomFourierFeatures(2, 30, lengthscale=0.2, seed=1)
    fn = _AutogradOnly(rff, torch.randn(3, 30, generator=g, dtype=f64))
    Xa, va = maximize_batched(fn, BOUNDS, 3, keys=torch.arange(3), raw_samples=128, num_restarts=4)
    assert mode.entries == 0 and torch.isfinite(va).all()
    # a cache filled in inference mode holds an ordinary tensor (the raw points' Sobol set)
    from fbo_torch.optim.batched import _SOBOL_CACHE, sobol_points

    _SOBOL_CACHE.clear()
    with real_inference_mode():
        for n in (1, 64, 5000):  # one point: the engine's stored first point; 5000: the table grows
            pts = sobol_points(n, 3, f64, torch.device("cpu"))
            ref = torch.quasirandom.SobolEngine(3, scramble=True, seed=0).draw(n, dtype=f64)
            assert torch.equal(pts, ref)  # the first n points of the sequence, whatever the table's size
    assert len(_SOBOL_CACHE) == 1 and not any(t.is_inference() for t in _SOBOL_CACHE.values())
    # a maximum: no random point above it (the values are maxima to gtol = 1e-9 in the gradient)
    dense = fn(torch.rand(3, 4096, 2, generator=g, dtype=f64)).max(-1).values
    assert (va >= dense - 1e-9).all(), va - dense
