"""Learned P_N: the fidelity scores' statistics, the weights and trust they give, and their use."""

import math

import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize
from scipy.stats import kendalltau

from fbo_torch.acquisition import FederatedThompsonSampling
from fbo_torch.features import RandomFourierFeatures
from fbo_torch.federation.settings import FTSSettings
from fbo_torch.models import RFFBayesianLinear
from fbo_torch.protocol import AgentDistribution
from fbo_torch.protocol.fidelity import (
    AGENT_WEIGHTS,
    coinciding_maximizers,
    corroborated_counts,
    cross_check,
    fidelity_scores,
    fidelity_weights,
    kendall_tau,
    learn_peer_choice,
    maximizer_correlation,
    null_std,
    peer_counts,
    peer_predictions,
    peer_trust,
    redundancy,
    reference_points,
    reference_values,
    trusted_p_t,
)


def f(X):
    return torch.sin(6 * X[..., 0]) + 0.5 * torch.cos(11 * X[..., 0])


@pytest.fixture
def peers():
    """Messages of a peer identical to the target, one with -f, and two unrelated ones."""
    rff = RandomFourierFeatures(1, 200, lengthscale=0.08, seed=3)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(300, 1, generator=g, dtype=torch.float64)
    same = RFFBayesianLinear(rff, X, f(X).unsqueeze(-1), noise_variance=1e-4).weight_mean.reshape(-1)
    unrelated = torch.randn(2, 200, generator=g, dtype=torch.float64) * 0.3
    return rff, torch.stack([same, -same, *unrelated])  # N = 4


def target_data(n, seed, noise=0.1):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 1, generator=g, dtype=torch.float64)
    return X, f(X) + noise * torch.randn(n, generator=g, dtype=torch.float64)


def test_kendall_tau_matches_scipy_and_ignores_masked_observations():
    g = torch.Generator().manual_seed(1)
    y = torch.randn(3, 17, generator=g, dtype=torch.float64)
    preds = y.unsqueeze(1) + torch.randn(3, 5, 17, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 17, generator=g) > 0.3
    tau, n = kendall_tau(preds, torch.where(mask, y, torch.nan), mask)
    for b in range(3):
        assert int(n[b]) == int(mask[b].sum())
        for k in range(5):
            ref = kendalltau(y[b][mask[b]].numpy(), preds[b, k][mask[b]].numpy()).statistic  # no ties: tau-b = tau-a
            assert tau[b, k].item() == pytest.approx(ref, abs=1e-12)


def test_scores_of_unrelated_peers_are_standard_normal_at_every_n():
    # Kendall's null variance 2(2n+5)/(9n(n-1)) is exact for continuous data: z has mean 0 and
    # variance 1 whatever n. With K draws the sample mean has s.e. 1/sqrt(K) and the sample
    # variance (of a near-normal z) s.e. sqrt(2/K): allow 4 standard errors.
    K = 4000
    g = torch.Generator().manual_seed(2)
    for n in (4, 12, 40):
        y = torch.randn(K, n, generator=g, dtype=torch.float64)
        preds = torch.randn(K, 1, n, generator=g, dtype=torch.float64)
        z = fidelity_scores(preds, y).squeeze(-1)
        assert abs(z.mean().item()) < 4 / math.sqrt(K)
        assert abs(z.var().item() - 1) < 4 * math.sqrt(2 / K)


def test_scores_are_invariant_to_increasing_transforms():
    g = torch.Generator().manual_seed(3)
    y = torch.randn(20, generator=g, dtype=torch.float64)
    preds = (y + torch.randn(20, generator=g, dtype=torch.float64)).unsqueeze(0)
    z = fidelity_scores(preds, y)
    assert torch.equal(fidelity_scores(1e6 * preds.exp() - 3, 0.01 * y + 7), z)


