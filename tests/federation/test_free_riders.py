"""Free-riders in the batched FTS runner (``free_riders``) and reciprocity (``reciprocity``):
what a free-rider sends, that the report's binomial test flags it in a run, and that an agent
flagged by the same test on its federation's counts follows no peer."""

import io

import pytest
import torch

from fbo_torch.experiments.accounting import method_accounting
from fbo_torch.experiments.fts import result_record
from fbo_torch.federation.free_riders import FreeRiders
from fbo_torch.federation.settings import DPFTSDESettings, FTSSettings
from fbo_torch.objectives.synthetic import GPSampleGridFederation
from fbo_torch.protocol.fidelity import helpful_posterior
from fbo_torch.protocol.reciprocity import (
    flag_free_riders,
    flag_low_rated,
    peer_ratings,
    rating_record,
    round_ratings,
)
from fbo_torch.simulate.fts import FederationHistory, FTSRunner
from fbo_torch.utils import keyed_random as kr

#: The FTS paper's synthetic map (the kernel the functions were drawn from).
MAP = dict(num_features=100, rff_lengthscale=0.03, rff_noise_variance=0.01, communication="every-round")


def _objective(agents: int, grid: int = 1000) -> GPSampleGridFederation:
    # one group of near-copies (f ± 0.02), every agent perturbed: a federation of equals
    return GPSampleGridFederation(
        num_groups=1, agents_per_group=agents, perturb_first=True, grid_size=grid, perturbation=0.02, seed=0
    )


def _runner(agents: int, inits: int, grid: int = 200, **kw) -> FTSRunner:
    s = FTSSettings(algorithm="fts", num_init=3, **{**MAP, **kw})
    return FTSRunner(_objective(agents, grid), s, torch.arange(agents), inits, seed=0, together=True)


# ------------------------------------------------------------------ settings
@pytest.mark.parametrize(
    ("value", "key"),
    [
        ([0], "`free_riders` must be a mapping"),
        ({"agents": [0]}, "`free_riders` must be a mapping"),
        ({"agents": [], "kind": "noise"}, "`free_riders.agents`"),
        ({"agents": [0, 0], "kind": "noise"}, "`free_riders.agents`"),
        ({"agents": [-1], "kind": "noise"}, "`free_riders.agents`"),
        ({"agents": [True], "kind": "noise"}, "`free_riders.agents`"),
        ({"agents": [0], "kind": "silent"}, "`free_riders.kind`"),
        ({"agents": [0], "kind": "noise", "report": "lie"}, "`free_riders.report`"),
        ({"agents": [0], "kind": "noise", "reports": "collude"}, "`free_riders` must be a mapping"),
    ],
)
def test_a_bad_free_riders_setting_is_refused_naming_the_key(value, key):
    with pytest.raises(ValueError, match=key.replace("`", "`").replace(".", r"\.")):
        FTSSettings(free_riders=value)


def test_free_riders_and_reciprocity_need_an_algorithm_that_can_use_them():
    riders = {"agents": [0], "kind": "noise"}
    FTSSettings(algorithm="fts", free_riders=riders, reciprocity=True)
    FTSSettings(algorithm="transfer", free_riders=riders, reciprocity=True)
    with pytest.raises(ValueError, match="`free_riders`.*'ts'"):
        FTSSettings(algorithm="ts", free_riders=riders)
    with pytest.raises(ValueError, match="`free_riders`.*'rgpe'"):
        FTSSettings(algorithm="rgpe", free_riders=riders)
    with pytest.raises(ValueError, match="`reciprocity`.*'peer_prior'"):
        FTSSettings(algorithm="peer_prior", reciprocity=True)


def test_reciprocity_is_refused_with_secure_aggregation_in_one_line_naming_both_keys():
    with pytest.raises(ValueError) as info:
        DPFTSDESettings(reciprocity=True, aggregation="secure", noise_multiplier=1.0, clip_norm=1.0)
    message = str(info.value)
    assert "\n" not in message and "`reciprocity: true`" in message and "`aggregation: secure`" in message
    with pytest.raises(ValueError, match="`reciprocity` is not available in `experiment: dp_fts_de`"):
        DPFTSDESettings(reciprocity=True)


