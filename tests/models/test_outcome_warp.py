import math

import pytest
import torch

from fbo_torch.federation.agents import Agents
from fbo_torch.federation.settings import MethodSettings
from fbo_torch.models.batched_gp import BatchedExactGP
from fbo_torch.models.outcome_warp import DEFAULT_OFFSETS, log_gap_warps
from fbo_torch.optim.domain import Domain
from fbo_torch.utils import keyed_random as kr

f64 = torch.float64


def test_identity_first_and_every_warp_increasing():
    g = torch.Generator().manual_seed(0)
    y = -torch.exp(3 * torch.randn(4, 12, generator=g, dtype=f64))
    mask = torch.ones_like(y, dtype=torch.bool)
    mask[1, 3] = False
    Z, log_jac = log_gap_warps(y, mask)
    assert Z.shape == (1 + len(DEFAULT_OFFSETS), 4, 12) and log_jac.shape == (1 + len(DEFAULT_OFFSETS), 4)
    torch.testing.assert_close(Z[0][mask], y[mask], rtol=0, atol=0)
    assert torch.all(log_jac[0] == 0)
    for k in range(Z.shape[0]):  # increasing warps keep every agent's ordering
        for b in range(4):
            keep = mask[b]
            assert torch.equal(torch.argsort(Z[k, b, keep]), torch.argsort(y[b, keep]))


def test_log_jacobian_is_the_derivative_of_the_warp():
    # w_c(y) = -log((y_max - y)/r + c): its derivative at fixed y_max, r by autograd
    g = torch.Generator().manual_seed(1)
    y = torch.randn(3, 9, generator=g, dtype=f64)
    mask = torch.ones_like(y, dtype=torch.bool)
    Z, log_jac = log_gap_warps(y, mask)
    hi, lo = y.amax(-1, keepdim=True), y.amin(-1, keepdim=True)
    for k, c in enumerate(DEFAULT_OFFSETS, start=1):
        yy = y.clone().requires_grad_(True)
        w = -torch.log((hi - yy) / (hi - lo) + c)
        torch.testing.assert_close(w.detach(), Z[k], rtol=1e-14, atol=1e-14)
        (grad,) = torch.autograd.grad(w.sum(), yy)
        torch.testing.assert_close(grad.log().sum(-1), log_jac[k], rtol=1e-12, atol=1e-12)


def test_constant_or_single_observation_gets_the_identity():
    y = torch.tensor([[2.0, 2.0, 2.0], [1.0, 5.0, 3.0]], dtype=f64)
    mask = torch.tensor([[True, True, True], [False, True, False]])
    Z, log_jac = log_gap_warps(y, mask)
    for k in range(Z.shape[0]):
        torch.testing.assert_close(Z[k][mask], y[mask], rtol=0, atol=0)
    assert torch.all(log_jac == 0)


@pytest.mark.parametrize("bad", [(), (0.0,), (-1.0, 0.1)])
def test_offsets_must_be_positive(bad):
    with pytest.raises(ValueError, match="offsets"):
        log_gap_warps(torch.zeros(1, 2, dtype=f64), torch.ones(1, 2, dtype=torch.bool), offsets=bad)


def _agents(Y, settings, seed=0):
    B, n = Y.shape
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(B, n, 2, generator=g, dtype=f64)
    keys = kr.fold(kr.root_key(seed, "warp-test"), torch.arange(B))
    return Agents(keys, X, Y.unsqueeze(-1), Domain(torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64)), settings)


def test_evidence_picks_a_log_warp_for_heavy_tails_and_keeps_gaussian_data():
    """The evidence is the likelihood of the *original* values, so it prefers the identity on
    smooth values with light tails and a log warp on values spanning orders of magnitude."""
    B, n = 12, 20
    g = torch.Generator().manual_seed(3)
    X = torch.rand(B, n, 2, generator=g, dtype=f64)
    centre = torch.rand(B, 1, 2, generator=g, dtype=f64)
    dist2 = ((X - centre) ** 2).sum(-1)
    settings = MethodSettings(gp_warp="auto", gp_kernel="fbo")
    keys = kr.fold(kr.root_key(0, "warp-test"), torch.arange(B))
    dom = Domain(torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64))
    # a smooth bump (light tails) vs a Rosenbrock-like spread of five orders of magnitude
    smooth = torch.exp(-dist2 / 0.3)
    heavy = -torch.exp(12.0 * dist2.sqrt())
    picks = {}
    for name, Y in (("smooth", smooth), ("heavy", heavy)):
        agents = Agents(keys, X, Y.unsqueeze(-1), dom, settings)
        agents.gp()
        picks[name] = agents.warp_choice
    assert (picks["smooth"] == 0).sum() >= 9, picks["smooth"]
    assert (picks["heavy"] > 0).sum() >= 9, picks["heavy"]


