r"""Agents from one labelled dataset: a Dirichlet label-skew partition.

torchvision's EMNIST carries no writer ids, so the image objectives
(:mod:`fbo_torch.objectives.vision`) build heterogeneous agents with
:func:`dirichlet_label_partition`: every agent gets its own label
distribution, data size and train/validation split (:class:`AgentSplit`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from fbo_torch.utils.validation import check_int, check_positive, check_probability, check_tensor

__all__ = ["AgentSplit", "dirichlet_label_partition"]

# Stream tags so that the partition (here) and the image objectives' training seeds
# (fbo_torch.objectives.vision) never share random numbers.
_PARTITION_STREAM = 0
_TRAINING_STREAM = 1


class AgentSplit(NamedTuple):
    """One agent's data: indices (into the partitioned dataset) of its training and validation samples."""

    train: Tensor
    val: Tensor


def dirichlet_label_partition(
    labels: Tensor,
    num_agents: int,
    alpha: float = 0.5,
    samples_per_agent: int = 200,
    min_samples_per_agent: int = 20,
    size_spread: float = 0.3,
    val_fraction: float = 0.2,
    seed: int = 0,
) -> list[AgentSplit]:
    r"""Split a labelled dataset into heterogeneous agents by Dirichlet label skew.

    Scheme (all draws from ``numpy.random.default_rng`` seeded by ``seed``):

    1. **Sizes.** Agent ``n`` asks for
       ``m_n = max(min_samples_per_agent, round(samples_per_agent · e^{σ z_n - σ²/2}))``
       samples with ``z_n ~ N(0, 1)`` and ``σ = size_spread`` (log-normal around
       the mean; ``σ = 0`` gives equal sizes). If ``Σ m_n`` exceeds the dataset,
       the sizes are scaled down proportionally (never below the minimum).
    2. **Label distributions.** ``p_n ~ Dir(α · 1_C)`` over the ``C`` classes:
       small ``α`` (e.g. 0.1) gives agents dominated by one or two digits,
       large ``α`` (e.g. 100) nearly the global label mix.
    3. **Sampling without replacement.** Agents are filled in order
       ``n = 0, 1, ...``: class counts ``~ Multinomial(m_n, p_n)``, taken from
       per-class shuffled pools; if a class pool runs out, the shortfall is
       redrawn from the classes with samples left, again in proportion to
       ``p_n``. Every sample is used by at most one agent. (Late agents may be
       pushed towards the leftover classes when ``Σ m_n`` is close to the
       dataset size.)
    4. **Train/validation.** Each agent's samples are shuffled and the first
       ``max(1, round(val_fraction · m_n))`` become its validation set (at
       least one sample stays for training).

    Args:
        labels: ``n`` integer class labels.
        num_agents: Number of agents ``N``.
        alpha: Dirichlet concentration ``α > 0``.
        samples_per_agent: Mean number of samples per agent (train + validation).
        min_samples_per_agent: Minimum samples per agent (``>= 2``).
        size_spread: Log-normal spread ``σ >= 0`` of the agents' sizes.
        val_fraction: Fraction of each agent's samples used for validation, in ``(0, 1)``.
        seed: Seed of the partition.

    Returns:
        ``num_agents`` :class:`AgentSplit` s of long index tensors (CPU) into ``labels``.

    Example:
        >>> parts = dirichlet_label_partition(torch.randint(10, (1000,)), num_agents=5, alpha=0.3,
        ...                                   samples_per_agent=100, seed=0)
        >>> len(parts), parts[0].train.dtype
        (5, torch.int64)
    """
    check_tensor("labels", labels)
    if labels.ndim != 1 or labels.is_floating_point() or labels.dtype == torch.bool:
        raise ValueError(
            f"`labels` must be a 1-d tensor of integer classes, got {labels.dtype} of shape {tuple(labels.shape)}."
        )
    num_agents = check_int("num_agents", num_agents, minimum=1)
    check_positive("alpha", alpha)
    samples_per_agent = check_int("samples_per_agent", samples_per_agent, minimum=2)
    min_samples_per_agent = check_int("min_samples_per_agent", min_samples_per_agent, minimum=2)
    check_positive("size_spread", size_spread, allow_zero=True)
    val_fraction = check_probability("val_fraction", val_fraction, open_left=True, open_right=True)
    n = labels.numel()
    if num_agents * min_samples_per_agent > n:
        raise ValueError(
            f"The dataset has {n} samples, fewer than num_agents x min_samples_per_agent = "
            f"{num_agents} x {min_samples_per_agent}; lower one of them."
        )

    rng = np.random.default_rng(np.random.SeedSequence([int(seed), _PARTITION_STREAM]))
    y = labels.detach().cpu().numpy()
    classes = np.unique(y)
    pools = [rng.permutation(np.flatnonzero(y == c)) for c in classes]
    used = np.zeros(len(classes), dtype=np.int64)
    available = np.array([len(p) for p in pools], dtype=np.int64)

    sigma = float(size_spread)
    z = rng.standard_normal(num_agents)
    sizes = np.maximum(min_samples_per_agent, np.rint(samples_per_agent * np.exp(sigma * z - 0.5 * sigma**2))).astype(
        np.int64
    )
    if sizes.sum() > n:
        sizes = np.maximum(min_samples_per_agent, np.floor(sizes * (n / sizes.sum()))).astype(np.int64)
        while sizes.sum() > n:  # rounding at the minimum: trim the largest agents
            sizes[np.argmax(sizes)] -= 1
    props = rng.dirichlet(np.full(len(classes), float(alpha)), size=num_agents)

    splits = []
    for i in range(num_agents):
        room = available - used
        take = np.minimum(rng.multinomial(sizes[i], props[i]), room)
        deficit = int(sizes[i] - take.sum())
        while deficit > 0:
            left = room - take
            weight = props[i] * (left > 0)
            if weight.sum() <= 0:
                weight = (left > 0).astype(float)
            extra = np.minimum(rng.multinomial(deficit, weight / weight.sum()), left)
            take += extra
            deficit -= int(extra.sum())
        idx = np.concatenate([pools[c][used[c] : used[c] + take[c]] for c in range(len(classes))])
        used += take
        idx = rng.permutation(idx)
        n_val = min(max(1, int(round(val_fraction * idx.size))), idx.size - 1)
        splits.append(
            AgentSplit(
                train=torch.as_tensor(idx[n_val:], dtype=torch.long),
                val=torch.as_tensor(idx[:n_val], dtype=torch.long),
            )
        )
    return splits
