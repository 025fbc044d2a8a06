r"""Federated CNN hyperparameter tuning on handwritten digits (EMNIST, scikit-learn digits).

The third real-world experiment of DP-FTS-DE (thesis appendix C.2.2): each of
``N`` agents trains a convolutional network that classifies digits 0-9 on its
*own* data and tunes three hyperparameters,

    learning rate, learning-rate decay, L2 regularization   ∈ [1e-7, 0.02]^3,

with the validation error (1 - accuracy) as the metric and pixels scaled to
``[0, 1]``. The BO domain is the unit cube ``[0, 1]^3``, mapped log-uniformly
onto the hyperparameter box (:meth:`AgentImageCNN.hyperparameters`).

Agents. The paper uses the first 50 writers of TensorFlow Federated's EMNIST;
torchvision's EMNIST carries no writer ids, so agents are built by Dirichlet
label skew instead
(:func:`~fbo_torch.objectives.label_partition.dirichlet_label_partition`):
every agent gets its own label distribution and data size, and its own
train/validation split.

Evaluation. One call ``objective(X)`` with ``X: k x q x 3`` trains all
``K = k q`` configurations as one stacked model with
:func:`~fbo_torch.objectives.cnn.train_cnn_batched`, so a round of queries from
the whole federation costs about one training run, not ``K``.

Two objectives:

* :class:`EMNISTCNN` — torchvision's EMNIST "digits" split (28 x 28), read by
  :mod:`fbo_torch.objectives.emnist`. It must be downloaded beforehand
  (``fbo-torch data emnist --root DIR``, :func:`~fbo_torch.objectives.emnist.download_emnist`).
* :class:`DigitsCNN` — scikit-learn's 1,797 real 8 x 8 digit images, shipped
  with scikit-learn: the offline image task for CPU runs and CI.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fbo_torch.objectives.cnn import SmallCNN, TrainerOptions, train_cnn_batched
from fbo_torch.objectives.emnist import EMNIST_ROOT_ENV, download_emnist, emnist_to_float, load_emnist_digits
from fbo_torch.objectives.label_partition import _TRAINING_STREAM, AgentSplit, dirichlet_label_partition
from fbo_torch.objectives.search_space import Real, SearchSpace, TuningObjective, as_search_space
from fbo_torch.utils.validation import (
    check_int,
    check_ndim,
    check_tensor,
)

# AgentSplit and dirichlet_label_partition live in fbo_torch.objectives.label_partition, EMNIST_ROOT_ENV and
# download_emnist in fbo_torch.objectives.emnist; imported from here they still work
__all__ = [
    "EMNIST_ROOT_ENV",
    "HYPERPARAMETER_NAMES",
    "HYPERPARAMETER_RANGE",
    "AgentSplit",
    "AgentImageCNN",
    "DigitsCNN",
    "EMNISTCNN",
    "default_cnn_search_space",
    "dirichlet_label_partition",
    "download_emnist",
]

#: Names of the three tuned hyperparameters, in input-column order.
HYPERPARAMETER_NAMES = ("learning_rate", "lr_decay", "l2")
#: Range of every hyperparameter (thesis appendix C.2.2).
HYPERPARAMETER_RANGE = (1e-7, 0.02)


def default_cnn_search_space() -> SearchSpace:
    r"""Learning rate, learning-rate decay and L2 coefficient, each in ``[1e-7, 0.02]`` on a log scale."""
    lo, hi = HYPERPARAMETER_RANGE
    return SearchSpace([Real(name, lo, hi, log=True) for name in HYPERPARAMETER_NAMES])


def _derive_seed(seed: int, *keys: int) -> int:
    return int(np.random.SeedSequence([int(seed), *keys]).generate_state(1, dtype=np.uint32)[0])


# --------------------------------------------------------------------------- objective
def _check_device(device: torch.device | str | None) -> torch.device:
    """The training device: CPU by default; a clear error for unknown or unavailable devices."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"`device` must be a torch device such as 'cpu' or 'cuda', got {device!r}.") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"`device` is {device!r} but no CUDA device is available here; use device: cpu.")
    return dev


