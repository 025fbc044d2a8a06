r"""A small CNN and a trainer that trains many hyperparameter configurations at once.

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
rounding, but on this 2-core CPU the hand-written version was 1.5-2x faster
per step (no functorch dispatch overhead; e.g. 9 ms vs 16 ms per step for
``K = 10`` configurations of the 8 x 8 network). It is plain tensor code and
runs unchanged on CUDA. There is no Python loop over configurations inside a
step; the only per-configuration Python work is drawing each configuration's
seeded initial weights and minibatch indices once, before training.

Measured on this 2-core CPU (one thread, CPU time): for the 8 x 8 digits task
ten configurations train 2-2.5x faster stacked than one after another. For
28 x 28 EMNIST images, oneDNN's grouped convolutions are *slower* than ``K``
separate convolutions (``K = 50``: ~0.55 s vs ~0.34 s per step of the two
convolution layers), so run the 50-agent EMNIST task on CUDA, where one
grouped cuDNN launch per layer replaces ``K`` small ones.

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
  ``torch.optim.SGD(weight_decay=2λ)`` applied to the weights only.
* **Learning-rate decay** (Keras' legacy ``SGD(lr, decay)``):
  ``lr_t = lr / (1 + decay · t)`` for steps ``t = 0, 1, ..., steps - 1``.
* **Metric**: accuracy on the configuration's own validation indices.

The networks run in float32 on the device of the ``images`` tensor. On CPU a
run is bitwise deterministic for its seed; on CUDA, cuDNN may pick
non-deterministic convolution backward kernels unless
``torch.backends.cudnn.deterministic = True`` (results then agree with the CPU
to float tolerance).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fbo_torch.utils.validation import check_int, check_ndim, check_tensor

__all__ = [
    "SmallCNN",
    "init_cnn_parameters",
    "lr_schedule",
    "sample_minibatch_indices",
    "stacked_cnn_forward",
    "train_cnn_batched",
    "train_cnn_single",
]


class SmallCNN(nn.Module):
    r"""``conv-relu-maxpool-conv-relu-maxpool-linear`` image classifier.

    Both convolutions are ``kernel_size x kernel_size`` with "same" padding, each
    followed by ReLU and 2 x 2 max pooling (floor), so an ``s x s`` image ends as
    a ``channels[1] x (s//2//2) x (s//2//2)`` feature map before the linear
    layer. With ``channels=(16, 32)`` the network has about 20k parameters for
    28 x 28 inputs (EMNIST) and 6k for 8 x 8 inputs (scikit-learn digits).

    Args:
        image_size: Side length ``s`` of the square input images (``>= 4``).
        in_channels: Number of input channels.
        num_classes: Number of output classes.
        channels: Output channels of the two convolutions.
        kernel_size: Odd convolution kernel size.

    Example:
        >>> net = SmallCNN(image_size=28)
        >>> net(torch.rand(5, 1, 28, 28)).shape
        torch.Size([5, 10])
    """

    def __init__(
        self,
        image_size: int = 28,
        in_channels: int = 1,
        num_classes: int = 10,
        channels: Sequence[int] = (16, 32),
        kernel_size: int = 3,
    ) -> None:
        super().__init__()
        image_size = check_int("image_size", image_size, minimum=4)
        in_channels = check_int("in_channels", in_channels, minimum=1)
        num_classes = check_int("num_classes", num_classes, minimum=2)
        kernel_size = check_int("kernel_size", kernel_size, minimum=1)
        if kernel_size % 2 == 0:
            raise ValueError(f"`kernel_size` must be odd ('same' padding), got {kernel_size}.")
        channels = tuple(channels)
        if len(channels) != 2:
            raise ValueError(f"`channels` must hold two convolution widths, got {channels}.")
        c1, c2 = (check_int(f"channels[{i}]", c, minimum=1) for i, c in enumerate(channels))
        self.image_size = image_size
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.channels = (c1, c2)
        self.kernel_size = kernel_size
        pad = kernel_size // 2
        self.conv1 = nn.Conv2d(in_channels, c1, kernel_size, padding=pad)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size, padding=pad)
        side = image_size // 2 // 2
        self.fc = nn.Linear(c2 * side * side, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``n x num_classes`` for images ``n x in_channels x s x s``."""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


# --------------------------------------------------------------------------- helpers
def _weight_names(model: nn.Module) -> list[str]:
    """Names of the tensors the L2 penalty applies to (kernels, not biases)."""
    return [name for name, _ in model.named_parameters() if name.endswith("weight")]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(int(seed))


def init_cnn_parameters(model: SmallCNN, generator: torch.Generator) -> dict[str, Tensor]:
    r"""Seeded initial parameters for ``model`` (float32, CPU).

    Convolution kernels are He-uniform ``U(±sqrt(6 / fan_in))``, the output
    layer's weight Glorot-uniform ``U(±sqrt(6 / (fan_in + fan_out)))`` (fans
    include the receptive field), biases zero. Tensors are drawn in
    ``model.named_parameters()`` order.

    Args:
        model: The architecture (its own parameter values are not used).
        generator: A CPU ``torch.Generator``.

    Returns:
        Parameter name -> fresh tensor.
    """
    params = {}
    for name, p in model.named_parameters():
        if name.endswith("weight"):
            fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(p)
            if p.ndim > 2:  # convolution followed by ReLU
                bound = math.sqrt(6.0 / fan_in)
            else:
                bound = math.sqrt(6.0 / (fan_in + fan_out))
            u = torch.rand(p.shape, generator=generator, dtype=torch.float32)
            params[name] = u.mul_(2 * bound).sub_(bound)
        else:
            params[name] = torch.zeros(p.shape, dtype=torch.float32)
    return params


def sample_minibatch_indices(
    num_samples: int, steps: int, batch_size: int, generator: torch.Generator
) -> Tensor:
    r"""``steps x batch_size`` indices in ``[0, num_samples)``, uniform with replacement (CPU)."""
    return torch.randint(num_samples, (steps, batch_size), generator=generator)


def lr_schedule(lr: Tensor, lr_decay: Tensor, steps: int) -> Tensor:
    r"""Keras-style decayed learning rates ``lr / (1 + decay · t)``, ``t = 0, ..., steps-1``.

    Args:
        lr: ``K`` initial learning rates.
        lr_decay: ``K`` decay coefficients.
        steps: Number of SGD steps.

    Returns:
        ``steps x K`` float32 learning rates (computed in float64, then rounded).
    """
    t = torch.arange(steps, dtype=torch.float64, device=lr.device).unsqueeze(-1)
    sched = lr.double().unsqueeze(0) / (1.0 + lr_decay.double().unsqueeze(0) * t)
    return sched.float()


def _as_config_vector(name: str, value: float | Tensor | Sequence[float], K: int, device) -> Tensor:
    v = torch.as_tensor(value, dtype=torch.float64).reshape(-1).to(device)
    if v.numel() == 1 and K != 1:
        v = v.expand(K)
    if v.numel() != K:
        raise ValueError(f"`{name}` must hold one value per configuration ({K}), got {v.numel()}.")
    if not torch.isfinite(v).all() or (v < 0).any():
        raise ValueError(f"`{name}` must be finite and >= 0, got {v.tolist()}.")
    return v


def _check_model(model: object) -> SmallCNN:
    if not isinstance(model, SmallCNN):
        raise TypeError(f"`model` must be a SmallCNN (the architecture template), got {type(model).__name__}.")
    return model


def _check_data(model: SmallCNN, images: Tensor, labels: Tensor) -> None:
    check_ndim("images", images, 4, "n x channels x height x width")
    s, c = model.image_size, model.in_channels
    if tuple(images.shape[1:]) != (c, s, s):
        raise ValueError(
            f"`images` must have shape n x {c} x {s} x {s} for this model, got {tuple(images.shape)}."
        )
    check_tensor("labels", labels)
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"`labels` must have shape ({images.shape[0]},) to match `images`, got {tuple(labels.shape)}."
        )
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise TypeError(f"`labels` must hold integer class indices, got dtype {labels.dtype}.")
    if labels.device != images.device:
        raise ValueError(f"`labels` must be on the device of `images` ({images.device}), got {labels.device}.")