def test_identical_peer_gets_most_weight_and_adversarial_weight_vanishes(peers):
    rff, omegas = peers
    ratio, adversarial = [], []
    for n in (5, 10, 20, 40, 80):
        X, y = target_data(n, seed=n)
        z = fidelity_scores(peer_predictions(rff, omegas, X), y)
        p = fidelity_weights(z)
        assert int(p.argmax()) == 0, (n, p)
        ratio.append((p[1] / p[0]).item())
        adversarial.append(p[1].item())
    # relative to the identical peer the adversarial weight is exp(2 tau / s(n)) with tau -> -1 and
    # s(n) ~ 2 / (3 sqrt(n)): it falls like exp(-3 sqrt(n))
    assert all(b < a for a, b in zip(ratio, ratio[1:], strict=False))
    assert adversarial[-1] < 1e-8
    # two observations (one pair) rank already; with one, P_N is uniform
    X, y = target_data(1, seed=0)
    assert torch.allclose(
        fidelity_weights(fidelity_scores(peer_predictions(rff, omegas, X), y)),
        torch.full((4,), 0.25, dtype=torch.float64),
    )


def test_weights_respect_support_and_batch(peers):
    rff, omegas = peers
    X = torch.stack([target_data(15, s)[0] for s in range(3)])
    y = f(X)
    support = torch.tensor([[False, True, True, True], [True, True, False, True], [False] * 4])
    p = fidelity_weights(fidelity_scores(peer_predictions(rff, omegas, X), y), support)
    assert p.shape == (3, 4)
    assert torch.equal(p[~support], torch.zeros(int((~support).sum()), dtype=torch.float64))
    assert torch.allclose(p[:2].sum(-1), torch.ones(2, dtype=torch.float64))
    assert int(p[0].argmax()) in (2, 3) and int(p[1].argmax()) == 0


def test_trust_follows_the_evidence(peers):
    rff, omegas = peers
    X, y = target_data(30, seed=5)
    n = torch.tensor(30)
    z = fidelity_scores(peer_predictions(rff, omegas, X), y)
    helpful = peer_trust(z, fidelity_weights(z), n)
    only_adversarial = peer_trust(z[1:2], fidelity_weights(z[1:2]), n)
    assert helpful.item() > 0.99 and only_adversarial.item() < 1e-6
    # nothing known yet: the schedule is kept
    assert peer_trust(torch.zeros(4), torch.full((4,), 0.25), torch.tensor(1)).item() == 1.0
    assert trusted_p_t(0.3, helpful).item() == pytest.approx(1 - 0.7 * helpful.item())
    assert trusted_p_t(0.3, only_adversarial).item() == pytest.approx(1.0, abs=1e-6)
    assert torch.allclose(null_std(torch.tensor([1, 0])), torch.full((2,), math.inf, dtype=torch.float64))


def test_trust_in_unrelated_peers_falls_as_observations_accumulate():
    # 20 unrelated peers, learned P_N (which favours the luckiest): the posterior that the drawn peer
    # is helpful (tau = 0.5 vs 0) starts near 1/2 (trust ~1) and decays as s(n) = O(1/sqrt(n)) shrinks
    g = torch.Generator().manual_seed(4)
    means = []
    for n in (3, 10, 40, 80):
        y = torch.randn(500, n, generator=g, dtype=torch.float64)
        z = fidelity_scores(torch.randn(500, 20, n, generator=g, dtype=torch.float64), y)
        means.append(peer_trust(z, fidelity_weights(z), torch.full((500,), n)).mean().item())
    assert means[0] > 0.8 and means[-1] < 0.05
    assert all(b < a for a, b in zip(means, means[1:], strict=False))


def test_agent_distribution_reweight_keeps_support_and_used_messages():
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    dist = AgentDistribution(4, probs=probs)
    dist.remove(torch.tensor([2, -1]))
    dist.reweight(torch.tensor([[9.0, 1.0, 5.0, 9.0], [0.0, 0.0, 0.0, 0.0]]))
    assert torch.equal(dist.probs[0], torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64))
    assert torch.equal(dist.probs[1], torch.full((4,), 0.25, dtype=torch.float64))  # all-zero row kept
    state = dist.state_dict()
    other = AgentDistribution(4, probs=probs)
    other.load_state_dict(state)
    assert torch.equal(other.support, dist.support) and torch.equal(other.probs, dist.probs)