def test_reciprocity_needs_agents_that_optimize_together():
    obj = _objective(4, 100)
    s = FTSSettings(algorithm="fts", reciprocity=True, **MAP)
    from fbo_torch.optim.domain import Domain

    h = FederationHistory(obj, Domain(obj.bounds, obj.candidates), 5, seed=1)
    with pytest.raises(ValueError, match="`reciprocity`.*`history.mode: together`"):
        FTSRunner(obj, s, torch.tensor([0]), 1, history=h)


def test_free_rider_agents_must_exist_and_copied_needs_an_honest_agent():
    with pytest.raises(ValueError, match=r"`free_riders\.agents` names agent\(s\) \[7\]"):
        _runner(4, 1, free_riders={"agents": [1, 7], "kind": "noise"})
    with pytest.raises(ValueError, match="at least one honest agent"):
        _runner(2, 1, free_riders={"agents": [0, 1], "kind": "copied"})


# ------------------------------------------------------------ what they send
def test_copied_from_is_the_next_honest_agent_cyclically():
    rider = torch.tensor([True, False, True, True, False])
    assert FreeRiders.copied_from(rider).tolist() == [1, 1, 4, 4, 4]


@pytest.mark.parametrize("kind", ["constant", "noise", "stale", "copied"])
def test_free_riders_send_their_kind_and_honest_agents_their_draw(kind):
    A, inits = 4, 2
    honest = _runner(A, inits)
    rider = _runner(A, inits, free_riders={"agents": [0, 2], "kind": kind})
    first = rider.method.omegas.clone()  # R x A x M, round 0
    for r in (honest, rider):
        r.step()  # every-round: the messages of round 1 are received after the step
    got, true = rider.method.omegas, honest.method.omegas
    # honest senders' messages are untouched (their runs made the same queries: no one's data depends on riders yet)
    assert torch.equal(got[:, [1, 3]], true[:, [1, 3]])
    sent = got[:, [0, 2]]
    if kind == "constant":
        assert torch.equal(sent, torch.zeros_like(sent))
    elif kind == "noise":
        assert not torch.allclose(sent, true[:, [0, 2]])
        # one message per sender and round: every receiver of a federation gets the same one
        for i in range(inits):
            runs = torch.arange(A) * inits + i
            assert torch.equal(got[runs, 0], got[runs[:1], 0].expand(A, -1))
        # N(0, I): unit variance, whatever the sender's data
        assert sent.var().item() == pytest.approx(1.0, abs=0.2)
    elif kind == "stale":
        assert torch.equal(sent, first[:, [0, 2]])
        assert not torch.allclose(sent, true[:, [0, 2]])  # an honest agent's message moved with its data
    else:  # copied: agent 0 forwards agent 1's message of the round before, agent 2 agent 3's
        assert torch.equal(got[:, 0], first[:, 1]) and torch.equal(got[:, 2], first[:, 3])
        # in round 0 a copier has received nothing to forward: it sent its own draw
        honest_first = _runner(A, inits).method.omegas
        assert torch.equal(first[:, [0, 2]], honest_first[:, [0, 2]])


def test_stale_free_riders_are_flagged_by_the_report_in_a_run():
    # 10 agents together on the FTS paper's near-copies, 2 of them sending their round-0 message
    # forever: following it queries the same point again, which never improves an incumbent twice,
    # while honest messages move with their senders' data. p_t = 0.3, 60 rounds, 3 federations.
    A, inits, T = 10, 3, 60
    s = FTSSettings(
        algorithm="fts", num_init=5, num_iterations=T, p_t=0.3, free_riders={"agents": [0, 1], "kind": "stale"}, **MAP
    )
    objective = _objective(A)
    res = FTSRunner(objective, s, torch.arange(A), inits, seed=0, together=True).run()
    record = result_record("FTS", res, objective.loss_name)
    acc = method_accounting(record, None)
    assert acc["free_riders"] == [0, 1]
    rate = {c["peer"]: c["improvement_rate"] for c in acc["contributions"]}
    assert max(rate[0], rate[1]) < min(rate[j] for j in range(2, A))


# ------------------------------------------------------------------ reciprocity
def test_the_runner_flags_each_federation_with_the_report_s_test():
    r = _runner(5, 3, reciprocity=True)
    g = torch.Generator().manual_seed(0)
    follows = torch.randint(0, 30, (15,), generator=g).double()
    wins = torch.minimum(torch.randint(0, 12, (15,), generator=g).double(), follows)
    r.sent_follows, r.sent_wins = follows, wins
    per_federation = torch.stack(
        [flag_free_riders(follows.view(5, 3)[:, i], wins.view(5, 3)[:, i])[0] for i in range(3)], 1
    )
    assert torch.equal(r.flagged(), per_federation.reshape(-1))


