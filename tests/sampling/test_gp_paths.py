"""GP Thompson paths on a CPU: evaluation in blocks of paths, and taken paths that share their batch."""

import pytest
import torch

from fbo_torch.models.batched_gp import BatchedExactGP
from fbo_torch.sampling.gp_paths import GPThompsonPaths
from fbo_torch.utils import keyed_random as kr

f64 = torch.float64


def _paths(d=3, B=7, F=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = 2 * torch.rand(B, 5 * d, d, generator=g, dtype=f64) - 1
    bounds = torch.tensor([[-1.0] * d, [1.0] * d], dtype=f64)
    gp = BatchedExactGP(X, torch.sin(4 * X).sum(-1, keepdim=True), bounds).fit(maxiter=20)
    return gp.draw_paths(kr.fold(kr.root_key(seed, "blocks"), torch.arange(B)), F)


def _points(B, C, d, dtype, seed=1):
    return (2 * torch.rand(B, C, d, generator=torch.Generator().manual_seed(seed), dtype=f64) - 1).to(dtype)


def _copied(paths, index):
    """Taken paths as copies of the indexed fields (folding their own constants)."""
    shared = ("lo", "width")
    fields = tuple(getattr(paths, f) if f in shared else getattr(paths, f)[index] for f in GPThompsonPaths._FIELDS)
    return GPThompsonPaths.from_graph_state(fields, ())


def _count_blocks(monkeypatch):
    calls = []
    real = GPThompsonPaths._parts_in_blocks

    def counting(self, X, grad):
        calls.append(grad)
        return real(self, X, grad)

    monkeypatch.setattr(GPThompsonPaths, "_parts_in_blocks", counting)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, f64])
def test_blocks_are_the_batched_evaluation(dtype, monkeypatch):
    calls = _count_blocks(monkeypatch)
    paths = _paths().astype(dtype)
    X = _points(7, 9, 3, dtype)
    value, grad = paths.value_and_grad(X)
    only = paths(X)
    assert calls == [True, False]  # a CPU evaluates in blocks, with and without the gradient
    monkeypatch.setenv("FBO_SYNC_FREE", "1")  # the GPU's path: every path and point in one product each
    batched = paths.astype(dtype)
    ref_value, ref_grad = batched.value_and_grad(X)
    assert calls == [True, False]
    # the same sums over F = 64 features and the data in another order (a transposed product):
    # a few hundred roundings of the values' scale, the gradients' scale is the frequencies' times that
    eps = torch.finfo(dtype).eps
    scale = ref_value.abs().max()
    torch.testing.assert_close(value, ref_value, atol=256 * eps * scale, rtol=0)
    torch.testing.assert_close(only, batched(X), atol=256 * eps * scale, rtol=0)
    torch.testing.assert_close(grad, ref_grad, atol=256 * eps * ref_grad.abs().max(), rtol=0)
    # without the gradient the prior's sum is the same product and sum in both paths
    assert value.dtype == grad.dtype == dtype and grad.shape == X.shape


@pytest.mark.parametrize("dtype", [torch.float32, f64])
@pytest.mark.parametrize("per", [1, 2, 3])
def test_a_paths_values_do_not_depend_on_its_block(dtype, per, monkeypatch):
    paths = _paths().astype(dtype)
    X = _points(7, 9, 3, dtype)
    whole = paths.value_and_grad(X), paths(X)  # 7 paths in one block
    F = paths._W2t.shape[-1]
    monkeypatch.setattr(GPThompsonPaths, "CPU_BLOCK", per * 9 * F)  # blocks of `per` paths, the last shorter
    products = []
    real_bmm = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda a, b, **kw: products.append(a.shape[0]) or real_bmm(a, b, **kw))
    (value, grad), only = paths.value_and_grad(X), paths(X)
    blocks = [per] * (7 // per) + ([7 % per] if 7 % per else [])
    assert products == [m for m in blocks for _ in (0, 1)] + blocks  # two products per block with the gradient
    assert torch.equal(value, whole[0][0]) and torch.equal(grad, whole[0][1]) and torch.equal(only, whole[1])


@pytest.mark.parametrize("dtype", [torch.float32, f64])
def test_taken_paths_share_their_batch_and_equal_copies(dtype):
    paths = _paths().astype(dtype)
    X = _points(7, 9, 3, dtype)
    value, grad = paths.value_and_grad(X)  # folds the constants
    index = torch.tensor([5, 5, 0, 6, 2, 2])
    sub = paths.take(index)
    # nothing copied: the batch's tensors and the rows
    assert sub._base is paths and torch.equal(sub._rows, index)
    assert not any(f in vars(sub) for f in GPThompsonPaths._FIELDS + GPThompsonPaths._PREPARED)
    assert sub.batch_size == 6 and sub.extrapolate == paths.extrapolate
    copy = _copied(paths, index)
    for a, b in zip(sub.value_and_grad(X[index]), copy.value_and_grad(X[index]), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(sub(X[index]), copy(X[index]))
    assert torch.equal(sub.value_and_grad(X[index])[0], value[index])
    assert torch.equal(sub.value_and_grad(X[index])[1], grad[index])
    # a take of a take indexes the first batch; any other use indexes a field when it reads it
    subsub = sub.take(torch.tensor([3, 0]))
    assert subsub._base is paths and subsub._rows.tolist() == [6, 5]
    assert torch.equal(subsub(X[[6, 5]]), paths(X)[[6, 5]])
    assert torch.equal(sub.lengthscales(), paths.lengthscales()[index])
    for f, t in zip(GPThompsonPaths._FIELDS, sub.graph_state()[0], strict=True):
        assert torch.equal(t, getattr(paths, f) if f in ("lo", "width") else getattr(paths, f)[index])
    XA, XB = X[index][..., :2], X[index][..., 2:]
    assert torch.equal(sub.product_values(XA, XB), copy.product_values(XA, XB))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = sub.nope


def test_paths_taken_before_their_first_evaluation_are_copies():
    paths = _paths()
    sub = paths.take(torch.tensor([1, 1, 4]))
    assert sub._base is None and "W" in vars(sub)  # indexed, folding their own constants when evaluated
    X = _points(3, 4, 3, f64)
    assert torch.equal(sub(X), _copied(paths, torch.tensor([1, 1, 4]))(X))


def test_gradients_through_the_paths_take_the_batched_evaluation(monkeypatch):
    # autograd (points that require a gradient) takes the batched products, which it can differentiate
    calls = _count_blocks(monkeypatch)
    paths = _paths()
    X = _points(7, 4, 3, f64).requires_grad_(True)
    (g,) = torch.autograd.grad(paths(X).sum(), X)
    assert calls == []
    _, closed = paths.value_and_grad(X.detach())
    torch.testing.assert_close(g, closed, atol=256 * torch.finfo(f64).eps * closed.abs().max(), rtol=0)
