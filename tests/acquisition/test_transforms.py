"""Messages fitted on transformed inputs: acquisitions evaluate phi(T(x))^T omega, or refuse when T is unknown."""

import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import ChainedInputTransform, InputStandardize, Normalize, Warp
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf
from botorch.test_functions import Branin

from fbo_torch import RandomFourierFeatures, RFFBayesianLinear
from fbo_torch.acquisition import FederatedThompsonSampling, PiecewiseRFFThompsonSample, RFFThompsonSample
from fbo_torch.protocol import AgentMessage, SubRegionPartition, stack_omegas
from fbo_torch.protocol.fidelity import fidelity_scores, peer_predictions
from fbo_torch.protocol.input_space import MessageSpace, input_bounds_of
from fbo_torch.sampling import RFFSamplePaths

f64 = torch.float64
BRANIN_BOUNDS = torch.tensor([[-5.0, 0.0], [10.0, 15.0]], dtype=f64)
BRANIN_MAX = -0.397887


_BRANIN = Branin()


def branin(X):
    """Negated Branin (to maximize) at any point: BoTorch's formula, without ``evaluate_true``'s domain check."""
    return -_BRANIN._evaluate_true(X)


def raw(U):
    return BRANIN_BOUNDS[0] + U * (BRANIN_BOUNDS[1] - BRANIN_BOUNDS[0])


def normalize(X):
    return (X - BRANIN_BOUNDS[0]) / (BRANIN_BOUNDS[1] - BRANIN_BOUNDS[0])


@pytest.fixture
def setup():
    """Peers fitted on Normalize'd raw Branin inputs, a target GP with its own Normalize, raw test points."""
    g = torch.Generator().manual_seed(0)
    rff = RandomFourierFeatures(2, 120, lengthscale=0.3, seed=1)
    Xp = raw(torch.rand(3, 25, 2, generator=g, dtype=f64))
    peers = RFFBayesianLinear(
        rff, Xp, branin(Xp).unsqueeze(-1) / 50, 1e-2, input_transform=Normalize(2, bounds=BRANIN_BOUNDS)
    )
    X = raw(torch.rand(6, 2, generator=g, dtype=f64))
    gp = SingleTaskGP(X, branin(X).unsqueeze(-1), input_transform=Normalize(2, bounds=BRANIN_BOUNDS))
    return rff, peers, gp, raw(torch.rand(200, 2, generator=g, dtype=f64))


def by_hand(rff, omega, X):
    """phi(normalize(x))^T omega, written out."""
    U = normalize(X)
    lin = U @ rff.spectral.T + rff.phase
    phi = torch.cos(lin)
    phi = phi * rff.outputscale.sqrt() / phi.norm(dim=-1, keepdim=True)  # the papers' normalized map
    return phi @ omega


def test_messages_carry_the_senders_input_bounds(setup):
    rff, peers, _, _ = setup
    msgs = peers.messages(generator=torch.Generator().manual_seed(0), agent_ids=[4, 5, 6])
    assert [m.agent_id for m in msgs] == [4, 5, 6] and [m.num_observations for m in msgs] == [25] * 3
    for m in msgs:
        assert torch.equal(m.input_bounds, BRANIN_BOUNDS) and m.fingerprint == rff.fingerprint
    # the same draws as sample_weights with the same generator
    ref = peers.sample_weights(generator=torch.Generator().manual_seed(0))
    assert torch.equal(stack_omegas(msgs), ref)
    # no transform: raw inputs, the unit box
    plain = RFFBayesianLinear(rff, normalize(peers.train_X), peers.train_Y, 1e-2).messages()
    assert torch.equal(plain[0].input_bounds, torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64))


def test_fts_evaluates_messages_on_normalized_inputs(setup):
    rff, peers, gp, Xt = setup
    msgs = peers.messages(generator=torch.Generator().manual_seed(1))
    omegas = stack_omegas(msgs)
    for messages, kw in ((msgs, {}), (omegas, {"input_transform": Normalize(2, bounds=BRANIN_BOUNDS)})):
        acqf = FederatedThompsonSampling(gp, messages, rff, p_t=0.0, generator=torch.Generator().manual_seed(2), **kw)
        want = by_hand(rff, omegas[acqf.source], Xt)
        assert torch.allclose(acqf(Xt.unsqueeze(-2)), want, atol=1e-12, rtol=0)
        assert (rff(Xt) @ omegas[acqf.source] - want).abs().max() > 1e-2  # raw inputs would be another function


