"""algorithm: transfer — the three channels, the arms' bookkeeping, the exploring arm, and the own arm that never
repeats a query."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from fbo_torch.federation.agents import Agents
from fbo_torch.federation.settings import FTSSettings
from fbo_torch.methods.transfer import ARMS, FUNCTION_ARM, OPTIMA_ARM, OWN_ARM, UCB_ARM, Transfer, channel_gate
from fbo_torch.objectives.synthetic import GPSampleContinuousFederation
from fbo_torch.optim.domain import Domain
from fbo_torch.simulate.fts import FederationHistory, FTSRunner

TINY = dict(num_init=4, num_iterations=6, num_features=32, rff_lengthscale=0.3, gp_fit_maxiter=15)
DOMAIN = dict(raw_samples=64, num_restarts=2, raw_samples_rff=64, num_restarts_rff=2)


def _objective(noise_variance: float = 0.0) -> GPSampleContinuousFederation:
    return GPSampleContinuousFederation(
        dim=2, num_groups=1, agents_per_group=4, num_basis=64, lengthscale=0.2, noise_variance=noise_variance, seed=3
    )


def _together(runs: int = 2, **kw) -> FTSRunner:
    obj = _objective()
    kw = {"communication": "every-round", "agent_weights": "learned", **kw}
    settings = FTSSettings(algorithm="transfer", **TINY, **kw)
    domain = Domain(obj.bounds, obj.candidates, **DOMAIN)
    return FTSRunner(obj, settings, torch.arange(obj.num_agents), runs, domain=domain, together=True, seed=1)


@pytest.mark.parametrize("weights", ["learned", "corroborated"])
def test_together_runs_and_every_query_is_accounted_to_one_arm_and_source(weights):
    """With learned ``P_N`` and with the recommended configuration's sybil-hardened ``corroborated`` one."""
    runner = _together(agent_weights=weights)
    result = runner.run()
    method = runner.method
    assert isinstance(method, Transfer)
    R, T = runner.num_runs, TINY["num_iterations"]
    assert result.sources.shape == (R, T) and bool(torch.isfinite(result.loss).all())
    # a source is the run's own GP (-1) or one of its peers, never itself
    assert bool(((result.sources >= -1) & (result.sources < runner.objective.num_agents)).all())
    assert not bool((result.sources == runner.targets.unsqueeze(-1)).any())  # runner.targets: each run's agent
    # every iteration was one arm's win or loss; a peer's tally only counts the iterations that followed it
    torch.testing.assert_close((method.wins + method.losses).sum(-1), torch.full((R,), float(T), dtype=torch.float64))
    followed = (result.sources >= 0).sum(-1).to(torch.float64)
    torch.testing.assert_close((method.peer_wins + method.peer_losses).sum(-1), followed)
    assert bool((method.wins[:, [OPTIMA_ARM, FUNCTION_ARM]].sum(-1) <= method.peer_wins.sum(-1) + 1e-12).all())
    assert OWN_ARM == 0 and method.wins.shape == (R, ARMS)
    probs = runner.dist.probs  # the P_N it ranked its peers by: a distribution over the others
    torch.testing.assert_close(probs.sum(-1), torch.ones(R, dtype=probs.dtype))
    assert not bool(probs[torch.arange(R), runner.targets].any())


def test_no_arm_queries_an_input_the_agent_has_observed():
    """On a noiseless objective a repeated query is a wasted evaluation: exploiting over the plug-in incumbent
    can propose the incumbent itself (the agent then takes its LogEI proposal over its best observation), a
    message that has not changed keeps its maximizer, and a peer's incumbent is offered until queried."""
    obj = _objective()
    domain = Domain(obj.bounds, obj.candidates, **DOMAIN)
    history = FederationHistory(obj, domain, t_n=8, mode="ts", num_init=3, seed=5)
    one_shot = FTSSettings(algorithm="transfer", agent_weights="learned", communication="one-shot", **TINY)
    newcomer = FTSRunner(obj, one_shot, torch.tensor([0, 2]), 2, history=history, domain=domain, seed=2)
    for runner in (_together(runs=3), newcomer):
        runner.run()
        X, n0 = runner.X, TINY["num_init"]
        lo, hi = runner.domain.bounds
        for t in range(TINY["num_iterations"]):
            query = X[:, n0 + t]
            earlier = X[:, : n0 + t]
            repeat = ((query.unsqueeze(1) - earlier).abs() <= 1e-6 * (hi - lo)).all(-1).any(-1)
            assert not bool(repeat.any()), (runner.together, t)