def test_warped_gp_is_the_chosen_warp_and_logei_uses_its_units():
    g = torch.Generator().manual_seed(5)
    Y = -torch.exp(6 * torch.rand(5, 14, generator=g, dtype=f64))
    agents = _agents(Y, MethodSettings(gp_warp="auto", own_acquisition="logei"))
    model = agents.gp()
    Z, _ = log_gap_warps(Y, torch.ones_like(Y, dtype=torch.bool))
    chosen = Z[agents.warp_choice, torch.arange(5)]  # 5 x n
    torch.testing.assert_close(model.y_mean.unsqueeze(-1) + model.y_std.unsqueeze(-1) * model.y, chosen)
    acq = agents.own_acquisition(model)
    torch.testing.assert_close(acq.best_f, chosen.amax(-1))
    # the unwarped default is what it was: the best raw observation
    plain = _agents(Y, MethodSettings(own_acquisition="logei", gp_warp="none"))
    torch.testing.assert_close(plain.own_acquisition(plain.gp()).best_f, Y.amax(-1), rtol=0, atol=0)


def test_warp_fits_every_candidate_like_separate_gps():
    """One batch of K x B GPs: each candidate's fit equals fitting that warp alone."""
    g = torch.Generator().manual_seed(7)
    Y = -torch.exp(4 * torch.rand(3, 10, generator=g, dtype=f64))
    agents = _agents(Y, MethodSettings(gp_warp="auto", gp_kernel="botorch"))  # BatchedExactGP's default kernel
    agents.gp()
    K = 1 + len(DEFAULT_OFFSETS)
    Z, log_jac = log_gap_warps(Y, torch.ones_like(Y, dtype=torch.bool))
    params = agents.gp_params.view(K, 3, -1)
    evid = []
    for k in range(K):
        alone = BatchedExactGP(agents.train_X, Z[k].unsqueeze(-1), agents.domain.bounds).fit()
        torch.testing.assert_close(alone.params, params[k], rtol=1e-6, atol=1e-6)
        evid.append(alone.mll() * 10 - 10 * alone.y_std.log() + log_jac[k])
    assert torch.equal(torch.stack(evid).argmax(0), agents.warp_choice)


def test_state_dict_keeps_the_warp_choice():
    g = torch.Generator().manual_seed(9)
    Y = -torch.exp(5 * torch.rand(2, 8, generator=g, dtype=f64))
    agents = _agents(Y, MethodSettings(gp_warp="auto", message_outputs="warped"))
    agents.gp()
    again = _agents(Y, MethodSettings(gp_warp="auto", message_outputs="warped"))
    again.load_state_dict(agents.state_dict())
    assert torch.equal(again.warp_choice, agents.warp_choice)


@pytest.mark.parametrize("key,value", [("gp_warp", "log"), ("message_outputs", "normalized")])
def test_settings_refuse_unknown_values(key, value):
    with pytest.raises(ValueError, match=key):
        MethodSettings(**{key: value})


def test_log_of_a_sphere_gap_is_quadratic_in_log_space():
    """Sanity of the family's purpose: a Sphere's values, gap-warped with a small offset,
    have a far smaller spread relative to the top than the raw values."""
    u = torch.linspace(0, 1, 50, dtype=f64)
    y = -(1e4 * (u - 0.3) ** 2)
    Z, _ = log_gap_warps(y.unsqueeze(0), torch.ones(1, 50, dtype=torch.bool), offsets=(1e-3,))
    raw_ratio = (y.max() - y.median()) / (y.max() - y.min())
    warped = Z[1, 0]
    warped_ratio = (warped.max() - warped.median()) / (warped.max() - warped.min())
    assert raw_ratio < 0.2 and warped_ratio > 0.5 and math.isfinite(float(warped.max()))
