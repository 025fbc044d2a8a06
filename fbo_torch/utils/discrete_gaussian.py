r"""Exact discrete Gaussian noise and unbiased stochastic rounding from a cryptographic source.

An agent of a secure-aggregation round (:mod:`fbo_torch.federation.secure`)
turns its real vector into integers and adds its share of integer noise. Both
must be unpredictable to everyone else and must not depend on floating-point
accidents, so both are drawn here from keyed SHAKE-256 streams
(:func:`~fbo_torch.utils.secure_random.secret_bits`) over the agent's own
256-bit secret, with integer arithmetic only:

* :func:`discrete_gaussian` — ``N_Z(0, σ²)`` with integer ``σ²``, by the
  rejection sampler of Canonne, Kamath & Steinke (2020, Algorithm 3: discrete
  Laplace proposals, accepted with probability ``exp(−(|Y| − σ²/t)²/(2σ²))``)
  whose Bernoulli(``exp(−γ)``) draws for rational ``γ`` (their Algorithm 1)
  use only uniform integers, themselves exact by rejection. No float enters,
  so the samples are exactly distributed — up to one documented cut: a
  proposal with ``|Y| > 40⌈σ⌉`` is rejected, which conditions the output on
  ``|Z| ≤ 40⌈σ⌉`` (the discrete Gaussian's mass beyond is below ``e^{−790}``)
  and keeps every product inside int64 for ``σ² ≤ 2²⁴``. It also bounds every
  share, which is what makes the modular sum provably wrap-free.
* :func:`stochastic_round` — ``⌊x⌋ + Bernoulli(x − ⌊x⌋)`` with 53-bit uniforms:
  unbiased (to ``2⁻⁵³``), and always within 1 of ``x``, which is all the
  sensitivity bound needs.

Why not a library: numpy's and torch's samplers draw from their own
non-cryptographic generators (and in floating point); Flower's
``secure_aggregation.quantization`` rounds with ``np.random``; the published
exact samplers (Canonne–Kamath–Steinke's reference code, OpenDP) are
element-by-element Python or Rust. This is their algorithm, vectorized.

Every element (an agent's coordinate) consumes its **own** sub-stream
(:class:`WordStreams`): the words it uses depend only on its own draws, so an
agent's noise is the same whether the simulator samples it in a batch of
thousands or a deployed agent samples it alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fbo_torch.utils.secure_random import check_secret, secret_bits

#: Largest variance :func:`discrete_gaussian` accepts (keeps its integer arithmetic inside int64).
MAX_VARIANCE = 2**24
#: A share is conditioned on ``|Z| ≤ TAIL_SIGMAS · ⌈σ⌉``.
TAIL_SIGMAS = 40
_U64 = np.uint64
_MAX64 = _U64(2**64 - 1)


def truncation_bound(variance: int) -> int:
    """The largest ``|Z|`` :func:`discrete_gaussian` returns for integer ``σ² = variance``."""
    return TAIL_SIGMAS * (math.isqrt(int(variance) - 1) + 1)


class WordStreams:
    r"""Independent streams of 64-bit words, one per element of ``rows x per_row``.

    Row ``r`` draws from the SHAKE-256 stream of ``(secrets[r], label)``: element
    ``j`` of it gets words ``j·block .. j·block + block − 1``, then (for the few
    elements that need more) the words of the stream ``(secrets[r], label + ("more", j))``.

    Args:
        secrets: One 32-byte secret per row.
        label: The purpose (and round) of the draws.
        per_row: Elements per row.
        block: Words per element drawn up front.
        more: Words drawn at once for an element that needs more than ``block``.
    """

    def __init__(
        self, secrets: Sequence[bytes], label: tuple[int | str, ...], per_row: int, block: int = 48, more: int = 256
    ) -> None:
        self.secrets = [check_secret(s) for s in secrets]
        self.label, self.per_row, self.block, self.more = tuple(label), int(per_row), int(block), int(more)
        n = self.per_row * self.block
        self._words = (
            np.concatenate([secret_bits(s, self.label, n) for s in self.secrets]).reshape(-1, self.block)
            if self.secrets
            else np.zeros((0, self.block), dtype=_U64)
        )
        self._used = np.zeros(len(self.secrets) * self.per_row, dtype=np.int64)
        self._more_row = np.full(len(self._used), -1, dtype=np.int64)  # element -> its row of self._more
        self._more = np.zeros((0, self.more), dtype=_U64)

    @property
    def size(self) -> int:
        return len(self._used)

    def _more_words(self, element: int, n: int) -> np.ndarray:
        row, j = divmod(int(element), self.per_row)
        return secret_bits(self.secrets[row], self.label + ("more", j), n)

    def take(self, idx: np.ndarray) -> np.ndarray:
        """The next word of each element in ``idx`` (distinct indices)."""
        used = self._used[idx]
        out = np.empty(len(idx), dtype=_U64)
        fast = used < self.block
        out[fast] = self._words[idx[fast], used[fast]]
        slow = np.flatnonzero(~fast)
        if slow.size:
            elements, k = idx[slow], used[slow] - self.block
            new = np.unique(elements[self._more_row[elements] < 0])
            if new.size:  # an element's further words, drawn once for all its later draws
                self._more_row[new] = np.arange(len(self._more), len(self._more) + len(new))
                self._more = np.concatenate([self._more, np.stack([self._more_words(e, self.more) for e in new])])
            inside = k < self.more
            out[slow[inside]] = self._more[self._more_row[elements[inside]], k[inside]]
            for i in np.flatnonzero(~inside):  # beyond even those: practically never
                out[slow[i]] = self._more_words(elements[i], int(k[i]) + 1)[-1]
        self._used[idx] = used + 1
        return out


def uniform_below(streams: WordStreams, idx: np.ndarray, n: np.ndarray | int) -> np.ndarray:
    r"""Exactly uniform integers in ``[0, n)`` (``1 ≤ n ≤ 2⁶³``), one per element of ``idx``: a word
    ``w`` is accepted when ``w < 2⁶⁴ − (2⁶⁴ mod n)`` and mapped to ``w mod n`` (``n = 1`` spends no word)."""
    n_all = np.broadcast_to(np.asarray(n, dtype=_U64), idx.shape).copy()
    out = np.zeros(len(idx), dtype=np.int64)
    todo = np.flatnonzero(n_all > 1)  # [0, 1) holds only 0: no word is spent on it
    while todo.size:
        w = streams.take(idx[todo])
        m = n_all[todo]
        rem = (_U64(0) - m) % m  # 2^64 mod m (uint64 arithmetic wraps)
        ok = w <= _MAX64 - rem
        out[todo[ok]] = (w[ok] % m[ok]).astype(np.int64)
        todo = todo[~ok]
    return out


def _bernoulli(streams: WordStreams, idx: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Bernoulli(``num/den``) for integers ``0 ≤ num ≤ den``."""
    return uniform_below(streams, idx, den) < num


