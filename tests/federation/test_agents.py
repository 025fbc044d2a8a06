"""The agents' own-GP branch with an analytic acquisition (``own_acquisition``: LogEI, UCB)."""

import sys
from pathlib import Path

import pytest
import torch
from botorch.acquisition import LogExpectedImprovement, UpperConfidenceBound
from torch.profiler import ProfilerActivity, profile

from fbo_torch.federation.agents import Agents
from fbo_torch.federation.settings import DPFTSDESettings, FTSSettings
from fbo_torch.optim.domain import Domain
from fbo_torch.utils import keyed_random as kr

f64 = torch.float64
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from op_count import SYNC_OPS

BOUNDS = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64)


def _agents(own_acquisition="logei", B=3, n=6, fail=True, **kw):
    """B agents on 2-D data; agent 0's second evaluation failed (NaN). BoTorch's GP without an
    outcome warp unless ``kw`` says otherwise: the tests compare with BoTorch's own model."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(B, n, 2, generator=g, dtype=f64)
    Y = torch.sin(6 * X).sum(-1, keepdim=True) + 0.05 * torch.randn(B, n, 1, generator=g, dtype=f64)
    if fail:
        Y[0, 1] = float("nan")
    s = FTSSettings(
        own_acquisition=own_acquisition, gp_fit_maxiter=30, **{"gp_kernel": "botorch", "gp_warp": "none", **kw}
    )
    dom = Domain(BOUNDS, raw_samples=256, num_restarts=8, maxiter=40)
    keys = kr.fold(kr.root_key(0, "agents"), torch.arange(B))
    return Agents(keys, X, Y, dom, s, capacity=2), Y


def _grid(n=121):
    g = torch.linspace(0, 1, n, dtype=f64)
    return torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)


def test_settings_validate_own_acquisition_and_ucb_beta():
    assert FTSSettings().own_acquisition == "logei" and DPFTSDESettings().ucb_beta == 2.0
    with pytest.raises(ValueError, match=r"`own_acquisition` must be one of \('ts', 'logei', 'ucb'\), got 'ei'"):
        FTSSettings(own_acquisition="ei")
    for bad in (-1.0, float("inf"), "2", True):
        with pytest.raises(ValueError, match="`ucb_beta` must be a finite number >= 0"):
            DPFTSDESettings(ucb_beta=bad)
    DPFTSDESettings(own_acquisition="ucb", ucb_beta=0)


def test_logei_proposals_maximize_botorch_logei_of_each_agent():
    agents, Y = _agents("logei")
    X, v = agents.own_proposals(1)
    assert X.shape == (3, 2) and v.shape == (3,) and X.dtype == v.dtype == f64
    assert ((X >= 0) & (X <= 1)).all()
    # best_f: the best valid observation (the failed one left out)
    best = torch.where(torch.isnan(Y), -torch.inf, Y).squeeze(-1).amax(-1)
    torch.testing.assert_close(agents.best_observed(), best, atol=0, rtol=0)
    model = agents.gp(refit=False)
    G = _grid()
    for b in range(3):
        logei = LogExpectedImprovement(model.to_botorch(b), best_f=best[b])
        with torch.no_grad():
            at_x = logei(X[b].view(1, 1, 2)).squeeze()
            dense = logei(G.unsqueeze(-2)).max()
        torch.testing.assert_close(v[b], at_x, atol=1e-10, rtol=1e-10)  # the value reported is LogEI's there
        assert v[b] >= dense - 1e-6, (b, v[b], dense)  # at least the 121 x 121 grid's best point


def test_ucb_proposals_and_ts_unchanged():
    agents, _ = _agents("ucb", ucb_beta=0.5)
    X, v = agents.own_proposals(1)
    model = agents.gp(refit=False)
    for b in range(3):
        ucb = UpperConfidenceBound(model.to_botorch(b), beta=torch.tensor(0.5, dtype=f64))
        with torch.no_grad():
            torch.testing.assert_close(v[b], ucb(X[b].view(1, 1, 2)).squeeze(), atol=1e-10, rtol=1e-10)
    # "ts" is the papers' branch: the maximizer of the keyed Thompson sample, as before
    ts, _ = _agents("ts")
    Xt, vt = ts.own_proposals(1)
    again, _ = _agents("ts")
    model = again.gp()
    paths = model.draw_paths(again.round_keys(1, "own-sample"), num_features=again.settings.gp_sample_features)
    Xr, vr = again.domain.maximize(paths, 3, keys=again.round_keys(1, "own-maximize"))
    assert torch.equal(Xt, Xr) and torch.equal(vt, vr)


def test_an_agent_without_valid_observations_gets_a_finite_proposal():
    agents, _ = _agents("logei", fail=False)
    agents._Y[1, : agents.n] = float("nan")
    agents._valid[1, : agents.n] = False
    X, v = agents.own_proposals(1)
    assert torch.isfinite(X).all() and torch.isfinite(v).all()


def test_a_logei_round_reads_no_device_value_on_the_host(monkeypatch):
    # as the Thompson branch (tests/federation/test_engine.py): nothing waits for the device
    monkeypatch.setenv("FBO_SYNC_FREE", "1")
    agents, _ = _agents("logei", gp_refit_every=0)
    agents.own_proposals(1)  # the first call fits the GPs (no sync either: tests/federation/test_engine.py)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        agents.own_proposals(2)
    assert [e.name for e in prof.events() if e.name in SYNC_OPS] == []


@pytest.mark.cuda
def test_logei_proposals_on_cuda_match_the_cpu_and_never_synchronize():
    cpu, _ = _agents("logei", gp_refit_every=0)
    gpu, _ = _agents("logei", gp_refit_every=0)
    gpu.keys, gpu._X, gpu._Y, gpu._valid = (t.cuda() for t in (gpu.keys, gpu._X, gpu._Y, gpu._valid))
    gpu.domain = gpu.domain.to("cuda")
    for t in (1, 2):  # round 1 fits and captures the CUDA graph, round 2 replays it
        if t == 2:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            _, vg = gpu.own_proposals(t)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        _, vc = cpu.own_proposals(t)
        # the same maximization in another kernel library: values agree to the maximizer's tolerance
        torch.testing.assert_close(vg.cpu(), vc, atol=1e-6, rtol=1e-6)


def test_plug_in_incumbent_is_the_largest_posterior_mean_at_the_valid_observations():
    agents, Y = _agents("logei")
    model = agents.gp(refit=False)
    plug = agents.plug_in_incumbent(model)
    for b in range(3):
        valid = ~torch.isnan(Y[b, :, 0])
        with torch.no_grad():
            mean = model.to_botorch(b).posterior(agents.train_X[b][valid]).mean.squeeze(-1)
        # the same GP algebra in float64 by two code paths: agreement to a few ulps of the data's scale
        torch.testing.assert_close(plug[b], mean.max(), atol=1e-9, rtol=1e-9)
    assert torch.equal(agents.own_acquisition(model, "plug-in").best_f, plug)
    assert torch.equal(agents.own_acquisition(model).best_f, agents.best_observed(model))
    with pytest.raises(ValueError, match="`incumbent` must be 'observed' or 'plug-in'"):
        agents.own_acquisition(model, "mean")
    # the error names the argument the bad value came from
    with pytest.raises(ValueError, match="^`acquisition` 'ts' has no analytic acquisition"):
        agents.own_acquisition(model, acquisition="ts")
