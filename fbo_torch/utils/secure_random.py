r"""Random numbers no one without the secret can predict: a keyed cryptographic stream.

The privacy of a DP-FTS-DE release rests on its Gaussian noise and Poisson
coins being unknown to everyone but the server. :mod:`~fbo_torch.utils.keyed_random`
(SplitMix64 keyed by the run's seed) is reproducible, fast and device-side —
right for research, wrong for this: every agent knows the seed, so every agent
can recompute the noise and subtract it. Here every number is drawn from
SHAKE-256 (FIPS 202, an extendable-output function; keyed, it is a
pseudorandom function) over a 256-bit secret from the OS's cryptographic
generator (:func:`new_secret`), so the stream is unpredictable without the
secret and still a pure function of ``(secret, label, counter)``: a server
that restarts with its saved secret redraws what it drew, and never draws the
same numbers for two different labels.

Why not a library: Opacus' ``secure_mode`` needs ``torchcsprng``, whose last
release (2021) targets torch 1.8; ``torch.Generator`` (Philox / Mersenne
Twister) seeded from a secret is not a cryptographic stream (its state is
recoverable from its outputs). SHAKE-256 is in Python's standard library
(``hashlib``, OpenSSL), so this costs no dependency.

Gaussians (:func:`secret_normal`) come by Box–Muller from the stream's
uniforms, in float64 on the CPU (the same bits on every machine with the same
libm), and — with ``mitigate=True``, the default — as Opacus' secure mode draws
them: the sum of four independent draws divided by two (Holohan & Braghin,
"Secure random sampling in differential privacy", 2021, n = 2), which defeats
the floating-point attacks on the Gaussian mechanism (a single Box–Muller
float64 draw leaves gaps in the set of values it can produce; the sum fills
them) at four times the draws.

The byte stream (:func:`new_secret`, :func:`check_secret`, :func:`secret_bits`) needs only
``hashlib`` and NumPy; torch is imported when a tensor is drawn, so a SecAgg+ stage on a
device (a process per message, :mod:`fbo_torch.flower.client_app`) does not import it.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import struct
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

#: Bytes of a server secret.
SECRET_BYTES = 32
_DOMAIN = b"fbo-torch/secure-random/v1"


def new_secret() -> bytes:
    """A fresh 256-bit secret from the operating system's cryptographic generator."""
    return secrets.token_bytes(SECRET_BYTES)


def check_secret(secret: object, name: str = "secret") -> bytes:
    """``secret`` as bytes, or a ``TypeError`` / ``ValueError`` naming ``name``."""
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError(
            f"`{name}` must be {SECRET_BYTES} bytes (e.g. fbo_torch.utils.secure_random.new_secret()), "
            f"got {type(secret).__name__}."
        )
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"`{name}` must be {SECRET_BYTES} bytes, got {len(secret)}.")
    return bytes(secret)


def _label(parts: tuple[int | str, ...]) -> bytes:
    out = []
    for p in parts:
        if isinstance(p, str):
            b = p.encode()
            out.append(b"s" + struct.pack("<I", len(b)) + b)
        else:
            out.append(b"i" + struct.pack("<q", int(p)))
    return b"".join(out)


def secret_bits(secret: bytes, label: tuple[int | str, ...], n: int) -> np.ndarray:
    r"""``n`` unsigned 64-bit words of the stream of ``(secret, label)``.

    A longer draw extends a shorter one (the first ``n`` words do not depend
    on how many follow); different labels give independent streams.
    """
    h = hashlib.shake_256(_DOMAIN + struct.pack("<I", len(secret)) + secret + _label(label))
    return np.frombuffer(h.digest(8 * int(n)), dtype="<u8")


def secret_uniform(secret: bytes, label: tuple[int | str, ...], shape: tuple[int, ...]) -> torch.Tensor:
    r"""Uniform ``[0, 1)`` float64 numbers of shape ``shape`` (53 random bits each), on the CPU."""
    import torch

    from fbo_torch.utils.validation import check_shape

    n = math.prod(check_shape("shape", shape))
    bits = secret_bits(secret, label, n) >> np.uint64(11)
    return torch.from_numpy(bits.astype(np.float64) * 2.0**-53).view(shape)


def _box_muller(u: torch.Tensor) -> torch.Tensor:
    """Standard normals from ``... x 2m`` uniforms (pairs ``u[..., :m]``, ``u[..., m:]``)."""
    import torch

    m = u.shape[-1] // 2
    r = torch.sqrt(-2.0 * torch.log1p(-u[..., :m]))  # 1 - u ∈ (0, 1]: finite
    theta = (2.0 * math.pi) * u[..., m:]
    return torch.cat([r * torch.cos(theta), r * torch.sin(theta)], dim=-1)


def secret_normal(
    secret: bytes, label: tuple[int | str, ...], shape: tuple[int, ...], mitigate: bool = True
) -> torch.Tensor:
    r"""Standard normal float64 numbers of shape ``shape`` (on the CPU).

    The rows (leading dimensions, flattened) are consecutive blocks of the one
    stream of ``label``: row 0 of any batch is the draw of a batch of one, so a
    deployment (one federation) gets what federation 0 of a simulator gets.

    Args:
        secret: The secret the stream is derived from (:func:`check_secret`).
        label: What the numbers are for (the stream's name within the secret).
        shape: The shape of the result.
        mitigate: Return ``(g₁ + g₂ + g₃ + g₄) / 2`` for four independent
            normals, as Opacus' secure mode (see the module docstring).

    Returns:
        ``shape`` float64 standard normals.
    """
    from fbo_torch.utils.validation import check_shape

    size = check_shape("shape", shape)
    *lead, n = size if len(size) else (1,)  # (): one number, returned as a 0-d tensor
    k = 4 if mitigate else 1
    m = (k * n + 1) // 2
    u = secret_uniform(secret, label, (math.prod(lead), 2 * m))
    z = _box_muller(u)[:, : k * n]
    if mitigate:
        z = z.view(-1, 4, n).sum(1) / 2.0
    return z.reshape(shape)


__all__ = ["SECRET_BYTES", "check_secret", "new_secret", "secret_bits", "secret_normal", "secret_uniform"]