def test_the_optima_channel_offers_the_peers_best_inputs_and_the_landscape_their_weighted_lengthscales():
    runner = _together(runs=1)
    runner.run()
    method = runner.method
    assert isinstance(method, Transfer)
    C = method.incumbents()  # R x A x d
    agents = runner.agents
    y = torch.where(agents.mask, runner.Y.squeeze(-1), -torch.inf)
    best = runner.X[torch.arange(runner.num_runs), y.argmax(-1)]  # each run's own incumbent
    peers = runner.peer_runs  # R x A: the run holding each agent's data
    torch.testing.assert_close(C, best[peers], rtol=0, atol=0)
    prior = method.landscape_prior()
    assert prior is not None
    loc, scale = prior
    ll = agents.log_lengthscales()[peers]  # R x A x k
    w = runner.dist.probs.to(ll.dtype).unsqueeze(-1)
    torch.testing.assert_close(loc, (w * ll).sum(1))
    assert bool((scale >= runner.settings.landscape_scale - 1e-12).all())


@pytest.mark.parametrize("channels", [["optima"], ["function"], ["landscape"], ["optima", "landscape"]])
def test_each_channel_alone_runs_and_an_absent_arm_is_never_followed(channels):
    runner = _together(runs=1, channels=channels)
    runner.run()
    method = runner.method
    assert isinstance(method, Transfer)
    if "optima" not in channels:
        assert float(method.wins[:, OPTIMA_ARM].sum() + method.losses[:, OPTIMA_ARM].sum()) == 0.0
    if "function" not in channels:
        assert float(method.wins[:, FUNCTION_ARM].sum() + method.losses[:, FUNCTION_ARM].sum()) == 0.0


def test_a_newcomer_joins_peers_with_a_history():
    obj = _objective(noise_variance=1e-4)
    domain = Domain(obj.bounds, obj.candidates, **DOMAIN)
    history = FederationHistory(obj, domain, t_n=8, mode="ts", num_init=3, seed=5)
    settings = FTSSettings(algorithm="transfer", agent_weights="learned", communication="one-shot", **TINY)
    runner = FTSRunner(obj, settings, torch.tensor([0]), 2, history=history, domain=domain, seed=2)
    result = runner.run()
    assert result.loss.shape == (2, TINY["num_iterations"] + 1) and bool(torch.isfinite(result.loss).all())
    assert bool(((result.sources >= -1) & (result.sources != 0)).all())  # never "follows" itself


def test_channel_gate_follows_a_poor_candidate_only_from_a_channel_that_has_paid():
    """A channel's candidate whose expected improvement is below a tenth of the own proposal's is
    closed, unless the channel's record (Beta(1, 1) posterior mean) beats the own arm's."""
    log_ei = torch.tensor(
        [
            [0.0, math.log(0.2), math.log(0.05)],  # optima plausible, function not
            [0.0, math.log(0.05), math.log(0.05)],  # both poor, no record: closed
            [0.0, math.log(0.05), math.log(0.05)],  # both poor, optima has won more often than own
            [-3.0, -3.0 + math.log(0.1) + 1e-9, -3.0 + math.log(0.1) - 1e-6],  # at the boundary
        ],
        dtype=torch.float64,
    )
    wins = torch.zeros(4, 3, dtype=torch.float64)
    losses = torch.zeros(4, 3, dtype=torch.float64)
    wins[2] = torch.tensor([1.0, 2.0, 0.0])
    losses[2] = torch.tensor([3.0, 1.0, 1.0])  # own 2/6, optima 3/5, function 1/3
    gate = channel_gate(log_ei, wins, losses)
    expected = torch.tensor([[True, False], [False, False], [True, False], [True, False]])
    assert torch.equal(gate, expected)
    # an equal record does not open the gate: a channel must have done better than the agent alone
    wins[1], losses[1] = torch.tensor([1.0, 1.0, 1.0]), torch.tensor([1.0, 1.0, 1.0])
    assert not bool(channel_gate(log_ei, wins, losses)[1].any())
    assert bool(channel_gate(log_ei, wins, losses, ratio=0.01)[1].all())  # a looser ratio admits them


