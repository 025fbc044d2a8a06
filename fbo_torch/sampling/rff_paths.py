r"""A batch of RFF sample paths ``f_b(x) = φ(x)ᵀω_b`` with closed-form input gradients.

Every function an FTS agent maximizes from another agent's message, and every
DP-FTS-DE broadcast region, is ``x ↦ φ(x)ᵀω`` for the shared map ``φ`` and
some weight vector ``ω``. :class:`RFFSamplePaths` evaluates ``B`` of them at
``B x C x d`` points with one matrix product for ``Sx + b`` (the spectral
matrix is shared) and one batched product with the ``ω``'s, and returns the
gradient in closed form, so a maximizer needs no autograd graph (fewer
kernel launches per step on a GPU; counts in ``docs/design.md``).

With ``z = Sx + b``, ``c = cos z``: the unnormalized map gives
``f = a ωᵀc`` with ``a = √(2σ₀²/M)`` and ``∇f = −a Sᵀ(sin z ⊙ ω)``; the papers'
normalized map (``‖φ(x)‖ = σ₀``) gives ``f = σ₀ ωᵀc / ‖c‖`` and

    ∇f = −(σ₀/‖c‖) Sᵀ( sin z ⊙ (ω − β c) ),   β = ωᵀc / ‖c‖².

Weights fitted on transformed inputs ``T(x) = (x − l)/w`` (``input_bounds``
``[l, l + w]``, :mod:`fbo_torch.protocol.input_space`) are the functions
``φ(T(x))ᵀω``; the transform folds into the map, ``S T(x) + b = (S/w) x + (b − S l/w)``,
so they cost the same as raw ones.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import Tensor

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.utils.dispatch import cos_, rowdot
from fbo_torch.utils.validation import check_input_bounds, check_last_dim, check_tensor


class RFFSamplePaths:
    r"""``B`` functions ``x ↦ φ(x)ᵀω_b`` on the shared feature map.

    Args:
        features: The shared :class:`~fbo_torch.features.RandomFourierFeatures`.
        omegas: ``B x M`` weight vectors (e.g. messages or broadcast regions).
        input_bounds: Optional ``2 x d`` input bounds of the input transform the
            weights were fitted under (one for all ``B``): the functions are then
            ``φ((x − l)/(u − l))ᵀω_b`` of raw ``x``.

    Called on ``B x C x d`` (or ``... x B x C x d``) points, returns ``... x B x C``.

    Example:
        >>> msgs = peers.messages()   # peers' models normalized their inputs
        >>> paths = RFFSamplePaths(rff, stack_omegas(msgs), input_bounds=msgs[0].input_bounds)
        >>> X, values = maximize_batched(paths, raw_bounds, batch_size=len(msgs))
    """

    #: Callable on ``... x B x C x d`` points, and cheaply: the spectral matrix is shared (one ``addmm``
    #: for all leading dimensions), so a maximizer may stack its line-search candidates in front.
    leading_dims = True
    #: The maximizer's line search (:func:`~fbo_torch.optim.quasi_newton.minimize_batched`'s), on
    #: every device: every candidate step in one evaluation. These paths are cheap to evaluate, so
    #: the operations of a step-by-step search cost more than the evaluations it saves (on a CPU
    #: 19 vs 34 ms for a broadcast's 4 regions, 1.7 vs 2.0 s for 200 agents' 4 each; docs/performance.md).
    line_search = "parallel"

    #: Closed-form gradients (``value_and_grad``) and no calls into other libraries: on a CPU
    #: :func:`~fbo_torch.optim.batched.maximize_batched` evaluates a copy rebuilt from
    #: :meth:`graph_state` in ``torch.inference_mode`` (only while ``value_and_grad`` is defined: a
    #: subclass without it keeps autograd).
    inference_safe = True

    def __init__(self, features: RandomFourierFeatures, omegas: Tensor, input_bounds: Tensor | None = None) -> None:
        check_tensor("omegas", omegas)
        if omegas.ndim != 2 or omegas.shape[-1] != features.num_features:
            raise ValueError(
                f"`omegas` must be B x M with M = {features.num_features}, got shape {tuple(omegas.shape)}."
            )
        self.omegas = omegas
        self.spectral = features.spectral.to(omegas)  # M x d
        self.phase = features.phase.to(omegas)
        self.outputscale = features.outputscale.to(omegas)
        self.lengthscale = features.lengthscale.to(omegas)  # d
        if input_bounds is not None:
            check_input_bounds("input_bounds", input_bounds, features.dim)
            if input_bounds.ndim != 2:
                raise ValueError(f"`input_bounds` must be one 2 x d box, got shape {tuple(input_bounds.shape)}.")
            lo, hi = input_bounds.to(omegas)
            w = hi - lo
            self.phase = self.phase - self.spectral @ (lo / w)  # S (x − l)/w + b = (S/w) x + (b − S l/w)
            self.spectral = self.spectral / w
            self.lengthscale = self.lengthscale * w
        self.normalize = features.normalize
        self._ready = False

    def _prepare(self) -> None:
        """Per-batch constants, once at the first evaluation (not at every one): ``σ₀`` or the
        unnormalized amplitude, ``Sᵀ`` and ``−ω ⊙ S`` (the gradient's first product). The paths
        are constants from then on: assign ``omegas`` anew only through :meth:`take` or a new object."""
        M = self.spectral.shape[0]
        s0 = self.outputscale.sqrt()
        self._amp = s0 if self.normalize else s0 * math.sqrt(2.0 / M)
        self._St = self.spectral.T.contiguous()  # d x M
        self._om = self.omegas.unsqueeze(-1)  # B x M x 1
        self._nSw = -(self._om * self.spectral)  # B x M x d
        # constants of the paths; where a source records gradients they are rebuilt at every
        # evaluation, so each backward pass has its own graph
        self._ready = not any(t.requires_grad for t in (self.omegas, self.spectral, self.outputscale))

    # a pure function of tensors: maximizers may capture it as a CUDA graph
    def graph_state(self) -> tuple[tuple[Tensor, ...], tuple[Any, ...]]:
        return (self.spectral, self.phase, self.outputscale, self.lengthscale, self.omegas), (self.normalize,)

    @classmethod
    def from_graph_state(cls, tensors: tuple[Tensor, ...], config: tuple[Any, ...]) -> RFFSamplePaths:
        obj = cls.__new__(cls)
        obj.spectral, obj.phase, obj.outputscale, obj.lengthscale, obj.omegas = tensors
        (obj.normalize,) = config
        obj._ready = False
        return obj

    def astype(self, dtype: torch.dtype) -> RFFSamplePaths:
        """The same functions computed in ``dtype`` (e.g. float32 for screening raw points)."""
        tensors, config = self.graph_state()
        return type(self).from_graph_state(tuple(t.to(dtype) for t in tensors), config)

    def take(self, index: Tensor) -> RFFSamplePaths:
        """The functions ``index`` (``m`` indices into the batch, repeats allowed) as a batch of ``m``."""
        sub = copy.copy(self)  # the feature map is shared; only the weight vectors are per function
        sub.omegas = self.omegas[index]
        sub._ready = False
        return sub

    @property
    def batch_size(self) -> int:
        return self.omegas.shape[0]

    def lengthscales(self) -> Tensor:
        """The feature map's lengthscales (``d``, input coordinates): the scale on which every path varies."""
        return self.lengthscale

    def _lin(self, X: Tensor) -> Tensor:
        check_last_dim("X", X, self.spectral.shape[-1])
        if not self._ready:
            self._prepare()
        d = X.shape[-1]
        return torch.addmm(self.phase, X.reshape(-1, d), self._St).view(*X.shape[:-1], -1)  # ... x B x C x M

    def __call__(self, X: Tensor) -> Tensor:
        """Values ``... x B x C`` at ``... x B x C x d`` points."""
        lin = self._lin(X)
        inplace = not (torch.is_grad_enabled() and lin.requires_grad)
        c = cos_(lin) if inplace else torch.cos(lin)
        if not self.normalize:
            return self._amp * rowdot(c, self._om, inplace)
        nrm = torch.linalg.vector_norm(c, dim=-1).clamp_min(_TINY_SQRT[c.dtype])
        dot = rowdot(c, self._om, inplace)
        return dot * (self._amp / nrm)

    def value_and_grad(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Values ``... x B x C`` and input gradients ``... x B x C x d`` (closed form)."""
        z = self._lin(X)
        c = torch.cos(z)
        s = z.sin_() if not (torch.is_grad_enabled() and z.requires_grad) else torch.sin(z)
        dot = rowdot(c, self._om)
        g = s @ self._nSw  # −Sᵀ(sin ⊙ ω): ... x B x C x d
        if not self.normalize:
            return self._amp * dot, g * self._amp
        nrm = torch.linalg.vector_norm(c, dim=-1).clamp_min(_TINY_SQRT[c.dtype])
        a = self._amp / nrm
        beta = dot / (nrm * nrm)
        # −a Sᵀ(sin ⊙ (ω − βc)) = a (−Sᵀ(sin ⊙ ω) + β Sᵀ(sin ⊙ c))
        g = torch.addcmul(g, beta.unsqueeze(-1), (s * c) @ self.spectral) * a.unsqueeze(-1)
        return a * dot, g


_TINY_SQRT = {
    dt: math.sqrt(torch.finfo(dt).tiny) for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
}


__all__ = ["RFFSamplePaths"]
