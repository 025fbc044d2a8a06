r"""Agents in chunks: a round's working memory set by a budget, not by the number of agents.

The largest transient of a round is each agent's own proposal: its GP refit
(``K`` warps x ``1 + gp_restarts`` starts, ``n x n`` matrices and their
derivatives), its Thompson sample's paths and their maximization (``k``
restarts, each evaluated on ``F`` features and ``n`` data points at every
quasi-Newton iteration). All of it is linear in the agents processed at once,
so :class:`~fbo_torch.federation.agents.Agents` runs these steps on contiguous
chunks of agents whose estimated working memory (:func:`own_step_bytes`) fits
the budget (:func:`round_budget`: the ``max_memory`` a run names, else half the
memory the device has free when the agents are built).

Chunking changes no result: every random number an agent uses comes from its
own keyed stream and every step is batched over agents without mixing them, so
a chunk computes for its agents exactly what the whole batch computes for them. On a CPU a chunk
holds at most :data:`CPU_CHUNK` agents whatever the budget: beyond it the maximizer's
arrays leave the cache and each agent costs more.
One exception is guarded here: torch multiplies a batch of one matrix and one
vector with a different kernel (``mv``) than a batch of several (``bmm``), which
rounds differently, so :func:`chunk_slices` never makes a one-agent chunk out
of a larger batch. The agents' state itself (observations, the RFF posteriors'
factors) and the ``B x M`` messages are what the run holds anyway; they are not
chunked.
"""

from __future__ import annotations

import math

import torch

from fbo_torch.federation.settings import MethodSettings
from fbo_torch.models.outcome_warp import DEFAULT_OFFSETS
from fbo_torch.optim.domain import Domain
from fbo_torch.utils.resources import available_memory, memory_budget

_F64 = 8
#: Scale of the count below: it counts the arrays of a GP refit and of the maximizer's restarts
#: as if all lived at once, an upper estimate (the growth of peak RSS per agent measured in
#: docs/performance.md is 0.3-0.7 of it).
_SLACK = 1.0


def own_step_bytes(settings: MethodSettings, domain: Domain, n: int, dim: int) -> int:
    r"""Estimated working memory (bytes) of one agent's own proposal with ``n`` observations.

    Args:
        settings: The agents' :class:`~fbo_torch.federation.settings.MethodSettings`
            (``gp_warp``, ``gp_restarts``, ``gp_sample_features``).
        domain: Their :class:`~fbo_torch.optim.domain.Domain` (restarts, raw points, candidates).
        n: Observations per agent.
        dim: ``d``.

    Returns:
        The estimate in bytes.
    """
    K = 1 + len(DEFAULT_OFFSETS) if settings.gp_warp != "none" else 1  # the identity and the log-gap warps
    starts = 1 + settings.gp_restarts
    p = dim + 3  # lengthscales, outputscale, noise, mean
    fit = K * starts * n * n * (p + 8)  # kernel, Cholesky, its solves and p derivative matrices
    F = settings.gp_sample_features or 1024
    k = int(domain.num_restarts)
    line_search = 5  # candidate steps evaluated at once
    paths = n * F + F * dim + n * n
    refine = (line_search + 1) * k * (F + n + dim)  # features, kernel values and gradients of each restart
    # the raw points' scores are computed in chunks of a fixed number of points (the domain's
    # max_points), whatever the number of agents: they do not grow with a chunk
    return int(_F64 * _SLACK * (fit + paths + refine))


def round_budget(max_memory: int | str | None, device: torch.device | str) -> int | None:
    r"""The working-memory budget of a round in bytes: ``max_memory``
    (:func:`~fbo_torch.utils.resources.memory_budget`), else half of what ``device`` has free now
    (``None`` when the system does not say: no chunking)."""
    if max_memory is not None:
        return memory_budget(max_memory)
    free = available_memory(device)
    return None if free is None else free // 2


#: Most agents per chunk on a CPU: the maximizer's arrays of 1,024 agents x 16 restarts x 256
#: features (32 MiB) stay near the cache; larger chunks are memory-bound and cost more per agent
#: (docs/performance.md). A GPU takes whatever fits: its throughput grows with the batch.
CPU_CHUNK = 1024


def agents_per_chunk(budget: int | None, per_agent: int, cap: int | None = None) -> int | None:
    r"""Agents a chunk may hold (at least 2; at most ``cap``), or ``None`` for all at once."""
    size = None if budget is None else max(2, budget // max(1, per_agent))
    if cap is not None:
        size = cap if size is None else min(size, cap)
    return size


def chunk_slices(num: int, size: int | None) -> list[slice]:
    r"""``num`` rows in contiguous chunks of at most ``size`` rows (``None``: one chunk), their
    sizes within one of each other; no chunk of one row unless ``num == 1`` (see the module)."""
    if size is None or size >= num:
        return [slice(0, num)]
    count = min(math.ceil(num / max(2, size)), num // 2)  # every chunk at least 2 rows
    base, extra = divmod(num, count)
    out, start = [], 0
    for i in range(count):
        stop = start + base + (1 if i < extra else 0)
        out.append(slice(start, stop))
        start = stop
    return out


__all__ = ["CPU_CHUNK", "agents_per_chunk", "chunk_slices", "own_step_bytes", "round_budget"]