def test_a_round_fits_each_agents_gp_once(monkeypatch):
    """The fallback proposal for a repeated query is computed on the GPs the round has just fitted
    (a second fit from the same start on the same data would only repeat the first), so a round of
    ``transfer`` costs one GP fit, as a round of the local engine does, and the refit schedule counts rounds."""
    from fbo_torch.models.batched_gp import BatchedExactGP

    fits = []
    fit = BatchedExactGP.fit

    def counted(self, *args, **kwargs):
        fits.append(self.params.shape[0])
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(BatchedExactGP, "fit", counted)
    runner = _together(runs=2)
    runner.run()
    T = TINY["num_iterations"]
    assert len(fits) == T  # one batched fit per round for all runs
    assert runner.agents.gp_updates == T


@pytest.mark.parametrize("kind", ["constant", "noise", "stale", "copied"])
def test_a_free_rider_sends_nothing_useful_on_any_channel(kind):
    """A free-rider's incumbent and lengthscales are replaced as its draw is: the box's centre and the
    spec prior's median (constant), a point in the box and a prior draw (noise), its first ones (stale),
    the next honest agent's of the round before (copied); the honest agents' are what they hold."""
    from fbo_torch.models.gp_spec import get_spec

    runner = _together(runs=1, free_riders={"agents": [1], "kind": kind})
    method = runner.method
    assert isinstance(method, Transfer)
    runner.step()  # round 0: the first incumbents and lengthscales sent
    first_X = runner.agents.incumbents()[runner.peer_runs[0]].clone()  # A x d, each agent's own
    first_ll = runner.agents.log_lengthscales()
    assert first_ll is not None
    first_ll = first_ll[runner.peer_runs[0]].clone()
    while runner.t < runner.settings.num_iterations - 1:
        runner.step()
    # what the agents hold as the last round begins: what that round sent (a copier forwards it after)
    last_X = runner.agents.incumbents()[runner.peer_runs[0]].clone()
    runner.run()
    C = method.incumbents()[0]  # A x d, as run 0 (agent 0) receives them
    prior = method.landscape_prior()
    assert prior is not None
    own_X = runner.agents.incumbents()[runner.peer_runs[0]]
    own_ll = runner.agents.log_lengthscales()
    assert own_ll is not None
    own_ll = own_ll[runner.peer_runs[0]]
    honest = [0, 2, 3]
    torch.testing.assert_close(C[honest], own_X[honest], rtol=0, atol=0)
    lo, hi = runner.domain.bounds
    loc, scale = get_spec(runner.settings.gp_kernel).ls_prior(lo.numel())
    # what agent 1 sent, seen by its peer agent 0 through the landscape prior's inputs
    sent_ll = method._sent(
        runner.agents.log_lengthscales(),
        "lengthscales",
        lambda: torch.full((own_ll.shape[-1],), loc),
        lambda k: loc + scale * torch.zeros(k.shape[0], own_ll.shape[-1]),
    )
    sent_ll = sent_ll[runner.peer_runs[0]]
    torch.testing.assert_close(sent_ll[honest], own_ll[honest], rtol=0, atol=0)
    if kind == "constant":
        torch.testing.assert_close(C[1], (lo + hi) / 2)
        torch.testing.assert_close(sent_ll[1], torch.full_like(sent_ll[1], loc))
    elif kind == "noise":
        assert bool(((C[1] >= lo) & (C[1] <= hi)).all()) and not torch.equal(C[1], own_X[1])
    elif kind == "stale":
        torch.testing.assert_close(C[1], first_X[1], rtol=0, atol=0)
        torch.testing.assert_close(sent_ll[1], first_ll[1], rtol=0, atol=0)
        assert not torch.equal(own_X[1], first_X[1]) or not torch.equal(own_ll[1], first_ll[1])
    else:
        torch.testing.assert_close(C[1], last_X[2], rtol=0, atol=0)
        # any channel: a copier forwards what its honest agent sent the round before, its own in its first round
        values = [torch.randn(runner.num_runs, 2, dtype=torch.float64) for _ in range(2)]
        sent = []
        for t, v in enumerate(values, start=runner.t + 1):
            runner.t = t
            sent.append(method._sent(v, "probe", lambda: torch.zeros(2), lambda k: torch.zeros(k.shape[0], 2)))
        first_sent, then = (x[runner.peer_runs[0]] for x in sent)
        torch.testing.assert_close(first_sent, values[0][runner.peer_runs[0]], rtol=0, atol=0)
        torch.testing.assert_close(then[honest], values[1][runner.peer_runs[0]][honest], rtol=0, atol=0)
        torch.testing.assert_close(then[1], values[0][runner.peer_runs[0]][2], rtol=0, atol=0)