def test_fts_acquisition_learned_weights(peers):
    rff, omegas = peers
    X, y = target_data(25, seed=7)
    gp = SingleTaskGP(X, y.unsqueeze(-1))
    acqf = FederatedThompsonSampling(
        gp, omegas, rff, p_t=0.0, agent_weights="learned", generator=torch.Generator().manual_seed(0)
    )
    assert int(acqf.agent_probs.argmax()) == 0 and acqf.agent_probs[1].item() < 1e-3
    assert acqf.fidelity.shape == (4,)
    counts = torch.zeros(4)
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        counts[FederatedThompsonSampling(gp, omegas, rff, p_t=0.0, agent_weights="learned", generator=g).source] += 1
    assert counts[0] > 150 and counts[1] == 0
    # restricted by agent_probs: the identical peer excluded
    acqf = FederatedThompsonSampling(
        gp,
        omegas,
        rff,
        p_t=0.0,
        agent_weights="learned",
        agent_probs=torch.tensor([0.0, 0.4, 0.3, 0.3], dtype=torch.float64),
    )
    assert acqf.agent_probs[0].item() == 0.0
    # trust: only the adversarial message left -> own GP
    acqf = FederatedThompsonSampling(gp, omegas[1:2], rff, p_t=0.0, peer_trust=True)
    assert acqf.p_t_used > 1 - 1e-6 and acqf.source == "own"
    uniform = FederatedThompsonSampling(gp, omegas, rff, p_t=0.0)
    assert uniform.fidelity is None and torch.allclose(uniform.agent_probs, torch.full((4,), 0.25, dtype=torch.float64))


def test_fts_acquisition_learned_weights_needs_raw_inputs_with_transform(peers):
    rff, omegas = peers
    X, y = target_data(10, seed=8)
    gp = SingleTaskGP(X, y.unsqueeze(-1), input_transform=Normalize(1))
    raw = {"input_transform": torch.nn.Identity()}  # the peers fitted raw inputs; gp's Normalize is its own
    with pytest.raises(ValueError, match="pass `train_X`"):
        FederatedThompsonSampling(gp, omegas, rff, p_t=0.5, agent_weights="learned", **raw)
    acqf = FederatedThompsonSampling(gp, omegas, rff, p_t=0.5, agent_weights="learned", train_X=X, train_Y=y, **raw)
    assert int(acqf.agent_probs.argmax()) == 0
    with pytest.raises(ValueError, match="`agent_weights` must be one of"):
        FederatedThompsonSampling(gp, omegas, rff, p_t=0.5, agent_weights="best", **raw)
    with pytest.raises(ValueError, match="has 10 points but `train_Y` has 9"):
        FederatedThompsonSampling(gp, omegas, rff, p_t=0.5, agent_weights="learned", train_X=X, train_Y=y[:9], **raw)


def test_settings_validate_agent_weights_and_trust():
    with pytest.raises(ValueError, match="`agent_weights` must be one of"):
        FTSSettings(agent_weights="Learned")
    with pytest.raises(ValueError, match="`peer_trust` must be true or false"):
        FTSSettings(peer_trust="yes")
    assert FTSSettings(agent_weights="learned", peer_trust=True).agent_weights == "learned"


def test_yaml_learned_weights_and_trust_run_end_to_end(tmp_path):
    import json

    from fbo_torch.cli import main

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("""
experiment: fts
name: tiny-learned
objective: {type: gp_grid, num_groups: 2, agents_per_group: 4, grid_size: 50}
runs: {num_inits: 2}
history: {t_n: 6}
defaults: {num_iterations: 4, num_features: 10, gp_refit_every: 0, p_t: 0.0}
methods:
  - {name: uniform, algorithm: fts}
  - {name: learned, algorithm: fts, agent_weights: learned}
  - {name: trusted, algorithm: fts, agent_weights: learned, peer_trust: true}
""")
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    text = json.dumps(results)
    assert '"agent_weights": "learned"' in text and '"peer_trust": true' in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(cfg.read_text().replace("agent_weights: learned}", "agent_weights: smart}", 1))
    assert main(["run", str(bad), "--out", str(tmp_path / "out2"), "--no-progress"]) == 2


