"""The server's secret stream: unpredictable without the secret, reproducible with it, well distributed."""

import math

import pytest
import torch

from fbo_torch.protocol.randomness import KeyedServerRandomness, SecretServerRandomness
from fbo_torch.utils.secure_random import new_secret, secret_bits, secret_normal, secret_uniform

SECRET = bytes(range(32))


def test_same_secret_same_numbers_other_secret_or_label_other_numbers():
    a = secret_uniform(SECRET, ("noise", 3), (4, 100))
    assert torch.equal(a, secret_uniform(SECRET, ("noise", 3), (4, 100)))
    assert not torch.equal(a, secret_uniform(bytes(31) + b"\x01", ("noise", 3), (4, 100)))
    assert not torch.equal(a, secret_uniform(SECRET, ("noise", 4), (4, 100)))
    assert not torch.equal(a, secret_uniform(SECRET, ("poisson", 3), (4, 100)))
    assert new_secret() != new_secret() and len(new_secret()) == 32


def test_a_longer_draw_extends_a_shorter_one_and_row_zero_is_a_batch_of_one():
    assert (secret_bits(SECRET, ("x",), 10) == secret_bits(SECRET, ("x",), 50)[:10]).all()
    r = SecretServerRandomness(SECRET)
    like = torch.zeros((), dtype=torch.float64)
    batch, one = r.normals(2, torch.Size([3, 40]), like), r.normals(2, torch.Size([40]), like)
    assert torch.equal(batch[0], one)
    assert torch.equal(r.coins(2, torch.Size([3, 7]), like)[0], r.coins(2, torch.Size([7]), like))


@pytest.mark.parametrize("mitigate", [True, False])
def test_normals_have_the_moments_of_a_standard_normal(mitigate):
    n = 200_000
    z = secret_normal(SECRET, ("noise", 1), (n,), mitigate=mitigate)
    # the sample mean has standard error 1/sqrt(n), the sample variance sqrt(2/n), the fourth moment sqrt(96/n)
    assert abs(z.mean().item()) < 5 / math.sqrt(n)
    assert abs(z.var().item() - 1) < 5 * math.sqrt(2 / n)
    assert abs((z**4).mean().item() - 3) < 5 * math.sqrt(96 / n)
    # tails: P(|z| > 3) = 0.0026998; its count is binomial
    p = 0.0026998
    assert abs((z.abs() > 3).double().mean().item() - p) < 5 * math.sqrt(p * (1 - p) / n)


def test_uniforms_are_uniform_and_independent_of_their_neighbours():
    n = 200_000
    u = secret_uniform(SECRET, ("poisson", 1), (n,))
    assert 0 <= u.min() and u.max() < 1
    counts = torch.histc(u, bins=20, min=0, max=1)
    chi2 = ((counts - n / 20) ** 2 / (n / 20)).sum().item()
    assert chi2 < 50  # chi-square with 19 degrees of freedom: P(> 50) < 1e-4
    lag = torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1].item()
    assert abs(lag) < 5 / math.sqrt(n)


def test_secret_randomness_follows_the_device_and_dtype_and_never_shows_its_secret():
    r = SecretServerRandomness(SECRET)
    x = r.normals(1, torch.Size([5]), torch.zeros(1, dtype=torch.float32))
    assert x.dtype == torch.float32 and x.device.type == "cpu"
    assert SECRET.hex() not in repr(r) and repr(SECRET) not in repr(r) and str(list(SECRET)) not in repr(r)
    with pytest.raises(ValueError, match="32 bytes"):
        SecretServerRandomness(b"short")
    with pytest.raises(TypeError, match="bytes"):
        SecretServerRandomness("a passphrase")


def test_the_seeded_streams_are_what_they_were():
    """The research default (the simulator's) must keep its numbers: results and checkpoints depend on them."""
    from fbo_torch.utils import keyed_random as kr

    keys = torch.tensor([11, -7], dtype=torch.int64)
    like = torch.zeros((), dtype=torch.float64)
    r = KeyedServerRandomness(keys)
    coins = kr.uniform(kr.fold(kr.fold(kr.fold(keys.unsqueeze(-1), "poisson"), 4), torch.arange(6)), 1).squeeze(-1)
    assert torch.equal(r.coins(4, torch.Size([2, 6]), like), coins)
    assert torch.equal(r.normals(4, torch.Size([2, 9]), like), kr.normal(kr.fold(kr.fold(keys, "noise"), 4), 9))
