"""What a GPU would launch, counted on a CPU: kernel operators per optimizer iteration and per round.

On a GPU the round is launch-bound (each tensor operator is one kernel of a few
microseconds, whatever its size), so the number of operators per BFGS iteration
is what the maximizers and the GP fit cost there, at any number of agents. The
budgets are the current code's counts with ~12% headroom for operator
decompositions that differ between torch versions (docs/design.md has the
counts); ``benchmarks/round_time.py --ops`` reports whole rounds.
"""

import sys
from pathlib import Path

import pytest
import torch

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.models.batched_gp import BatchedExactGP
from fbo_torch.optim import maximize_batched
from fbo_torch.sampling.rff_paths import RFFSamplePaths
from fbo_torch.utils import keyed_random as kr

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from op_count import count_ops

f64 = torch.float64
BOUNDS = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64)
BUDGET = {"rff": 121, "gp_path": 139, "gp_fit": 166}


def _problem(kind: str, B: int):
    """``maxiter -> None``: one maximization (or fit) of ``B`` problems, built as the engine builds them."""
    g = torch.Generator().manual_seed(B)
    keys = torch.arange(B)
    opts = dict(raw_samples=64, num_restarts=4, keys=keys, validate=False)
    X = torch.rand(B, 12, 2, generator=g, dtype=f64)
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    gp = BatchedExactGP(X, Y, BOUNDS, validate=False).fit(maxiter=5)
    if kind == "rff":
        paths = RFFSamplePaths(
            RandomFourierFeatures(2, 50, lengthscale=0.2, seed=0), torch.randn(B, 50, generator=g, dtype=f64)
        )
        return lambda m: maximize_batched(paths, BOUNDS, B, maxiter=m, **opts)
    if kind == "gp_path":
        paths = gp.draw_paths(kr.fold(kr.root_key(0, "budget"), keys), 64)
        return lambda m: maximize_batched(paths, BOUNDS, B, maxiter=m, **opts)
    return lambda m: BatchedExactGP(X, Y, BOUNDS, params=gp.params, validate=False).fit(maxiter=m)


@pytest.mark.parametrize("kind", sorted(BUDGET))
def test_kernel_operators_per_iteration_are_few_and_flat_in_the_batch(kind):
    per_iter = {}
    for B in (4, 32):
        run = _problem(kind, B)
        run(1)  # first calls fill caches (the Sobol points)
        counts = {m: count_ops(lambda m=m, run=run: run(m)) for m in (10, 20)}
        per_iter[B] = (counts[20]["kernel_ops"] - counts[10]["kernel_ops"]) / 10
        assert counts[10]["syncs"] == counts[20]["syncs"] == 0  # nothing read on the host
    assert per_iter[4] == per_iter[32], per_iter  # one batched operator per step, whatever the batch
    assert per_iter[4] <= BUDGET[kind], per_iter


def test_count_ops_counts_operators_that_launch_kernels():
    # bmm and where dispatch only kernel-free children (resolve_conj, expand): they are launches;
    # matmul is not (its bmm is); views and .to() of the same dtype are none; .item() is a sync
    a, b = torch.rand(3, 4, 5, dtype=f64), torch.rand(3, 5, 2, dtype=f64)
    assert count_ops(lambda: torch.bmm(a, b))["kernel_ops"] == 1
    assert count_ops(lambda: a @ b)["kernel_ops"] == 1
    assert count_ops(lambda: torch.where(a > 0.5, a, -a))["kernel_ops"] == 3  # gt, neg, where
    assert count_ops(lambda: a.view(12, 5).mT.unsqueeze(0).to(f64))["kernel_ops"] == 0
    assert count_ops(lambda: a.mT.contiguous())["kernel_ops"] == 1  # the copy
    assert count_ops(lambda: (a > 0.5).max(0))["kernel_ops"] == 2  # its children only restride (as_strided_)
    assert count_ops(lambda: torch.baddbmm(a[:, :, :2], a, b))["kernel_ops"] == 2  # copy of the input term, product
    c = count_ops(lambda: a.sum().item())
    assert c["kernel_ops"] >= 1 and c["syncs"] >= 1