def test_a_flagged_agent_follows_no_peer_and_the_others_are_as_without_reciprocity():
    A, inits = 5, 2
    kw = dict(p_t=0.0, num_iterations=3)  # p_t = 0: every agent follows a peer every round unless excluded
    plain, recip = _runner(A, inits, **kw), _runner(A, inits, reciprocity=True, **kw)
    # agent 0 of federation 0 (run 0): its messages followed 20 times, never improving; its peers' 20 times, 8 each
    follows = torch.full((A * inits,), 20.0, dtype=torch.float64)
    wins = torch.full((A * inits,), 8.0, dtype=torch.float64)
    wins[0] = 0.0
    recip.sent_follows, recip.sent_wins = follows.clone(), wins.clone()
    for r in (plain, recip):
        r.run()
    res = recip.result()
    assert res.excluded is not None and res.excluded[0].all() and not res.excluded[1:].any()
    assert (res.sources[0] == -1).all()  # flagged: its own proposal every round
    assert (res.sources[1:] >= 0).all() and (plain.sources >= 0).all()
    # the counts grew by who followed whom in each federation (run r's agent is r // inits)
    added = recip.sent_follows - follows
    assert added.sum().item() == (res.sources >= 0).sum().item()
    peer_run = res.sources.clamp_min(0) * inits + res.inits.unsqueeze(-1)
    expected = torch.zeros(A * inits, dtype=torch.float64).index_add_(
        0, peer_run[res.sources >= 0], torch.ones(int((res.sources >= 0).sum()), dtype=torch.float64)
    )
    assert torch.equal(added, expected)
    # federation 1 had no one flagged: reciprocity changed nothing there
    fed1 = res.inits == 1
    assert torch.equal(res.sources[fed1], plain.sources[fed1])
    assert torch.equal(res.best_value[fed1], plain.best[fed1])


def test_reciprocity_without_flags_is_the_plain_run():
    a, b = _runner(4, 2, num_iterations=4), _runner(4, 2, num_iterations=4, reciprocity=True)
    ra, rb = a.run(), b.run()
    assert not rb.excluded.any()
    assert torch.equal(ra.sources, rb.sources) and torch.equal(ra.best_value, rb.best_value)


def test_a_resumed_run_with_stale_free_riders_and_reciprocity_is_the_uninterrupted_one():
    kw = dict(num_iterations=4, p_t=0.0, reciprocity=True, free_riders={"agents": [1], "kind": "stale"})
    whole = _runner(4, 2, **kw)
    whole.run()
    first = _runner(4, 2, **kw)
    first.step()
    first.step()
    state = first.state_dict()
    resumed = _runner(4, 2, **kw)
    resumed.load_state_dict(state)
    resumed.run()
    assert torch.equal(resumed.sources, whole.sources) and torch.equal(resumed.best, whole.best)
    assert torch.equal(resumed.sent_follows, whole.sent_follows) and torch.equal(resumed.excluded, whole.excluded)
    assert torch.equal(resumed.method.first, whole.method.first)


# ------------------------------------------------------- reciprocity on the scores of what agents send
def test_the_scores_signal_lets_each_agent_follow_with_its_share_of_its_federation():
    A, inits = 4, 2
    r = _runner(A, inits, reciprocity=True, reciprocity_signal="scores", free_riders={"agents": [0], "kind": "noise"})
    r.step()
    r.step()
    scores, _ = r.method.peer_scores()
    helpful = helpful_posterior(scores, r.agents.mask.sum(-1))
    u = kr.uniform(kr.fold(kr.fold(r.agents.keys, "reciprocity"), 3), 1).squeeze(-1)
    expected = torch.zeros(A * inits, dtype=torch.bool)
    shares = torch.zeros(A * inits, dtype=torch.float64)
    for i in range(inits):  # one federation at a time, one sender at a time
        runs = torch.arange(A) * inits + i
        useful = torch.stack([helpful[runs[[a for a in range(A) if a != j]], j].mean() for j in range(A)])
        share = (useful / useful.median()).clamp(max=1.0)
        shares[runs] = share
        expected[runs] = u[runs] < share
    assert shares.min() < 1  # someone's messages are less useful than the median sender's
    got = r._share_coin(3)
    clear = (u - shares).abs() > 1e-12  # the loop's mean may differ from the batched one in the last bits
    assert torch.equal(got[clear], expected[clear])


