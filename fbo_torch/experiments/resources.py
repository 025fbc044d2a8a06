r"""What a scenario's methods will need in memory, estimated from their settings before anything runs.

A run stores every agent's observations for the whole run, fits a GP on them
(an ``n x n`` kernel matrix per agent), keeps an ``M x M`` posterior per agent
of the shared feature map, screens ``C`` candidate points per agent, and keeps
its curves: with ``B`` agents simulated at once, ``n`` observations each,
``M`` features and ``C`` candidates, about

    ``8 B (4 n² + n (d + 2 + M) + 3 M'² + 4 C) + 32 R T`` bytes

(float64; ``R`` runs of ``T`` iterations; ``M'² = M²`` for the RFF posterior's weight
representation, ``n M`` for its dual one, taken when ``n < M``), plus one scoring call of
a message's maximizer (``2¹¹ M`` features). The screening term ``4 C``
is working memory, which agents beyond the round's budget (``max_memory``) use in chunks
(:mod:`~fbo_torch.federation.chunks`): it counts at most the budget. :func:`check_scenario_memory`
compares that with what the machine has
(:func:`~fbo_torch.utils.resources.available_memory`) for every method of a
scenario, before the output folder is created, and refuses the one that does
not fit with one line naming the YAML key that makes the largest term
(``num_iterations``, ``num_features``, ``domain.raw_samples``,
``runs.num_inits``). It is an estimate of the dominant terms, not a bound:
it is meant to stop settings that cannot fit, not to budget ones that nearly do.
"""

from __future__ import annotations

from typing import Any

from fbo_torch.experiments.config import ConfigError
from fbo_torch.federation.chunks import round_budget
from fbo_torch.optim.batched import DEFAULT_MAX_POINTS
from fbo_torch.protocol.fidelity import REFERENCE_POINTS
from fbo_torch.utils.resources import MemoryLimitError, check_memory

_F64 = 8


def method_memory(
    settings: Any,
    agents: int,
    runs: int,
    history: int,
    dim: int,
    candidates: int,
    budget: int | None = None,
    peers: int = 0,
    reference: int = 0,
) -> dict[str, float]:
    r"""Bytes of each dominant term of one method, by the setting that drives it.

    Args:
        settings: The method's settings (``num_iterations``, ``num_init``, ``num_features``).
        agents: ``B``, agents simulated at once.
        runs: ``R``, curves kept.
        history: Observations agents hold before the run (an FTS history's ``t_n``).
        dim: ``d``.
        candidates: ``C``, points screened per agent and maximization.
        budget: The round's working-memory budget (bytes; ``None``: none), which bounds the screening term.
        peers: ``A``, the peers whose messages each agent weighs.
        reference: ``C_ref``, the points on which ``agent_weights: corroborated`` compares the peers'
            maximizers (:func:`~fbo_torch.protocol.fidelity.reference_points`).

    Returns:
        ``{"num_iterations": ..., "num_features": ..., "candidates": ..., "agent_weights": ...}`` in bytes
        (``agent_weights``: every agent's ``A x C_ref`` values of its peers' messages, sorted, and their
        quantiles, with ``corroborated``; 0 otherwise).
    """
    T = int(settings.num_iterations)
    n = int(getattr(settings, "num_init", 0)) + T + int(history)
    M = int(settings.num_features) if settings.method.federated() else 0
    B = int(agents)
    return {
        "num_iterations": _F64 * B * (4.0 * n * n + n * (dim + 2 + M)) + 4 * _F64 * float(runs) * T,
        # the posteriors' factors, and one scoring call of the messages' maximizer (max_points points x M)
        "num_features": _F64 * (B * 3.0 * (M * M if n >= M else n * M) + DEFAULT_MAX_POINTS * M),
        "candidates": min(_F64 * B * 4.0 * candidates, float("inf") if budget is None else float(budget)),
        "agent_weights": (
            _F64 * (3.0 * B * peers * reference + reference * M)
            if getattr(settings, "agent_weights", None) == "corroborated"
            else 0.0
        ),
    }


def check_scenario_memory(ctx: Any, agents: int, runs: int, history: int = 0) -> None:
    r"""Refuse a method of the scenario in ``ctx`` whose estimated memory exceeds the machine's.

    Args:
        ctx: The :class:`~fbo_torch.experiments.kind.ScenarioContext`.
        agents / runs / history: As in :func:`method_memory`.

    Raises:
        ConfigError: Naming the method and the YAML key of its largest term.
    """
    sc, objective, domain = ctx.scenario, ctx.objective, ctx.domain
    C = domain.candidates.shape[0] if domain.candidates is not None else max(domain.raw_samples, domain.raw_samples_rff)
    budget = round_budget(ctx.max_memory, ctx.device)
    C_ref = domain.candidates.shape[0] if domain.candidates is not None else REFERENCE_POINTS
    for j, (label, settings) in enumerate(sc.methods):
        terms = method_memory(settings, agents, runs, history, objective.dim, C, budget, objective.num_agents, C_ref)
        key = max(terms, key=terms.__getitem__)
        value = getattr(settings, key, None)
        name = (
            f"`{key}: {value}`"
            if key != "candidates"
            else ("the objective's candidates" if domain.candidates is not None else "`domain.raw_samples`")
        )
        what = (
            f"{agents} agent(s) at once ({ctx.num_inits} init(s)), {int(settings.num_iterations)} iterations, "
            f"{getattr(settings, 'num_features', 0)} features, {C} candidates"
        )
        try:
            check_memory(f"{sc.where}: methods[{j}] ({label!r}): {name}", sum(terms.values()), what, ctx.device)
        except MemoryLimitError as err:
            raise ConfigError(str(err)) from None


__all__ = ["check_scenario_memory", "method_memory"]