def _bernoulli_exp_fraction(streams: WordStreams, idx: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    r"""Bernoulli(``exp(−num/den)``) for ``0 ≤ num ≤ den`` (CKS Algorithm 1): draw Bernoulli(γ/k) for
    ``k = 1, 2, ...`` until one fails; success iff it fails at an odd ``k``. Bernoulli(γ/k) is drawn as
    Bernoulli(1/k) and Bernoulli(γ) together (two words; no product overflows)."""
    k = np.ones(len(idx), dtype=np.int64)
    live = np.arange(len(idx))
    while live.size:
        a = _bernoulli(streams, idx[live], num[live], den[live])
        a &= uniform_below(streams, idx[live], k[live]) == 0  # Bernoulli(1/k); no word for k = 1
        k[live[a]] += 1
        live = live[a]
    return (k % 2) == 1


def _bernoulli_exp(streams: WordStreams, idx: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    r"""Bernoulli(``exp(−num/den)``) for any ``num ≥ 0``: ``⌊γ⌋`` Bernoulli(``e⁻¹``) draws that must all
    succeed, then Bernoulli(``exp(−(γ − ⌊γ⌋))``)."""
    whole, rest = num // den, num % den
    ok = np.ones(len(idx), dtype=bool)
    ones = np.ones(len(idx), dtype=np.int64)
    for i in range(int(whole.max(initial=0))):
        live = np.flatnonzero(ok & (whole > i))
        ok[live] = _bernoulli_exp_fraction(streams, idx[live], ones[live], ones[live])
    live = np.flatnonzero(ok)
    ok[live] = _bernoulli_exp_fraction(streams, idx[live], rest[live], den[live])
    return ok


def discrete_gaussian(streams: WordStreams, variance: int) -> np.ndarray:
    r"""One draw of ``N_Z(0, σ²)``, conditioned on ``|Z| ≤ 40⌈σ⌉``, per element of ``streams``.

    Args:
        streams: Where each element's words come from (every element is drawn).
        variance: ``σ²``, an integer in ``[1, 2²⁴]``.

    Returns:
        An int64 array of ``streams.size`` samples.
    """
    s = int(variance)
    if isinstance(variance, bool) or s != variance or not 1 <= s <= MAX_VARIANCE:
        raise ValueError(f"`variance` must be an integer in [1, {MAX_VARIANCE}], got {variance!r}.")
    t = math.isqrt(s) + 1  # ⌊σ⌋ + 1
    bound = truncation_bound(s)
    out = np.zeros(streams.size, dtype=np.int64)
    todo = np.arange(streams.size)
    while todo.size:
        u = uniform_below(streams, todo, t)
        d = _bernoulli_exp_fraction(streams, todo, u, np.full(len(todo), t, dtype=np.int64))
        cand, u = todo[d], u[d]
        v = np.zeros(len(cand), dtype=np.int64)  # geometric: successes of Bernoulli(e^-1) before a failure
        live = np.arange(len(cand))
        ones = np.ones(len(cand), dtype=np.int64)
        while live.size:
            a = _bernoulli_exp_fraction(streams, cand[live], ones[live], ones[live])
            v[live[a]] += 1
            live = live[a]
        y = u + t * v
        negative = uniform_below(streams, cand, 2) == 1
        keep = ~(negative & (y == 0)) & (y <= bound)
        cand, y, negative = cand[keep], y[keep], negative[keep]
        accept = _bernoulli_exp(streams, cand, (y * t - s) ** 2, np.full(len(cand), 2 * s * t * t, dtype=np.int64))
        out[cand[accept]] = np.where(negative[accept], -y[accept], y[accept])
        done = np.zeros(streams.size, dtype=bool)
        done[cand[accept]] = True
        todo = todo[~done[todo]]
    return out


def uniforms(streams: WordStreams) -> np.ndarray:
    """One uniform ``[0, 1)`` float64 (53 random bits) per element."""
    w = streams.take(np.arange(streams.size))
    return (w >> _U64(11)).astype(np.float64) * 2.0**-53


def stochastic_round(x: np.ndarray, u: np.ndarray) -> np.ndarray:
    r"""``⌊x⌋ + 1{u < x − ⌊x⌋}`` as int64: ``E = x`` for uniform ``u``, and ``|result − x| < 1`` always."""
    low = np.floor(x)
    return (low + (u < (x - low))).astype(np.int64)


__all__ = [
    "MAX_VARIANCE",
    "TAIL_SIGMAS",
    "WordStreams",
    "discrete_gaussian",
    "stochastic_round",
    "truncation_bound",
    "uniform_below",
    "uniforms",
]
