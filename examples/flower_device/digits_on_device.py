r"""One device's own black box for a Flower deployment: a CNN trained on the digits this device holds.

In a federation of node-local objectives (run config ``objective = '{"type":
"node", ...}'``, see docs/flower.md) every SuperNode names its own objective in
its node config; nothing about it is in the run config, and the server never
imports it. This module is what one such device holds: :class:`DigitsOnDevice`
tunes the learning rate, learning-rate decay and L2 penalty of a small CNN
trained on the device's own labelled images (an ``.npz`` file with ``images``,
``n x 8 x 8`` in ``[0, 1]``, and ``labels``), valued by validation accuracy.
It is :class:`~fbo_torch.objectives.vision.AgentImageCNN` with one agent, the
device, and all of its data.

A real device reads its own data; for the demo, :func:`write_shards` gives each
of ``N`` devices a different, label-skewed (non-IID) share of scikit-learn's
digits::

    python examples/flower_device/digits_on_device.py DATA_DIR --nodes 2   # DATA_DIR/node-0.npz, node-1.npz

(it prints the federation's run config ``objective``: its parameters, no class), and each
SuperNode, with this folder on its ``PYTHONPATH``, is started with::

    flower-supernode ... --node-config "partition-id=0 objective.type=\"digits_on_device:DigitsOnDevice\" \
        objective.data=\"DATA_DIR/node-0.npz\""
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch

from fbo_torch.objectives.search_space import SearchSpace
from fbo_torch.objectives.vision import AgentImageCNN, default_cnn_search_space, dirichlet_label_partition


class DigitsOnDevice(AgentImageCNN):
    r"""Validation accuracy of a small CNN trained on this device's digits (one agent's function).

    Args:
        data: The device's ``.npz`` file (``images``: ``n x s x s`` floats in ``[0, 1]``,
            ``labels``: ``n`` classes ``0..9``).
        steps: SGD steps per training run.
        val_fraction: Share of the device's images held out for validation.
        device: Where to train (``"cpu"``, ``"cuda"``).
        seed: The device's train/validation split and training seeds.
        search_space: The hyperparameters searched (default: learning rate, decay and L2,
            each in ``[1e-7, 0.02]`` on a log scale); it must be the federation's.
    """

    def __init__(
        self,
        data: str | os.PathLike,
        steps: int = 60,
        val_fraction: float = 0.25,
        device: str | None = None,
        seed: int = 0,
        search_space: SearchSpace | dict | None = None,
    ) -> None:
        with np.load(data) as arrays:
            images = torch.as_tensor(arrays["images"], dtype=torch.float32).unsqueeze(1)
            labels = torch.as_tensor(arrays["labels"], dtype=torch.long)
        n = labels.numel()
        super().__init__(
            images,
            labels,
            num_agents=1,
            samples_per_agent=n,
            min_samples_per_agent=n,
            size_spread=0.0,
            val_fraction=val_fraction,
            steps=steps,
            device=device,
            seed=seed,
            num_classes=10,
            search_space=search_space,
        )


def write_shards(
    folder: str | os.PathLike, num_nodes: int, alpha: float = 0.5, samples: int = 150, seed: int = 0
) -> list[Path]:
    r"""Write ``folder/node-{n}.npz``: each node's label-skewed share of scikit-learn's digits."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    parts = dirichlet_label_partition(
        torch.as_tensor(digits.target),
        num_nodes,
        alpha=alpha,
        samples_per_agent=samples,
        min_samples_per_agent=40,
        seed=seed,
    )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, part in enumerate(parts):
        idx = torch.cat([part.train, part.val]).numpy()
        paths.append(folder / f"node-{n}.npz")
        np.savez(paths[-1], images=(digits.images[idx] / 16.0).astype(np.float32), labels=digits.target[idx])
    return paths


#: The search space of :class:`DigitsOnDevice`, as a run config's ``parameters``.
PARAMETERS = default_cnn_search_space().to_config()

if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Write each device's share of the digits (FOLDER/node-{n}.npz) "
        "and print the federation's run config `objective`."
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_shards(args.folder, args.nodes, seed=args.seed)
    print(json.dumps({"type": "node", "parameters": PARAMETERS}))
