r"""The keys of a federation's random streams (:mod:`fbo_torch.utils.keyed_random`).

Agent ``n`` of repetition ``r`` draws every random number of its own (initial
points, Thompson samples, ``ω``, the ``p_t`` coin) from
``federation_agent_keys(seed, r, n)``; a federation's shared, public
randomness (the shared search of a broadcast) from ``federation_keys(seed, r)``.
A simulator of ``R`` repetitions and a deployment (repetition 0) derive the
same keys from the same seed, so agent ``n`` computes the same round in both.

These keys follow from the run's seed, which every agent knows: they are
never used for the server's privacy-protecting randomness (Poisson coins,
noise) in a deployment (see :mod:`fbo_torch.protocol.randomness`).
"""

from __future__ import annotations

from torch import Tensor

from fbo_torch.utils import keyed_random as kr


def federation_agent_keys(seed: int, runs: Tensor, agents: Tensor) -> Tensor:
    """Keys of agent ``agents[b]`` in repetition ``runs[b]`` (the same key in a deployment of repetition 0)."""
    return kr.fold(kr.fold(kr.root_key(seed, "agents"), runs), agents)


def federation_keys(seed: int, runs: Tensor) -> Tensor:
    """Keys of the federations (server streams, shared broadcast maximization)."""
    return kr.fold(kr.root_key(seed, "federation"), runs)