def test_the_scores_signal_is_one_of_the_signals_in_one_line():
    with pytest.raises(
        ValueError, match=r"`reciprocity_signal` must be one of \('improvements', 'scores', 'ranks'\)"
    ) as info:
        FTSSettings(reciprocity_signal="votes")
    assert "\n" not in str(info.value)


# ------------------------------------------------------- reciprocity on ranks accumulated over rounds
def test_the_ranks_signal_adds_each_federation_s_round_to_the_record_and_flags_from_it():
    A, inits = 4, 2
    r = _runner(A, inits, reciprocity=True, reciprocity_signal="ranks", free_riders={"agents": [0], "kind": "noise"})
    r.step()
    r.step()
    before = r.ratings.clone()
    scores, _ = r.method.peer_scores()
    obs = r.agents.mask.sum(-1).double()
    expected = torch.zeros_like(before)
    for i in range(inits):  # one federation at a time
        runs = torch.arange(A) * inits + i
        receives = ~torch.eye(A, dtype=torch.bool).unsqueeze(0)
        mean, count = round_ratings(peer_ratings(scores[runs].unsqueeze(0), receives), receives)
        weight = torch.stack([(obs[runs[[a for a in range(A) if a != j]]] - 1).mean() for j in range(A)])
        expected[:, runs] = rating_record(mean[0], count[0], weight)
    flags = r._rated_low()
    torch.testing.assert_close(r.ratings - before, expected, rtol=0, atol=1e-15)
    assert torch.equal(flags, flag_low_rated(r.ratings)[0])


def test_an_agent_rated_low_follows_no_peer_under_the_ranks_signal():
    A, inits = 4, 2
    r = _runner(A, inits, p_t=0.0, num_iterations=3, reciprocity=True, reciprocity_signal="ranks")
    # run 0 (agent 0, federation 0) rated 0 in a hundred rounds by three receivers: flagged in every round
    r.ratings[:, 0] = rating_record(torch.zeros(1), torch.full((1,), 3.0), torch.ones(1))[:, 0] * 100
    res = r.run()
    assert res.excluded is not None and res.excluded[0].all() and not res.excluded[1:].any()
    assert (res.sources[0] == -1).all() and (res.sources[1:] >= 0).all()


@pytest.mark.parametrize(("kind", "replays"), [("noise", False), ("stale", True), ("copied", True)])
def test_a_resumed_run_under_the_ranks_signal_is_the_uninterrupted_one(kind, replays):
    riders = {"agents": [1], "kind": kind}
    kw = dict(
        num_iterations=4, reciprocity=True, reciprocity_signal="ranks", reciprocity_replays=replays, free_riders=riders
    )
    whole = _runner(4, 2, **kw)
    whole.run()
    first = _runner(4, 2, **kw)
    first.step()
    first.step()
    resumed = _runner(4, 2, **kw)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)  # through the checkpoint's format: data only
    resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    resumed.run()
    assert torch.equal(resumed.ratings, whole.ratings) and torch.any(whole.ratings != 0)
    assert torch.equal(resumed.sources, whole.sources) and torch.equal(resumed.excluded, whole.excluded)
    if replays:  # the stale or copying rider barred from its second round on, across the checkpoint
        assert resumed.excluded[resumed.rider[resumed.targets]][:, 1:].all()


# ------------------------------------------------------- strategic reports: colluding free-riders
def test_colluding_free_riders_report_each_other_first_and_honest_agents_last():
    riders = FreeRiders((0, 2), "noise", "collude")
    sender = riders.mask(4)
    scores = torch.tensor([[0.0, 3.0, 1.0, -2.0], [5.0, 0.0, -1.0, 2.0], [0.5, 0.2, 0.0, 0.1]], dtype=torch.float64)
    receiver = torch.tensor([True, False, True])
    got = riders.reported(scores, receiver, sender)
    assert torch.equal(got[1], scores[1])  # an honest receiver reports what it scored
    for row in (0, 2):  # a rider: fellow riders above every honest agent
        assert got[row, sender].min() > got[row, ~sender].max()
    # with the observations to judge, as helpful posteriors: 1 for the riders, 0 for the honest agents
    helpful = helpful_posterior(got, torch.tensor([20, 20, 20]))
    assert torch.equal(helpful[0, [0, 2]], torch.ones(2, dtype=torch.float64))
    assert torch.equal(helpful[0, [1, 3]], torch.zeros(2, dtype=torch.float64))
    # without any (fewer than two observations) every report is 1/2, a rider's too: no NaN
    assert torch.equal(helpful_posterior(got, torch.tensor([1, 1, 1])), torch.full((3, 4), 0.5, dtype=torch.float64))
    assert torch.equal(FreeRiders((0, 2), "noise").reported(scores, receiver, sender), scores)


