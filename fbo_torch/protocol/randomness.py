r"""Where the DP-FTS-DE server's random numbers come from: its Poisson coins and its noise.

The release protects the agents only while nobody who sees it can reproduce
the noise in it or tell which agents were sampled. A server's randomness is
one of:

* :class:`SecretServerRandomness` — **for deployment**. Every coin and every
  noise entry is drawn from a keyed cryptographic stream
  (:mod:`fbo_torch.utils.secure_random`: SHAKE-256 over a 256-bit secret from
  the OS's generator) that only the server holds: never in a run config or
  a message. With ``secure_mode`` (the default) the Gaussian noise is drawn as
  Opacus' secure mode draws it (the sum of four draws over two), against
  floating-point attacks on the Gaussian mechanism. The same secret gives the
  same numbers (a restarted server that kept its secret redraws exactly what it
  drew; a simulator given the secret computes what the deployment computed);
  a new secret gives new ones.
* :class:`KeyedServerRandomness` — **for research**. The federation's
  :mod:`~fbo_torch.utils.keyed_random` streams, derived from the run's seed:
  reproducible, on the device, without host synchronization — and known to
  every agent that knows the seed, so it protects nothing against agents.
  The simulator's default.
* :class:`GeneratorServerRandomness` — a ``torch.Generator`` (or the global
  RNG), for :class:`~fbo_torch.federation.DPAggregator` used on its own.

Each gives ``coins(round, shape, like)``: uniforms ``[0, 1)`` of shape
``... x N`` (agent ``n`` is sampled when its coin is below ``q``), and
``normals(round, shape, like)``: standard normals of shape ``... x P·M``; the
leading dimensions are independent federations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.secure_random import check_secret, secret_normal, secret_uniform


@runtime_checkable
class ServerRandomness(Protocol):
    r"""The interface of a server's randomness (see the module docstring)."""

    #: Whether the numbers are unpredictable to anyone without the server's secret.
    private: bool

    def coins(self, round: int, shape: torch.Size, like: Tensor) -> Tensor:
        """``shape`` (``... x N``) uniforms in ``[0, 1)``, on ``like``'s device and dtype."""

    def normals(self, round: int, shape: torch.Size, like: Tensor) -> Tensor:
        """``shape`` (``... x K``) standard normals, on ``like``'s device and dtype."""


class KeyedServerRandomness:
    r"""The federations' keyed streams (research: reproducible from the seed, **not private**).

    Agent ``n``'s coin in round ``t`` depends only on ``(key, n, t)`` and the
    noise only on ``(key, t)``, so a deployment of one federation computes what
    the simulator computes; nothing is read back to the host.

    Args:
        keys: int64 keys of the federations (shape: the leading dimensions).
    """

    private = False

    def __init__(self, keys: Tensor) -> None:
        if not isinstance(keys, Tensor) or keys.dtype != torch.int64:
            raise TypeError(f"`keys` must be an int64 tensor, got {getattr(keys, 'dtype', type(keys).__name__)}.")
        self.keys = keys

    def _keys(self, shape: torch.Size, like: Tensor) -> Tensor:
        if tuple(self.keys.shape) != tuple(shape[:-1]):
            raise ValueError(
                f"`keys` must have shape {tuple(shape[:-1])} (one per federation), got {tuple(self.keys.shape)}."
            )
        return self.keys.to(like.device)

    def coins(self, round: int, shape: torch.Size, like: Tensor) -> Tensor:
        keys = self._keys(shape, like)
        ids = torch.arange(shape[-1], device=like.device)
        coin_keys = kr.fold(kr.fold(kr.fold(keys.unsqueeze(-1), "poisson"), round), ids)
        return kr.uniform(coin_keys, 1, dtype=like.dtype).squeeze(-1)

    def normals(self, round: int, shape: torch.Size, like: Tensor) -> Tensor:
        keys = self._keys(shape, like)
        return kr.normal(kr.fold(kr.fold(keys, "noise"), round), shape[-1], dtype=like.dtype)


class SecretServerRandomness:
    r"""Coins and noise from the server's secret (deployment: unpredictable without it).

    Args:
        secret: The server's 32-byte secret (:func:`~fbo_torch.utils.secure_random.new_secret`).
            Keep it out of anything agents receive.
        secure_mode: Draw the noise with the floating-point mitigation of
            Opacus' secure mode (four draws per entry). ``False`` draws one.

    Numbers are drawn on the CPU (float64) and moved to ``like``'s device: a
    batch of ``R`` federations draws ``R`` consecutive blocks of one stream, so
    federation 0 of a simulator and a deployment given the same secret agree.
    """

    private = True

    def __init__(self, secret: bytes, secure_mode: bool = True) -> None:
        self._secret = check_secret(secret)
        if not isinstance(secure_mode, bool):
            raise TypeError(f"`secure_mode` must be True or False, got {secure_mode!r}.")
        self.secure_mode = secure_mode

    def coins(self, round: int, shape: torch.Size, like: Tensor) -> Tensor:
        u = secret_uniform(self._secret, ("poisson", int(round)), tuple(shape))
        return u.to(device=like.device, dtype=like.dtype)

    def normals(self, round: int, shape: torch.Size, like: Tensor) -> Tensor:
        z = secret_normal(self._secret, ("noise", int(round)), tuple(shape), mitigate=self.secure_mode)
        return z.to(device=like.device, dtype=like.dtype)

    def __repr__(self) -> str:  # never the secret
        return f"SecretServerRandomness(secure_mode={self.secure_mode})"


class GeneratorServerRandomness:
    r"""Draws from a ``torch.Generator`` (``None``: the global RNG); not a cryptographic source."""

    private = False

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator

    def _draw(self, fn: Callable[..., Tensor], shape: torch.Size, like: Tensor) -> Tensor:
        g = self.generator
        if g is None:
            return fn(tuple(shape), dtype=like.dtype, device=like.device)
        return fn(tuple(shape), dtype=like.dtype, device=g.device, generator=g).to(like.device)

    def coins(self, round: int, shape: torch.Size, like: Tensor) -> Tensor:
        return self._draw(torch.rand, shape, like)

    def normals(self, round: int, shape: torch.Size, like: Tensor) -> Tensor:
        return self._draw(torch.randn, shape, like)


__all__ = ["GeneratorServerRandomness", "KeyedServerRandomness", "SecretServerRandomness", "ServerRandomness"]
