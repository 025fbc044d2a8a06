r"""Thompson samples of a batch of exact GPs as Matheron paths with closed-form input gradients.

:meth:`~fbo_torch.models.batched_gp.BatchedExactGP.draw_paths` builds them from
each agent's keyed stream; the maximizers (:mod:`fbo_torch.optim.batched`)
evaluate them and their input gradients as a few batched tensor operations.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal, overload

import torch
from torch import Tensor

from fbo_torch.utils.dispatch import cos_, gpu_path, rowdot

if TYPE_CHECKING:  # an annotation only: importing fbo_torch.models here would run its __init__, which imports this
    from fbo_torch.models.gp_posterior import FactoredGPs


class GPThompsonPaths:
    r"""``B`` GP Thompson samples ``f_b(x) = m_b + φ_b(x)ᵀw_b + k_b(x, X_b) v_b`` (Matheron paths).

    ``φ_b(x) = √(2σ_f²/F) [sin(W_b x̃), cos(W_b x̃)]`` on normalized inputs
    ``x̃``; ``v_b = (K_b + σ_b²I)⁻¹ (y_b − m_b − φ_b(X_b)ᵀw_b − ε_b)``; values
    are returned in the original outcome units. Callable on ``B x C x d``
    (or ``K x B x C x d``) domain points; :meth:`value_and_grad` gives the input
    gradient in closed form (a handful of batched operations). Build it with
    :meth:`from_draws` (or a batched GP's ``draw_paths``).

    Args:
        lo: ``d`` lower bounds of the domain (the normalization's offset).
        width: ``d`` widths of the domain (the normalization's scale).
        W: ``B x F/2 x d`` spectral frequencies, divided by the lengthscales.
        w: ``B x F`` standard-normal feature weights.
        amp: ``B`` feature amplitudes ``√(2σ_f²/F)``.
        X: ``B x n x d`` normalized training inputs.
        v: ``B x n`` data weights ``(K + σ²I)⁻¹(y − m − φ(X)ᵀw − ε)`` (0 at invalid observations).
        ls: ``B x d`` lengthscales (normalized units).
        os_: ``B`` outputscales ``σ_f²``.
        mean: ``B`` constant means (standardized units).
        y_mean: ``B`` means of the outcome standardization.
        y_std: ``B`` standard deviations of the outcome standardization.
    """

    #: Not ``True`` although callable on ``... x B x C x d``: a maximizer that stacked its K line-search
    #: candidates in front would make ``matmul`` copy every per-path matrix K times (broadcast batch
    #: dimensions are materialized); folding them into ``C`` copies only the points.
    leading_dims = False

    #: Closed-form gradients (``value_and_grad``) and no calls into other libraries: on a CPU
    #: :func:`~fbo_torch.optim.batched.maximize_batched` evaluates a copy rebuilt from
    #: :meth:`graph_state` in ``torch.inference_mode`` (only while ``value_and_grad`` is defined: a
    #: subclass without it keeps autograd).
    inference_safe = True

    def __init__(
        self,
        lo: Tensor,
        width: Tensor,
        W: Tensor,
        w: Tensor,
        amp: Tensor,
        X: Tensor,
        v: Tensor,
        ls: Tensor,
        os_: Tensor,
        mean: Tensor,
        y_mean: Tensor,
        y_std: Tensor,
    ) -> None:
        self.lo, self.width = lo, width
        self.W, self.w, self.amp, self.Xt, self.v, self.ls, self.os, self.mean = W, w, amp, X, v, ls, os_, mean
        self.y_mean, self.y_std = y_mean, y_std
        self._ready = False

    def _prepare(self) -> None:
        r"""Fold every per-path constant into the matrices it multiplies, once per batch of paths
        (at the first evaluation: a maximizer that captures the paths as a CUDA graph rebuilds
        them from :meth:`graph_state` inside the graph, and only that copy is evaluated).

        A maximizer evaluates the paths at every BFGS iteration (a few dozen times per
        round); what does not depend on the points is computed here, so an evaluation is a
        few batched operations with or without the gradient (counts in ``docs/design.md``):

        * ``[sin z, cos z] = cos([z − π/2, z])`` with ``z = (x − lo) W'ᵀ``, ``W' = W / width``:
          one product (the phase ``−π/2`` enters through a column of ones appended to
          ``x − lo``, not as a pass over the ``C x F`` features) and one ``cos`` for both halves;
        * the gradient from the same features: ``∂[sin z, cos z] = [cos z, −sin z] ⊙ W'``
          is the value features with their halves swapped, so value and gradient are one
          product with ``[w, (−w_c ⊙ W'; w_s ⊙ W')]`` (``F x (1+d)``), no ``sin``; the data
          part likewise one product of the kernel values with ``[v, v ⊙ b]``;
        * without the gradient, the dot products with ``w`` and ``v`` on a CPU are products
          and sums (:func:`~fbo_torch.utils.dispatch.rowdot`: a one-column batched ``matmul``
          is slow there), a GEMV on a GPU;
        * the outcome scale ``y_std`` and the feature amplitude folded into the feature
          weights, ``v`` and the constant; the lengthscales into the scaled training inputs
          ``b = X/ℓ`` and their squared norms.
        """
        B, F2, d = self.W.shape
        dt, dev = self.W.dtype, self.W.device
        inv_w = 1.0 / self.width  # d
        Wx = self.W * inv_w  # B x F/2 x d: frequencies in domain units
        off = torch.zeros(B, 2 * F2, 1, dtype=dt, device=dev)
        off[:, :F2] = -0.5 * math.pi  # sin z = cos(z − π/2)
        # B x (d+1) x F: [x − lo, 1] → [z − π/2, z]; contiguous, so a block's rows gathered from it
        # (taken paths) enter the product with the same layout as a slice of it
        self._W2t = torch.cat([torch.cat([Wx, Wx], -2), off], -1).mT.contiguous()
        scale = self.amp * self.y_std  # B
        wA = self.w * scale.unsqueeze(-1)  # B x F
        # ∇ of the prior part: [cos z, −sin z] (the features, halves swapped) @ [w_s ⊙ W'; w_c ⊙ W']
        gW = torch.cat([-wA[:, F2:, None] * Wx, wA[:, :F2, None] * Wx], -2)  # B x F x d
        # B x (1+d) x F: [w; ∇ weights], value and gradient in one product (rows: what a CPU reads)
        self._wGt = torch.cat([wA.unsqueeze(-2), gW.mT], -2)
        inv_ls = 1.0 / self.ls  # B x d
        self._q = (inv_ls * inv_w).unsqueeze(-2)  # B x 1 x d: (x − lo) → (x̃ / ℓ)
        self._q1 = torch.nn.functional.pad(self._q, (0, 1))  # B x 1 x (d+1): the ones column maps to 0
        b = self.Xt * inv_ls.unsqueeze(-2)  # B x n x d
        self._bt = torch.nn.functional.pad(b.mT, (0, 0, 0, 1))  # B x (d+1) x n
        self._bb = (b * b).sum(-1).unsqueeze(-2)  # B x 1 x n
        vs = self.v * self.y_std.unsqueeze(-1)  # B x n
        self._vG = torch.cat([vs.unsqueeze(-1), vs.unsqueeze(-1) * b], -1)  # B x n x (1+d): [v, v ⊙ b]
        self._log_os = torch.log(self.os).view(-1, 1, 1)
        self._const = (self.y_mean + self.y_std * self.mean).view(-1, 1)
        # the folded tensors are constants of the paths; where a source records gradients they are
        # rebuilt at every evaluation, so each backward pass has its own graph
        self._ready = not any(getattr(self, f).requires_grad for f in self._FIELDS)

    @classmethod
    def from_draws(cls, gp: FactoredGPs, W: Tensor, w: Tensor, eps: Tensor) -> GPThompsonPaths:
        r"""Paths of factored GPs from given random draws: ``W`` (``B x F/2 x d``, already divided by the
        lengthscales), ``w`` (``B x F`` standard normals), ``eps`` (``B x n`` noise draws)."""
        hp = gp.hyperparameters
        F = w.shape[-1]
        amp = torch.sqrt(2.0 * hp["outputscale"] / F)  # B
        lin = gp.X @ W.mT  # B x n x F/2
        # w_s sin z + w_c cos z = r cos(z − φ) with r = |(w_s, w_c)|, φ = atan2(w_s, w_c): one cosine
        # per frequency and data point instead of a sine and a cosine
        ws, wc = w[:, : F // 2], w[:, F // 2 :]
        shift = torch.atan2(ws, wc).unsqueeze(-2)
        if torch.is_grad_enabled() and (lin.requires_grad or shift.requires_grad):
            waves = torch.cos(lin - shift)  # B x n x F/2
        else:  # the same values in place (B x n x F/2 float64: a fresh array per pass costs its page faults)
            waves = lin.sub_(shift).cos_()
        prior = amp.unsqueeze(-1) * rowdot(waves, torch.hypot(ws, wc).unsqueeze(-1), not waves.requires_grad)
        resid = torch.where(gp.mask, gp.y - hp["mean"].unsqueeze(-1) - prior - eps, 0.0)
        L = gp.L
        # two triangular solves: torch.cholesky_solve checks for errors on the host (a synchronization)
        w_ = torch.linalg.solve_triangular(L, resid.unsqueeze(-1), upper=False)
        v = torch.linalg.solve_triangular(L.mT, w_, upper=True).squeeze(-1)
        v = torch.where(gp.mask, v, 0.0)
        lo, width = gp.bounds[0], gp.bounds[1] - gp.bounds[0]
        return cls(lo, width, W, w, amp, gp.X, v, hp["lengthscale"], hp["outputscale"], hp["mean"], gp.y_mean, gp.y_std)

    #: Taken paths (:meth:`take`) that share a prepared batch's tensors: that batch and the rows.
    _base: GPThompsonPaths | None = None
    _rows: Tensor | None = None
    _SHARED = ("lo", "width")  # the domain's box, d: the same for every path

    def take(self, index: Tensor) -> GPThompsonPaths:
        """The paths ``index`` (``m`` indices into the batch, repeats allowed) as a batch of ``m``.

        Taken from paths already evaluated (their constants folded), they share the batch's
        tensors instead of copying them: a CPU evaluation gathers each block's rows
        (``_parts_in_blocks``), and any other use indexes a field the first time it reads it.
        A maximizer takes sub-batches at most line-search steps, most of them evaluated once."""
        if not self._ready:
            shared = self._SHARED
            return type(self).from_graph_state(
                tuple(getattr(self, f) if f in shared else getattr(self, f)[index] for f in self._FIELDS), ()
            )
        sub = type(self).__new__(type(self))
        sub._base = self if self._base is None else self._base
        sub._rows = index if self._rows is None else self._rows[index]
        sub._ready = True
        return sub

    def __getattr__(self, name: str) -> Any:
        # reached only for attributes not set: a field of taken paths, indexed from their batch once
        base = self.__dict__.get("_base")
        if base is None or name not in self._FIELDS + self._PREPARED:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = getattr(base, name)
        if name not in self._SHARED:
            value = value[self._rows]
        setattr(self, name, value)
        return value

    @property
    def batch_size(self) -> int:
        return self.W.shape[0] if self._rows is None else self._rows.numel()

    @property
    def extrapolate(self) -> str:
        r"""When the maximizer's line search tries steps beyond the quasi-Newton step
        (:func:`~fbo_torch.optim.quasi_newton.minimize_batched`'s ``extrapolate``): in ``d <= 3``
        only while they are accepted — the maxima found are the same with a fifth less work
        (``benchmarks/maximizer_quality.py``, docs/performance.md) — else always (in ``d = 5``
        skipping them lost a hair of the mean gap)."""
        return "while_accepted" if (self._base or self).W.shape[-1] <= 3 else "always"

    def lengthscales(self) -> Tensor:
        """Each GP's lengthscales in input coordinates (``B x d``): the scale on which its sample varies."""
        return self.ls * self.width

    #: What :meth:`_prepare` folds, one row per path.
    _PREPARED = ("_W2t", "_wGt", "_q", "_q1", "_bt", "_bb", "_vG", "_log_os", "_const")

    @property
    def _wA(self) -> Tensor:  # B x F x 1: the feature weights (the first row of _wGt)
        return self._wGt[:, :1].mT

    @property
    def _v(self) -> Tensor:  # B x n x 1: the data weights (the first column of _vG)
        return self._vG[..., :1]

    # a pure function of tensors: maximizers may capture it as a CUDA graph
    _FIELDS = ("lo", "width", "W", "w", "amp", "Xt", "v", "ls", "os", "mean", "y_mean", "y_std")

    def graph_state(self) -> tuple[tuple[Tensor, ...], tuple[Any, ...]]:
        return tuple(getattr(self, f) for f in self._FIELDS), ()

    @classmethod
    def from_graph_state(cls, tensors: tuple[Tensor, ...], config: tuple[Any, ...]) -> GPThompsonPaths:
        obj = cls.__new__(cls)
        for f, t in zip(cls._FIELDS, tensors, strict=True):
            setattr(obj, f, t)
        obj._ready = False
        return obj

    def astype(self, dtype: torch.dtype) -> GPThompsonPaths:
        """The same paths computed in ``dtype`` (e.g. float32 for screening raw points)."""
        return type(self).from_graph_state(tuple(getattr(self, f).to(dtype) for f in self._FIELDS), ())

    @overload
    def _parts(self, X: Tensor, grad: Literal[False]) -> tuple[Tensor, None]: ...
    @overload
    def _parts(self, X: Tensor, grad: Literal[True]) -> tuple[Tensor, Tensor]: ...
    def _parts(self, X: Tensor, grad: bool) -> tuple[Tensor, Tensor | None]:
        # every reduction over features or data points is a batched matrix product (no
        # elementwise pass over B x C x F): weights are folded into the matrices (_prepare)
        if not self._ready:
            self._prepare()
        # in place only where autograd records nothing (the points or, `_ready` False, the paths' tensors)
        inplace = not (torch.is_grad_enabled() and (X.requires_grad or not self._ready))
        if inplace and X.ndim == 3 and X.device.type == "cpu" and not gpu_path(X.device):
            return self._parts_in_blocks(X, grad)
        Xc = torch.nn.functional.pad(X - self.lo, (0, 1), value=1.0)  # ... x B x C x (d+1): [x − lo, 1]
        lin = Xc @ self._W2t  # ... x B x C x F: [z − π/2, z]
        c = cos_(lin) if inplace else torch.cos(lin)  # [sin z, cos z]
        a = Xc * self._q1  # [x̃ / ℓ, 0]
        ab = a @ self._bt  # ... x B x C x n
        D = (
            ((a * a).sum(-1, keepdim=True) + self._bb).add_(ab, alpha=-2.0)
            if inplace
            else (a * a).sum(-1, keepdim=True) + self._bb - 2.0 * ab
        )  # squared scaled distances
        if inplace:
            k = torch.add(self._log_os, D.clamp_min_(0.0), alpha=-0.5).exp_()
        else:
            k = torch.exp(self._log_os - 0.5 * D.clamp_min(0.0))
        if not grad:
            return rowdot(c, self._wA, inplace) + rowdot(k, self._v, inplace) + self._const, None
        # value and gradient from one product each with the features and the kernel values:
        # d/dx: prior [cos z, −sin z] @ (w ⊙ W'); data Σ_j v_j k_j (b_j − a) ⊙ ∂a/∂x
        cg = c @ self._wGt.mT  # ... x B x C x (1+d): [f, ∇ prior]
        kg = k @ self._vG  # ... x B x C x (1+d): [kᵀv, Σ_j v_j k_j b_j]
        kv = kg[..., :1]
        out = (cg[..., 0] + kv.squeeze(-1)) + self._const
        g = cg[..., 1:] + torch.addcmul(kg[..., 1:], kv, a[..., :-1], value=-1.0) * self._q
        return out, g

    #: Feature values per block of paths on a CPU (``_parts_in_blocks``): 2 MB in float32.
    CPU_BLOCK = 2**19

    def _parts_in_blocks(self, X: Tensor, grad: bool) -> tuple[Tensor, Tensor | None]:
        r""":meth:`_parts` on a CPU for ``B x C x d`` points, without autograd: the paths in blocks
        whose ``block x C x F`` features stay in the cache, written into one buffer.

        The same operations as the batched form, per block: one product for ``[z − π/2, z]``, one
        cosine in place, and for the gradient the product ``[w, ∇]ᵀ [sin z, cos z]ᵀ`` taken as
        ``(1+d) x F`` times ``F x C`` (the features transposed: the faster of the two orders on a
        CPU). Evaluating the whole batch at once wrote ``B x C x F`` features to fresh memory at
        every call (page faults, then a second pass from main memory); blocks of :data:`CPU_BLOCK`
        values are twice as fast (docs/performance.md). A path's values do not depend on the
        block it is in: every product is one matrix per path, the sums are over its own rows.
        """
        B, C, d = X.shape
        src, rows = (self, None) if self._base is None else (self._base, self._rows)
        F, n = src._W2t.shape[-1], src._bt.shape[-1]
        per = max(1, min(B, self.CPU_BLOCK // max(1, C * max(F, n))))
        feats = torch.empty(per * C * F, dtype=X.dtype)
        out = torch.empty(B, C, dtype=X.dtype)
        g = torch.empty(B, C, d, dtype=X.dtype) if grad else None
        for s in range(0, B, per):
            e = min(B, s + per)
            # taken paths: this block's rows of the batch they were taken from
            idx = None if rows is None else rows[s:e]

            def pick(t: Tensor, s: int = s, e: int = e, idx: Tensor | None = idx) -> Tensor:
                return t[s:e] if idx is None else t.index_select(0, idx)

            Xc = torch.nn.functional.pad(X[s:e] - src.lo, (0, 1), value=1.0)  # m x C x (d+1)
            c = cos_(torch.bmm(Xc, pick(src._W2t), out=feats[: (e - s) * C * F].view(e - s, C, F)))
            a = Xc * pick(src._q1)
            D = ((a * a).sum(-1, keepdim=True) + pick(src._bb)).add_(a @ pick(src._bt), alpha=-2.0)
            k = torch.add(pick(src._log_os), D.clamp_min_(0.0), alpha=-0.5).exp_()
            if g is None:
                value = rowdot(c, pick(src._wA), True).add_(rowdot(k, pick(src._v), True))
                torch.add(value, pick(src._const), out=out[s:e])
                continue
            cg = torch.bmm(pick(src._wGt), c.mT)  # m x (1+d) x C: [f, ∇ prior]
            kg = k @ pick(src._vG)  # m x C x (1+d): [kᵀv, Σ_j v_j k_j b_j]
            kv = kg[..., :1]
            torch.add(cg[:, 0], kv.squeeze(-1), out=out[s:e]).add_(pick(src._const))
            torch.addcmul(
                cg[:, 1:].mT, torch.addcmul(kg[..., 1:], kv, a[..., :-1], value=-1.0), pick(src._q), out=g[s:e]
            )
        return out, g

    def product_values(self, XA: Tensor, XB: Tensor) -> Tensor:
        r"""Values on the product sets ``{(a, b)}``: ``B x nA x dA`` points ``a`` of the first ``dA``
        coordinates and ``B x nB x (d − dA)`` points ``b`` of the others give ``B x nA x nB`` values
        ``f_b((a_i, b_j))``, as two batched matrix products instead of ``nA · nB`` evaluations.

        Both parts of a path separate over the two groups of coordinates: the features by the
        angle sum, ``cos(α_i + β_j) = cos α_i cos β_j − sin α_i sin β_j`` with ``α = W'_A a + phase``
        and ``β = W'_B b``, so ``Σ_f w_f cos(α_if + β_jf) = [cos α, sin α]_i · [w ⊙ cos β, −w ⊙ sin β]_j``;
        the squared-exponential kernel by ``exp(−½|x̃ − x̃_m|²/ℓ²) = exp(−½ D_A) exp(−½ D_B)``, so
        ``Σ_m v_m k_m = E_A diag(v) E_Bᵀ``. The sines and cosines are computed on ``nA + nB`` points
        instead of ``nA · nB``: a maximizer screens ``nA · nB`` raw points for the transcendental cost of
        ``nA + nB`` (:func:`~fbo_torch.optim.batched.maximize_batched`'s ``screen="product"``). The
        values equal the paths' values (calling them) at the same points up to rounding.
        """
        if not self._ready:
            self._prepare()
        dA = XA.shape[-1]
        W2t = self._W2t  # B x (d+1) x F: rows of x − lo, then the phase row
        half = 0.5 * math.pi
        # [cos α, sin α] = cos([α, α − π/2]) and [cos β, −sin β] = cos([β, β + π/2]): one cosine each
        # (in place: NumPy's on a CPU in float32, :func:`~fbo_torch.utils.dispatch.cos_`)
        alpha = torch.baddbmm(W2t[:, -1:], XA - self.lo[:dA], W2t[:, :dA])  # B x nA x F, phase included
        left = cos_(torch.cat([alpha, alpha - half], -1))  # B x nA x 2F
        # B x nB x F; with one coordinate (d = 2, 3) a broadcast product: the value of the batched
        # product with an inner dimension of 1, without its per-matrix cost
        XB_ = XB - self.lo[dA:]
        beta = XB_ * W2t[:, dA:-1] if XB.shape[-1] == 1 else XB_ @ W2t[:, dA:-1]
        right = cos_(torch.cat([beta, beta + half], -1)).mul_(self._wA.mT.repeat(1, 1, 2))  # w ⊙ [cos β, −sin β]
        prior = left @ right.mT  # B x nA x nB
        bt = self._bt[:, :-1]  # B x d x n: the scaled training inputs
        aA = (XA - self.lo[:dA]) * self._q[..., :dA]  # x̃ / ℓ on each half
        aB = (XB - self.lo[dA:]) * self._q[..., dA:]

        def sq_dist(a: Tensor, b: Tensor) -> Tensor:  # B x C x k, B x k x n -> B x C x n
            return ((a * a).sum(-1, keepdim=True) + (b * b).sum(-2, keepdim=True) - 2.0 * (a @ b)).clamp_min_(0.0)

        EA = torch.exp(self._log_os - 0.5 * sq_dist(aA, bt[:, :dA]))  # B x nA x n
        EB = torch.exp(-0.5 * sq_dist(aB, bt[:, dA:]))  # B x nB x n
        data = EA @ (EB * self._v.mT).mT  # B x nA x nB
        return prior + data + self._const.unsqueeze(-1)

    def __call__(self, X: Tensor) -> Tensor:
        """Values at ``... x B x C x d`` points: ``... x B x C``."""
        return self._parts(X, grad=False)[0]

    def value_and_grad(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Values (``... x B x C``) and input gradients (``... x B x C x d``), in closed form."""
        return self._parts(X, grad=True)


__all__ = ["GPThompsonPaths"]
