"""A problem's result does not depend on the other problems of its batch: products, GP fits, runs."""

import os
import subprocess
import sys

import pytest
import torch

from fbo_torch.federation.settings import FTSSettings
from fbo_torch.models.batched_gp import BatchedExactGP
from fbo_torch.models.gp_spec import get_spec
from fbo_torch.objectives.function_families import FunctionFamilyFederation
from fbo_torch.optim.domain import Domain
from fbo_torch.simulate.fts import FederationHistory, FTSRunner
from fbo_torch.utils.batch_invariant import blas_mode, matmul


def _strict_or_skip():
    mode = blas_mode()
    if mode == "off":
        pytest.skip("MKL runs without MKL_CBWR=...,STRICT in this process (torch computed before fbo_torch's import)")


@pytest.mark.parametrize(
    "a_shape, b_shape, transpose_b",
    [((20, 20), (20, 1), False), ((1, 400), (3, 400), True), ((50, 3), (20, 3), True), ((1, 20), (20, 1), False)],
)
def test_a_batch_of_one_rounds_as_in_a_larger_batch(a_shape, b_shape, transpose_b):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, *a_shape, dtype=torch.float64, generator=g)
    b = torch.randn(5, *b_shape, dtype=torch.float64, generator=g)
    b = b.mT if transpose_b else b  # a transposed view keeps its layout in the batch of one
    full = a @ b
    for i in range(5):
        assert torch.equal(matmul(a[i : i + 1], b[i : i + 1]), full[i : i + 1])
    assert torch.equal(matmul(a[:3], b[:3]), full[:3])
    # batch dimensions of size one, broadcast or not, keep their shape
    assert matmul(a[:1].unsqueeze(0), b[:1]).shape == (1, 1, *full.shape[-2:])
    assert torch.equal(matmul(a[0], b[0]), full[0])  # unbatched operands: the same bits as in a batch


def test_matmul_refuses_vectors():
    with pytest.raises(ValueError, match="matrices or batches of them"):
        matmul(torch.ones(3), torch.ones(3, 1))


def test_importing_fbo_torch_asks_mkl_for_alignment_free_results():
    code = "import fbo_torch, torch; from fbo_torch.utils.batch_invariant import blas_mode; print(blas_mode())"
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    if out.stdout.strip() == "unavailable":
        pytest.skip("this torch has no MKL")
    assert out.stdout.strip() == "AUTO,STRICT"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**env, "MKL_CBWR": "AUTO"}, check=True
    )
    assert out.stdout.strip() == "AUTO"  # the user's own setting is kept


def _gp_data(B, n=15, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(B, n, d, dtype=torch.float64, generator=g)
    Y = torch.sin(6 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(B, n, 1, dtype=torch.float64, generator=g)
    return X, Y, torch.stack([torch.zeros(d), torch.ones(d)]).double()


@pytest.mark.parametrize("n", [15, 30])  # small products take ATen's own loops, larger ones BLAS
@pytest.mark.parametrize("spec", ["botorch", "fbo"])
def test_a_gp_fit_is_the_same_alone_and_among_any_others(spec, n):
    """Problems leave the fit's batch as they converge, so each is fitted among others that vary,
    at varying offsets: alone, among consecutive and among scattered problems, the same bits."""
    _strict_or_skip()
    X, Y, bounds = _gp_data(12, n=n)

    def fit(idx):
        idx = torch.tensor(idx)
        return BatchedExactGP(X[idx], Y[idx], bounds, spec=get_spec(spec)).fit(maxiter=60).params

    full = fit(list(range(12)))
    for subset in ([4], [0, 4], [3, 4, 5], list(range(0, 12, 2)), [11, 4, 7]):
        assert torch.equal(fit(subset), full[subset]), subset


@pytest.mark.parametrize(
    "engine",
    [
        dict(algorithm="ts", gp_kernel="botorch", own_acquisition="ts"),
        dict(algorithm="ts", gp_kernel="fbo", gp_warp="auto", own_acquisition="logei"),
        dict(
            algorithm="transfer",
            agent_weights="corroborated",
            gp_kernel="fbo",
            gp_warp="auto",
            own_acquisition="logei",
            communication="every-round",
            num_features=100,
            message_outputs="warped",
        ),
    ],
    ids=["paper", "engine", "transfer"],
)
def test_runs_give_the_same_bits_alone_and_among_others(engine):
    """The first runs of a batch of four are, bit for bit, those runs in a batch of two, and the
    first alone: what makes a subset of a recorded result reproducible (benchmarks/reproduce.py)."""
    _strict_or_skip()
    objective = FunctionFamilyFederation(num_agents=4, dim=3, seed=0)
    settings = FTSSettings(num_init=8, num_iterations=4, **engine)
    history = None
    if settings.algorithm != "ts":
        history = FederationHistory(objective, Domain(objective.bounds, objective.candidates), t_n=10, seed=1)

    def run(inits):
        runner = FTSRunner(objective, settings, torch.tensor([0]), inits, history=history, seed=0)
        return runner.run().loss, runner.X

    loss4, X4 = run(4)
    for inits in (1, 2):
        loss, X = run(inits)
        assert torch.equal(loss, loss4[:inits]) and torch.equal(X, X4[:inits]), inits