@pytest.mark.parametrize("signal", ["ranks", "scores"])
def test_colluding_reports_replace_only_the_riders_rows(signal):
    r = _runner(
        4,
        2,
        reciprocity=True,
        reciprocity_signal=signal,
        free_riders={"agents": [0, 1], "kind": "noise", "report": "collude"},
    )
    r.step()
    r.step()
    truth, _ = r.method.peer_scores()
    reported = r._reported_scores()
    rider_run = r.rider[r.targets]  # runs target-major: agents 0 and 1 are the riders
    assert rider_run.any() and (~rider_run).any()
    assert torch.equal(reported[~rider_run], truth[~rider_run])
    assert (reported[rider_run][:, :2] > 0).all() and (reported[rider_run][:, 2:] < 0).all()


def test_colluding_reports_move_ratings_from_the_honest_agents_to_the_riders():
    A, inits = 4, 2
    r = _runner(A, inits, reciprocity=True, reciprocity_signal="ranks", free_riders={"agents": [0, 1], "kind": "noise"})
    r.step()
    r.step()
    before = r.ratings.clone()
    r._rated_low()
    truthful = r.ratings - before
    r.ratings = before.clone()
    r.free_riders = FreeRiders((0, 1), "noise", "collude")  # the same state, the riders now lie
    r._rated_low()
    lying = r.ratings - before
    assert torch.equal(lying[0], truthful[0])  # the rounds' weights: observations, not reports
    up = lying[1] - truthful[1]  # the weighted ratings w·r, per run
    rider_run = r.rider[r.targets]
    assert (up[rider_run] > 0).all()  # each rider now ranked first by its fellow rider
    for i in range(inits):  # what the riders gain the honest agents lose, federation by federation
        runs = torch.arange(A) * inits + i
        torch.testing.assert_close(up[runs].sum(), torch.zeros((), dtype=torch.float64), rtol=0, atol=1e-12)


# ------------------------------------------------------- replays: a message sent twice bit for bit
def test_reciprocity_replays_needs_reciprocity_in_one_line():
    with pytest.raises(ValueError, match=r"`reciprocity_replays`.*`reciprocity: true`") as info:
        FTSSettings(algorithm="fts", reciprocity_replays=True)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kind", ["stale", "constant", "noise", "copied"])
def test_only_riders_that_replay_are_barred_from_the_second_round_on(kind):
    A, inits, T = 4, 2, 4
    riders = {"agents": [0], "kind": kind}
    kw = dict(num_iterations=T, reciprocity=True, reciprocity_signal="ranks", free_riders=riders)
    r = _runner(A, inits, reciprocity_replays=True, **kw)
    rider_run = r.rider[r.targets]
    # the same vector every round (stale, constant), or the one a peer sent the round before (copied); noise is fresh
    replays = kind in ("stale", "constant", "copied")
    for _ in range(T):
        r.step()
        assert r.method.replayed is not None and not r.method.replayed[~rider_run].any()  # honest draws are fresh
        assert bool(r.method.replayed[rider_run].all()) is replays
    res = r.result()
    assert res.excluded is not None
    # a replay shows once two messages were received: from the second round on, whatever the ranks say
    assert bool(res.excluded[rider_run][:, 1:].all()) is replays
    if replays:
        assert (res.sources[rider_run][:, 1:] == -1).all()  # barred: follows no peer
    else:  # nothing replayed: the run is the one without the rule
        assert torch.equal(res.excluded, _runner(A, inits, **kw).run().excluded)


def test_replays_off_leave_the_run_as_it_was():
    kw = dict(
        num_iterations=3, reciprocity=True, reciprocity_signal="ranks", free_riders={"agents": [0], "kind": "stale"}
    )
    plain = _runner(4, 2, **kw).run()
    off = _runner(4, 2, reciprocity_replays=False, **kw).run()
    assert torch.equal(plain.sources, off.sources) and torch.equal(plain.loss, off.loss)