def _as_trainer_options(trainer: TrainerOptions | dict[str, Any] | None) -> TrainerOptions:
    if trainer is None:
        return TrainerOptions()
    if isinstance(trainer, TrainerOptions):
        return trainer
    if isinstance(trainer, dict):
        fields = set(TrainerOptions.__dataclass_fields__)
        unknown = sorted(set(trainer) - fields)
        if unknown:
            raise ValueError(f"`trainer` has unknown keys {unknown}; expected some of {sorted(fields)}.")
        return TrainerOptions(**trainer)
    raise TypeError(f"`trainer` must be a TrainerOptions or a mapping of its fields, got {type(trainer).__name__}.")


class AgentImageCNN(TuningObjective):
    r"""CNN hyperparameter tuning for ``N`` agents with their own image data.

    Inputs ``x ∈ [0, 1]^3`` map through ``search_space`` (default
    :func:`default_cnn_search_space`: log-uniformly onto (learning rate,
    learning-rate decay, L2 coefficient) ``∈ [1e-7, 0.02]^3``); the value of
    agent ``n`` at ``x``
    is the validation accuracy of :class:`~fbo_torch.objectives.cnn.SmallCNN`
    trained on agent ``n``'s training split with those hyperparameters (plain
    SGD, Keras-style decay ``lr_t = lr / (1 + decay · t)``, penalty
    ``λ Σ ||w||²``; see :mod:`fbo_torch.objectives.cnn`).

    Evaluations are deterministic: agent ``n`` always trains from the same
    initial weights with the same minibatch sequence (seeds derived from
    ``seed`` and ``n``), so the value is a fixed function of ``x`` (common random
    numbers across queries); ``__call__`` and :meth:`evaluate_true` agree.

    Subclasses load the images; this class partitions them
    (:func:`~fbo_torch.objectives.label_partition.dirichlet_label_partition`)
    and keeps only the samples the agents use, on ``device``.

    Args:
        images: ``n x C x s x s`` float images with pixels in ``[0, 1]`` (any
            device), or raw images that ``transform`` turns into those.
        labels: ``n`` integer class labels.
        num_agents: Number of agents ``N``.
        alpha: Dirichlet label-skew concentration.
        samples_per_agent: Mean samples per agent (train + validation).
        min_samples_per_agent: Minimum samples per agent.
        size_spread: Log-normal spread of the agents' sizes.
        val_fraction: Validation fraction of each agent's samples.
        steps: SGD steps per training run.
        batch_size: Minibatch size.
        channels: Widths of the two convolutions.
        device: Device of the data and the training (default: CPU).
        seed: Seed of the partition and of the training runs.
        max_configs_per_batch: Train at most this many configurations per
            stacked model (memory cap); ``None`` trains all ``k q`` at once.
        num_classes: Number of classes (default: ``labels.max() + 1``).
        search_space: A :class:`SearchSpace` (or its dict form) over exactly
            ``learning_rate``, ``lr_decay`` and ``l2``; default
            :func:`default_cnn_search_space`.
        transform: Optional map applied to the *selected* samples only (e.g.
            ``uint8 -> float`` for a large dataset of which the agents use a few).
        trainer: How the CNNs train (:class:`~fbo_torch.objectives.cnn.TrainerOptions`
            or its keyword dict, e.g. ``{autocast_dtype: bfloat16, allow_tf32: true}``);
            default float32, TF32 off, CUDA graphs on CUDA.
    """

    value_name = "accuracy"
    _loss_name = "validation error"

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        num_agents: int,
        alpha: float = 0.5,
        samples_per_agent: int = 200,
        min_samples_per_agent: int = 20,
        size_spread: float = 0.3,
        val_fraction: float = 0.2,
        steps: int = 200,
        batch_size: int = 32,
        channels: Sequence[int] = (16, 32),
        device: torch.device | str | None = None,
        seed: int = 0,
        max_configs_per_batch: int | None = None,
        num_classes: int | None = None,
        search_space: SearchSpace | dict[str, Any] | None = None,
        transform: Callable[[Tensor], Tensor] | None = None,
        trainer: TrainerOptions | dict[str, Any] | None = None,
    ) -> None:
        self.search_space = as_search_space(search_space, default_cnn_search_space(), HYPERPARAMETER_NAMES)
        self._columns = [self.search_space.index(name) for name in HYPERPARAMETER_NAMES]
        check_tensor("images", images)
        check_tensor("labels", labels)
        if labels.shape != images.shape[:1]:
            raise ValueError(f"`labels` must have shape ({images.shape[0]},), got {tuple(labels.shape)}.")
        self.num_agents = check_int("num_agents", num_agents, minimum=1)
        self.steps = check_int("steps", steps, minimum=1)
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.seed = int(seed)
        if max_configs_per_batch is not None:
            max_configs_per_batch = check_int("max_configs_per_batch", max_configs_per_batch, minimum=1)
        self.max_configs_per_batch = max_configs_per_batch
        self.device = _check_device(device)
        self.trainer_options = _as_trainer_options(trainer)
        num_classes = int(labels.max()) + 1 if num_classes is None else check_int("num_classes", num_classes, minimum=2)
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
            raise ValueError(
                f"`labels` must lie in [0, {num_classes}), got [{int(labels.min())}, {int(labels.max())}]."
            )
        self.num_classes = num_classes

        parts = dirichlet_label_partition(
            labels,
            num_agents=self.num_agents,
            alpha=alpha,
            samples_per_agent=samples_per_agent,
            min_samples_per_agent=min_samples_per_agent,
            size_spread=size_spread,
            val_fraction=val_fraction,
            seed=self.seed,
        )
        # Keep only the samples the agents use, re-indexed into a compact pool.
        selected = torch.cat([torch.cat([p.train, p.val]) for p in parts])
        #: Indices (into the dataset given to the constructor) of the pooled samples.
        self.source_index = selected
        pooled = images[selected.to(images.device)]
        if transform is not None:
            pooled = transform(pooled)
        check_ndim("images", pooled, 4, "n x channels x height x width")
        if pooled.shape[-1] != pooled.shape[-2]:
            raise ValueError(f"`images` must be square, got {tuple(pooled.shape[1:])} per image.")
        self.images = pooled.to(device=self.device, dtype=torch.float32)
        self.labels = labels[selected.to(labels.device)].to(device=self.device, dtype=torch.long)
        self.agent_train: list[Tensor] = []
        self.agent_val: list[Tensor] = []
        offset = 0
        for p in parts:
            nt, nv = p.train.numel(), p.val.numel()
            self.agent_train.append(torch.arange(offset, offset + nt, device=self.device))
            self.agent_val.append(torch.arange(offset + nt, offset + nt + nv, device=self.device))
            offset += nt + nv
        self.agent_seeds = [_derive_seed(self.seed, _TRAINING_STREAM, n) for n in range(self.num_agents)]

        self.model = SmallCNN(
            image_size=self.images.shape[-1],
            in_channels=self.images.shape[1],
            num_classes=num_classes,
            channels=channels,
        )

    # ----------------------------------------------------------------- mapping
    def hyperparameters(self, X: Tensor) -> Tensor:
        r"""Native (learning rate, lr decay, L2) of unit-cube inputs.

        Args:
            X: ``... x 3`` points in ``[0, 1]^3`` (search-space column order).

        Returns:
            ``... x 3`` float64 values in the order :data:`HYPERPARAMETER_NAMES`
            (default mapping: ``exp(log 1e-7 + x (log 0.02 - log 1e-7))`` per column).
        """
        X = check_tensor("X", X)
        return self.search_space.to_native(X.to(torch.float64))[..., self._columns]

    def inputs_from_hyperparameters(self, H: Tensor) -> Tensor:
        r"""Inverse of :meth:`hyperparameters`: ``... x 3`` (lr, decay, L2) values to ``[0, 1]^3``."""
        H = check_tensor("H", H).to(torch.float64)
        V = torch.empty_like(H)
        V[..., self._columns] = H
        return self.search_space.from_native(V)

    # ----------------------------------------------------------------- data info
    def agent_sizes(self) -> Tensor:
        """``num_agents x 2`` numbers of training and validation samples per agent."""
        return torch.tensor([[t.numel(), v.numel()] for t, v in zip(self.agent_train, self.agent_val, strict=True)])

    def agent_label_histograms(self) -> Tensor:
        """``num_agents x num_classes`` label counts of each agent (train + validation)."""
        hist = torch.zeros(self.num_agents, self.num_classes, dtype=torch.long)
        labels = self.labels.cpu()
        for n, (t, v) in enumerate(zip(self.agent_train, self.agent_val, strict=True)):
            hist[n] = torch.bincount(labels[torch.cat([t, v]).cpu()], minlength=self.num_classes)
        return hist

    # ----------------------------------------------------------------- objective
    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        k, q, _ = X.shape
        H = self.hyperparameters(X).reshape(k * q, 3)
        config_agents = agents.repeat_interleave(q).tolist()
        K = len(config_agents)
        chunk = K if self.max_configs_per_batch is None else self.max_configs_per_batch
        accs = []
        for start in range(0, K, chunk):
            ids = config_agents[start : start + chunk]
            h = H[start : start + chunk].to(self.device)
            accs.append(
                train_cnn_batched(
                    self.model,
                    self.images,
                    self.labels,
                    [self.agent_train[a] for a in ids],
                    [self.agent_val[a] for a in ids],
                    lr=h[:, 0],
                    lr_decay=h[:, 1],
                    l2=h[:, 2],
                    seeds=[self.agent_seeds[a] for a in ids],
                    steps=self.steps,
                    batch_size=self.batch_size,
                    options=self.trainer_options,
                )
            )
        return torch.cat(accs).reshape(k, q).to(X)