def test_rff_thompson_sample_and_piecewise_use_the_message_space(setup):
    rff, peers, _, Xt = setup
    msgs = peers.messages(generator=torch.Generator().manual_seed(3))
    want = by_hand(rff, msgs[1].omega, Xt)
    assert torch.allclose(RFFThompsonSample(rff, msgs[1])(Xt.unsqueeze(-2)), want, atol=1e-12, rtol=0)
    tf = Normalize(2, bounds=BRANIN_BOUNDS)
    assert torch.allclose(
        RFFThompsonSample(rff, msgs[1].omega, input_transform=tf)(Xt.unsqueeze(-2)), want, atol=1e-12, rtol=0
    )
    # a raw tensor without a transform means raw inputs (no model to tell otherwise)
    assert torch.allclose(RFFThompsonSample(rff, msgs[1].omega)(Xt.unsqueeze(-2)), rff(Xt) @ msgs[1].omega)

    part = SubRegionPartition(BRANIN_BOUNDS, 2, splits=[2, 1])
    omegas = stack_omegas(msgs[:2])
    pw = PiecewiseRFFThompsonSample(rff, omegas, part, input_transform=tf)
    region = part.region_of(Xt)
    want = torch.stack(
        [by_hand(rff, omegas[r], x.unsqueeze(0)).squeeze(0) for r, x in zip(region.tolist(), Xt, strict=True)]
    )
    assert torch.allclose(pw(Xt.unsqueeze(-2)), want, atol=1e-12, rtol=0)
    assert torch.allclose(pw.region_acquisition(1)(Xt.unsqueeze(-2)), by_hand(rff, omegas[1], Xt), atol=1e-12, rtol=0)


def test_batched_paths_fold_the_bounds_into_the_map(setup):
    rff, peers, _, Xt = setup
    msgs = peers.messages(generator=torch.Generator().manual_seed(4))
    omegas = stack_omegas(msgs)
    paths = RFFSamplePaths(rff, omegas, input_bounds=msgs[0].input_bounds)
    X = Xt.expand(3, -1, -1).clone()
    want = torch.stack([by_hand(rff, w, Xt) for w in omegas])
    values, grad = paths.value_and_grad(X)
    assert torch.allclose(paths(X), want, atol=1e-11, rtol=0) and torch.allclose(values, want, atol=1e-11, rtol=0)
    Xg = X.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(sum(by_hand(rff, w, x).sum() for w, x in zip(omegas, Xg, strict=True)), Xg)
    assert torch.allclose(grad, ref, atol=1e-10, rtol=0)
    # lengthscales in raw coordinates: the box widths times the map's lengthscale
    assert torch.allclose(paths.lengthscales(), 0.3 * torch.tensor([15.0, 15.0], dtype=f64))


def test_learned_weights_score_messages_on_transformed_inputs(setup):
    rff, peers, gp, _ = setup
    omegas = stack_omegas(peers.messages(generator=torch.Generator().manual_seed(5)))
    Xs = raw(torch.rand(8, 2, generator=torch.Generator().manual_seed(6), dtype=f64))
    ys = branin(Xs)
    acqf = FederatedThompsonSampling(
        gp,
        omegas,
        rff,
        p_t=0.5,
        agent_weights="learned",
        train_X=Xs,
        train_Y=ys,
        input_transform=Normalize(2, bounds=BRANIN_BOUNDS),
    )
    want = fidelity_scores(peer_predictions(rff, omegas, normalize(Xs)), ys)
    assert torch.allclose(acqf.fidelity, want, atol=1e-12)
    assert not torch.allclose(want, fidelity_scores(peer_predictions(rff, omegas, Xs), ys))


def test_refuses_unknown_or_conflicting_spaces(setup):
    rff, peers, gp, _ = setup
    msgs = peers.messages()
    omegas = stack_omegas(msgs)
    with pytest.raises(ValueError, match="Pass `input_transform=`"):
        FederatedThompsonSampling(gp, omegas, rff, p_t=0.0)
    # messages without bounds are undeclared, like tensors
    bare = [AgentMessage(m.omega, m.agent_id, m.num_observations, m.fingerprint) for m in msgs]
    with pytest.raises(ValueError, match="Pass `input_transform=`"):
        FederatedThompsonSampling(gp, bare, rff, p_t=0.5)
    FederatedThompsonSampling(gp, bare, rff, p_t=0.5, input_transform=Normalize(2, bounds=BRANIN_BOUNDS))
    with pytest.raises(ValueError, match=r"agents \[1\] carry no `input_bounds`"):
        FederatedThompsonSampling(gp, [msgs[0], bare[1]], rff, p_t=0.5)
    # different transforms in one acquisition
    other = AgentMessage(msgs[2].omega, 2, 25, rff.fingerprint, input_bounds=BRANIN_BOUNDS * 2)
    with pytest.raises(ValueError, match=r"agents \[2\] were fitted on a different input space"):
        FederatedThompsonSampling(gp, [msgs[0], msgs[1], other], rff, p_t=0.5)
    with pytest.raises(ValueError, match="differs from that of `input_transform`"):
        RFFThompsonSample(rff, msgs[0], input_transform=torch.nn.Identity())
    # p_t = 1 with no messages needs no space; a model without a transform: raw inputs
    FederatedThompsonSampling(gp, [], rff, p_t=1.0)
    with pytest.raises(ValueError, match="upper bound must exceed"):
        AgentMessage(msgs[0].omega, 0, 1, rff.fingerprint, input_bounds=BRANIN_BOUNDS.flip(0))
    with pytest.raises(ValueError, match="2 x d"):
        AgentMessage(msgs[0].omega, 0, 1, rff.fingerprint, input_bounds=BRANIN_BOUNDS[0])