def test_simulator_learned_weights_avoid_adversarial_peers():
    # half of every target's 10 peers are adversarial (1 - f); with p_t = 0 every query follows a
    # peer (one-shot: 10 iterations use every message once, so compare the first 5 draws): uniform
    # P_N draws adversarial peers half the time, learned P_N (from 5-9 own observations) far less
    from fbo_torch.objectives import GPSampleGridFederation
    from fbo_torch.objectives.synthetic import AGENT_KINDS
    from fbo_torch.optim.domain import Domain
    from fbo_torch.simulate.fts import FederationHistory, FTSRunner

    obj = GPSampleGridFederation(
        num_groups=4, agents_per_group=11, grid_size=200, perturbation=0.02, adversarial_fraction=0.5, seed=1
    )
    dom = Domain(obj.bounds, obj.candidates)
    hist = FederationHistory(obj, dom, t_n=30, seed=0)
    adversarial = AGENT_KINDS.index("adversarial")
    share = {}
    for weights in ("uniform", "learned"):
        s = FTSSettings(num_iterations=5, num_init=5, agent_weights=weights, p_t=0.0, num_features=50)
        res = FTSRunner(obj, s, obj.targets, 5, history=hist, seed=0).run()
        assert (res.sources >= 0).all()
        share[weights] = (obj.kind_of_agent[res.sources] == adversarial).float().mean().item()
    # 100 draws: uniform's share has s.e. 0.05 around 0.5
    assert 0.3 < share["uniform"] < 0.7
    assert share["learned"] < 0.2, share  # at most 20 of 100 draws: six s.e. below uniform


# ------------------------------------------------------------------ sybils
def _spiked_copy(rff, omega, X):
    """``omega`` plus the smallest change that makes the grid point farthest from ``X`` its function's maximum."""
    grid = torch.linspace(0, 1, 501, dtype=torch.float64).unsqueeze(-1)
    x_s = grid[(grid - X.T).abs().amin(-1).argmax()]
    values = rff(grid) @ omega
    phi = rff(x_s.unsqueeze(0))[0]
    c = values.max() - phi @ omega + 0.25 * (values.max() - values.min())
    spiked = omega + c * phi / phi.square().sum()
    assert torch.allclose(grid[(rff(grid) @ spiked).argmax()], x_s, atol=0.05)  # following it queries x_s
    return spiked


def test_copies_of_a_helpful_message_count_as_one_peer():
    """Before: sybils that copy a helpful message and add a spike where the target has not looked scored what
    the copied peer scores and took k/(k+1) of its mass (3 of them: the other helpful peer fell from 0.40 to
    0.23 of P_N). A cluster of copies, rescaled or not, now weighs what one peer weighs."""
    rff = RandomFourierFeatures(1, 100, lengthscale=0.08, seed=3)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(2, 40, 1, generator=g, dtype=torch.float64)  # two honest helpful peers' own data
    honest = RFFBayesianLinear(rff, X, f(X).unsqueeze(-1), noise_variance=1e-2).sample_weights(generator=g)
    unrelated = torch.randn(3, 100, generator=g, dtype=torch.float64)
    messages = torch.cat([honest, unrelated])  # N = 5: peers 0, 1 helpful
    Xt, yt = target_data(5, seed=7)
    sybils = torch.stack([a * _spiked_copy(rff, honest[0], Xt) for a in (0.5, 1.0, 3.0)])
    gp = SingleTaskGP(Xt, yt.unsqueeze(-1))
    alone = FederatedThompsonSampling(gp, messages, rff, p_t=0.0, agent_weights="learned").agent_probs
    attacked = FederatedThompsonSampling(
        gp, torch.cat([messages, sybils]), rff, p_t=0.0, agent_weights="learned"
    ).agent_probs
    assert alone[:2].min() > 0.2
    assert attacked[1] > 0.85 * alone[1]  # the other helpful peer keeps its weight
    assert attacked[[0, 5, 6, 7]].sum() < 1.15 * alone[0]  # the copied peer and its copies: about one peer
    # honest posterior draws are not copies of one another; exact and rescaled copies are
    assert torch.allclose(redundancy(messages), torch.ones(5, dtype=torch.float64))
    counts = redundancy(torch.stack([honest[0], 2 * honest[0], honest[1]]))
    assert torch.allclose(counts, torch.tensor([2.0, 2.0, 1.0], dtype=torch.float64))