def test_the_exploring_arm_queries_the_agents_ucb_maximizer_computed_only_where_it_can_win(monkeypatch):
    """The fourth arm's query is the maximizer of UCB (``β = ucb_beta``) on the round's GPs; off the GPU
    path it is maximized only for the runs whose Thompson draw of the arms could pick it, and those rows
    are the numbers a maximization of every row gives (keyed streams). It follows no peer."""
    proposals = Agents.own_proposals
    seen: list[tuple[Tensor, Tensor]] = []

    def recorded(self, round, which=None, incumbent="observed", refit=True, acquisition=None):
        X, v = proposals(self, round, which, incumbent, refit, acquisition)
        if acquisition == "ucb":
            assert which is not None and not refit
            X_all, v_all = proposals(self, round, None, incumbent, refit, acquisition)
            torch.testing.assert_close(X[which], X_all[which], rtol=0, atol=0)
            assert bool(X[~which].isnan().all())  # rows it could not win are not maximized on a CPU
            seen.append((X_all, which))
        return X, v

    monkeypatch.setattr(Agents, "own_proposals", recorded)
    runner = _together(runs=3, channels=["landscape"], ucb_beta=4.0)
    method = runner.method
    assert isinstance(method, Transfer)
    followed = 0
    for t in range(TINY["num_iterations"]):
        runner.step()
        X_ucb, need = seen[-1]
        arm = method._arm
        assert not bool((arm == UCB_ARM)[~need].any())  # never chosen where it was not maximized
        query = runner.X[:, TINY["num_init"] + t]
        picked = arm == UCB_ARM
        torch.testing.assert_close(query[picked], X_ucb[picked], rtol=0, atol=0)
        assert bool((runner.sources[:, t][picked] == -1).all())
        followed += int(picked.sum())
    assert len(seen) == TINY["num_iterations"] and followed > 0
    assert float(method.wins[:, UCB_ARM].sum() + method.losses[:, UCB_ARM].sum()) == followed


def test_with_own_acquisition_ucb_the_exploring_arm_is_not_offered():
    """The own proposal already is the UCB maximizer: a second arm for the same point is not offered."""
    runner = _together(runs=2, own_acquisition="ucb")
    runner.run()
    method = runner.method
    assert isinstance(method, Transfer)
    assert float(method.wins[:, UCB_ARM].sum() + method.losses[:, UCB_ARM].sum()) == 0.0
    torch.testing.assert_close(
        (method.wins + method.losses).sum(-1),
        torch.full((runner.num_runs,), float(TINY["num_iterations"]), dtype=torch.float64),
    )


def test_a_checkpoint_without_the_exploring_arm_resumes_with_it_unfollowed():
    """A state saved with three arms (before the exploring one) loads: the fourth arm starts with no record."""
    runner = _together(runs=2)
    runner.step()
    state = runner.state_dict()
    method_state = state["method"]
    wins, losses = method_state["wins"].clone(), method_state["losses"].clone()
    method_state["wins"], method_state["losses"] = wins[:, :UCB_ARM], losses[:, :UCB_ARM]
    resumed = _together(runs=2)
    resumed.load_state_dict(state)
    method = resumed.method
    assert isinstance(method, Transfer)
    assert method.wins.shape == (resumed.num_runs, ARMS) and float(method.wins[:, UCB_ARM].abs().sum()) == 0.0
    torch.testing.assert_close(method.wins[:, :UCB_ARM], wins[:, :UCB_ARM], rtol=0, atol=0)
    torch.testing.assert_close(method.losses[:, :UCB_ARM], losses[:, :UCB_ARM], rtol=0, atol=0)
    resumed.run()  # and the run goes on


def test_own_proposals_names_an_unknown_acquisition():
    runner = _together(runs=1)
    with pytest.raises(ValueError, match="`acquisition` must be 'ts', 'logei' or 'ucb', got 'ei'"):
        runner.agents.own_proposals(0, acquisition="ei")
