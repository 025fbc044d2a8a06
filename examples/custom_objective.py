r"""Your own objective: tune a small neural network across clients, each with its own data.

Each of ``N`` clients trains a one-hidden-layer MLP on its *own* shard of
scikit-learn's handwritten digits (1,797 real 8 x 8 images, shipped with
scikit-learn, so this runs offline) and tunes two hyperparameters, the
learning rate and the weight decay (both log-uniform). The value of client
``n`` at a configuration is the validation accuracy of the network trained on
its shard; fbo_torch minimizes the validation error.

:class:`DigitsMLP` is all a user writes: a subclass of
:class:`~fbo_torch.objectives.search_space.TuningObjective` (the objective
protocol of :mod:`fbo_torch.objectives.base` with inputs in ``[0, 1]^d`` mapped
through a search space) whose ``_evaluate`` trains every queried configuration
of every client at once, as one batch of networks.

Tuned from Python with the DP-FTS-DE runner (every client is a target; each
round every client queries one configuration): standard Thompson sampling
(each client alone) against DP-FTS-DE (clients share random-feature
posteriors through a server that clips them and adds Gaussian noise)::

    python examples/custom_objective.py              # 6 clients, 12 rounds; well under a minute on 2 cores
    python examples/custom_objective.py --rounds 4   # quicker

The same class from an experiment file (run from this folder, so that
``custom_objective`` is importable; ``examples/custom_objective.yaml``)::

    cd examples && fbo-torch run custom_objective.yaml --out ../runs/custom_objective
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import Tensor

from fbo_torch.federation.settings import DPFTSDESettings
from fbo_torch.objectives.search_space import Real, SearchSpace, TuningObjective
from fbo_torch.simulate.dp_fts_de import DPFTSDERunner


class DigitsMLP(TuningObjective):
    r"""MLP tuning on scikit-learn's digits, one disjoint data shard per client.

    Inputs ``x ∈ [0, 1]^2`` map log-uniformly onto (learning rate, weight
    decay) ``∈ [1e-3, 1] x [1e-6, 1e-1]``. Client ``n`` trains ``64 -> hidden -> 10``
    with full-batch gradient descent for ``steps`` steps from its own fixed
    initial weights (so its value is a deterministic function of ``x``) and
    reports the accuracy on its validation split.

    Args:
        num_agents: Number of clients ``N``.
        samples_per_agent: Images per client (train + validation), ``N x samples_per_agent <= 1797``.
        val_fraction: Fraction of each client's images held out for validation.
        hidden: Hidden units.
        steps: Gradient steps per training run.
        seed: Seed of the shards and of the initial weights.
    """

    value_name = "accuracy"
    _loss_name = "validation error"

    def __init__(
        self,
        num_agents: int = 6,
        samples_per_agent: int = 240,
        val_fraction: float = 0.3,
        hidden: int = 32,
        steps: int = 60,
        seed: int = 0,
    ) -> None:
        from sklearn.datasets import load_digits

        images, labels = load_digits(return_X_y=True)
        if num_agents < 1 or num_agents * samples_per_agent > len(labels):
            raise ValueError(
                f"`num_agents` x `samples_per_agent` must lie in [1, {len(labels)}], got "
                f"{num_agents} x {samples_per_agent}."
            )
        if not 0 < val_fraction < 1:
            raise ValueError(f"`val_fraction` must lie in (0, 1), got {val_fraction}.")
        self.search_space = SearchSpace(
            [
                Real("learning_rate", 1e-3, 1.0, log=True),
                Real("weight_decay", 1e-6, 1e-1, log=True),
            ]
        )
        self.num_agents, self.steps = num_agents, steps
        g = torch.Generator().manual_seed(seed)
        #: ``N x samples_per_agent`` indices into ``load_digits()`` of each client's images (disjoint shards).
        self.shards = torch.randperm(len(labels), generator=g)[: num_agents * samples_per_agent].view(num_agents, -1)
        x = torch.as_tensor(images, dtype=torch.float32)[self.shards].view(num_agents, samples_per_agent, 64) / 16.0
        y = torch.as_tensor(labels)[self.shards]
        n_val = max(1, round(val_fraction * samples_per_agent))
        self.x_train, self.y_train = x[:, n_val:], y[:, n_val:]  # N x n_train x 64, N x n_train
        self.x_val, self.y_val = x[:, :n_val], y[:, :n_val]
        # each client's initial weights, fixed: common random numbers across its queries
        self.W1 = torch.randn(num_agents, 64, hidden, generator=g) / 8.0
        self.W2 = torch.randn(num_agents, hidden, 10, generator=g) / hidden**0.5

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        k, q, _ = X.shape
        lr, wd = self.search_space.to_native(X.double()).reshape(k * q, 2).float().unbind(-1)
        a = agents.cpu().repeat_interleave(q)  # the client of each of the K = k q configurations
        return self._train(a, lr, wd).reshape(k, q).to(X)

    def _train(self, a: Tensor, lr: Tensor, wd: Tensor) -> Tensor:
        """Train ``K`` networks at once (client ``a[i]``'s data, learning rate ``lr[i]``, weight decay
        ``wd[i]``); returns their ``K`` validation accuracies."""
        K = a.numel()
        W1 = self.W1[a].clone().requires_grad_()
        W2 = self.W2[a].clone().requires_grad_()
        b1 = torch.zeros(K, 1, self.W1.shape[-1], requires_grad=True)
        b2 = torch.zeros(K, 1, 10, requires_grad=True)
        params = (W1, b1, W2, b2)
        x, y = self.x_train[a], self.y_train[a]
        step = lr.view(K, 1, 1)
        for _ in range(self.steps):
            logits = torch.baddbmm(b2, torch.relu(torch.baddbmm(b1, x, W1)), W2)
            data = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(K, -1).mean(1)
            penalty = wd * (W1.square().sum((1, 2)) + W2.square().sum((1, 2)))
            grads = torch.autograd.grad((data + penalty).sum(), params)  # each network's own gradient
            with torch.no_grad():
                for p, g in zip(params, grads, strict=False):
                    p -= step * torch.nan_to_num(g).clamp(-1e3, 1e3)
        with torch.no_grad():
            logits = torch.baddbmm(b2, torch.relu(torch.baddbmm(b1, self.x_val[a], W1)), W2)
            return (logits.argmax(-1) == self.y_val[a]).double().mean(1)


def methods(rounds: int) -> dict[str, DPFTSDESettings]:
    """Thompson sampling (each client alone) and DP-FTS-DE with two sub-regions."""
    shared = dict(
        num_iterations=rounds,
        num_init=3,
        num_features=100,
        rff_lengthscale=0.2,
        rff_noise_variance=1e-3,
        p_t="1-1/t",
        gp_refit_every=3,
        const_rounds=2,
        decay_rounds=4,
    )
    return {
        "TS": DPFTSDESettings(algorithm="ts", **shared),
        "DP-FTS-DE": DPFTSDESettings(
            algorithm="fts_de", num_regions=2, sample_rate=0.5, noise_multiplier=1.0, clip_norm=10.0, **shared
        ),
    }


def tune(num_agents: int = 6, rounds: int = 12, steps: int = 60, seed: int = 0) -> dict[str, dict]:
    r"""Tune :class:`DigitsMLP` across ``num_agents`` clients with each method; print and return, per
    method, the clients' final validation errors, ε, and each client's best configuration."""
    objective = DigitsMLP(num_agents=num_agents, steps=steps, seed=seed)
    out = {}
    for name, settings in methods(rounds).items():
        t0 = time.perf_counter()
        runner = DPFTSDERunner(objective, settings, num_inits=1, seed=seed, name=name, accountant="rdp")
        result = runner.run()
        errors = result.loss[:, -1]  # N clients: validation error of the best configuration found
        best = runner.Y.squeeze(-1).argmax(-1)  # each client's best query
        configs = objective.search_space.to_dicts(runner.X[torch.arange(num_agents), best].unsqueeze(1))
        eps = result.epsilon[-1] if result.accountant else None
        out[name] = {
            "errors": errors,
            "epsilon": eps,
            "configs": [c[0] for c in configs],
            "seconds": time.perf_counter() - t0,
        }
        privacy = f", ε = {eps:.2f} (δ = {result.delta:.3g})" if eps is not None else ""
        print(
            f"{name}: mean validation error {errors.mean():.3f} over {num_agents} clients after {rounds} rounds"
            f"{privacy}, {out[name]['seconds']:.1f} s"
        )
        for n, (err, cfg) in enumerate(zip(errors.tolist(), out[name]["configs"], strict=False)):
            print(
                f"  client {n}: error {err:.3f} at learning rate {cfg['learning_rate']:.3g}, "
                f"weight decay {cfg['weight_decay']:.2g}"
            )
    return out


def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=6, help="number of clients (default 6)")
    parser.add_argument("--rounds", type=int, default=12, help="BO rounds (default 12)")
    parser.add_argument("--steps", type=int, default=60, help="gradient steps per training run (default 60)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default 1: faster for these many small operations)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    return tune(args.clients, args.rounds, args.steps, args.seed)


if __name__ == "__main__":
    main()