def test_non_finite_scores_are_refused_not_turned_into_zero_weights():
    """Before: a NaN score gave a row of zeros and P_N silently kept its old preferences."""
    with pytest.raises(ValueError, match="`scores` holds 1 NaN"):
        fidelity_weights(torch.tensor([0.3, math.nan, 1.0], dtype=torch.float64))
    assert fidelity_weights(torch.tensor([0.0, -math.inf], dtype=torch.float64)).tolist() == [1.0, 0.0]


# ------------------------------------------------------------ corroborated weights
def _sybil_study():
    """``benchmarks/sybil_study.py`` as a module (the attacks are built as the study builds them)."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "sybil_study"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "benchmarks" / "sybil_study.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


@pytest.fixture(scope="module")
def decorrelated_attack():
    """The study's federation (10 targets x 5 initializations, 5 observations each) and its messages
    without sybils and with 10 decorrelated sybils in place of 10 useless peers, as the study builds them
    (fixed seeds): ``(shares, runs)``, ``shares[(sybils, agent_weights)] = (sybils' share, helpful share)``
    of ``P_N``, mean over runs."""
    from fbo_torch.simulate.fts import FTSRunner
    from fbo_torch.simulate.presets import PAPER

    S = _sybil_study()
    obj, domain, history = S.federation(10)
    grid = obj.candidates[:, 0]
    settings = FTSSettings(
        **PAPER,
        algorithm="fts",
        num_init=5,
        num_iterations=1,
        num_features=100,
        rff_lengthscale=0.03,
        rff_noise_variance=0.01,
        communication="one-shot",
        agent_weights="learned",
    )
    runner = FTSRunner(obj, settings, obj.targets, 5, history=history, domain=domain, seed=0)
    features, R = runner.features, runner.num_runs
    peers = torch.stack([obj.members(int(g))[1:] for g in runner.targets // obj.agents_per_group])  # R x 20
    kinds = obj.kind_of_agent[peers]
    all_omegas = runner.method.omegas
    honest = all_omegas.gather(1, peers.unsqueeze(-1).expand(-1, -1, all_omegas.shape[-1]))  # R x 20 x M
    X, y, mask = runner.X, runner.Y.squeeze(-1), runner.agents.mask
    gen = torch.Generator().manual_seed(5)
    helpful_idx = torch.stack([torch.nonzero(row == S.HELPFUL).squeeze(-1) for row in kinds])
    copied = helpful_idx.gather(1, torch.randint(0, helpful_idx.shape[1], (R, 1), generator=gen))
    useless_idx = torch.stack([torch.nonzero(row == S.USELESS).squeeze(-1) for row in kinds])
    base = honest[torch.arange(R), copied[:, 0]]
    reference = reference_points(domain.bounds, domain.candidates)
    shares = {}
    for k in (0, 10):
        omegas, is_sybil = honest.clone(), torch.zeros_like(kinds, dtype=torch.bool)
        if k:
            slots = useless_idx[:, :k]
            is_sybil.scatter_(1, slots, True)
            sybils = S.decorrelated_sybils(features, base, honest, ~is_sybil, X, mask, grid, k, gen)
            omegas.scatter_(1, slots.unsqueeze(-1).expand(-1, -1, omegas.shape[-1]), sybils)
            assert redundancy(omegas).amax() < 1.01  # the message count does not see them
        scores = fidelity_scores(peer_predictions(features, omegas, X), y, mask)
        for weights in ("learned", "corroborated"):
            dist = AgentDistribution(omegas.shape[1], batch_shape=torch.Size([R]))
            copies = peer_counts(weights, features, omegas, scores, reference)
            learn_peer_choice(dist, scores, mask.sum(-1), 0.5, weights, False, copies)
            probs = dist.probs
            helpful = (kinds == S.HELPFUL) & ~is_sybil
            shares[(k, weights)] = (float((probs * is_sybil).sum(-1).mean()), float((probs * helpful).sum(-1).mean()))
    return shares, R


def test_corroborated_weights_keep_ten_decorrelated_sybils_below_a_tenth_of_p_n(decorrelated_attack):
    """Before (``learned``): ten sybils decorrelated in the null space of the target's observed features, all
    peaking at the attacker's point, took about 40% of ``P_N`` at 5 observations (k/20 = 50% under uniform
    ``P_N``). With ``corroborated`` weights their maximizers count as one peer and the peers outside their
    group do not vouch for their point: below 10%."""
    shares, runs = decorrelated_attack
    assert runs == 50
    assert shares[(10, "learned")][0] > 0.10, shares
    assert shares[(10, "corroborated")][0] < 0.10, shares
    assert shares[(10, "corroborated")][1] > shares[(10, "learned")][1]  # the helpful peers get the rest


def test_corroborated_weights_do_not_lower_the_helpful_share_without_sybils(decorrelated_attack):
    shares, _ = decorrelated_attack
    assert shares[(0, "learned")][0] == shares[(0, "corroborated")][0] == 0.0
    assert shares[(0, "corroborated")][1] >= shares[(0, "learned")][1], shares


def test_corroborated_counts_shapes_dtype_and_batching():
    rff = RandomFourierFeatures(2, 64, lengthscale=0.2, seed=1)
    g = torch.Generator().manual_seed(0)
    messages = torch.randn(2, 3, 6, 64, generator=g, dtype=torch.float64)  # batch_shape 2 x 3, N = 6
    messages[..., 1, :] = 2.0 * messages[..., 0, :]  # a rescaled copy
    scores = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    bounds = torch.tensor([[0.0, -1.0], [1.0, 1.0]], dtype=torch.float64)
    reference = reference_points(bounds, num=256)
    assert reference.shape == (256, 2) and reference.dtype == torch.float64
    assert ((reference >= bounds[0]) & (reference <= bounds[1])).all()
    assert torch.equal(reference, reference_points(bounds, num=256))  # the same points for everyone
    grid = torch.rand(40, 2, generator=g, dtype=torch.float32)
    assert torch.equal(reference_points(bounds, grid), grid.double())  # a finite domain: its candidates

    counts = corroborated_counts(rff, messages.float(), scores, reference)
    assert counts.shape == (2, 3, 6) and counts.dtype == torch.float64
    assert (counts >= 1).all()
    assert counts[..., 0].min() >= 2 - 1e-9  # the copy and the message it copied count each other
    looped = torch.stack(
        [corroborated_counts(rff, messages[i, j], scores[i, j], reference) for i in range(2) for j in range(3)]
    )
    torch.testing.assert_close(corroborated_counts(rff, messages, scores, reference), looped.view(2, 3, 6))

    values = reference_values(rff, messages, reference)
    assert values.shape == (2, 3, 6, 256) and values.dtype == torch.float64
    correlation = maximizer_correlation(rff, values, reference)
    assert correlation.shape == (2, 3, 6, 6)
    phi = rff(reference.to(torch.float64))  # features the caller already has give the same bits
    assert torch.equal(reference_values(rff, messages, reference, reference_features=phi), values)
    assert torch.equal(maximizer_correlation(rff, values, reference, reference_features=phi), correlation)
    torch.testing.assert_close(correlation.diagonal(dim1=-2, dim2=-1), torch.ones(2, 3, 6, dtype=torch.float64))
    same = coinciding_maximizers(correlation)
    assert same.dtype == torch.float64 and same[..., 0, 1].eq(1).all()
    ell = cross_check(values, correlation, torch.full((2, 3, 6), 1 / 6, dtype=torch.float64))
    assert ell.shape == (2, 3, 6) and (ell <= 0).all() and (ell >= -8).all()
    # a peer with no outside opinion keeps its weight
    assert cross_check(values, torch.ones(2, 3, 6, 6, dtype=torch.float64), torch.ones(2, 3, 6)).eq(0).all()
    # support: a peer outside it neither counts nor rates
    support = torch.ones(2, 3, 6, dtype=torch.bool)
    support[..., 1] = False
    assert (corroborated_counts(rff, messages, scores, reference, support)[..., 0] < counts[..., 0]).all()
    # "learned" keeps the message count, bit for bit
    assert torch.equal(peer_counts("learned", rff, messages, scores, None), redundancy(messages))
    with pytest.raises(ValueError, match="needs reference points"):
        peer_counts("corroborated", rff, messages, scores, None)


def test_settings_and_yaml_accept_corroborated_and_name_the_key_of_a_wrong_value(tmp_path, capsys):
    from fbo_torch.cli import main

    assert "corroborated" in AGENT_WEIGHTS
    assert FTSSettings(agent_weights="corroborated").agent_weights == "corroborated"
    with pytest.raises(ValueError, match="`agent_weights` must be one of") as err:
        FTSSettings(agent_weights="corroborate")
    assert "\n" not in str(err.value)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("""
