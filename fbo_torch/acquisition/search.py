r"""What agents maximize besides their own GPs: peers' messages and the server's broadcasts.

* :func:`maximize_rff_samples` / :func:`maximize_broadcast` — maximize
  ``φ(x)ᵀω`` functions (messages, DP-FTS-DE broadcasts) for many problems at once
  over a :class:`~fbo_torch.optim.domain.Domain`.
* :func:`broadcast_queries` — where agents that follow a broadcast query.

Every maximizer takes ``keys`` (one int64 key per problem, see
:mod:`fbo_torch.utils.keyed_random`): a problem's result then depends only on
its key and its function, so a simulator batching many agents and a single
agent on its own device compute the same point.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.optim.domain import Domain
from fbo_torch.sampling.rff_paths import RFFSamplePaths
from fbo_torch.utils import keyed_random as kr


def maximize_rff_samples(
    features: RandomFourierFeatures,
    omegas: Tensor,
    domain: Domain,
    generator: torch.Generator | None = None,
    keys: Tensor | None = None,
    input_bounds: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Maximize ``x ↦ φ(x)ᵀω_b`` for ``B`` weight vectors ``omegas`` (``B x M``) at once.

    With ``input_bounds`` (``2 x d``, the senders' input transform), ``φ((x − l)/(u − l))ᵀω_b``
    (:class:`~fbo_torch.sampling.rff_paths.RFFSamplePaths`).
    """
    return domain.maximize(
        RFFSamplePaths(features, omegas, input_bounds=input_bounds),
        omegas.shape[0],
        generator=generator,
        keys=keys,
        raw_samples=domain.raw_samples_rff,
        maxiter=domain.maxiter_rff,
        num_restarts=domain.num_restarts_rff,
    )


def maximize_broadcast(
    features: RandomFourierFeatures,
    broadcast: Tensor,
    region_bounds: Tensor,
    domain: Domain,
    generator: torch.Generator | None = None,
    keys: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Maximize the DP-FTS-DE agent function ``x ↦ φ(x)ᵀω^(i[x])`` for ``R`` problems.

    One bounded maximization of ``φᵀω^(i)`` over sub-region ``i`` per region
    and problem (all ``R·P`` at once), best region kept. In the simulator a
    problem is a repetition (the broadcast is the same for all its agents, so
    it is maximized once, with the repetition's key); a deployed agent, or the
    authors' per-agent randomized maximization, passes its own key.

    Args:
        features: The shared map.
        broadcast: ``R x P x M`` server output.
        region_bounds: ``P x 2 x d`` sub-region boxes.
        domain: The search domain.
        generator: Optional generator for the problems' keys (when ``keys`` is not given).
        keys: Optional ``R`` int64 keys (region ``i`` of problem ``r`` uses ``fold(keys[r], i)``).

    Returns:
        ``(X, values)``: ``R x d`` maximizers and ``R`` values.
    """
    R, P, M = broadcast.shape
    paths = RFFSamplePaths(features, broadcast.reshape(R * P, M))
    rb = region_bounds.to(domain.bounds).repeat(R, 1, 1) if P > 1 else None
    sub_keys = None
    if keys is not None:
        sub_keys = kr.fold(keys.unsqueeze(-1), torch.arange(P, device=keys.device)).reshape(R * P)
    X, vals = domain.maximize(
        paths,
        R * P,
        generator=generator,
        region_bounds=rb,
        raw_samples=domain.raw_samples_rff,
        maxiter=domain.maxiter_rff,
        num_restarts=domain.num_restarts_rff,
        keys=sub_keys,
    )
    best_vals, best = vals.view(R, P).max(-1)
    return X.view(R, P, -1).gather(1, best.view(R, 1, 1).expand(R, 1, X.shape[-1])).squeeze(1), best_vals


def broadcast_queries(
    features: RandomFourierFeatures,
    broadcast: Tensor,
    region_bounds: Tensor,
    domain: Domain,
    round: int,
    keys: Tensor,
) -> Tensor:
    r"""Where agents that follow a DP-FTS-DE broadcast query in round ``round``: ``R x d``.

    ``keys`` are the keys of whoever maximizes: the federations' keys (the
    broadcast is the same for all agents of a federation, so one maximization
    serves them all — a deployed agent that uses its federation's key gets the
    same point), or each agent's own key with ``broadcast`` repeated per agent
    (the authors' per-agent randomized maximization).
    """
    X, _ = maximize_broadcast(
        features, broadcast, region_bounds, domain, keys=kr.fold(kr.fold(keys, round), "broadcast-maximize")
    )
    return X
