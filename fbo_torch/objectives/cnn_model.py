r"""The small CNN the image objectives train: its architecture, seeded initialization and stacked forward.

:class:`SmallCNN` is one network; :func:`stacked_cnn_forward` evaluates ``K``
copies with their own parameters (``name -> K x ...``, the layout of
:func:`torch.func.stack_module_state`) as one grouped convolution per layer
(the trainer, :mod:`fbo_torch.objectives.cnn`, says why).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fbo_torch.objectives.cnn_options import TrainerOptions
from fbo_torch.utils.validation import check_int, check_ndim


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


# --------------------------------------------------------------------------- options


def init_cnn_parameters(model: SmallCNN, generator: torch.Generator) -> dict[str, Tensor]:
    r"""Seeded initial parameters for ``model`` (float32, CPU).

    Convolution kernels are He-uniform ``U(±sqrt(6 / fan_in))``, the output
    layer's weight Glorot-uniform ``U(±sqrt(6 / (fan_in + fan_out)))`` (fans
    include the receptive field), biases zero. Tensors are drawn in
    ``model.named_parameters()`` order. Trainers cast them to their ``dtype``,
    so float32 and float64 runs start from the same weights.

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


def _check_model(model: object) -> SmallCNN:
    if not isinstance(model, SmallCNN):
        raise TypeError(f"`model` must be a SmallCNN (the architecture template), got {type(model).__name__}.")
    return model


def _grouped_forward(
    model: SmallCNN, params: dict[str, Tensor], x: Tensor, K: int, channels_last: bool = False
) -> Tensor:
    """Logits ``K x B x classes`` of the stacked networks for inputs ``B x (K*C) x H x W``."""
    pad = model.kernel_size // 2
    h = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    for name in ("conv1", "conv2"):
        w = params[f"{name}.weight"]  # K x O x C x k x k
        h = F.conv2d(h, w.flatten(0, 1), params[f"{name}.bias"].flatten(), padding=pad, groups=K)
        h = F.relu(F.max_pool2d(h, 2))  # = max_pool(relu(h)): ReLU is monotone
    B = h.shape[0]
    feats = h.reshape(B, K, -1).transpose(0, 1)  # K x B x F, per-config flatten(1) order
    return torch.baddbmm(params["fc.bias"].unsqueeze(1), feats, params["fc.weight"].transpose(1, 2))


def stacked_cnn_forward(
    model: SmallCNN, params: dict[str, Tensor], x: Tensor, channels_last: bool | None = None
) -> Tensor:
    r"""Evaluate ``K`` stacked copies of ``model`` on their own inputs.

    Args:
        model: Architecture template (:class:`SmallCNN`).
        params: Stacked parameters, ``name -> K x ...`` (as returned by
            :func:`~fbo_torch.objectives.cnn.train_cnn_batched` with ``return_params=True`` or by
            :func:`torch.func.stack_module_state`).
        x: ``K x B x C x H x W`` inputs, ``x[k]`` for network ``k``.
        channels_last: Activation layout (default: :class:`TrainerOptions`' choice).

    Returns:
        ``K x B x num_classes`` logits; ``out[k]`` equals
        ``model_k(x[k])`` for the network ``model_k`` with parameters ``params[·][k]``.
    """
    _check_model(model)
    check_ndim("x", x, 5, "K x B x C x H x W")
    K, B = x.shape[:2]
    if channels_last is None:
        channels_last = TrainerOptions().use_channels_last(x.device)
    return _grouped_forward(model, params, x.transpose(0, 1).reshape(B, -1, *x.shape[-2:]), K, channels_last)


__all__ = ["SmallCNN", "init_cnn_parameters", "stacked_cnn_forward"]
