r"""The input space a message's weight vector was fitted on.

An agent whose model transforms its inputs (e.g. BoTorch's ``Normalize`` from
raw Branin bounds to the unit cube) fits its weights on ``φ(T(x))``: its
message ``ω`` means the function ``x ↦ φ(T(x))ᵀω``, not ``φ(x)ᵀω``. Evaluated
on raw ``x``, the same ``ω`` is a different, unrelated function. A receiver
must therefore apply ``T`` before ``φ``, and must know ``T``.

Messages describe ``T`` by **input bounds**, a ``2 x d`` tensor ``[lower, upper]``
with ``T(x) = (x − lower) / (upper − lower)``:

* every affine BoTorch transform has such bounds: ``Normalize(d, bounds=B)``
  has ``B``, ``InputStandardize`` has ``[mean, mean + std]``, a
  ``ChainedInputTransform`` of affine ones their composition, the identity
  ``[0, 1]^d`` (:func:`input_bounds_of`);
* it travels as one float64 array (e.g. in a Flower ``ArrayRecord``), like ``ω``;
* it folds into the feature map, ``S(x − l)/w + b = (S/w)x + (b − S l/w)``, so
  batched maximizers (:class:`~fbo_torch.sampling.rff_paths.RFFSamplePaths`)
  pay nothing for it.

:class:`MessageSpace` is the map ``x ↦ T(x)`` an acquisition applies before
``φ``, and :func:`resolve_message_space` the rule that finds it:

1. spaces are *declared* by messages (:class:`~fbo_torch.protocol.AgentMessage`
   with ``input_bounds``, as :meth:`RFFBayesianLinear.messages
   <fbo_torch.models.RFFBayesianLinear.messages>` builds them) and by the
   acquisition's ``input_transform`` argument (any BoTorch input transform, or
   ``torch.nn.Identity()`` for raw inputs); every declaration must agree, so
   messages fitted on different input spaces never share one acquisition;
2. with no declaration (raw ``ω`` tensors, or messages without bounds), the
   messages are taken to be fitted on raw inputs, unless the target's ``model``
   has an input transform: then the space cannot be known and it is an error,
   which asks for ``input_transform=``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch
from botorch.models.transforms.input import AffineInputTransform, ChainedInputTransform
from torch import Tensor
from torch.nn import Identity, Module

from fbo_torch.utils.validation import check_input_bounds

if TYPE_CHECKING:  # pragma: no cover
    from fbo_torch.protocol.messages import AgentMessage

#: Relative tolerance within which two declared input spaces are the same.
SAME_SPACE_RTOL = 1e-9


def unit_bounds(dim: int, like: Tensor | None = None) -> Tensor:
    r"""``[0, 1]^d`` as ``2 x d`` bounds: the identity map."""
    kw = {"dtype": torch.float64} if like is None else {"dtype": like.dtype, "device": like.device}
    return torch.stack([torch.zeros(dim, **kw), torch.ones(dim, **kw)])


def input_bounds_of(transform: Module | None, dim: int) -> Tensor:
    r"""The input bounds (``batch_shape x 2 x d``, float64) of an affine input transform.

    ``T(x) = (x − lower) / (upper − lower)``, as the transform computes in eval
    mode (fitted coefficients, ``transform_on_eval``, ``indices``).

    Args:
        transform: ``None`` or ``torch.nn.Identity()`` (raw inputs: ``[0, 1]^d``),
            an ``AffineInputTransform`` (``Normalize``, ``InputStandardize``), or a
            ``ChainedInputTransform`` of those.
        dim: The input dimension ``d``.

    Returns:
        ``batch_shape x 2 x d`` float64 bounds ``(lower, upper)``.

    Raises:
        ValueError: The transform is not affine (e.g. ``Warp``, ``Log10``), or
            reverses itself; such an input space has no bounds to send.

    Example:
        >>> input_bounds_of(Normalize(2, bounds=Branin().bounds), 2)
        tensor([[-5.,  0.], [10., 15.]], dtype=torch.float64)
    """
    offset = torch.zeros(dim, dtype=torch.float64)
    scale = torch.ones(dim, dtype=torch.float64)
    for tf in _affine_parts(transform):
        if not tf.transform_on_eval:
            continue
        o = tf.offset.detach().to(device="cpu", dtype=torch.float64)
        c = tf.coefficient.detach().to(device="cpu", dtype=torch.float64)
        o, c = o.squeeze(-2), c.squeeze(-2)  # batch_shape x d_tf
        idx = getattr(tf, "indices", None)
        if idx is not None:
            full_o = torch.zeros(*o.shape[:-1], dim, dtype=torch.float64)
            full_c = torch.ones(*c.shape[:-1], dim, dtype=torch.float64)
            full_o[..., idx.cpu()] = o
            full_c[..., idx.cpu()] = c
            o, c = full_o, full_c
        if o.shape[-1] != dim:
            raise ValueError(f"`transform` {type(tf).__name__} acts on {o.shape[-1]} inputs, expected d = {dim}.")
        # T2(T1(x)) = ((x − o1)/c1 − o2)/c2 = (x − (o1 + o2·c1)) / (c1·c2)
        offset, scale = offset + o * scale, scale * c
    return torch.stack(torch.broadcast_tensors(offset, offset + scale), dim=-2)


def _affine_parts(transform: Module | None) -> list[AffineInputTransform]:
    if transform is None or isinstance(transform, Identity):
        return []
    if isinstance(transform, ChainedInputTransform):
        return [p for tf in transform.values() for p in _affine_parts(tf)]
    if isinstance(transform, AffineInputTransform):
        if transform.reverse:
            raise ValueError(
                f"`transform` {type(transform).__name__} has reverse=True (it un-normalizes); "
                "messages describe normalizing affine maps only."
            )
        return [transform]
    raise ValueError(
        f"`transform` {type(transform).__name__} is not affine, so a message cannot describe its input space by "
        "bounds. Use an affine transform (Normalize, InputStandardize) on models that send messages, or pass "
        "the omega tensors together with `input_transform=` to the acquisition."
    )


class MessageSpace(Module):
    r"""``x ↦ T(x)``: raw inputs to the inputs a message's features were evaluated on.

    Either affine (``bounds``: ``T(x) = (x − lower)/(upper − lower)``, the
    identity for ``[0, 1]^d``) or any module applied in eval mode (a non-affine
    BoTorch input transform); built by :func:`resolve_message_space`.

    Args:
        bounds: ``2 x d`` input bounds, or ``None`` with ``transform``.
        transform: A module mapping ``... x d`` to ``... x d`` (with ``bounds=None``).

    Example:
        >>> space = MessageSpace(Branin().bounds)     # a sender's Normalize(2, bounds=Branin().bounds)
        >>> value = rff(space(X_raw)) @ omega         # phi(T(x))^T omega
    """

    # a buffer (registered in __init__; declared so a type checker knows it) and a submodule
    bounds: Tensor | None
    transform: Module | None

    def __init__(self, bounds: Tensor | None = None, transform: Module | None = None) -> None:
        super().__init__()
        if (bounds is None) == (transform is None):
            raise ValueError("MessageSpace needs exactly one of `bounds` and `transform`.")
        if bounds is not None:
            check_input_bounds("bounds", bounds)
            if bounds.ndim != 2:
                raise ValueError(f"`bounds` must be one 2 x d box, got shape {tuple(bounds.shape)}.")
        self.register_buffer("bounds", None if bounds is None else bounds.detach().clone())
        self.transform = transform

    @property
    def is_identity(self) -> bool:
        b = self.bounds
        return b is not None and bool((b[0] == 0).all() and (b[1] == 1).all())

    def forward(self, X: Tensor) -> Tensor:
        """Map ``... x d`` raw inputs to ``... x d`` message-space inputs (in ``X``'s dtype/device)."""
        if self.bounds is not None:
            if self.is_identity:
                return X
            lo, hi = self.bounds.to(X)
            return (X - lo) / (hi - lo)
        tf = self.transform
        if tf is None:  # __init__ sets exactly one of `bounds` and `transform`
            raise RuntimeError("MessageSpace has neither `bounds` nor `transform`.")
        was_training = tf.training
        tf.eval()  # a fitted transform: never update its coefficients here
        try:
            return tf(X)
        finally:
            tf.train(was_training)

    def same_as(self, other: MessageSpace) -> bool:
        r"""Whether two spaces are the same map (bounds within :data:`SAME_SPACE_RTOL`, or the same module)."""
        if self.bounds is not None and other.bounds is not None:
            a, b = self.bounds.to(torch.float64).cpu(), other.bounds.to(torch.float64).cpu()
            return a.shape == b.shape and torch.allclose(a, b, rtol=SAME_SPACE_RTOL, atol=0.0)
        return self.transform is not None and self.transform is other.transform

    def describe(self) -> str:
        if self.bounds is None:
            return type(self.transform).__name__
        return "raw inputs" if self.is_identity else f"input bounds {self.bounds.tolist()}"


def space_of(input_transform: Module, dim: int) -> MessageSpace:
    r"""The :class:`MessageSpace` of an acquisition's ``input_transform`` argument (affine ones as bounds)."""
    if isinstance(input_transform, MessageSpace):
        return input_transform
    if not isinstance(input_transform, Module):
        raise TypeError(
            "`input_transform` must be a BoTorch InputTransform (e.g. Normalize(d, bounds=...)) or torch.nn.Identity() "
            f"for raw inputs, got {type(input_transform).__name__}."
        )
    try:
        bounds = input_bounds_of(input_transform, dim)
    except ValueError:  # not affine: applied as a module
        return MessageSpace(transform=input_transform)
    if bounds.ndim != 2:
        raise ValueError(
            f"`input_transform` has batch shape {tuple(bounds.shape[:-2])}: one transform for every "
            "message is expected (one acquisition, one input space)."
        )
    return MessageSpace(bounds)


def resolve_message_space(
    messages: Tensor | AgentMessage | Sequence[AgentMessage],
    input_transform: Module | None,
    dim: int,
    model: Module | None = None,
) -> MessageSpace:
    r"""The one input space an acquisition evaluates its messages on (the rule in the module docstring).

    Args:
        messages: Raw ``ω`` tensor(s) (nothing declared), or one or more
            :class:`~fbo_torch.protocol.AgentMessage` (each declares its
            ``input_bounds``, or ``None``).
        input_transform: The acquisition's ``input_transform`` argument: ``None``,
            a BoTorch input transform, ``torch.nn.Identity()`` or a :class:`MessageSpace`.
        dim: Input dimension ``d``.
        model: The target's model, if any; with an input transform of its own it
            makes undeclared spaces an error.

    Returns:
        The :class:`MessageSpace` (its bounds, or none for raw inputs).

    Raises:
        ValueError: Messages with different spaces (or some declared, some not),
            messages whose space differs from ``input_transform``, or nothing
            declared while ``model`` transforms its inputs.

    Example:
        >>> space = resolve_message_space(peers.messages(), None, dim=2, model=gp)
        >>> phi = rff(space(X))   # the inputs the senders' features saw
    """
    message_bounds: list[Tensor | None] = []
    ids: list[int] = []
    if not isinstance(messages, Tensor):
        if hasattr(messages, "input_bounds"):
            seq = [cast("AgentMessage", messages)]
        else:
            seq = list(messages)
        message_bounds = [m.input_bounds for m in seq]
        ids = [m.agent_id for m in seq]
    declared: list[tuple[str, MessageSpace]] = []
    if message_bounds:
        missing = [i for i, b in zip(ids, message_bounds, strict=True) if b is None]
        if missing and len(missing) < len(ids):
            raise ValueError(
                f"Messages from agents {missing} carry no `input_bounds` while the others do: every message of one "
                "acquisition must say which input space its weights were fitted on (RFFBayesianLinear.messages())."
            )
        if not missing:
            spaces = [
                MessageSpace(check_input_bounds(f"messages[{j}].input_bounds", b, dim))
                for j, b in enumerate(message_bounds)
                if b is not None  # all of them
            ]
            odd = [i for i, s in zip(ids, spaces, strict=True) if not s.same_as(spaces[0])]
            if odd:
                raise ValueError(
                    f"Messages from agents {odd} were fitted on a different input space than agent {ids[0]}'s "
                    f"({spaces[0].describe()}): one acquisition evaluates one feature map on one input space. Give "
                    "every agent's model the same input transform (e.g. Normalize(d, bounds=search-space bounds)), or "
                    "maximize those messages separately."
                )
            declared.append((f"the messages ({spaces[0].describe()})", spaces[0]))
    if input_transform is not None:
        space = space_of(input_transform, dim)
        declared.append((f"`input_transform` ({space.describe()})", space))
    if len(declared) == 2 and not declared[0][1].same_as(declared[1][1]):
        raise ValueError(
            f"The input space of {declared[0][0]} differs from that of {declared[1][0]}; "
            "leave `input_transform` out (messages say which space they were fitted on) or make them agree."
        )
    if declared:
        return declared[0][1]
    own = None if model is None else getattr(model, "input_transform", None)
    if own is not None:
        raise ValueError(
            f"`model` transforms its inputs ({type(own).__name__}) but the messages do not say which input space their "
            "weights were fitted on, so phi(x)^T omega cannot be evaluated where the senders fitted it. Pass "
            "`input_transform=`: the transform the senders' models applied (e.g. the same Normalize(d, bounds=...)), "
            "or torch.nn.Identity() if they fitted raw inputs; or send AgentMessages from "
            "RFFBayesianLinear.messages(), which carry their input bounds."
        )
    return MessageSpace(unit_bounds(dim))


__all__ = ["MessageSpace", "check_input_bounds", "input_bounds_of", "resolve_message_space", "space_of", "unit_bounds"]
