r"""The CNN trainer: many configurations of the small CNN (:mod:`fbo_torch.objectives.cnn_model`) at once.

The image-tuning objectives (:mod:`fbo_torch.objectives.vision`) evaluate one
round of queries, ``k`` agents x ``q`` points, as ``K = k * q`` CNN trainings.
:func:`train_cnn_batched` runs all ``K`` of them as *one* stacked model whose
parameters carry a leading ``K`` dimension (the layout of
:func:`torch.func.stack_module_state`: same names as
``SmallCNN.named_parameters()``, each ``K x ...``). One training step is a
single forward/backward pass of the stacked model:

* the ``K`` minibatches are laid out as ``B x (K * C) x H x W`` and each
  convolution is **one grouped convolution** (``groups=K``, weights
  ``(K * C_out) x C_in x k x k``), so configuration ``k`` only sees its own
  channels; ReLU and max pooling act on that layout unchanged;
* the output layer is one batched matrix product (``torch.baddbmm``);
* the loss is ``Σ_k loss_k`` — the configurations share no parameters, so its
  gradient with respect to configuration ``k``'s parameters is the gradient of
  ``loss_k`` alone — and one ``torch.autograd.grad`` call gives all gradients.

Why grouped convolutions rather than ``vmap(grad(functional_call(...)))``:
PyTorch's ``vmap`` batching rule turns a convolution with per-sample weights
into the very same grouped convolution, so the results agree to float
rounding, but the hand-written version is faster per step (no functorch
dispatch overhead; see docs/design.md). It is plain tensor code and runs
unchanged on CUDA. There is no Python loop over configurations inside a
step; the only per-configuration Python work is drawing each configuration's
seeded initial weights and minibatch indices once, before training.

On a CPU, stacking pays for the small 8 x 8 digits network; for 28 x 28
EMNIST images oneDNN's grouped convolutions can be *slower* than ``K``
separate convolutions, so run the 50-agent EMNIST task on CUDA, where one
grouped cuDNN launch per layer replaces ``K`` small ones
(``benchmarks/cnn_training.py`` measures both; docs/design.md has numbers).

How a training run executes (:class:`TrainerOptions`):

* **Everything on the device before the first step.** The stacked initial
  weights, all ``steps x B x K`` minibatch indices, their labels and the
  per-step learning rates are built once and moved in one copy each; a step
  reads its slice through a one-element step counter *on the device*
  (``index_select``), so the loop never reads a value back to the host: no
  ``.item()``, ``bool(tensor)`` or data-dependent shapes between the first and
  the last step (``tests/objectives/test_vision.py`` checks this on CPU by intercepting
  every host-reading tensor method during the steps).
* **CUDA graphs** (``cuda_graph``, default on for CUDA): after 3 eager warm-up
  steps on a side stream (cuDNN autotuning, allocator warm-up), one step —
  forward, backward and SGD update, counter increment included — is captured
  once and replayed for the remaining steps, so a step costs one launch
  instead of ~40 (small ``K`` is launch-bound on a GPU). Graph and eager
  execution run the same kernels on the same tensors.
* **Layouts**: channels-last activations (``channels_last``; default on for
  CPU, where oneDNN's grouped convolutions and max pooling are several times
  faster in that layout, and on CUDA with bf16 autocast or TF32, where cuDNN's
  tensor-core kernels want NHWC). Max pooling runs before the ReLU (the same
  function and gradient, ReLU being monotone) so the ReLU touches 4x fewer
  values.
* **cuDNN**: ``benchmark`` autotuning on (off with ``deterministic=True``,
  which also makes cuDNN pick deterministic kernels).
* **Precision**: the parameters, gradients and the loss are in ``dtype``
  (float32 by default; float64 for exact comparisons in tests). TF32 is **off**
  on CUDA unless ``allow_tf32=True`` (PyTorch enables it for cuDNN
  convolutions by default, which changes results at the ~1e-3 level);
  ``autocast_dtype=torch.bfloat16`` runs the convolutions and the output layer
  under :func:`torch.autocast` (float32 master weights, no loss scaling needed
  for bf16). The CUDA backend flags are set for the duration of a call and
  restored afterwards (not thread-safe, like the flags themselves).

Training maths (identical in :func:`train_cnn_single`, the plain reference):

* **Initialization**: He-uniform ``U(±sqrt(6 / fan_in))`` for the convolution
  kernels (they feed ReLUs), Glorot-uniform ``U(±sqrt(6 / (fan_in + fan_out)))``
  for the output layer, zero biases; drawn on the CPU from a
  ``torch.Generator`` seeded with the configuration's seed, so CPU and CUDA runs
  start from the same weights. (Keras' default, Glorot everywhere, learns too
  slowly at the largest allowed learning rate 0.02: after 100 SGD steps on the
  digits task it was still at chance, He-initialized convolutions at ~70%.)
* **Minibatches**: ``steps`` minibatches of ``batch_size`` indices drawn
  uniformly *with replacement* from the configuration's own training indices,
  from the same generator right after the weights. Configurations of agents
  with different data sizes thus share the batch shape.
* **Loss**: mean cross-entropy plus the Keras ``l2(λ)`` kernel penalty
  ``λ Σ_w ||w||²`` over the weight tensors (not the biases).
* **Optimizer**: plain SGD, ``θ ← θ - lr_t ∇loss``. Since
  ``∇(λ||w||²) = 2λw``, this is the same as SGD on the cross-entropy with
  ``torch.optim.SGD(weight_decay=2λ)`` applied to the weights only, which is
  how the batched trainer computes it (the penalty's gradient ``2λw`` is added
  to the cross-entropy gradient, not differentiated through a loss term).
* **Learning-rate decay** (Keras' legacy ``SGD(lr, decay)``):
  ``lr_t = lr / (1 + decay · t)`` for steps ``t = 0, 1, ..., steps - 1``.
* **Metric**: accuracy on the configuration's own validation indices.

The networks run in ``dtype`` (float32 by default) on the device of the
``images`` tensor. On CPU a run is bitwise deterministic for its seed and
machine; other CPUs (AVX2 vs AVX-512 kernels) and CUDA agree to float rounding,
which SGD amplifies over the steps: a float32 trajectory is close to the float64
one only within that amplified rounding error (``tests/objectives/test_vision.py`` derives
the bound), and the batched trainer equals the plain loop to ~1e-12 in float64.
On CUDA, cuDNN may pick non-deterministic backward kernels unless
``deterministic=True``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor

from fbo_torch.objectives.cnn_model import (
    SmallCNN,
    _check_model,
    _grouped_forward,
    init_cnn_parameters,
    stacked_cnn_forward,
)
from fbo_torch.objectives.cnn_options import TrainerOptions, _as_dtype, _autocast, cuda_backend_flags
from fbo_torch.utils.validation import check_int, check_ndim, check_tensor

# SmallCNN, init_cnn_parameters, stacked_cnn_forward live in fbo_torch.objectives.cnn_model, TrainerOptions
# and cuda_backend_flags in fbo_torch.objectives.cnn_options; imported from here they still work
__all__ = [
    "SmallCNN",
    "TrainerOptions",
    "cuda_backend_flags",
    "init_cnn_parameters",
    "lr_schedule",
    "sample_minibatch_indices",
    "stacked_cnn_forward",
    "train_cnn_batched",
    "train_cnn_single",
]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(int(seed))


def sample_minibatch_indices(num_samples: int, steps: int, batch_size: int, generator: torch.Generator) -> Tensor:
    r"""``steps x batch_size`` indices in ``[0, num_samples)``, uniform with replacement (CPU)."""
    return torch.randint(num_samples, (steps, batch_size), generator=generator)


def lr_schedule(lr: Tensor, lr_decay: Tensor, steps: int, dtype: torch.dtype = torch.float32) -> Tensor:
    r"""Keras-style decayed learning rates ``lr / (1 + decay · t)``, ``t = 0, ..., steps-1``.

    Args:
        lr: ``K`` initial learning rates.
        lr_decay: ``K`` decay coefficients.
        steps: Number of SGD steps.
        dtype: Dtype of the result.

    Returns:
        ``steps x K`` learning rates (computed in float64, then rounded to ``dtype``).
    """
    t = torch.arange(steps, dtype=torch.float64, device=lr.device).unsqueeze(-1)
    sched = lr.double().unsqueeze(0) / (1.0 + lr_decay.double().unsqueeze(0) * t)
    return sched.to(dtype)


def _as_config_vector(name: str, value: float | Tensor | Sequence[float], K: int) -> Tensor:
    """``K`` float64 values on the CPU, checked finite and ``>= 0``."""
    v = torch.as_tensor(value).detach().to(device="cpu", dtype=torch.float64).reshape(-1)
    if v.numel() == 1 and K != 1:
        v = v.expand(K)
    if v.numel() != K:
        raise ValueError(f"`{name}` must hold one value per configuration ({K}), got {v.numel()}.")
    if not torch.isfinite(v).all() or (v < 0).any():
        raise ValueError(f"`{name}` must be finite and >= 0, got {v.tolist()}.")
    return v


def _check_data(model: SmallCNN, images: Tensor, labels: Tensor) -> None:
    check_ndim("images", images, 4, "n x channels x height x width")
    if not images.is_floating_point():
        raise TypeError(f"`images` must be a floating-point tensor, got dtype {images.dtype}.")
    s, c = model.image_size, model.in_channels
    if tuple(images.shape[1:]) != (c, s, s):
        raise ValueError(f"`images` must have shape n x {c} x {s} x {s} for this model, got {tuple(images.shape)}.")
    check_tensor("labels", labels)
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(f"`labels` must have shape ({images.shape[0]},) to match `images`, got {tuple(labels.shape)}.")
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise TypeError(f"`labels` must hold integer class indices, got dtype {labels.dtype}.")
    if labels.device != images.device:
        raise ValueError(f"`labels` must be on the device of `images` ({images.device}), got {labels.device}.")


def _check_index(name: str, idx: Tensor, n: int) -> Tensor:
    """A non-empty long index vector into ``[0, n)``, on the CPU (validated there: no device syncs)."""
    idx = torch.as_tensor(idx).detach().reshape(-1).cpu()
    if idx.is_floating_point() or idx.dtype == torch.bool:
        raise TypeError(f"`{name}` must hold integer indices, got dtype {idx.dtype}.")
    if idx.numel() == 0:
        raise ValueError(f"`{name}` is empty; every configuration needs at least one sample.")
    if (idx < 0).any() or (idx >= n).any():
        raise ValueError(f"`{name}` has indices outside [0, {n}).")
    return idx.long()


# --------------------------------------------------------------------------- single
def train_cnn_single(
    model: SmallCNN,
    images: Tensor,
    labels: Tensor,
    train_index: Tensor,
    val_index: Tensor,
    lr: float,
    lr_decay: float,
    l2: float,
    seed: int,
    steps: int = 200,
    batch_size: int = 32,
    dtype: torch.dtype | str = torch.float32,
) -> tuple[float, SmallCNN]:
    r"""Train one network with a plain PyTorch loop (the reference for the batched trainer).

    Same maths and seed handling as :func:`train_cnn_batched` (see the module
    docstring), written as an ordinary ``loss.backward()`` / in-place SGD loop
    on an ``nn.Module``, with the L2 penalty in the loss.

    Args:
        model: Architecture template (:class:`SmallCNN`); it is copied, not modified.
        images: ``n x C x H x W`` float images (the pool all indices refer to).
        labels: ``n`` integer class labels on ``images.device``.
        train_index: Indices of this configuration's training samples.
        val_index: Indices of its validation samples.
        lr: Initial learning rate.
        lr_decay: Keras learning-rate decay (``lr_t = lr / (1 + lr_decay · t)``).
        l2: Coefficient ``λ`` of the penalty ``λ Σ ||w||²`` on the weights.
        seed: Seed of the initial weights and the minibatch indices.
        steps: Number of SGD steps.
        batch_size: Minibatch size.
        dtype: ``torch.float32`` or ``torch.float64`` (parameters, data, loss).

    Returns:
        ``(accuracy, trained_model)``: validation accuracy and the trained copy
        of ``model`` (in ``dtype``, on ``images.device``).
    """
    _check_model(model)
    _check_data(model, images, labels)
    steps = check_int("steps", steps, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    dtype = _as_dtype("dtype", dtype, (torch.float32, torch.float64))
    device = images.device
    train_index = _check_index("train_index", train_index, images.shape[0])
    val_index = _check_index("val_index", val_index, images.shape[0]).to(device)
    lr_v, decay_v, l2_v = (_as_config_vector(n, v, 1) for n, v in (("lr", lr), ("lr_decay", lr_decay), ("l2", l2)))
    sched = lr_schedule(lr_v, decay_v, steps, dtype)[:, 0].to(device)
    lam = l2_v.to(device=device, dtype=dtype)[0]

    gen = _generator(seed)
    init = init_cnn_parameters(model, gen)
    local = sample_minibatch_indices(train_index.numel(), steps, batch_size, gen)
    batches = train_index[local].to(device)  # steps x B
    net = copy.deepcopy(model).to(device=device, dtype=dtype)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(init[name])
    weights = [p for name, p in net.named_parameters() if name.endswith("weight")]
    x_all = images.to(dtype)
    for t in range(steps):
        idx = batches[t]
        ce = F.cross_entropy(net(x_all[idx]), labels[idx])
        loss = ce + lam * sum(w.pow(2).sum() for w in weights)
        net.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for p in net.parameters():
                if p.grad is not None:  # every parameter of a SmallCNN takes part in the loss
                    p.sub_(sched[t] * p.grad)
    net.zero_grad(set_to_none=True)
    with torch.no_grad():
        pred = net(x_all[val_index]).argmax(-1)
        acc = (pred == labels[val_index]).to(dtype).mean().item()
    return acc, net


# --------------------------------------------------------------------------- batched
#: Eager steps before a CUDA graph is captured (cuDNN autotuning, allocator warm-up).
_GRAPH_WARMUP_STEPS = 3


class _StackedSGD:
    r"""The training loop of :func:`train_cnn_batched`: all state on the device, no host reads.

    ``batch_index``: ``steps x (B K)`` image indices (row ``t``: minibatch ``b``
    of configuration ``k`` at ``b K + k``); ``batch_labels``: ``steps x (K B)``
    their labels in configuration-major order; ``lr``: ``steps x K`` rates;
    ``two_l2``: ``K`` coefficients ``2λ``. :meth:`step` reads row ``t`` through
    the device counter ``self.t`` and advances it, so the same captured CUDA
    graph serves every step.
    """

    def __init__(
        self,
        model: SmallCNN,
        params: dict[str, Tensor],
        images: Tensor,
        batch_index: Tensor,
        batch_labels: Tensor,
        lr: Tensor,
        two_l2: Tensor,
        batch_size: int,
        options: TrainerOptions,
    ) -> None:
        self.model, self.params, self.images = model, params, images
        self.batch_index, self.batch_labels, self.lr = batch_index, batch_labels, lr
        self.B, self.K = batch_size, lr.shape[1]
        self.options = options
        self.device = images.device
        self.channels_last = options.use_channels_last(self.device)
        self.names = list(params)
        self.leaves = [params[n] for n in self.names]
        self.views = [(self.K,) + (1,) * (params[n].ndim - 1) for n in self.names]
        # 2λ broadcast per weight tensor (biases carry no penalty)
        self.decay = {n: two_l2.view(v) for n, v in zip(self.names, self.views, strict=True) if n.endswith("weight")}
        self.t = torch.zeros(1, dtype=torch.long, device=self.device)

    def step(self) -> None:
        """One SGD step of all ``K`` networks."""
        B, K = self.B, self.K
        C, H, W = self.images.shape[1:]
        idx = self.batch_index.index_select(0, self.t).reshape(-1)  # (B K)
        x = self.images.index_select(0, idx).reshape(B, K * C, H, W)
        with _autocast(self.device, self.options):
            logits = _grouped_forward(self.model, self.params, x, K, self.channels_last)
        logits = logits.to(self.options.dtype).reshape(K * B, -1)
        y = self.batch_labels.index_select(0, self.t).reshape(-1)
        # Σ_k mean_b CE: configuration k's parameters only see its own mean
        loss = F.cross_entropy(logits, y, reduction="sum") / B
        grads = torch.autograd.grad(loss, self.leaves)
        lr = self.lr.index_select(0, self.t).reshape(K)
        with torch.no_grad():
            for name, p, g, view in zip(self.names, self.leaves, grads, self.views, strict=True):
                if name in self.decay:  # ∇(λ||w||²) = 2λw
                    g = torch.addcmul(g, p, self.decay[name])
                p.addcmul_(g, lr.view(view), value=-1.0)
            self.t.add_(1)

    def run(self, steps: int) -> None:
        """``steps`` SGD steps, eagerly or (CUDA) replayed from one captured graph."""
        if not self.options.use_cuda_graph(self.device):
            for _ in range(steps):
                self.step()
            return
        warm = min(steps, _GRAPH_WARMUP_STEPS)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(warm):  # real steps: the trajectory continues from them
                self.step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        if steps == warm:
            return
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # records one step; nothing runs during capture
            self.step()
        for _ in range(steps - warm):
            graph.replay()
        del graph


def _prepare_batched(
    model: SmallCNN,
    images: Tensor,
    labels: Tensor,
    train_indices: Sequence[Tensor],
    val_indices: Sequence[Tensor],
    lr: Tensor | Sequence[float] | float,
    lr_decay: Tensor | Sequence[float] | float,
    l2: Tensor | Sequence[float] | float,
    seeds: Sequence[int] | Tensor,
    steps: int,
    batch_size: int,
    options: TrainerOptions,
) -> tuple[_StackedSGD, list[Tensor]]:
    """Validate the arguments and build the on-device training state."""
    _check_model(model)
    _check_data(model, images, labels)
    K = len(train_indices)
    if K == 0:
        raise ValueError("`train_indices` must hold at least one configuration.")
    if len(val_indices) != K:
        raise ValueError(f"`val_indices` must hold {K} index tensors (one per configuration), got {len(val_indices)}.")
    seeds = [int(s) for s in (seeds.reshape(-1).tolist() if isinstance(seeds, Tensor) else seeds)]
    if len(seeds) != K:
        raise ValueError(f"`seeds` must hold {K} integers (one per configuration), got {len(seeds)}.")
    device, dtype = images.device, options.dtype
    n = images.shape[0]
    lr_v = _as_config_vector("lr", lr, K)
    decay_v = _as_config_vector("lr_decay", lr_decay, K)
    two_l2 = 2.0 * _as_config_vector("l2", l2, K)
    tr = [_check_index(f"train_indices[{k}]", t, n) for k, t in enumerate(train_indices)]
    va = [_check_index(f"val_indices[{k}]", v, n) for k, v in enumerate(val_indices)]

    # Per-configuration seeded initial weights and minibatches, drawn on the CPU
    # (the same numbers on every device), then moved in one copy each.
    inits, batches = [], []
    for k in range(K):
        gen = _generator(seeds[k])
        inits.append(init_cnn_parameters(model, gen))
        batches.append(tr[k][sample_minibatch_indices(tr[k].numel(), steps, batch_size, gen)])
    params = {
        name: torch.stack([p[name] for p in inits]).to(device=device, dtype=dtype).requires_grad_() for name in inits[0]
    }
    batch_index = torch.stack(batches, dim=-1).to(device)  # steps x B x K
    batch_labels = labels[batch_index].transpose(1, 2).reshape(steps, K * batch_size)
    trainer = _StackedSGD(
        model,
        params,
        images.to(dtype),
        batch_index.reshape(steps, batch_size * K),
        batch_labels,
        lr_schedule(lr_v, decay_v, steps, dtype).to(device),
        two_l2.to(device=device, dtype=dtype),
        batch_size,
        options,
    )
    return trainer, va


@overload
def train_cnn_batched(
    model: SmallCNN,
    images: Tensor,
    labels: Tensor,
    train_indices: Sequence[Tensor],
    val_indices: Sequence[Tensor],
    lr: Tensor | Sequence[float] | float,
    lr_decay: Tensor | Sequence[float] | float,
    l2: Tensor | Sequence[float] | float,
    seeds: Sequence[int] | Tensor,
    steps: int = ...,
    batch_size: int = ...,
    eval_chunk_size: int = ...,
    return_params: Literal[False] = ...,
    options: TrainerOptions | None = ...,
) -> Tensor: ...
@overload
def train_cnn_batched(
    model: SmallCNN,
    images: Tensor,
    labels: Tensor,
    train_indices: Sequence[Tensor],
    val_indices: Sequence[Tensor],
    lr: Tensor | Sequence[float] | float,
    lr_decay: Tensor | Sequence[float] | float,
    l2: Tensor | Sequence[float] | float,
    seeds: Sequence[int] | Tensor,
    steps: int = ...,
    batch_size: int = ...,
    eval_chunk_size: int = ...,
    *,
    return_params: Literal[True],
    options: TrainerOptions | None = ...,
) -> tuple[Tensor, dict[str, Tensor]]: ...
@overload
def train_cnn_batched(
    model: SmallCNN,
    images: Tensor,
    labels: Tensor,
    train_indices: Sequence[Tensor],
    val_indices: Sequence[Tensor],
    lr: Tensor | Sequence[float] | float,
    lr_decay: Tensor | Sequence[float] | float,
    l2: Tensor | Sequence[float] | float,
    seeds: Sequence[int] | Tensor,
    steps: int = ...,
    batch_size: int = ...,
    eval_chunk_size: int = ...,
    return_params: bool = ...,
    options: TrainerOptions | None = ...,
) -> Tensor | tuple[Tensor, dict[str, Tensor]]: ...
def train_cnn_batched(
    model: SmallCNN,
    images: Tensor,
    labels: Tensor,
    train_indices: Sequence[Tensor],
    val_indices: Sequence[Tensor],
    lr: Tensor | Sequence[float] | float,
    lr_decay: Tensor | Sequence[float] | float,
    l2: Tensor | Sequence[float] | float,
    seeds: Sequence[int] | Tensor,
    steps: int = 200,
    batch_size: int = 32,
    eval_chunk_size: int = 512,
    return_params: bool = False,
    options: TrainerOptions | None = None,
) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
    r"""Train ``K`` configurations of ``model`` at once and return their validation accuracies.

    Configuration ``k`` trains its own copy of the network on its own data
    (``train_indices[k]`` into the shared pool ``images``) with its own learning
    rate, learning-rate decay, L2 coefficient and seed; the ``K`` networks are
    stacked and advanced together, one grouped forward/backward pass per step
    (see the module docstring). The result for configuration ``k`` equals
    :func:`train_cnn_single` with the same arguments up to float rounding, so
    ``K`` configurations in one call equal ``K`` separate runs.

    Args:
        model: Architecture template (:class:`SmallCNN`); not modified.
        images: ``n x C x H x W`` float images; all work happens on its device.
        labels: ``n`` integer class labels on the same device.
        train_indices: ``K`` index tensors into ``images`` (training data of
            each configuration; sizes may differ; any device, validated on the CPU).
        val_indices: ``K`` index tensors (validation data; sizes may differ).
        lr: ``K`` initial learning rates (or one value for all).
        lr_decay: ``K`` Keras decays, ``lr_t = lr / (1 + lr_decay · t)`` (or one value).
        l2: ``K`` coefficients ``λ`` of the penalty ``λ Σ ||w||²`` on the weights (or one value).
        seeds: ``K`` integer seeds (initial weights and minibatch indices).
            Configurations with equal seeds and training data start from the
            same weights and see the same minibatches (common random numbers).
        steps: Number of SGD steps.
        batch_size: Minibatch size per configuration.
        eval_chunk_size: Validation images per configuration per forward pass.
        return_params: Also return the trained stacked parameters.
        options: Precision, layout and CUDA execution (:class:`TrainerOptions`;
            default float32, TF32 off, CUDA graphs on CUDA).

    Returns:
        ``K`` validation accuracies (``options.dtype``) on ``images.device``;
        with ``return_params``, also a dict of stacked ``K x ...`` parameters.

    Example:
        >>> net = SmallCNN(image_size=8)
        >>> acc = train_cnn_batched(net, X, y, [tr0, tr1], [va0, va1],
        ...                         lr=[0.02, 1e-7], lr_decay=1e-4, l2=1e-5, seeds=[0, 0])
    """
    steps = check_int("steps", steps, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    eval_chunk_size = check_int("eval_chunk_size", eval_chunk_size, minimum=1)
    if options is None:
        options = TrainerOptions()
    elif not isinstance(options, TrainerOptions):
        raise TypeError(f"`options` must be a TrainerOptions, got {type(options).__name__}.")
    trainer, va = _prepare_batched(
        model, images, labels, train_indices, val_indices, lr, lr_decay, l2, seeds, steps, batch_size, options
    )
    with cuda_backend_flags(images.device, options):
        trainer.run(steps)
        params = {name: p.detach() for name, p in trainer.params.items()}
        acc = _batched_accuracy(model, params, trainer.images, labels, va, eval_chunk_size, trainer.channels_last)
    if return_params:
        return acc, params
    return acc


def _batched_accuracy(
    model: SmallCNN,
    params: dict[str, Tensor],
    images: Tensor,
    labels: Tensor,
    val_indices: Sequence[Tensor],
    chunk: int,
    channels_last: bool,
) -> Tensor:
    """Validation accuracy of each stacked network on its own (padded, masked) validation set.

    ``val_indices`` are CPU tensors; the padded index matrix is built there and
    moved once. Evaluated in the parameters' dtype (no autocast).
    """
    device = images.device
    K = len(val_indices)
    sizes = [v.numel() for v in val_indices]
    vmax = max(sizes)
    padded = torch.zeros(vmax, K, dtype=torch.long)
    for k, v in enumerate(val_indices):
        padded[: v.numel(), k] = v
    sizes_t = torch.tensor(sizes)
    mask = (torch.arange(vmax).unsqueeze(1) < sizes_t.unsqueeze(0)).to(device)  # vmax x K
    padded = padded.to(device)
    C, H, W = images.shape[1:]
    correct = torch.zeros(K, dtype=images.dtype, device=device)
    with torch.no_grad():
        for start in range(0, vmax, chunk):
            idx = padded[start : start + chunk]  # b x K
            x = images[idx].reshape(idx.shape[0], K * C, H, W)
            pred = _grouped_forward(model, params, x, K, channels_last).argmax(-1)  # K x b
            hit = (pred == labels[idx.T]) & mask[start : start + chunk].T
            correct += hit.sum(-1).to(correct.dtype)
    return correct / sizes_t.to(device=device, dtype=correct.dtype)
