"""The free-rider test: the binomial tail against exact sums, batched as row by row, and its evidence floor;
reciprocity on what a peer sends: its receivers' mean helpful posterior and the share it keeps."""

import math

import torch

from fbo_torch.protocol.reciprocity import (
    FREE_RIDER_MIN_FOLLOWS,
    binomial_cdf,
    flag_free_riders,
    reciprocal_share,
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