def _check_index(name: str, idx: Tensor, n: int) -> Tensor:
    idx = torch.as_tensor(idx).reshape(-1)
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
) -> tuple[float, SmallCNN]:
    r"""Train one network with a plain PyTorch loop (the reference for the batched trainer).

    Same maths and seed handling as :func:`train_cnn_batched` (see the module
    docstring), written as an ordinary ``loss.backward()`` / in-place SGD loop.

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

    Returns:
        ``(accuracy, trained_model)``: validation accuracy and the trained copy
        of ``model`` (float32, on ``images.device``).
    """
    _check_model(model)
    _check_data(model, images, labels)
    steps = check_int("steps", steps, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    device = images.device
    train_index = _check_index("train_index", train_index, images.shape[0])
    val_index = _check_index("val_index", val_index, images.shape[0]).to(device)
    lr_v, decay_v, l2_v = (
        _as_config_vector(n, v, 1, device) for n, v in (("lr", lr), ("lr_decay", lr_decay), ("l2", l2))
    )
    sched = lr_schedule(lr_v, decay_v, steps)[:, 0]
    lam = l2_v.float()[0]

    gen = _generator(seed)
    init = init_cnn_parameters(model, gen)
    local = sample_minibatch_indices(train_index.numel(), steps, batch_size, gen)
    batches = train_index.cpu()[local].to(device)  # steps x B
    net = copy.deepcopy(model).to(device=device, dtype=torch.float32)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(init[name])
    weights = [p for name, p in net.named_parameters() if name.endswith("weight")]
    x_all = images.to(torch.float32)
    for t in range(steps):
        idx = batches[t]
        ce = F.cross_entropy(net(x_all[idx]), labels[idx])
        loss = ce + lam * sum(w.pow(2).sum() for w in weights)
        net.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for p in net.parameters():
                p.sub_(sched[t] * p.grad)
    net.zero_grad(set_to_none=True)
    with torch.no_grad():
        pred = net(x_all[val_index]).argmax(-1)
        acc = (pred == labels[val_index]).float().mean().item()
    return acc, net


# --------------------------------------------------------------------------- batched
def _grouped_forward(model: SmallCNN, params: dict[str, Tensor], x: Tensor, K: int) -> Tensor:
    """Logits ``K x B x classes`` of the stacked networks for inputs ``B x (K*C) x H x W``."""
    pad = model.kernel_size // 2
    # On CPU, oneDNN's grouped convolutions and max pooling are several times faster in
    # channels-last layout for these small feature maps (NCHW max pooling dominated a step).
    h = x.contiguous(memory_format=torch.channels_last) if x.device.type == "cpu" else x
    for name in ("conv1", "conv2"):
        w = params[f"{name}.weight"]  # K x O x C x k x k
        h = F.conv2d(h, w.flatten(0, 1), params[f"{name}.bias"].flatten(), padding=pad, groups=K)
        h = F.max_pool2d(F.relu(h), 2)
    B = h.shape[0]
    feats = h.reshape(B, K, -1).transpose(0, 1)  # K x B x F, per-config flatten(1) order
    return torch.baddbmm(params["fc.bias"].unsqueeze(1), feats, params["fc.weight"].transpose(1, 2))


def stacked_cnn_forward(model: SmallCNN, params: dict[str, Tensor], x: Tensor) -> Tensor:
    r"""Evaluate ``K`` stacked copies of ``model`` on their own inputs.

    Args:
        model: Architecture template (:class:`SmallCNN`).
        params: Stacked parameters, ``name -> K x ...`` (as returned by
            :func:`train_cnn_batched` with ``return_params=True`` or by
            :func:`torch.func.stack_module_state`).
        x: ``K x B x C x H x W`` inputs, ``x[k]`` for network ``k``.

    Returns:
        ``K x B x num_classes`` logits; ``out[k]`` equals
        ``model_k(x[k])`` for the network ``model_k`` with parameters ``params[·][k]``.
    """
    _check_model(model)
    check_ndim("x", x, 5, "K x B x C x H x W")
    K, B = x.shape[:2]
    return _grouped_forward(model, params, x.transpose(0, 1).reshape(B, -1, *x.shape[-2:]), K)


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
            each configuration; sizes may differ).
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

    Returns:
        ``K`` float32 validation accuracies on ``images.device``; with
        ``return_params``, also a dict of stacked ``K x ...`` parameters.

    Example:
        >>> net = SmallCNN(image_size=8)
        >>> acc = train_cnn_batched(net, X, y, [tr0, tr1], [va0, va1],
        ...                         lr=[0.02, 1e-7], lr_decay=1e-4, l2=1e-5, seeds=[0, 0])
    """
    _check_model(model)
    _check_data(model, images, labels)
    steps = check_int("steps", steps, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    eval_chunk_size = check_int("eval_chunk_size", eval_chunk_size, minimum=1)
    K = len(train_indices)
    if K == 0:
        raise ValueError("`train_indices` must hold at least one configuration.")
    if len(val_indices) != K:
        raise ValueError(
            f"`val_indices` must hold {K} index tensors (one per configuration), got {len(val_indices)}."
        )
    seeds = [int(s) for s in (seeds.reshape(-1).tolist() if isinstance(seeds, Tensor) else seeds)]
    if len(seeds) != K:
        raise ValueError(f"`seeds` must hold {K} integers (one per configuration), got {len(seeds)}.")
    device = images.device
    n = images.shape[0]
    lr_v = _as_config_vector("lr", lr, K, device)
    decay_v = _as_config_vector("lr_decay", lr_decay, K, device)
    lam = _as_config_vector("l2", l2, K, device).float()
    sched = lr_schedule(lr_v, decay_v, steps)  # steps x K
    tr = [_check_index(f"train_indices[{k}]", t, n).cpu() for k, t in enumerate(train_indices)]
    va = [_check_index(f"val_indices[{k}]", v, n) for k, v in enumerate(val_indices)]

    # Per-configuration seeded initial weights and minibatches, drawn once on the CPU.
    inits, batches = [], []
    for k in range(K):
        gen = _generator(seeds[k])
        inits.append(init_cnn_parameters(model, gen))
        batches.append(tr[k][sample_minibatch_indices(tr[k].numel(), steps, batch_size, gen)])
    params = {
        name: torch.stack([p[name] for p in inits]).to(device).requires_grad_() for name in inits[0]
    }
    batch_idx = torch.stack(batches, dim=-1).to(device)  # steps x B x K: gathers as B x K x C x H x W
    names = list(params)
    weight_names = [name for name in names if name.endswith("weight")]
    x_all = images.to(torch.float32)
    C, H, W = x_all.shape[1:]
    view = {name: (K,) + (1,) * (p.ndim - 1) for name, p in params.items()}

    for t in range(steps):
        idx = batch_idx[t]  # B x K
        logits = _grouped_forward(model, params, x_all[idx].reshape(batch_size, K * C, H, W), K)
        ce = F.cross_entropy(
            logits.reshape(K * batch_size, -1), labels[idx.T].reshape(-1), reduction="none"
        ).reshape(K, batch_size).mean(-1)
        penalty = sum(params[w].pow(2).flatten(1).sum(-1) for w in weight_names)
        loss = (ce + lam * penalty).sum()  # configurations are independent: ∂loss/∂θ_k = ∂loss_k/∂θ_k
        grads = torch.autograd.grad(loss, [params[name] for name in names])
        rate = sched[t]
        with torch.no_grad():
            for name, g in zip(names, grads):
                params[name].sub_(rate.view(view[name]) * g)

    params = {name: p.detach() for name, p in params.items()}
    acc = _batched_accuracy(model, params, x_all, labels, va, eval_chunk_size)
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
) -> Tensor:
    """Validation accuracy of each stacked network on its own (padded, masked) validation set."""
    device = images.device
    K = len(val_indices)
    sizes = torch.tensor([v.numel() for v in val_indices], device=device)
    vmax = int(sizes.max())
    padded = torch.zeros(vmax, K, dtype=torch.long, device=device)
    for k, v in enumerate(val_indices):
        padded[: v.numel(), k] = v.to(device)
    mask = torch.arange(vmax, device=device).unsqueeze(1) < sizes.unsqueeze(0)  # vmax x K
    C, H, W = images.shape[1:]
    correct = torch.zeros(K, device=device)
    with torch.no_grad():
        for start in range(0, vmax, chunk):
            idx = padded[start : start + chunk]  # b x K
            x = images[idx].reshape(idx.shape[0], K * C, H, W)
            pred = _grouped_forward(model, params, x, K).argmax(-1)  # K x b
            hit = (pred == labels[idx.T]) & mask[start : start + chunk].T
            correct += hit.sum(-1).float()
    return correct / sizes.float()