def test_input_bounds_of_affine_transforms():
    X = raw(torch.rand(50, 2, generator=torch.Generator().manual_seed(7), dtype=f64))
    std = InputStandardize(2)
    std(X)
    std.eval()
    partial = Normalize(2, bounds=BRANIN_BOUNDS[:, 1:], indices=[1])
    chained = ChainedInputTransform(a=Normalize(2, bounds=BRANIN_BOUNDS), b=std)
    for tf in (Normalize(2, bounds=BRANIN_BOUNDS), std, partial, chained):
        tf.eval()
        space = MessageSpace(input_bounds_of(tf, 2))
        assert torch.allclose(space(X), tf(X), atol=1e-12)
    with pytest.raises(ValueError, match="not affine"):
        input_bounds_of(Warp(2, indices=[0, 1]), 2)
    with pytest.raises(ValueError, match="reverse=True"):
        input_bounds_of(Normalize(2, bounds=BRANIN_BOUNDS, reverse=True), 2)
    # a non-affine transform still works as the acquisitions' argument (applied as a module, in eval mode)
    rff = RandomFourierFeatures(2, 50, lengthscale=0.3, seed=2)
    warp = ChainedInputTransform(n=Normalize(2, bounds=BRANIN_BOUNDS), w=Warp(2, indices=[0, 1]))
    warp.eval()
    omega = torch.randn(50, dtype=f64)
    acqf = RFFThompsonSample(rff, omega, input_transform=warp)
    assert torch.allclose(acqf(X.unsqueeze(-2)), rff(warp(X)) @ omega)
    assert not warp.training


def test_readme_loop_follows_messages_to_good_points():
    """Target GP with Normalize on raw Branin bounds, peers with shifted Branin: a message's argmax is a good point.

    Random points have a median regret of ~36 on Branin; a peer's function is the target's shifted by at most 0.3
    (2 % of the box), so following its message should land near a global minimum. Evaluated on raw inputs (what
    the acquisition computed before it knew the messages' space) the same messages' argmaxes are far worse.
    """
    g = torch.Generator().manual_seed(0)
    N, n = 8, 50
    shift = (torch.rand(N, 1, 2, generator=g, dtype=f64) - 0.5) * 0.6
    Xp = raw(torch.rand(N, n, 2, generator=g, dtype=f64))
    rff = RandomFourierFeatures(2, 200, lengthscale=0.3, seed=0)
    peers = RFFBayesianLinear(
        rff,
        Xp,
        branin(Xp - shift).unsqueeze(-1),
        1e-3,
        input_transform=Normalize(2, bounds=BRANIN_BOUNDS),
        outcome_transform=Standardize(1, batch_shape=torch.Size([N])),
    )
    X = raw(torch.rand(5, 2, generator=g, dtype=f64))
    gp = SingleTaskGP(
        X, branin(X).unsqueeze(-1), input_transform=Normalize(2, bounds=BRANIN_BOUNDS), outcome_transform=Standardize(1)
    )
    msgs = peers.messages(generator=g)

    def median_regret(messages, **kw):
        regrets = []
        for i in range(N):
            probs = torch.nn.functional.one_hot(torch.tensor(i), N).to(f64)
            acqf = FederatedThompsonSampling(gp, messages, rff, p_t=0.0, agent_probs=probs, generator=g, **kw)
            x, _ = optimize_acqf(acqf, BRANIN_BOUNDS, q=1, num_restarts=4, raw_samples=128)
            regrets.append(BRANIN_MAX - branin(x).item())
        return torch.tensor(regrets).median()

    random = (BRANIN_MAX - branin(raw(torch.rand(1000, 2, generator=g, dtype=f64)))).median()
    followed = median_regret(msgs)
    on_raw_inputs = median_regret(stack_omegas(msgs), input_transform=torch.nn.Identity())
    assert followed < 0.25 * random, (followed, random)
    assert on_raw_inputs > 0.25 * random, (on_raw_inputs, random)
