r"""The DP-FTS-DE central server (DP-FTS-DE Algorithm 1, lines 5-12).

Each round the server receives one vector ``ω_n`` per agent and releases ``P``
vectors, one per sub-region, through a single Poisson-subsampled Gaussian
mechanism (McMahan et al. 2018's DP-FedAvg with the unbiased estimator):

1. **Subsample**: each agent joins with probability ``q``.
2. **Clip**: ``ω̂_n = ω_n / max(1, ‖ω_n‖ / (S/√P))``, so the joint vector
   ``(N φ_n^(i) ω̂_n)_i`` has norm at most ``N φ_max S``.
3. **Aggregate**: ``ω^(i) = Σ_{n sampled} φ_n^(i) ω̂_n / q``.
4. **Noise**: add ``N(0, (z φ_max S / q)²)`` to every entry, with
   ``φ_max = max_{i,n} φ_n^(i)``.

The privacy loss of the releases is accounted by :mod:`fbo_torch.privacy`
(one step with ``(z, q)`` per round). ``z = 0`` is the non-private FTS-DE;
``P = 1`` is DP-FTS.

**When no agent is sampled**, the aggregate is the empty sum, 0, and the
release is pure noise. This is simply the mechanism's output for that draw of
the subsample, which the privacy analysis already covers; substituting
anything else (the authors' code substitutes a random vector) would either be
equivalent to more noise or depend on data outside the sample. The server
does not tell agents that the sample was empty: the sample size is itself
private information. Such rounds are visible in ``DPAggregator.history``.

**Invalid messages are dropped, never mixed in.** A row of ``omegas`` with a
non-finite entry (NaN, ±inf: a malfunction or an attack) is treated like a
message that never arrived: it takes no part in the sample, and its entries
are replaced by zeros with ``torch.where`` *before* any arithmetic (multiplying
a NaN by a zero mask would still give NaN). The accounting is unchanged: the
guarantee is for neighbouring federations that differ in one agent's data
replaced by the null message (Kairouz et al. 2021's zero-out neighbours, which
give the sampled Gaussian mechanism the same (ε, δ) as adding or removing the
agent); a dropped message contributes exactly what the null message does, the
zero vector, whatever the agent's data, and every message that enters is
clipped to the same bound, so the sensitivity and the sampling probability
``q`` the accountant assumes still hold. An honest agent's ``ω`` is always a
finite vector (its models never take non-finite observations), so whether a
message is valid does not depend on an honest agent's data. The argument
treats *whether* a message arrives (a timeout, a crash, a lost connection) as
participation, independent of the agent's data, as every federated deployment
does; a server that releases nothing in a round without a valid message
(:class:`~fbo_torch.federation.server.DPFTSDEServer`) reveals that bit of
participation, never a bit of data.

**Randomness.** The Poisson coins and the noise come from a
:class:`~fbo_torch.protocol.randomness.ServerRandomness`: a cryptographic
stream keyed by the server's secret in deployment, the federation's seeded
streams in research (see :mod:`fbo_torch.protocol.randomness`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from fbo_torch.privacy.accountants import check_noise_multiplier, check_sample_rate
from fbo_torch.protocol.randomness import (
    GeneratorServerRandomness,
    KeyedServerRandomness,
    ServerRandomness,
)
from fbo_torch.utils.validation import check_finite, check_int, check_tensor

#: The exploration weights of a round: a tensor, or a function of the round number that returns one.
RegionWeights = Tensor | Callable[[int], Tensor]


@dataclass
class AggregationRecord:
    r"""What one round of the server did (batch dimensions of the input kept).

    Attributes:
        round: Round index.
        sampled: ``... x N`` booleans, agents in the Poisson sample.
        num_sampled: ``...`` sample sizes.
        clipped: ``... x N`` booleans, sampled agents whose vector was clipped.
        fraction_clipped: ``...`` clipped / sampled (0 when none sampled).
        noise_std: Standard deviation of the added noise, ``z φ_max S / q``
            (a 0-d tensor on the keyed, synchronization-free path).
        signal_norm: ``... x P`` norms of the data part ``Σ w clip(ω) / q`` of each region.
        noise_norm: ``... x P`` norms of the added noise of each region.
        num_reported: ``...`` agents whose vector arrived (all ``N`` without dropouts).
        valid: ``... x N`` booleans: agents whose vector arrived and was valid
            (finite); only these take part in the Poisson sample.
        num_invalid: ``...`` vectors that arrived but were invalid (dropped).
        released: Secure aggregation: ``...`` booleans, the federation's sum had
            ``min_survivors`` vectors and was released.
        out_of_range: Secure aggregation: ``...`` coordinates of the sum outside the
            honest range (only hostile agents put them there), clamped.
    """

    round: int
    sampled: Tensor
    num_sampled: Tensor
    clipped: Tensor
    fraction_clipped: Tensor
    noise_std: float | Tensor
    signal_norm: Tensor | None = None
    noise_norm: Tensor | None = None
    num_reported: Tensor | None = None
    valid: Tensor | None = None
    num_invalid: Tensor | None = None
    released: Tensor | None = None
    out_of_range: Tensor | None = None


def clip_vectors(omegas: Tensor, max_norm: float) -> tuple[Tensor, Tensor]:
    r"""Clip each vector (last dimension) to L2 norm ``max_norm``.

    Args:
        omegas: ``... x M`` vectors.
        max_norm: The bound ``S`` on each vector's L2 norm.

    Returns:
        ``(clipped, was_clipped)``: ``... x M`` vectors and ``...`` booleans; vectors within the
        bound are unchanged.

    Entries are first limited to ``±sqrt(max_float / M) / 2``, so no finite
    vector's norm overflows: one with larger entries (only a hostile agent
    sends such) is still scaled onto the bound, its huge entries saturated.
    """
    M = omegas.shape[-1]
    big = math.sqrt(torch.finfo(omegas.dtype).max / max(M, 1)) / 2
    omegas = omegas.clamp(-big, big)
    norms = omegas.norm(dim=-1, keepdim=True)
    scale = torch.clamp(max_norm / norms.clamp_min(torch.finfo(omegas.dtype).tiny), max=1.0)
    return omegas * scale, (norms.squeeze(-1) > max_norm)


class DPAggregator:
    r"""The central server of DP-FTS-DE.

    Args:
        sample_rate: ``q ∈ (0, 1]``, Poisson sampling probability of each agent.
        clip_norm: ``S > 0``; each vector is clipped to ``S/√P``.
            ``float('inf')`` disables clipping (only meaningful with ``z = 0``).
        noise_multiplier: ``z >= 0``; ``0`` gives the non-private FTS-DE.
        region_weights: ``P x N`` weights whose rows sum to 1, or a callable
            ``round -> P x N`` (e.g. :class:`~fbo_torch.protocol.ExplorationWeights`).

    Example:
        >>> server = DPAggregator(0.25, clip_norm=11.0, noise_multiplier=1.0, region_weights=weights)
        >>> broadcast = server.aggregate(omegas, round=t, generator=gen)   # P x M
    """

    def __init__(
        self,
        sample_rate: float,
        clip_norm: float,
        noise_multiplier: float,
        region_weights: RegionWeights,
    ) -> None:
        self.sample_rate = check_sample_rate(sample_rate)
        try:
            S = float(clip_norm)
        except (TypeError, ValueError):
            raise TypeError(f"`clip_norm` must be a number, got {type(clip_norm).__name__}.") from None
        if not S > 0 or math.isnan(S):
            raise ValueError(f"`clip_norm` S must be > 0, got {clip_norm}.")
        z = check_noise_multiplier(noise_multiplier)
        if math.isinf(S) and z > 0:
            raise ValueError("`clip_norm` must be finite when `noise_multiplier` > 0 (the noise scales with S).")
        if not (isinstance(region_weights, Tensor) or callable(region_weights)):
            raise TypeError("`region_weights` must be a P x N tensor or a callable round -> P x N tensor.")
        self.clip_norm, self.noise_multiplier = S, z
        self.region_weights = region_weights
        if isinstance(region_weights, Tensor):
            self._check_weights(region_weights)
        self.history: list[AggregationRecord] = []

    @staticmethod
    def _check_weights(W: Tensor, num_agents: int | None = None) -> Tensor:
        check_tensor("region_weights", W)
        if W.ndim != 2:
            raise ValueError(f"`region_weights` must be P x N, got shape {tuple(W.shape)}.")
        if W.shape[0] < 1 or W.shape[1] < 1:
            raise ValueError(f"`region_weights` needs P >= 1 regions and N >= 1 agents, got shape {tuple(W.shape)}.")
        if num_agents is not None and W.shape[1] != num_agents:
            raise ValueError(f"`region_weights` has {W.shape[1]} columns but {num_agents} agents sent vectors.")
        check_finite("region_weights", W)
        if (W < 0).any():
            raise ValueError("`region_weights` must be non-negative.")
        sums = W.sum(-1)
        if not torch.allclose(sums, torch.ones_like(sums), atol=1e-6):
            raise ValueError(f"each row of `region_weights` must sum to 1, got {sums.tolist()}.")
        return W

    def weights(self, round: int) -> Tensor:
        """The ``P x N`` weights used in round ``round``."""
        W = self.region_weights(round) if callable(self.region_weights) else self.region_weights
        return self._check_weights(W)

    def noise_std(self, weights: Tensor) -> float:
        r"""``z φ_max S / q``."""
        if self.noise_multiplier == 0:
            return 0.0
        return self.noise_multiplier * float(weights.max()) * self.clip_norm / self.sample_rate

    def aggregate(
        self,
        omegas: Tensor,
        round: int = 0,
        generator: torch.Generator | None = None,
        keys: Tensor | None = None,
        reported: Tensor | None = None,
        randomness: ServerRandomness | None = None,
    ) -> Tensor:
        r"""One server round.

        Args:
            omegas: ``... x N x M`` vectors from ``N`` agents (leading dimensions
                are independent federations, e.g. repetitions). Rows with a
                non-finite entry are invalid and dropped (see the module docstring).
            round: Round index (selects the weights of a schedule).
            generator: Optional generator for the subsample and the noise.
            keys: Optional ``...`` int64 keys of the federations' seeded streams
                (:class:`~fbo_torch.protocol.randomness.KeyedServerRandomness`:
                reproducible, for research).
            reported: Optional ``... x N`` booleans: agents whose vector arrived
                (dropped agents are treated as not sampled; their rows may hold
                anything). Privacy accounting with ``q`` stays valid: an agent
                that did not report is not in the aggregate, one that reported
                was included with probability ``q``.
            randomness: The server's :class:`~fbo_torch.protocol.randomness.ServerRandomness`
                (e.g. a :class:`~fbo_torch.protocol.randomness.SecretServerRandomness`
                in deployment), instead of ``generator`` or ``keys``.

        With ``keys`` or ``randomness`` nothing is read back to the host (no
        synchronization); with a ``generator`` (or nothing) the weights are
        checked on the host first.

        Returns:
            ``... x P x M`` broadcast vectors, on ``omegas``' device and dtype.
        """
        check_tensor("omegas", omegas)
        if omegas.ndim < 2:
            raise ValueError(f"`omegas` must be N x M (or ... x N x M), got shape {tuple(omegas.shape)}.")
        if not omegas.is_floating_point():
            raise TypeError(f"`omegas` must be a floating-point tensor, got {omegas.dtype}.")
        round = check_int("round", round, minimum=0)
        N = omegas.shape[-2]
        batch = omegas.shape[:-1]  # ... x N
        if reported is not None:
            check_tensor("reported", reported)
            if reported.dtype != torch.bool:
                raise TypeError(
                    f"`reported` must be a boolean tensor (agents whose vector arrived), got {reported.dtype}."
                )
            if reported.shape != batch:
                raise ValueError(f"`reported` must have shape {tuple(batch)}, got {tuple(reported.shape)}.")
        if sum(x is not None for x in (generator, keys, randomness)) > 1:
            raise ValueError("give at most one of `generator`, `keys` and `randomness`.")
        if keys is not None:
            if keys.shape != batch[:-1] or keys.dtype != torch.int64:
                raise ValueError(
                    f"`keys` must be int64 of shape {tuple(batch[:-1])}, got {keys.dtype} {tuple(keys.shape)}."
                )
            randomness = KeyedServerRandomness(keys)
        checked = randomness is None
        if randomness is None:
            randomness = GeneratorServerRandomness(generator)
            W = self.weights(round)
            self._check_weights(W, num_agents=N)
        else:
            W = self.region_weights(round) if callable(self.region_weights) else self.region_weights
            if W.ndim != 2 or W.shape[1] != N:
                raise ValueError(f"`region_weights` must be P x {N}, got shape {tuple(W.shape)}.")
        W = W.to(omegas)
        P = W.shape[0]
        # validate before any arithmetic: an invalid row is replaced, not multiplied by a zero mask
        valid = torch.isfinite(omegas).all(-1)  # ... x N
        if reported is not None:
            valid = valid & reported
        omegas = torch.where(valid.unsqueeze(-1), omegas, 0.0)
        u = randomness.coins(round, batch, omegas)
        sampled = (u < self.sample_rate) & valid
        clipped, was_clipped = clip_vectors(omegas, self.clip_norm / math.sqrt(P))
        masked = clipped * sampled.unsqueeze(-1).to(omegas.dtype)
        signal = (W @ masked) / self.sample_rate  # ... x P x M
        std: float | Tensor
        if checked:
            std = self.noise_std(W)
            positive = std > 0
        else:
            std = self.noise_multiplier * W.amax() * (self.clip_norm / self.sample_rate)  # a 0-d tensor
            positive = self.noise_multiplier > 0
        if positive:
            z = randomness.normals(round, signal.shape[:-2] + (P * signal.shape[-1],), omegas)
            noise = std * z.view(signal.shape)
        else:
            noise = torch.zeros_like(signal)
        out = signal + noise
        num = sampled.sum(-1)
        n_clip = (was_clipped & sampled).sum(-1)
        frac = torch.where(
            num > 0,
            n_clip.to(omegas.dtype) / num.clamp_min(1).to(omegas.dtype),
            torch.zeros_like(num, dtype=omegas.dtype),
        )
        n_rep = torch.full_like(num, N) if reported is None else reported.sum(-1)
        n_valid = valid.sum(-1)
        self.history.append(
            AggregationRecord(
                round,
                sampled,
                num,
                was_clipped & sampled,
                frac,
                std,
                signal_norm=signal.norm(dim=-1),
                noise_norm=noise.norm(dim=-1),
                num_reported=n_rep,
                valid=valid,
                num_invalid=n_rep - n_valid,
            )
        )
        return out

    def __repr__(self) -> str:
        return (
            f"DPAggregator(sample_rate={self.sample_rate}, clip_norm={self.clip_norm}, "
            f"noise_multiplier={self.noise_multiplier})"
        )
