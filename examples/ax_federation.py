r"""Federated Thompson sampling between Ax experiments, on a mixed search space, beside plain Ax.

Four agents minimize shifted versions of a mixed-space Branin function: ``x1``
a float, ``x2`` an integer, ``variant`` an unordered choice (``"a"`` is best)
and ``width`` an ordered choice (2 is best). Each agent is an ordinary Ax
``Client`` with its own experiment. After a few Sobol trials, every trial of an
agent comes from FTS: with probability ``p_t`` the maximizer of a Thompson
sample of its own GP, otherwise the maximizer of ``φ(x)ᵀω`` for a message
``ω`` another agent sent (a posterior draw of that agent's objective on shared
random Fourier features ``φ`` of the relaxed unit cube: ``x2`` and ``width``
as continuous coordinates rounded back, ``variant`` one-hot). Each round every
agent sends a fresh message; a message is used for at most one trial.

The same agents also run plain Ax (its default Sobol + BoTorch strategy, each
agent alone) with the same budget, and the script prints both.

Run (needs the ``ax`` extra, ``pip install 'fbo_torch[ax]'``):

    python examples/ax_federation.py [--agents 4] [--initial 5] [--rounds 8]
"""

from __future__ import annotations

import argparse
import logging
import math
import warnings

import torch
from ax.api.client import Client
from ax.api.configs import ChoiceParameterConfig, RangeParameterConfig
from ax.utils.common.logger import set_stderr_log_level

from fbo_torch import RandomFourierFeatures
from fbo_torch.integrations.ax import AxFederation

BRANIN_MIN = 0.397887  # the minimum of the (continuous, unshifted) Branin function
VARIANTS = {"a": 0.0, "b": 1.0, "c": 3.0}  # the variant's penalty
WIDTHS = [1, 2, 4, 8]  # ordered; the penalty is (log2(width) - 1)^2, zero at 2


def branin(x1: float, x2: float) -> float:
    """The Branin function on [-5, 10] x [0, 15] (three global minima, value 0.397887)."""
    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


def shifted_branin(agent: int):
    """Agent ``agent``'s objective: the mixed Branin moved by a small agent-specific shift.

    The agents' tasks are related but not identical, the setting FTS is made for."""
    dx, dy = 0.6 * math.cos(2.0 * agent), 0.6 * math.sin(2.0 * agent)

    def f(params) -> float:
        penalty = VARIANTS[params["variant"]] + (math.log2(params["width"]) - 1) ** 2
        return branin(params["x1"] - dx, params["x2"] - dy) + penalty

    return f


PARAMETERS = [
    RangeParameterConfig(name="x1", parameter_type="float", bounds=(-5.0, 10.0)),
    RangeParameterConfig(name="x2", parameter_type="int", bounds=(0, 15)),
    ChoiceParameterConfig(name="variant", parameter_type="str", values=list(VARIANTS), is_ordered=False),
    ChoiceParameterConfig(name="width", parameter_type="int", values=WIDTHS, is_ordered=True),
]


def _client(seed: int) -> Client:
    client = Client(random_seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Ax's notes on choice parameters' defaults
        client.configure_experiment(parameters=PARAMETERS, name=f"agent{seed}")
    client.configure_optimization(objective="-branin")  # minimize "branin"
    return client


def _run(clients, objectives, num_trials: int, exchange=None) -> list[float]:
    """``num_trials`` trials per agent, one agent after the other each round; the best value of each."""
    for t in range(num_trials):
        if exchange is not None:
            exchange(t)
        for client, f in zip(clients, objectives, strict=False):
            for index, params in client.get_next_trials(max_trials=1).items():
                client.complete_trial(index, raw_data={"branin": f(params)})
    return [client.get_best_parameterization(use_model_predictions=False)[1]["branin"][0] for client in clients]


def main(
    num_agents: int = 4,
    num_initial: int = 5,
    num_rounds: int = 8,
    num_features: int = 200,
    baseline: bool = True,
    seed: int = 0,
) -> dict[str, list[float]]:
    set_stderr_log_level(logging.WARNING)  # Ax logs every trial at INFO
    torch.manual_seed(seed)
    objectives = [shifted_branin(n) for n in range(num_agents)]

    # The random Fourier features every agent shares: messages are weight vectors on this map
    # of the relaxed unit cube (6 coordinates: x1, x2, variant one-hot (3), width; see UnitCube).
    features = RandomFourierFeatures(dim=6, num_features=num_features, lengthscale=0.2, seed=seed)
    # p_t = 1 - 1/sqrt(t): early trials follow the others' messages more often.
    federation = AxFederation(features, p_t="1-1/sqrt(t)", one_shot=True, seed=seed)
    clients = [_client(seed + n) for n in range(num_agents)]
    for client in clients:  # Sobol for the first `num_initial` trials, then FTS (Ax ExternalGenerationNode)
        federation.add_agent(client, num_initial_trials=num_initial)
    # Initial Sobol trials: nothing to exchange yet; then every agent sends a fresh message each round.
    best = {
        "FTS": _run(
            clients,
            objectives,
            num_initial + num_rounds,
            exchange=lambda t: federation.exchange() if t >= num_initial else None,
        )
    }
    for n, node in enumerate(federation.agents):
        used = sum(step.source != "own" for step in node.history)
        print(f"FTS agent {n}: best branin {best['FTS'][n]:.4f}; {used}/{len(node.history)} FTS trials used a message")

    if baseline:  # each agent alone with Ax's default strategy (Sobol, then BoTorch), the same budget
        alone = [_client(seed + n) for n in range(num_agents)]
        for n, client in enumerate(alone):
            client.configure_generation_strategy(initialization_budget=num_initial, initialization_random_seed=seed + n)
        best["plain Ax"] = _run(alone, objectives, num_initial + num_rounds)
    for name, values in best.items():
        print(
            f"{name:>9}: mean best branin {sum(values) / len(values):.4f} over {num_agents} agents, "
            f"{num_initial + num_rounds} trials each (optimum {BRANIN_MIN} before rounding x2)"
        )
    return best


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--initial", type=int, default=5, help="Sobol trials per agent")
    parser.add_argument("--rounds", type=int, default=8, help="FTS trials per agent")
    parser.add_argument("--features", type=int, default=200, help="random Fourier features M")
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain-Ax agents")
    parser.add_argument("--seed", type=int, default=0, help="seed of the map, the agents' draws and Sobol")
    args = parser.parse_args()
    torch.set_num_threads(1)  # GPs on a dozen points: more threads only add synchronization
    main(args.agents, args.initial, args.rounds, args.features, baseline=not args.no_baseline, seed=args.seed)
