r"""Secure aggregation with distributed noise: what each agent sends, and what the sum means.

In the central mechanism (:class:`~fbo_torch.federation.DPAggregator`) the
server sees every agent's ``ω`` and adds the noise itself. With
``aggregation = "secure"`` no party but the agent sees its ``ω``: every agent
turns its weighted, clipped ``ω`` into an integer vector, adds its own share
of discrete Gaussian noise, and the server learns only the sum modulo ``m``
(secure aggregation: :mod:`fbo_torch.flower.secagg` on Flower; the simulator
adds the vectors itself, which gives the same sum). This module is the
mechanism both run, written once for ``B`` agents at once
(:meth:`SecureMechanism.contributions`, :meth:`SecureMechanism.decode`).

**An agent's vector.** Agent ``n``, sampled (the server's Poisson coin, told
only to it) or not, with its public region weights ``w_n^{(i)}`` of the round
(the server sends the ratios ``r_i = w_n^{(i)}/w_max ∈ [0, 1]``; the agent
clamps them there, so no server can make it send more), computes

.. math::

    x_n = b_n \big(r_i \, \hat ω_n\, c/S\big)_{i=1..P} ∈ \mathbb{R}^{d},\qquad
    y_n = \mathrm{round}(x_n) + ξ_n ∈ \mathbb{Z}^{d},\quad d = PM,

with ``ω̂_n`` the vector clipped to ``S/√P`` (a non-finite ``ω`` is the null
message: zero signal), ``b_n ∈ {0, 1}`` its coin, ``c`` the lattice scale
(integer units per ``S``), ``round`` unbiased stochastic rounding and
``ξ_n ~ N_Z(0, σ²)^d`` its noise share; coins and noise come from the
agent's own secret (:mod:`fbo_torch.utils.discrete_gaussian`). The server
decodes the sum as ``ω^{(i)} = (S/c) w_max Σ_n y_n^{(i)} / q``: the central
release ``Σ w ω̂ / q`` plus rounding error plus the summed noise.

**Why the distributed discrete Gaussian, not Skellam.** Both are discrete,
so the sum modulo ``m`` is exact and no floating-point attack applies. The
discrete Gaussian has an exact sampler that needs only uniform integers
(Canonne, Kamath & Steinke 2020), which we draw from SHAKE-256, vectorized;
Skellam noise needs Poisson variates of mean ``~σ²`` (10⁴–10⁷ here), whose
exact samplers from random bits are far costlier, and every numpy/torch
Poisson sampler uses its own non-cryptographic generator and floating point.
Skellam's advantage — a sum of Skellams is Skellam, so its RDP is exact for
any per-agent variance — matters when each share is tiny (``σ < 1``), where
the sum of discrete Gaussians departs from one (the ``τ`` of KLS 2021). Here
the lattice keeps ``σ ≥ 2`` (``τ ≤ 10(n−1)e^{−4π²} < 10⁻¹⁰`` for up to 10⁶
agents; the automatic lattice gives ``σ`` in the thousands), so the
distributed discrete Gaussian's RDP is the continuous Gaussian's, its tails
are Gaussian (a smaller modulus for the same failure-free bound), and the
central and the secure mechanism differ only by rounding, which makes a
matched-ε comparison of the two a comparison of trust, not of noise shapes.

**Sensitivity** (proof). The joint vector has ``‖x_n‖₂² = Σ_i r_i² ‖ω̂_n‖²
(c/S)² ≤ P · (S²/P) · (c/S)² = c²``. Stochastic rounding moves every entry by
less than 1, so ``‖round(x_n)‖₂ ≤ c + √d =: Δ₂`` for every outcome of the
coins, and, the entries being integers, ``‖·‖₁ ≤ min(√d Δ₂, Δ₂²) =: Δ₁``. The
null message (not sampled, dropped, invalid) rounds to exactly 0. Neighbouring
federations differ in one agent's data replaced by the null message (zero-out
neighbours, as in the central mode), so the signal of the sum moves by a
vector of L2 norm at most ``Δ₂`` whatever the coins; the noise shares do not
depend on data. Each share's variance is ``σ² = ⌈z² Δ₂² / k_min⌉`` so that
``k_min`` shares (``min_survivors``) have at least the central mechanism's
noise multiplier ``z`` with respect to ``Δ₂``; a round whose sum has ``k``
shares is accounted with ``z_k = √(kσ²)/Δ₂``
(:class:`~fbo_torch.privacy.DistributedDiscreteGaussianAccountant`).

**No wrap-around** (proof). Every entry of ``ω̂_n`` is at most its norm,
``S/√P``, so ``|x_{n,j}| ≤ c/√P`` and ``|round(x_{n,j})| ≤ ⌈c/√P⌉``; every
share is conditioned on ``|ξ_{n,j}| ≤ L = 40⌈σ⌉``
(:func:`~fbo_torch.utils.discrete_gaussian.truncation_bound`). So every honest
entry is at most ``A = ⌈c/√P⌉ + L`` in magnitude, any sum of ``k ≤ N`` honest
vectors at most ``N·A``, and with ``m = 2^b > 2NA`` the centred residue
``((Σ y) mod m) ∈ [−m/2, m/2)`` *is* the integer sum: the modular sum never
wraps, for any data, weights, coins and noise (``tests/federation/test_secure.py``
checks it at the bound, and that one bit less wraps). :attr:`SecureMechanism.bits`
is the smallest such ``b``.

**Hostile agents** (no range proofs: bounded damage). A hostile agent may send
any residue ``v ∈ Z_m^d``. Addition modulo ``m`` is a group operation, so its
integers enter the sum additively — the decoded sum is the honest sum plus
``v`` (mod ``m``) and nothing it sends can cancel, copy or expose another
agent's vector (it never sees one: the masks make every vector uniform). What
it can do is shift the release, and :meth:`SecureMechanism.decode` bounds the
shift by what honest sums can be, not by the worst case of ``N·A`` (every
share at its truncation bound at once). The discrete Gaussian is
``σ²``-sub-Gaussian (Canonne, Kamath & Steinke 2020, Cor. 9), and conditioning
it on ``|ξ| ≤ L`` keeps that (``cosh`` grows with ``|ξ|``), so a sum of
``k ≤ N`` shares has ``P(|Σξ_j| > τ√N σ) ≤ 2e^{−τ²/2}`` per coordinate and,
as a sub-Gaussian vector, ``P(‖Σξ‖² > Nσ²(d + 2√(td) + 2t)) ≤ e^{−t}`` (Hsu,
Kakade & Zhang 2012, Thm. 1), ``t = τ²/2``; the signal adds at most
``N⌈c/√P⌉`` per coordinate and ``NΔ₂`` in norm. So every coordinate is
clamped to ``±B`` (:attr:`SecureMechanism.release_entry_bound`) and the
vector's norm to ``R`` (:attr:`SecureMechanism.release_norm_bound`); with
``τ = 12`` an honest sum is touched with probability below ``10⁻³⁰`` per
coordinate and round (and then only clamped: post-processing, the privacy
guarantee is unchanged). Whatever a hostile agent sends, each coordinate of
the release moves by at most ``2B`` lattice units and the release by at most
``2R`` in L2 norm (``× (S/c) · w_max / q`` in ``ω`` units): against ``2NA``
per coordinate before, ``N⌈c/√P⌉ + 12√N σ`` instead of ``N⌈c/√P⌉ + 40Nσ``.
That is still up to ``N`` honest agents' worth of signal plus the noise's
range: the sum alone cannot tell one agent's share of it. Bounding each
agent's vector (zero-knowledge range or norm proofs, as in verifiable secure
aggregation) is out of scope. A hostile agent that leaves out its noise share
lowers the sum's noise by one share.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fbo_torch.federation.aggregator import clip_vectors
from fbo_torch.privacy.analysis.ddg import noise_multiplier_of
from fbo_torch.utils.discrete_gaussian import (
    MAX_VARIANCE,
    WordStreams,
    discrete_gaussian,
    stochastic_round,
    truncation_bound,
    uniforms,
)
from fbo_torch.utils.secure_random import check_secret

if TYPE_CHECKING:
    from fbo_torch.privacy.ddg import DDGConstants

#: The largest lattice scale the automatic choice takes.
MAX_SCALE = 2**16
#: The smallest share variance accepted (``τ`` of KLS 2021 below 1e-10 for up to 10⁶ agents).
MIN_VARIANCE = 4
#: ``τ`` of the release's bounds: an honest sum leaves them with probability below ``2e^{−τ²/2} ≈ 10⁻³¹``.
RELEASE_TAIL = 12.0


def share_variance(noise_multiplier: float, scale: int, dim: int, min_survivors: int) -> int:
    r"""``σ² = ⌈z² (c + √d)² / k_min⌉`` (0 for ``z = 0``)."""
    if noise_multiplier <= 0:
        return 0
    return math.ceil((noise_multiplier * (scale + math.sqrt(dim))) ** 2 / min_survivors - 1e-9)


def auto_scale(noise_multiplier: float, dim: int, min_survivors: int) -> int:
    r"""The largest power of two up to :data:`MAX_SCALE` whose :func:`share_variance` is at most
    :data:`~fbo_torch.utils.discrete_gaussian.MAX_VARIANCE`."""
    c = MAX_SCALE
    while c > 1 and share_variance(noise_multiplier, c, dim, min_survivors) > MAX_VARIANCE:
        c //= 2
    return c


def min_survivors(num_agents: int, dropout_tolerance: float) -> int:
    r"""``k_min = N − ⌊f N⌋``: the fewest agents whose vectors a secure round sums (``f`` the tolerance)."""
    return int(num_agents) - math.floor(float(dropout_tolerance) * int(num_agents) + 1e-9)


@dataclass(frozen=True)
class SecureMechanism:
    r"""The constants of a federation's secure rounds (every party derives them from the settings).

    Attributes:
        num_agents: ``N``.
        num_regions / num_features: ``P`` and ``M`` (``d = PM``).
        clip_norm: ``S``.
        noise_multiplier: ``z`` (of ``k_min`` shares, with respect to ``Δ₂``); 0: no noise.
        min_survivors: ``k_min ≥ 2``: a round whose sum has fewer vectors is not released.
        scale: ``c``, lattice units per ``S``.
    """

    num_agents: int
    num_regions: int
    num_features: int
    clip_norm: float
    noise_multiplier: float
    min_survivors: int
    scale: int

    def __post_init__(self) -> None:
        if self.num_agents < 2:
            raise ValueError(f"secure aggregation needs at least 2 agents, got {self.num_agents}.")
        if not 2 <= self.min_survivors <= self.num_agents:
            raise ValueError(
                f"`dropout_tolerance` leaves min_survivors = {self.min_survivors}; secure aggregation "
                f"needs 2 <= min_survivors <= N = {self.num_agents} (a sum of one vector is that vector)."
            )
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise ValueError(f"secure aggregation needs a finite `clip_norm` > 0, got {self.clip_norm!r}.")
        if isinstance(self.scale, bool) or not isinstance(self.scale, int) or self.scale < 1:
            raise ValueError(f"`lattice_scale` must be an integer >= 1, got {self.scale!r}.")
        if self.noise_multiplier > 0 and not MIN_VARIANCE <= self.local_variance <= MAX_VARIANCE:
            raise ValueError(
                f"`lattice_scale` = {self.scale} gives each agent a noise variance of {self.local_variance} lattice "
                f"units², outside [{MIN_VARIANCE}, {MAX_VARIANCE}]: choose a lattice_scale near "
                f"{auto_scale(self.noise_multiplier, self.dim, self.min_survivors)} (or leave it unset)."
            )

    @classmethod
    def from_settings(cls, settings: Any, num_agents: int) -> SecureMechanism:
        r"""The mechanism of :class:`~fbo_torch.federation.settings.DPFTSDESettings` for ``N`` agents.

        Without ``lattice_scale`` the scale is the largest power of two up to
        :data:`MAX_SCALE` whose share variance is at most
        :data:`~fbo_torch.utils.discrete_gaussian.MAX_VARIANCE`: the finest lattice
        the exact sampler's integer arithmetic allows (rounding then inflates the
        sensitivity by ``√d / c``, ~0.1% for ``d = 200``).
        """
        clip = settings.clip_norm if settings.clip_norm is not None else math.inf
        N, P, M = int(num_agents), int(settings.num_regions), int(settings.num_features)
        z = float(settings.noise_multiplier)
        k_min = min_survivors(num_agents, settings.dropout_tolerance)
        scale = settings.lattice_scale
        if scale is None:
            scale = auto_scale(z, P * M, k_min)
        return cls(
            num_agents=N,
            num_regions=P,
            num_features=M,
            clip_norm=float(clip),
            noise_multiplier=z,
            min_survivors=k_min,
            scale=scale,
        )

    # ------------------------------------------------------------------ derived constants
    @property
    def dim(self) -> int:
        """``d = PM``: entries of an agent's vector."""
        return self.num_regions * self.num_features

    @property
    def l2_sensitivity(self) -> float:
        """``Δ₂ = c + √d``."""
        return self.scale + math.sqrt(self.dim)

    @property
    def l1_sensitivity(self) -> float:
        """``Δ₁ = min(√d Δ₂, Δ₂²)``."""
        return min(math.sqrt(self.dim) * self.l2_sensitivity, self.l2_sensitivity**2)

    @property
    def local_variance(self) -> int:
        """``σ² = ⌈z² Δ₂² / k_min⌉``: each agent's noise share (0 without noise)."""
        return share_variance(self.noise_multiplier, self.scale, self.dim, self.min_survivors)

    @property
    def entry_bound(self) -> int:
        """``A = ⌈c/√P⌉ + L``: the largest magnitude of an honest agent's entry."""
        noise = truncation_bound(self.local_variance) if self.local_variance > 0 else 0
        return math.ceil(self.scale / math.sqrt(self.num_regions)) + noise

    @property
    def sum_bound(self) -> int:
        """``N·A``: the largest magnitude of an entry of any sum of honest vectors."""
        return self.num_agents * self.entry_bound

    @property
    def bits(self) -> int:
        """``b``, the smallest with ``2^b > 2·N·A``."""
        return (2 * self.sum_bound).bit_length()

    @property
    def modulus(self) -> int:
        """``m = 2^b``."""
        return 1 << self.bits

    def noise_multiplier_of(self, num_shares: int) -> float:
        """``z_k = √(kσ²)/Δ₂``, the noise multiplier of a sum of ``k`` shares."""
        return noise_multiplier_of(num_shares, self.l2_sensitivity, self.local_variance)

    def ddg_constants(self) -> DDGConstants:
        """What the accountant needs (:class:`~fbo_torch.privacy.DDGConstants`)."""
        from fbo_torch.privacy.ddg import DDGConstants  # with the accountant, which imports Opacus

        return DDGConstants(self.l2_sensitivity, self.l1_sensitivity, float(self.local_variance), self.dim)

    # ------------------------------------------------------------------ the agents' half
    def contributions(
        self, omegas: Tensor, sampled: Tensor, ratios: Tensor, secrets: list[bytes], round: int
    ) -> tuple[Tensor, Tensor]:
        r"""``B`` agents' integer vectors for round ``round`` (see the module docstring).

        Args:
            omegas: ``B x M`` draws (a row with a non-finite entry is the null message).
            sampled: ``B`` booleans: the agent's Poisson coin came up.
            ratios: ``B x P`` region weights over the round's largest weight (clamped to ``[0, 1]``).
            secrets: ``B`` 32-byte agent secrets (the rounding coins and the noise).
            round: The round (a fresh stream of coins and noise per round).

        Returns:
            ``(y, clipped)``: ``B x d`` int64 vectors on the host (entries within
            ``±entry_bound``), and ``B`` booleans (a sampled agent's vector was clipped).
        """
        B, M = omegas.shape
        if M != self.num_features or tuple(ratios.shape) != (B, self.num_regions) or len(secrets) != B:
            raise ValueError(
                f"contributions: expected B x {self.num_features} omegas, B x {self.num_regions} ratios "
                f"and B secrets, got {tuple(omegas.shape)}, {tuple(ratios.shape)}, {len(secrets)}."
            )
        omegas = omegas.detach().to("cpu", torch.float64)
        valid = torch.isfinite(omegas).all(-1)
        omegas = torch.where(valid.unsqueeze(-1), omegas, 0.0)  # before any arithmetic
        clipped, was_clipped = clip_vectors(omegas, self.clip_norm / math.sqrt(self.num_regions))
        r = torch.nan_to_num(ratios.detach().to("cpu", torch.float64), nan=0.0).clamp(0.0, 1.0)
        take = (sampled.detach().cpu() & valid).to(torch.float64)
        x = (take[:, None, None] * r[:, :, None] * clipped[:, None, :]) * (self.scale / self.clip_norm)
        d = self.dim
        coins = uniforms(WordStreams(secrets, ("secagg-rounding", int(round)), d)).reshape(B, d)
        y = stochastic_round(x.reshape(B, d).numpy(), coins)
        if self.local_variance > 0:
            y = y + discrete_gaussian(
                WordStreams(secrets, ("secagg-noise", int(round)), d), self.local_variance
            ).reshape(B, d)
        return torch.from_numpy(y), was_clipped & sampled.detach().cpu() & valid

    # ------------------------------------------------------------------ the sum
    def reduce(self, y: Tensor) -> Tensor:
        """Residues in ``[0, m)`` of int64 vectors."""
        return torch.remainder(y, self.modulus)

    def modular_sum(self, y: Tensor, survivors: Tensor) -> Tensor:
        r"""``(Σ_{n survived} y_n) mod m``: ``... x N x d`` vectors, ``... x N`` booleans → ``... x d``
        residues (what secure aggregation reveals)."""
        y = torch.where(survivors.unsqueeze(-1), self.reduce(y), 0)
        return self.reduce(y.sum(-2))

    @property
    def release_entry_bound(self) -> int:
        r"""``B = N⌈c/√P⌉ + ⌈τ√N σ⌉`` (at most ``N·A``): a coordinate of an honest sum lies in ``±B`` but
        with probability below ``2e^{−τ²/2}`` (see the module docstring)."""
        signal = self.num_agents * math.ceil(self.scale / math.sqrt(self.num_regions))
        noise = math.ceil(RELEASE_TAIL * math.sqrt(self.num_agents * self.local_variance))
        return min(signal + noise, self.sum_bound)

    @property
    def release_norm_bound(self) -> float:
        r"""``R = NΔ₂ + √(Nσ²(d + 2√(td) + 2t))``, ``t = τ²/2``: an honest sum's L2 norm stays within ``R``
        but with probability below ``e^{−t}`` (see the module docstring)."""
        t, d = RELEASE_TAIL**2 / 2, self.dim
        noise = math.sqrt(self.num_agents * self.local_variance * (d + 2 * math.sqrt(t * d) + 2 * t))
        return self.num_agents * self.l2_sensitivity + noise

    def centre(self, total: Tensor) -> Tensor:
        r"""The integer sum behind residues ``... x d`` (``[0, m)``): the centred residues in ``[−m/2, m/2)``
        (exactly the sum of any honest vectors: no wrap-around)."""
        m = self.modulus
        total = self.reduce(total.to(torch.int64))
        return torch.where(total >= m // 2, total - m, total)

    def decode(self, total: Tensor) -> tuple[Tensor, Tensor]:
        r"""The release behind residues ``... x d`` (``[0, m)``), in units of ``ω`` (before ``w_max/q``).

        Returns:
            ``(vectors, out_of_range)``: ``... x P x M`` float64 ``(S/c)·Σ y`` with
            every coordinate clamped to ``±B`` (:attr:`release_entry_bound`) and
            then the vector's L2 norm to ``R`` (:attr:`release_norm_bound`), and
            ``...`` counts of coordinates that were outside ``±B`` (plus one when
            the norm was above ``R``): an honest sum lands there with
            probability below ``10⁻³⁰``; a hostile agent can put it there.
        """
        centred = self.centre(total)
        bound = self.release_entry_bound
        out = (centred.abs() > bound).sum(-1)
        vec = centred.clamp(-bound, bound).to(torch.float64)
        norm = vec.norm(dim=-1, keepdim=True)
        over = norm > self.release_norm_bound
        vec = torch.where(over, vec * (self.release_norm_bound / norm.clamp_min(1.0)), vec)
        out = out + over.squeeze(-1)
        vec = vec * (self.clip_norm / self.scale)
        return vec.view(*vec.shape[:-1], self.num_regions, self.num_features), out


def agent_secret(master: bytes, run: int, agent: int) -> bytes:
    r"""Agent ``agent``'s 32-byte secret in repetition ``run``, derived from a ``master`` secret.

    A deployed agent draws its own secret from the OS (:func:`~fbo_torch.utils.secure_random.new_secret`);
    a simulator derives every agent's from one master so that it computes what
    the deployment computes given the same secrets.
    """
    check_secret(master, "master")
    data = b"fbo-torch/agent-secret/v1" + master + struct.pack("<qq", int(run), int(agent))
    return hashlib.shake_256(data).digest(32)


def research_master(seed: int) -> bytes:
    r"""The simulator's default master secret, derived from the run's seed: reproducible and
    **known to anyone who knows the seed** (research, like the seeded server streams)."""
    return hashlib.shake_256(b"fbo-torch/research-agent-master/v1" + struct.pack("<q", int(seed))).digest(32)


__all__ = [
    "SecureMechanism",
    "agent_secret",
    "auto_scale",
    "min_survivors",
    "research_master",
    "share_variance",
]