def federation_arguments(values: dict[str, Any]) -> dict[str, Any]:
    r"""The arguments of :class:`AgentImageCNN` among ``values`` (a subclass constructor's ``locals()``).

    A dataset's subclass differs from :class:`AgentImageCNN` only in how it loads
    ``images`` and ``labels`` and in its defaults; every other argument passes
    through unchanged, under its own name.
    """
    names = inspect.signature(AgentImageCNN.__init__).parameters
    return {k: v for k, v in values.items() if k in names and k != "self"}


class DigitsCNN(AgentImageCNN):
    r"""CNN tuning on scikit-learn's 8 x 8 handwritten digits, split into label-skewed agents.

    ``sklearn.datasets.load_digits()`` (1,797 real images of the digits 0-9,
    16 gray levels, shipped with scikit-learn) with pixels scaled to ``[0, 1]``,
    partitioned into ``num_agents`` agents by
    :func:`~fbo_torch.objectives.label_partition.dirichlet_label_partition`.
    The offline stand-in for :class:`EMNISTCNN`. The defaults are sized for a
    CPU: one call for 10 agents x 1 configuration (120 SGD steps each) takes
    about a second of one core (see docs/design.md). With seed 0, the mean
    validation accuracy over the 10 agents is ~0.81 (0.71-1.0 per agent) at
    (learning rate, decay, L2) = (0.02, 1e-4, 1e-6), ~0.38 at learning rate
    1e-3 and ~0.15 at 1e-7.

    Args:
        num_agents: Number of agents (``num_agents x min_samples_per_agent <= 1797``).
        alpha: Dirichlet label-skew concentration.
        samples_per_agent: Mean samples per agent (train + validation).
        min_samples_per_agent: Minimum samples per agent.
        size_spread: Log-normal spread of the agents' sizes.
        val_fraction: Validation fraction of each agent's samples.
        steps: SGD steps per training run.
        batch_size: Minibatch size.
        channels: Widths of the two convolutions.
        device: Device of the data and the training (default: CPU).
        seed: Seed of the partition and of the training runs.
        max_configs_per_batch: Memory cap on configurations per stacked model.
        search_space: Search space over ``learning_rate``, ``lr_decay``, ``l2``
            (default :func:`default_cnn_search_space`, the paper's ranges).
        trainer: How the CNNs train (:class:`~fbo_torch.objectives.cnn.TrainerOptions`
            or its keyword dict); default float32, TF32 off, CUDA graphs on CUDA.

    Example:
        >>> f = DigitsCNN(num_agents=10, seed=0)
        >>> f(torch.rand(10, 1, 3, dtype=torch.float64)).shape
        torch.Size([10, 1])
    """

    def __init__(
        self,
        num_agents: int = 10,
        alpha: float = 0.5,
        samples_per_agent: int = 150,
        min_samples_per_agent: int = 40,
        size_spread: float = 0.3,
        val_fraction: float = 0.25,
        steps: int = 120,
        batch_size: int = 32,
        channels: Sequence[int] = (16, 32),
        device: torch.device | str | None = None,
        seed: int = 0,
        max_configs_per_batch: int | None = None,
        search_space: SearchSpace | dict[str, Any] | None = None,
        trainer: TrainerOptions | dict[str, Any] | None = None,
    ) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        labels = torch.as_tensor(digits.target, dtype=torch.long)
        super().__init__(**federation_arguments(locals()), num_classes=10)


