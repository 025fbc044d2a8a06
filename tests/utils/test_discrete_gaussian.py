"""Discrete Gaussian shares and stochastic rounding drawn from an agent's secret stream."""

import math

import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp

from fbo_torch.utils.discrete_gaussian import (
    WordStreams,
    discrete_gaussian,
    stochastic_round,
    truncation_bound,
    uniform_below,
    uniforms,
)

SECRETS = [bytes([i]) * 32 for i in range(8)]


@pytest.mark.parametrize("variance", [2, 37])
def test_samples_follow_the_discrete_gaussian_pmf(variance):
    z = discrete_gaussian(WordStreams(SECRETS[:2], ("pmf", variance), 40_000), variance)
    half = int(6 * math.sqrt(variance)) + 1
    x = np.arange(-half, half + 1)
    logp = -(x**2) / (2 * variance)
    expected = np.exp(logp - logsumexp(logp)) * len(z)
    counts = np.array([(z == v).sum() for v in x])
    keep = expected > 5
    chi2 = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    assert chi2 < stats.chi2.ppf(0.999, keep.sum() - 1)
    assert abs(z.mean()) < 4 * math.sqrt(variance / len(z))


def test_an_agents_draws_do_not_depend_on_the_batch_it_is_drawn_in():
    alone = discrete_gaussian(WordStreams(SECRETS[3:4], ("noise", 5), 300), 1000)
    batch = discrete_gaussian(WordStreams(SECRETS, ("noise", 5), 300), 1000).reshape(len(SECRETS), -1)
    assert np.array_equal(batch[3], alone)
    other = discrete_gaussian(WordStreams(SECRETS[3:4], ("noise", 6), 300), 1000)
    assert not np.array_equal(alone, other)  # another round, other noise


def test_shares_are_bounded_and_the_variance_is_checked():
    z = discrete_gaussian(WordStreams(SECRETS, ("tail",), 5000), 1)
    assert np.abs(z).max() <= truncation_bound(1) == 40
    assert truncation_bound(160000) == 40 * 400 and truncation_bound(160001) == 40 * 401
    for bad in (0, 2**24 + 1, 2.5, True):
        with pytest.raises(ValueError, match="variance"):
            discrete_gaussian(WordStreams(SECRETS[:1], ("x",), 3), bad)


def test_uniform_integers_stay_below_their_bound():
    streams = WordStreams(SECRETS, ("u",), 1000)
    for n in (1, 3, 2**62 + 5):
        u = uniform_below(streams, np.arange(streams.size), n)
        assert ((u >= 0) & (u < n)).all()
    assert (uniform_below(streams, np.arange(streams.size), 1) == 0).all()


def test_stochastic_rounding_is_unbiased_and_within_one():
    x = np.full(8 * 20_000, -1.3)
    r = stochastic_round(x, uniforms(WordStreams(SECRETS, ("round",), 20_000)))
    assert set(np.unique(r)) == {-2, -1}
    p_up = (r == -1).mean()  # P(round up) = 0.7
    assert abs(p_up - 0.7) < 4 * math.sqrt(0.21 / len(r))
    assert np.array_equal(stochastic_round(np.array([2.0, -5.0]), np.array([0.999, 0.0])), [2, -5])
