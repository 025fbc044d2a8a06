"""``algorithm="peer_prior"`` in the simulator: peers' averaged messages as a πBO prior."""

import pytest
import torch

from fbo_torch.acquisition.peer_prior import BatchedPriorGuided
from fbo_torch.federation.settings import FTSSettings
from fbo_torch.objectives.base import Objective
from fbo_torch.protocol.message_average import MessageAverage
from fbo_torch.sampling.rff_paths import RFFSamplePaths
from fbo_torch.simulate.fts import FTSRunner

f64 = torch.float64


class SharedOptimum(Objective):
    """Agents whose functions differ in shape and scale but share their maximizer ``c``."""

    def __init__(self, num_agents=5, dim=2):
        self.num_agents = num_agents
        self.bounds = torch.tensor([[0.0] * dim, [1.0] * dim], dtype=f64)
        self.c = torch.full((dim,), 0.8, dtype=f64)
        self.scale = torch.logspace(0, 3, num_agents, dtype=f64)
        self.power = torch.linspace(1.0, 2.0, num_agents, dtype=f64)
        self.optimum = torch.zeros(num_agents, dtype=f64)

    def _evaluate(self, X, agents, noise):
        r = (X - self.c).norm(dim=-1)
        return -self.scale[agents].unsqueeze(-1) * r ** self.power[agents].unsqueeze(-1)


def settings(**kw):
    base = dict(
        algorithm="peer_prior",
        communication="every-round",
        num_init=4,
        num_iterations=6,
        num_features=200,
        rff_lengthscale=0.3,
        gp_warp="auto",
        message_outputs="warped",
        gp_kernel="fbo",
    )
    return FTSSettings(**{**base, **kw})


def test_centers_are_the_maximizers_of_each_senders_averaged_messages():
    obj = SharedOptimum()
    r = FTSRunner(obj, settings(num_iterations=2), torch.arange(5), 2, seed=0, together=True)
    avg = MessageAverage(r.settings.message_memory)
    avg.update(r.agents.message(0))
    r.step()  # observes, then receives round 1's messages
    means = avg.update(r.agents.message(1))
    torch.testing.assert_close(r.method._averaged_slots, means[r.peer_runs], rtol=0, atol=0)
    d = r.domain
    centers, _ = d.maximize(
        RFFSamplePaths(r.features, means),
        means.shape[0],
        keys=r.agents.round_keys(1, "peer-optima"),
        raw_samples=d.raw_samples,
        num_restarts=4,
        maxiter=10,
    )
    torch.testing.assert_close(r.method.peer_centers, centers[r.peer_runs], rtol=0, atol=0)
    assert (r.sources == -1).all()  # every query is the agent's own acquisition's


def test_peers_that_share_the_optimum_help():
    """Shapes and scales differ (powers 1-2, scales 1-1000) but the maximizer is shared: the
    prior built from the peers' averaged messages finds it in fewer evaluations than LogEI alone."""
    obj = SharedOptimum()
    prior = FTSRunner(obj, settings(), torch.arange(5), 6, seed=1, together=True).run()
    local = FTSRunner(obj, settings(algorithm="ts", own_acquisition="logei"), torch.arange(5), 6, seed=1).run()
    assert torch.equal(prior.queries[:, :4], local.queries[:, :4])  # paired: the same initial points
    # from the second query on (the first follows a single, unaveraged draw of each peer)
    dist_prior = (prior.queries[:, 5:] - obj.c).norm(dim=-1).mean()
    dist_local = (local.queries[:, 5:] - obj.c).norm(dim=-1).mean()
    assert dist_prior < 0.75 * dist_local, (dist_prior, dist_local)
    assert prior.loss[:, -1].mean() < local.loss[:, -1].mean()


def test_a_vanishing_prior_is_the_local_acquisition():
    # With beta -> 0 what the runner maximizes is the agents' own LogEI: compared as functions at the
    # runner's state (the points a multi-start L-BFGS returns on a multimodal LogEI may move to an
    # equally good maximum under a 1e-12 perturbation, so comparing queries would test the optimizer).
    obj = SharedOptimum()
    r = FTSRunner(obj, settings(prior_strength=1e-12, num_iterations=3), torch.arange(5), 2, seed=3, together=True)
    r.step()
    r.step()  # the peers' centers exist from the first round's messages
    model = r.agents.gp()
    own = r.agents.own_acquisition(model)
    probs = r.dist.probs
    log_w = torch.where(probs > 0, probs.clamp_min(1e-300).log(), -torch.inf)
    s = r.settings
    guided = BatchedPriorGuided(own, r.method.peer_centers, log_w, s.prior_strength / 2, s.prior_width, s.prior_floor)
    X = torch.rand(
        r.num_runs, 64, obj.bounds.shape[-1], dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    a, b = guided(X), own(X)
    # |beta/t * log prior| <= 1e-12 * |log floor| / 2 ~ 1.5e-12 on top of float64 roundoff of LogEI
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-11)
    assert (probs[:, :] > 0).sum(-1).min() >= 1  # every run does have weighted peers: the prior is there


def test_resume_is_exact():
    obj = SharedOptimum()
    full = FTSRunner(
        obj, settings(num_iterations=3, agent_weights="learned"), torch.arange(5), 2, seed=0, together=True
    )
    full.run()
    half = FTSRunner(
        obj, settings(num_iterations=3, agent_weights="learned"), torch.arange(5), 2, seed=0, together=True
    )
    half.step()
    again = FTSRunner(
        obj, settings(num_iterations=3, agent_weights="learned"), torch.arange(5), 2, seed=0, together=True
    )
    again.load_state_dict(half.state_dict())
    again.run()
    assert torch.equal(again.X, full.X)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(own_acquisition="ts"), "own_acquisition"),
        (dict(prior_floor=1.0), "prior_floor"),
        (dict(prior_width=0.0), "prior_width"),
        (dict(message_memory=0), "message_memory"),
    ],
)
def test_settings_are_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        settings(**kw)


def test_peer_trust_is_refused():
    with pytest.raises(ValueError, match="peer_trust"):
        FTSRunner(SharedOptimum(), settings(peer_trust=True), torch.arange(5), 1, together=True)


def test_own_acquisition_defaults_to_logei():
    assert settings().own_acquisition == "logei"
    assert FTSSettings(algorithm="fts").own_acquisition == "logei"  # the engine is every method's default
