r"""Federated Thompson sampling between Ax experiments.

Four agents minimize shifted versions of the Branin function: each is an
ordinary Ax ``Client`` with its own experiment. After a few Sobol trials, every
trial of an agent comes from FTS: with probability ``p_t`` the maximizer of a
Thompson sample of its own GP, otherwise the maximizer of ``φ(x)ᵀω`` for a
message ``ω`` another agent sent (a posterior draw of that agent's objective on
shared random Fourier features ``φ``). Each round every agent sends a fresh
message; a message is used for at most one trial.

Run (needs the ``ax`` extra, ``pip install 'fbo_torch[ax]'``):

    python examples/ax_federation.py [--agents 4] [--initial 5] [--rounds 8]
"""

from __future__ import annotations

import argparse
import logging
import math

import torch
from ax.api.client import Client
from ax.api.configs import RangeParameterConfig
from ax.utils.common.logger import set_stderr_log_level

from fbo_torch import RandomFourierFeatures
from fbo_torch.integrations.ax import AxFederation

BRANIN_MIN = 0.397887  # the minimum of the unshifted Branin function


def branin(x1: float, x2: float) -> float:
    """The Branin function on [-5, 10] x [0, 15] (three global minima, value 0.397887)."""
    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


def shifted_branin(agent: int):
    """Agent ``agent``'s objective: Branin moved by a small agent-specific shift.

    The agents' tasks are related but not identical, the setting FTS is made for."""
    dx, dy = 0.6 * math.cos(2.0 * agent), 0.6 * math.sin(2.0 * agent)
    return lambda params: branin(params["x1"] - dx, params["x2"] - dy)


def main(num_agents: int = 4, num_initial: int = 5, num_rounds: int = 8, num_features: int = 200) -> list[float]:
    set_stderr_log_level(logging.WARNING)  # Ax logs every trial at INFO

    # The random Fourier features every agent shares: messages are weight vectors on
    # this map of the unit cube (each agent's search space is mapped to [0, 1]^2).
    features = RandomFourierFeatures(dim=2, num_features=num_features, lengthscale=0.2, seed=0)
    # p_t = 1 - 1/sqrt(t): early trials follow the others' messages more often.
    federation = AxFederation(features, p_t="1-1/sqrt(t)", one_shot=True, seed=0)

    clients, objectives = [], []
    for n in range(num_agents):
        client = Client(random_seed=n)
        client.configure_experiment(
            parameters=[
                RangeParameterConfig(name="x1", parameter_type="float", bounds=(-5.0, 10.0)),
                RangeParameterConfig(name="x2", parameter_type="float", bounds=(0.0, 15.0)),
            ],
            name=f"agent{n}",
        )
        client.configure_optimization(objective="-branin")  # minimize "branin"
        # Sobol for the first `num_initial` trials, then FTS (Ax ExternalGenerationNode).
        federation.add_agent(client, num_initial_trials=num_initial)
        clients.append(client)
        objectives.append(shifted_branin(n))

    def run_one_trial(n: int) -> None:
        for index, params in clients[n].get_next_trials(max_trials=1).items():
            clients[n].complete_trial(index, raw_data={"branin": objectives[n](params)})

    # Initial Sobol trials: nothing to exchange yet.
    for _ in range(num_initial):
        for n in range(num_agents):
            run_one_trial(n)

    # FTS rounds: every agent sends a fresh message built on its data, then runs one trial.
    for _ in range(num_rounds):
        federation.exchange()
        for n in range(num_agents):
            run_one_trial(n)

    best = []
    for n, client in enumerate(clients):
        params, values, _, _ = client.get_best_parameterization(use_model_predictions=False)
        history = federation.agents[n].history
        used = sum(step.source != "own" for step in history)
        best.append(values["branin"][0])
        print(
            f"agent {n}: best branin {best[-1]:.4f} (optimum {BRANIN_MIN}) at "
            f"x1={params['x1']:.3f}, x2={params['x2']:.3f}; {used}/{len(history)} FTS trials used a message"
        )
    return best


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--initial", type=int, default=5, help="Sobol trials per agent")
    parser.add_argument("--rounds", type=int, default=8, help="FTS trials per agent")
    parser.add_argument("--features", type=int, default=200, help="random Fourier features M")
    args = parser.parse_args()
    torch.set_num_threads(1)  # GPs on a dozen points: more threads only add synchronization
    main(args.agents, args.initial, args.rounds, args.features)