class EMNISTCNN(AgentImageCNN):
    r"""CNN tuning on EMNIST digits for ``N`` label-skewed agents (DP-FTS-DE's third experiment).

    Loads ``torchvision.datasets.EMNIST(root, split="digits", train=train)``
    (:func:`~fbo_torch.objectives.emnist.load_emnist_digits`, through
    :func:`~fbo_torch.utils.torchvision_compat.import_torchvision`), scales
    pixels to ``[0, 1]``, transposes the images to upright (EMNIST's idx files
    store them transposed; this does not change what a CNN can learn) and
    partitions the labels into ``num_agents`` agents by
    :func:`~fbo_torch.objectives.label_partition.dirichlet_label_partition`.
    Only the agents' samples are kept (a 50-agent federation with 200 samples
    each holds 10,000 images, ~31 MB).

    The paper's agents are the first 50 writers of TensorFlow Federated's EMNIST
    (about 100 digits each, ~10% held out); writer ids are not in torchvision's
    EMNIST, so label skew stands in for writer heterogeneity here.

    Args:
        root: Folder holding ``EMNIST/raw/emnist-digits-*-ubyte`` (torchvision's
            layout); default: the environment variable ``FBO_EMNIST_ROOT``, else the user data folder
            (:func:`~fbo_torch.utils.paths.user_data_dir`, where ``fbo-torch data emnist`` downloads it).
        num_agents: Number of agents ``N`` (the paper: 50).
        alpha: Dirichlet label-skew concentration.
        samples_per_agent: Mean samples per agent (train + validation).
        min_samples_per_agent: Minimum samples per agent.
        size_spread: Log-normal spread of the agents' sizes.
        val_fraction: Validation fraction of each agent's samples.
        steps: SGD steps per training run.
        batch_size: Minibatch size.
        channels: Widths of the two convolutions.
        train: Partition EMNIST's training file (``True``) or its test file.
        device: Device of the data and the training (default: CPU; use CUDA
            for the full 50-agent task).
        seed: Seed of the partition and of the training runs.
        download: Let torchvision download EMNIST (needs internet access).
        max_configs_per_batch: Memory cap on configurations per stacked model.
        search_space: Search space over ``learning_rate``, ``lr_decay``, ``l2``
            (default :func:`default_cnn_search_space`, the paper's ranges).
        trainer: How the CNNs train (:class:`~fbo_torch.objectives.cnn.TrainerOptions`
            or its keyword dict); default float32, TF32 off, CUDA graphs on CUDA.

    Raises:
        FileNotFoundError: If the EMNIST files are missing (the message says how
            to fetch them).
        ImportError: If torchvision is not installed.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        num_agents: int = 50,
        alpha: float = 0.5,
        samples_per_agent: int = 200,
        min_samples_per_agent: int = 40,
        size_spread: float = 0.3,
        val_fraction: float = 0.2,
        steps: int = 300,
        batch_size: int = 32,
        channels: Sequence[int] = (16, 32),
        train: bool = True,
        device: torch.device | str | None = None,
        seed: int = 0,
        download: bool = False,
        max_configs_per_batch: int | None = None,
        search_space: SearchSpace | dict[str, Any] | None = None,
        trainer: TrainerOptions | dict[str, Any] | None = None,
    ) -> None:
        images, labels, root = load_emnist_digits(root, train, download)
        super().__init__(**federation_arguments(locals()), num_classes=10, transform=emnist_to_float)
        self.root = root
