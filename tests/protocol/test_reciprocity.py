"""The free-rider test: the binomial tail against exact sums, batched as row by row, and its evidence floor;
reciprocity on what a peer sends: its receivers' mean helpful posterior and the share it keeps; the ranks
signal: ratings as ranks, their record and test, and what receivers that misreport can and cannot do."""

import math

import torch

from fbo_torch.protocol.reciprocity import (
    FREE_RIDER_MIN_FOLLOWS,
    RATING_THRESHOLD,
    binomial_cdf,
    flag_free_riders,
    flag_low_rated,
    peer_ratings,
    rating_record,
    reciprocal_share,
    round_ratings,
    sender_usefulness,
)


def _exact_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(min(k, n) + 1))


def test_the_binomial_tail_equals_the_exact_sum():
    cases = [(k, n, p) for n in (0, 1, 8, 43, 120) for k in (0, 1, 3, n // 2, n) for p in (0.04, 0.36, 0.9)]
    k, n, p = (torch.tensor(c, dtype=torch.float64) for c in zip(*cases, strict=True))
    got = binomial_cdf(k, n, p)
    want = torch.tensor([_exact_cdf(*c) for c in cases], dtype=torch.float64)
    # float64 sums of at most 121 terms, each exp(lgamma(...)) to a few ulps times the terms' size
    assert torch.allclose(got, want, rtol=1e-11, atol=1e-13)


def test_federations_are_tested_at_once_as_each_alone():
    g = torch.Generator().manual_seed(0)
    follows = torch.randint(0, 60, (5, 7), generator=g)
    wins = (torch.rand(5, 7, generator=g, dtype=torch.float64) * (follows + 1)).floor().clamp(max=follows)
    wins[:, 0] = 0  # one peer that never helped, in every federation
    flagged, pvalue, p0 = flag_free_riders(follows, wins)
    for r in range(5):
        f, pv, q = flag_free_riders(follows[r], wins[r])
        assert torch.equal(flagged[r], f)
        assert torch.allclose(pvalue[r], pv, equal_nan=True) and torch.allclose(p0[r], q, equal_nan=True)
    # p0 is the pooled rate of the other peers
    assert torch.allclose(p0[:, 1], (wins.sum(-1) - wins[:, 1]) / (follows.sum(-1) - follows[:, 1]))


def test_a_peer_followed_too_rarely_is_never_flagged_however_it_did():
    follows = torch.tensor([FREE_RIDER_MIN_FOLLOWS - 1, 200, 200])
    wins = torch.tensor([0, 80, 80])
    flagged, pvalue, _ = flag_free_riders(follows, wins)
    assert not flagged[0] and math.isnan(pvalue[0])
    follows[0] = 60  # 0 improvements in 60 follows against a pooled 40 %: P = 0.6**60, about 5e-14
    flagged, pvalue, _ = flag_free_riders(follows, wins)
    assert flagged.tolist() == [True, False, False] and abs(pvalue[0].item() - 0.6**60) < 1e-20


# ------------------------------------------------------------- reciprocity on what a peer sends
def test_a_sender_s_usefulness_is_the_mean_of_its_receivers_posteriors_only():
    # 2 federations of 3 agents: helpful[f, a, j] is receiver a's posterior of sender j's message
    helpful = torch.tensor(
        [[[0.5, 0.9, 0.1], [0.7, 0.5, 0.3], [0.9, 0.6, 0.5]], [[0.5, 0.2, 0.4], [0.8, 0.5, 0.6], [0.6, 0.4, 0.5]]],
        dtype=torch.float64,
    )
    receives = ~torch.eye(3, dtype=torch.bool).expand(2, 3, 3)  # everyone but oneself
    got = sender_usefulness(helpful, receives)
    want = torch.tensor([[0.8, 0.75, 0.2], [0.7, 0.3, 0.5]], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=0, atol=1e-15)
    # a sender nobody receives has no evidence: 1/2
    nobody = receives.clone()
    nobody[..., 2] = False
    assert torch.equal(sender_usefulness(helpful, nobody)[:, 2], torch.full((2,), 0.5, dtype=torch.float64))


def test_the_share_is_usefulness_over_the_median_sender_at_most_one():
    u = torch.tensor([[0.9, 0.6, 0.3, 0.0, 0.6], [0.5, 0.5, 0.5, 0.5, 0.5], [0.0, 0.0, 0.0, 0.4, 0.8]])
    share = reciprocal_share(u)
    # medians 0.6, 0.5 and 0 (a federation whose median sender helps nobody restricts no one)
    assert torch.allclose(share[0], torch.tensor([1.0, 1.0, 0.5, 0.0, 1.0], dtype=torch.float64), atol=1e-15)
    assert torch.equal(share[1], torch.ones(5, dtype=torch.float64))
    assert torch.equal(share[2], torch.ones(5, dtype=torch.float64))


# ------------------------------------------------------------------ the ranks signal
def _receives(A: int, batch: int = 1) -> torch.Tensor:
    return (~torch.eye(A, dtype=torch.bool)).expand(batch, A, A).clone()


def test_ratings_are_each_receiver_s_ranks_with_ties_sharing_and_unreceived_nan():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (3, 6, 6), generator=g).double()  # many ties
    receives = _receives(6, 3) & (torch.rand(3, 6, 6, generator=g) < 0.8)
    q = peer_ratings(scores, receives)
    for b in range(3):
        for a in range(6):
            peers = receives[b, a].nonzero().flatten().tolist()
            for j in range(6):
                if j not in peers:
                    assert math.isnan(q[b, a, j])
                    continue
                lower = sum(scores[b, a, k] < scores[b, a, j] for k in peers)
                tied = sum(scores[b, a, k] == scores[b, a, j] for k in peers) - 1
                expected = (lower + tied / 2) / (len(peers) - 1) if len(peers) > 1 else 0.5
                assert q[b, a, j].item() == expected


def test_whatever_a_receiver_reports_its_ratings_average_one_half():
    # a receiver's report only orders its peers: it can move reputation between them, not lower them all
    g = torch.Generator().manual_seed(1)
    for scores in (
        torch.randn(4, 7, 7, generator=g),
        torch.full((4, 7, 7), -1e9),
        torch.randn(4, 7, 7, generator=g) * 1e6,
    ):
        q = peer_ratings(scores, _receives(7, 4))
        torch.testing.assert_close(q.nansum(-1) / 6, torch.full((4, 7), 0.5, dtype=torch.float64), rtol=0, atol=1e-15)


def test_a_round_s_rating_is_the_mean_over_the_sender_s_receivers_only():
    q = torch.tensor([[[math.nan, 1.0, 0.0], [0.5, math.nan, 0.5], [1.0, 0.0, math.nan]]], dtype=torch.float64)
    receives = _receives(3)
    receives[0, 2, 0] = False  # agent 2 did not receive agent 0
    mean, count = round_ratings(q, receives)
    assert torch.equal(count, torch.tensor([[1.0, 2.0, 2.0]], dtype=torch.float64))
    assert torch.equal(mean, torch.tensor([[0.5, 0.5, 0.25]], dtype=torch.float64))
    mean, count = round_ratings(q, torch.zeros(1, 3, 3, dtype=torch.bool))
    assert mean.isnan().all() and (count == 0).all()


def test_the_record_s_test_is_the_weighted_mean_s_upper_bound():
    g = torch.Generator().manual_seed(2)
    T, B = 8, 5
    r = torch.rand(T, B, generator=g, dtype=torch.float64) * 0.6
    w = torch.rand(T, B, generator=g, dtype=torch.float64) * 5 + 0.5
    m = torch.randint(3, 9, (T, B), generator=g).double()
    record = sum(rating_record(r[t], m[t], w[t]) for t in range(T))
    flags, upper = flag_low_rated(record, threshold=0.4, z=2.0, min_rounds=3)
    for b in range(B):
        mean = (w[:, b] * r[:, b]).sum() / w[:, b].sum()
        n = w[:, b].sum() ** 2 / (w[:, b] ** 2).sum()
        var = ((w[:, b] * (r[:, b] - mean) ** 2).sum() / w[:, b].sum()) * n / (n - 1)
        floor = 1 / (12 * (w[:, b] * m[:, b]).sum() / w[:, b].sum())
        expected = mean + 2.0 * (max(var, floor) / n).sqrt()
        torch.testing.assert_close(upper[b], expected, rtol=1e-12, atol=0)
        assert bool(flags[b]) == bool(expected < 0.4)
    # nothing rated: no bound, no flag; too few effective rounds: no flag however low
    flags, upper = flag_low_rated(torch.zeros(5, 2, dtype=torch.float64))
    assert upper.isnan().all() and not flags.any()
    two = rating_record(torch.zeros(1), torch.full((1,), 9.0), torch.ones(1)) * 2
    assert not flag_low_rated(two, min_rounds=3)[0].any() and flag_low_rated(two * 2, min_rounds=3)[0].all()
    unrated = rating_record(torch.tensor([math.nan]), torch.zeros(1), torch.ones(1))
    assert torch.equal(unrated, torch.zeros(5, 1, dtype=torch.float64))


def _scored_rounds(rounds: int, liars: list[int], target: int, colluders: list[int], rider: int, seed: int = 0):
    """Ratings of 10 agents over ``rounds``: each receiver scores honest peers ~ N(1, 1) and the free-rider
    ``rider`` ~ N(-1, 1); ``liars`` score ``target`` lowest of all, ``colluders`` score ``rider`` highest."""
    A = 10
    g = torch.Generator().manual_seed(seed)
    receives = _receives(A)
    record = torch.zeros(5, A, dtype=torch.float64)
    for _ in range(rounds):
        scores = torch.randn(1, A, A, generator=g, dtype=torch.float64) + 1
        scores[..., rider] -= 2
        scores[0, liars, target] = -1e9
        scores[0, colluders, rider] = 1e9
        mean, count = round_ratings(peer_ratings(scores, receives), receives)
        record += rating_record(mean[0], count[0], torch.ones(A))
    return record


def test_free_riders_are_flagged_and_honest_senders_are_not():
    flags, upper = flag_low_rated(_scored_rounds(20, [], 5, [], rider=0))
    assert flags[0] and not flags[1:].any()
    assert upper[1:].min() > RATING_THRESHOLD


def test_receivers_that_rank_an_honest_sender_last_lower_it_at_most_in_proportion_and_do_not_get_it_flagged():
    # two of the target's nine receivers lie, every round: each can lower its round's mean by at most 1/9
    # (by its honest rating / 9: on average the mean falls to (1 - 2/9) of the honest one)
    honest = _scored_rounds(40, [], 5, [], rider=0)
    lied = _scored_rounds(40, [1, 2], 5, [], rider=0)
    mean_honest, mean_lied = honest[1, 5] / honest[0, 5], lied[1, 5] / lied[0, 5]
    assert mean_honest - 2 / 9 - 1e-12 <= mean_lied < mean_honest
    flags, upper = flag_low_rated(lied)
    assert not flags[1:].any() and flags[0]
    assert upper[5] > RATING_THRESHOLD


def test_a_colluder_that_ranks_a_free_rider_first_does_not_save_it():
    flags, _ = flag_low_rated(_scored_rounds(20, [], 5, [1], rider=0))
    assert flags[0] and not flags[1:].any()