experiment: fts
name: tiny-corroborated
objective: {type: gp_grid, num_groups: 2, agents_per_group: 4, grid_size: 50}
runs: {num_inits: 2}
history: {t_n: 6}
defaults: {num_iterations: 3, num_features: 10, gp_refit_every: 0, p_t: 0.0}
methods:
  - {name: corroborated, algorithm: fts, agent_weights: corroborated, peer_trust: true}
""")
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    assert '"agent_weights": "corroborated"' in (tmp_path / "out" / "results.json").read_text()
    capsys.readouterr()
    bad = tmp_path / "bad.yaml"
    bad.write_text(cfg.read_text().replace("agent_weights: corroborated,", "agent_weights: sybil-proof,"))
    assert main(["run", str(bad), "--out", str(tmp_path / "out2"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "agent_weights" in err and "sybil-proof" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("algorithm", ["fts", "peer_prior", "transfer"])
def test_every_draw_method_runs_with_corroborated_weights_on_a_box(algorithm):
    from fbo_torch.objectives.synthetic import GPSampleContinuousFederation
    from fbo_torch.optim.domain import Domain
    from fbo_torch.simulate.fts import FTSRunner

    obj = GPSampleContinuousFederation(dim=2, num_groups=1, agents_per_group=4, num_basis=64, lengthscale=0.2, seed=3)
    s = FTSSettings(
        algorithm=algorithm,
        agent_weights="corroborated",
        num_init=4,
        num_iterations=3,
        num_features=32,
        rff_lengthscale=0.3,
        gp_fit_maxiter=10,
        communication="every-round",
        p_t=0.0 if algorithm == "fts" else 0.5,
    )
    domain = Domain(obj.bounds, None, raw_samples=64, num_restarts=2, raw_samples_rff=64, num_restarts_rff=2)
    runner = FTSRunner(obj, s, torch.arange(obj.num_agents), 2, domain=domain, together=True, seed=1)
    result = runner.run()
    assert bool(torch.isfinite(result.loss).all())
    reference = runner.method.reference()
    assert reference is not None and reference.shape == (4096, 2)
    probs = runner.dist.probs
    assert torch.allclose(probs.sum(-1), torch.ones(probs.shape[0], dtype=probs.dtype))


def test_the_acquisition_takes_corroborated_weights_with_reference_points():
    rff = RandomFourierFeatures(1, 100, lengthscale=0.08, seed=3)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(2, 40, 1, generator=g, dtype=torch.float64)
    honest = RFFBayesianLinear(rff, X, f(X).unsqueeze(-1), noise_variance=1e-2).sample_weights(generator=g)
    messages = torch.cat([honest, torch.randn(3, 100, generator=g, dtype=torch.float64)])
    Xt, yt = target_data(5, seed=7)
    gp = SingleTaskGP(Xt, yt.unsqueeze(-1))
    grid = torch.linspace(0, 1, 201, dtype=torch.float64).unsqueeze(-1)
    with pytest.raises(ValueError, match="needs `reference_points`"):
        FederatedThompsonSampling(gp, messages, rff, p_t=0.0, agent_weights="corroborated")
    with pytest.raises(ValueError, match="`reference_points` must be C x 1"):
        FederatedThompsonSampling(
            gp, messages, rff, p_t=0.0, agent_weights="corroborated", reference_points=grid.expand(-1, 2)
        )
    acqf = FederatedThompsonSampling(gp, messages, rff, p_t=0.0, agent_weights="corroborated", reference_points=grid)
    probs = acqf.agent_probs
    assert (
        probs.shape == (5,) and probs.dtype == torch.float64 and torch.isclose(probs.sum(), torch.tensor(1.0).double())
    )
    learned = FederatedThompsonSampling(gp, messages, rff, p_t=0.0, agent_weights="learned").agent_probs
    assert probs[:2].sum() >= learned[:2].sum() - 0.05  # the helpful peers keep their weight
