r"""Every agent's exact GP as plain batched tensors: fitted and sampled on the device.

On its own branch of FTS / DP-FTS-DE an agent maximizes a Thompson sample of
its exact GP posterior. :class:`BatchedExactGP` holds ``B`` independent GPs
(one per agent, or per agent and restart) with the model BoTorch's
``SingleTaskGP`` defines — same kernel, priors, constraints, ``Normalize``\ d
inputs and ``Standardize``\ d outcomes (:data:`GP_SPECS`) — but computes its
marginal likelihood, fit and Thompson samples as a few batched tensor
operations:

* **MLL** in closed form (Cholesky, triangular solves), equal to GPyTorch's
  ``ExactMarginalLogLikelihood`` on the same model (tests compare them to
  float64 round-off), vectorized over agents and over line-search candidates.
* **Fit** by :func:`~fbo_torch.optim.quasi_newton.minimize_batched` (batched
  BFGS, every agent its own convergence, a fixed iteration cap, no host
  synchronization), warm-started from the previous hyperparameters.
* **Posterior** mean and variance (:meth:`BatchedExactGP.posterior`, factored once by
  :meth:`BatchedExactGP.posterior_moments`) with closed-form input gradients, for
  analytic acquisitions (:mod:`fbo_torch.acquisition.batched`).
* **Thompson samples** as Matheron paths (Wilson et al., 2020), exactly
  BoTorch's ``draw_matheron_paths`` construction (``F/2`` random frequencies,
  ``[sin, cos]`` features, data update through ``(K + σ²I)⁻¹``), with random
  numbers from each agent's keyed stream (:mod:`fbo_torch.utils.keyed_random`)
  and **closed-form input gradients** for the maximizer.

Why not BoTorch's own machinery (we use it as the reference in the tests):
``fit_gpytorch_mll`` runs SciPy's L-BFGS-B on the host, moving parameters and
gradients between devices at every iteration (a host synchronization per
iteration; measurements in ``docs/design.md``), and treats a
batch of agents as *one* problem with one line search and one stopping rule,
so an agent's fit depends on who else is in the batch — a federated client
fitting alone would get another answer than the simulator. Its torch-side
``fit_gpytorch_mll_torch`` keeps the joint stopping rule and evaluates the MLL
through GPyTorch's lazy operators (many kernel launches per step).
``draw_matheron_paths`` draws from the global RNG (no per-agent streams) and
its paths are evaluated through module stacks with autograd gradients. The model definition stays
BoTorch's: :meth:`BatchedExactGP.to_botorch` returns the equal ``SingleTaskGP``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, overload

import torch
from botorch.models import SingleTaskGP
from torch import Tensor

from fbo_torch.models.gp_export import to_single_task_gp
from fbo_torch.models.gp_posterior import BatchedGPPosterior, FactoredGPs
from fbo_torch.models.gp_spec import GP_SPECS, GPSpec, get_spec
from fbo_torch.optim.quasi_newton import minimize_batched
from fbo_torch.sampling.gp_paths import GPThompsonPaths
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.batch_invariant import matmul
from fbo_torch.utils.constants import constant_tensor
from fbo_torch.utils.cuda_graphs import GraphCache
from fbo_torch.utils.dispatch import gpu_path, without_autograd
from fbo_torch.utils.validation import check_bounds, check_int, check_tensor

_LOG2PI = math.log(2.0 * math.pi)
_FIT_GRAPHS = GraphCache("BatchedExactGP.fit")


class BatchedExactGP:
    r"""``B`` independent exact GPs with a :class:`GPSpec`, as batched tensors.

    Args:
        train_X: ``B x n x d`` inputs (in the domain ``bounds``).
        train_Y: ``B x n x 1`` observations (entries where ``mask`` is False may be NaN).
        bounds: ``2 x d`` domain; inputs are normalized to the unit cube.
        spec: A :class:`GPSpec` or a name in :data:`GP_SPECS` (default ``"botorch"``).
        mask: Optional ``B x n`` booleans marking valid observations (e.g.
            excluding failed evaluations); masked entries do not enter the GP.
        params: Optional ``B x p`` unconstrained hyperparameters (e.g. a previous fit).
        validate: Check ``bounds`` (reads device values on the host; engines that
            pass their domain's already-checked bounds use ``False``).
        ls_prior: Optional per-agent LogNormal prior of the lengthscales (unit-cube units),
            ``(loc, scale)``, each ``B x k`` (``k = d`` with ARD, else 1) or broadcastable to it:
            ``log ℓ_bj ~ N(loc_bj, scale_bj²)`` in place of the spec's one prior for every
            agent (a spec with ``priors``). An agent's prior learned from others (e.g. from its
            peers' fitted lengthscales, :meth:`~fbo_torch.methods.transfer.Transfer.landscape_prior`) enters its MAP fit
            and its marginal likelihood exactly as the spec's does.

    The unconstrained vector per agent is ``[log(ℓ - ℓ_min) (d or 1),
    log σ_f² (if learned), log(σ² - σ²_min), c (if constant mean)]``.
    """

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        bounds: Tensor,
        spec: str | GPSpec = "botorch",
        mask: Tensor | None = None,
        params: Tensor | None = None,
        validate: bool = True,
        ls_prior: tuple[Tensor, Tensor] | None = None,
    ) -> None:
        check_tensor("train_X", train_X)
        check_tensor("train_Y", train_Y)
        if train_X.ndim != 3 or train_Y.shape != (*train_X.shape[:2], 1):
            raise ValueError(
                f"`train_X` and `train_Y` must be B x n x d and B x n x 1, got {tuple(train_X.shape)} and "
                f"{tuple(train_Y.shape)}."
            )
        B, n, d = train_X.shape
        if validate:
            check_bounds("bounds", bounds, dim=d)
        elif bounds.shape != (2, d):
            raise ValueError(f"`bounds` must have shape (2, {d}), got {tuple(bounds.shape)}.")
        self.spec = get_spec(spec)
        self.dim = d
        dt, dev = train_X.dtype, train_X.device
        bounds = bounds.to(dtype=dt, device=dev)
        self.bounds = bounds
        if mask is None:
            mask = torch.ones(B, n, dtype=torch.bool, device=dev)
        elif mask.shape != (B, n) or mask.dtype != torch.bool:
            raise ValueError(f"`mask` must be a bool tensor of shape {(B, n)}, got {mask.dtype} {tuple(mask.shape)}.")
        self.mask = mask.to(dev)
        y = train_Y.squeeze(-1)
        m = self.mask.to(dt)
        count = m.sum(-1)
        y0 = torch.where(self.mask, y, 0.0)
        if self.spec.standardize:
            mean = y0.sum(-1) / count.clamp_min(1)
            var = (torch.where(self.mask, y - mean.unsqueeze(-1), 0.0) ** 2).sum(-1) / (count - 1).clamp_min(1)
            std = var.sqrt()
            std = torch.where((count > 1) & (std >= 1e-8), std, torch.ones_like(std))  # BoTorch's Standardize
        else:
            mean, std = torch.zeros(B, dtype=dt, device=dev), torch.ones(B, dtype=dt, device=dev)
        self.y_mean, self.y_std = mean, std
        self.y = torch.where(self.mask, (y - mean.unsqueeze(-1)) / std.unsqueeze(-1), 0.0)  # B x n
        self.X = (train_X - bounds[0]) / (bounds[1] - bounds[0])  # unit cube
        self.X = torch.where(self.mask.unsqueeze(-1), self.X, 0.0)
        self.num_valid = count
        self.ls_prior = self._check_ls_prior(ls_prior, B) if ls_prior is not None else None
        p = self.spec.num_params(d)
        if params is None:
            params = self.initial_params(B, dtype=dt, device=dev)
        elif params.shape != (B, p):
            raise ValueError(f"`params` must have shape {(B, p)}, got {tuple(params.shape)}.")
        self.params = params.to(dtype=dt, device=dev)
        self._chol: Tensor | None = None
        self._sqd: Tensor | None = None
        self._bias: Tensor | None = None

    def _check_ls_prior(self, ls_prior: Any, B: int) -> tuple[Tensor, Tensor]:
        """``ls_prior`` as two ``B x k`` tensors (``ValueError`` naming the argument otherwise)."""
        k = self.dim if self.spec.ard else 1
        if not self.spec.priors:
            raise ValueError(
                "`ls_prior` needs a GP spec with priors (a MAP fit); this spec fits by maximum likelihood."
            )
        if not (isinstance(ls_prior, tuple) and len(ls_prior) == 2 and all(isinstance(t, Tensor) for t in ls_prior)):
            raise ValueError("`ls_prior` must be a tuple (loc, scale) of two tensors.")
        dt, dev = self.X.dtype, self.X.device
        try:
            loc, scale = (t.to(dtype=dt, device=dev).expand(B, k) for t in ls_prior)
        except RuntimeError:
            shapes = tuple(tuple(t.shape) for t in ls_prior)
            raise ValueError(f"`ls_prior` (loc, scale) must broadcast to {B} x {k}, got shapes {shapes}.") from None
        if not bool(torch.isfinite(loc).all()) or not bool((torch.isfinite(scale) & (scale > 0)).all()):
            raise ValueError("`ls_prior`: loc must be finite and scale finite and > 0.")
        return loc.contiguous(), scale.contiguous()

    # ----------------------------------------------------------- parameters
    def initial_params(
        self, batch: int, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
    ) -> Tensor:
        """BoTorch's starting values (the priors' modes, or GPyTorch's defaults)."""
        s, d = self.spec, self.dim
        if s.lengthscale_init is not None:
            ls0 = s.lengthscale_init
        else:
            loc, scale = s.ls_prior(d)
            ls0 = math.exp(loc - scale**2)  # LogNormal mode
        noise0 = s.noise_init if s.noise_init is not None else math.exp(-4.0 - 1.0)
        parts = [math.log(max(ls0 - s.lengthscale_lower, 1e-12))] * (d if s.ard else 1)
        if s.outputscale:
            parts.append(math.log(s.outputscale_init))
        parts.append(math.log(max(noise0 - s.noise_lower, 1e-12)))
        if s.mean == "constant":
            parts.append(0.0)
        out = constant_tensor(parts, dtype=dtype, device=device).expand(batch, len(parts)).clone()
        prior = getattr(self, "ls_prior", None)
        if prior is not None and s.lengthscale_init is None and batch == prior[0].shape[0]:
            loc, scale = prior  # each agent starts at its own prior's mode
            k = loc.shape[-1]
            out[:, :k] = (loc - scale.square()).exp().sub(s.lengthscale_lower).clamp_min(1e-12).log().to(out)
        return out

    def unpack(self, params: Tensor) -> dict[str, Tensor]:
        r"""Constrained hyperparameters from ``... x p`` unconstrained ones.

        Returns ``lengthscale`` (``... x d``), ``outputscale``, ``noise``, ``mean`` (``...``).
        """
        s, d = self.spec, self.dim
        k = d if s.ard else 1
        con, _ = self._constrained(params)
        ls = con[..., :k]
        if not s.ard:
            ls = ls.expand(*params.shape[:-1], d)
        os_ = con[..., k] if s.outputscale else torch.ones_like(params[..., 0])
        noise = con[..., k + int(s.outputscale)]
        mean = params[..., -1] if s.mean == "constant" else torch.zeros_like(params[..., 0])
        return {"lengthscale": ls, "outputscale": os_, "noise": noise, "mean": mean}

    def _constrained(self, params: Tensor) -> tuple[Tensor, Tensor]:
        r"""``(x, e)``: the positive hyperparameters ``x = x_min + e``, ``e = exp(p)``, in the
        order of ``params`` (lengthscales, signal variance, noise; ``... x (p - 1)`` with a
        constant mean, else ``... x p``), in two tensor operations."""
        c = self._consts()
        e = params[..., : c["num_positive"]].exp()
        return e + c["lower"], e

    def pack(
        self, lengthscale: Tensor, noise: Tensor, outputscale: Tensor | None = None, mean: Tensor | None = None
    ) -> Tensor:
        """Unconstrained parameters from constrained values (inverse of :meth:`unpack`)."""
        s = self.spec
        ls = lengthscale if s.ard else lengthscale[..., :1]
        parts = [torch.log((ls - s.lengthscale_lower).clamp_min(1e-300))]
        if s.outputscale:
            if outputscale is None:
                raise ValueError("`outputscale` is required: this GP spec has a signal variance.")
            parts.append(torch.log(outputscale).unsqueeze(-1))
        parts.append(torch.log((noise - s.noise_lower).clamp_min(1e-300)).unsqueeze(-1))
        if s.mean == "constant":
            if mean is None:
                raise ValueError("`mean` is required: this GP spec has a constant mean.")
            parts.append(mean.unsqueeze(-1))
        return torch.cat(parts, -1)

    # ------------------------------------------------------------------ MLL
    @property
    def sqdist(self) -> Tensor:
        r"""``B x k x n x n`` squared differences of the training inputs per dimension
        (``k = d`` with ARD; summed over dimensions, ``k = 1``, with a shared lengthscale).

        Computed once (the inputs do not change during a fit): every MLL
        evaluation then needs ``k`` multiply-adds with ``1/ℓ²`` instead of rebuilding
        distances, and the lengthscale gradient is one contraction with it.
        Differences, not ``|a|² − 2ab + |b|²``: no cancellation for close points.
        Coordinate-major, so each dimension's ``n x n`` block is contiguous: the sums over
        dimensions are ``k`` elementwise passes, not a batched ``n² x k`` by ``k x 1`` product
        (docs/design.md). Memory: ``B·n²·k`` numbers, ``k`` times the covariance matrix.
        """
        if self._sqd is None:
            Xt = self.X.mT  # B x d x n
            diff = Xt.unsqueeze(-1) - Xt.unsqueeze(-2)
            sqd = diff * diff
            self._sqd = sqd if self.spec.ard else sqd.sum(-3, keepdim=True)
        return self._sqd

    @property
    def _pair_bias(self) -> Tensor:
        """``B x n x n``: 0 where both points are observed, ``-inf`` where either is padding
        (added to the exponent, it zeroes the padded part of ``K_f``). Built once, like :attr:`sqdist`."""
        if self._bias is None:
            mm = self.mask.unsqueeze(-1) & self.mask.unsqueeze(-2)
            self._bias = torch.zeros(mm.shape, dtype=self.X.dtype, device=self.X.device).masked_fill_(~mm, -torch.inf)
        return self._bias

    def _consts(self) -> dict[str, Any]:
        r"""Tensors that depend only on the data and the spec, built once per GP (the fit
        evaluates the MLL a few hundred times on the same data): masks as numbers, ``1/n``,
        the MLL's constant, the priors' locations and scales, the positive parameters' lower bounds."""
        c = getattr(self, "_const_cache", None)
        if c is not None:
            return c
        s, d = self.spec, self.dim
        dt, dev = self.X.dtype, self.X.device
        k = d if s.ard else 1
        mask_f = self.mask.to(dt)
        n = self.num_valid.to(dt)
        const = 0.5 * _LOG2PI * n  # −log N's constant; the priors' normalizers are added below
        # constant_tensor writes runs of equal values with one fill each (no host copy: also
        # inside a CUDA graph capture, for any dimension)
        lower = [s.lengthscale_lower] * k + [0.0] * int(s.outputscale) + [s.noise_lower]
        c = {
            "mask_f": mask_f,
            "pad_f": 1.0 - mask_f,
            "inv_n": 1.0 / n.clamp_min(1),
            "num_positive": len(lower),
            "lower": constant_tensor(lower, dtype=dt, device=dev),
            "k": k,
            "one": torch.ones((), dtype=dt, device=dev),
        }
        if s.priors:  # LogNormal on the lengthscales (k) and the noise (1)
            ls_prior = getattr(self, "ls_prior", None)
            if ls_prior is None:
                loc, scale = s.ls_prior(d)
                c["prior_inv_scale"] = constant_tensor([1.0 / scale] * k + [1.0], dtype=dt, device=dev)
                c["prior_shift"] = constant_tensor([-loc / scale] * k + [4.0], dtype=dt, device=dev)
                const = const + k * (math.log(scale) + 0.5 * _LOG2PI) + 0.5 * _LOG2PI
            else:  # one prior per agent: B x (k + 1), the noise's LogNormal(-4, 1) last
                loc_b, scale_b = ls_prior
                one = torch.ones_like(loc_b[:, :1])
                c["prior_inv_scale"] = torch.cat([1.0 / scale_b, one], -1)
                c["prior_shift"] = torch.cat([-loc_b / scale_b, 4.0 * one], -1)
                const = const + scale_b.log().sum(-1) + (k + 1) * 0.5 * _LOG2PI
        c["const"] = const
        self._const_cache = c
        return c

    def _train_parts(self, x: Tensor, params: Tensor, signal: bool = True) -> tuple[Tensor | None, Tensor, Tensor]:
        r"""``(K_f, K_f + σ²I, ℓ⁻²)``: the masked signal covariance and the full one with
        masked rows/columns replaced by identity, both ``... x B x n x n``, from the
        constrained hyperparameters ``x`` (:meth:`_constrained`).

        ``K_f = exp(log s² − ½ Σ_j D_j/ℓ_j² + bias)``: one ``... x B x n x n`` allocation
        and the other passes (one multiply-add per further dimension, the bias, ``log s²``,
        ``exp``) in place unless autograd records (an out-of-place chain allocated at every
        step, and on a CPU the page faults of each fresh allocation cost as much as the
        arithmetic). With ``signal=False`` only ``K`` is built (``None`` for ``K_f``) and,
        unless autograd records, in the same memory.
        """
        s, c = self.spec, self._consts()
        k = c["k"]
        D = self.sqdist  # B x k x n x n
        inv_ls2 = x[..., :k].pow(-2)
        # Σ_j D_j (−½ℓ_j⁻²) for every leading batch (the line search's K candidates), D read as it is
        w = (-0.5 * inv_ls2).unsqueeze(-1).unsqueeze(-1)  # ... x B x k x 1 x 1
        grad = torch.is_grad_enabled() and (w.requires_grad or D.requires_grad)  # autograd: out of place
        t = D[:, 0] * w[..., 0, :, :]
        for j in range(1, D.shape[-3]):
            # the same operation either way (addcmul rounds like addcmul_: the same bits with autograd)
            t = torch.addcmul(t, D[:, j], w[..., j, :, :]) if grad else t.addcmul_(D[:, j], w[..., j, :, :])
        t = t + self._pair_bias if grad else t.add_(self._pair_bias)
        if s.outputscale:  # log s² is the unconstrained parameter itself
            log_os = params[..., k].unsqueeze(-1).unsqueeze(-1)
            t = t + log_os if grad else t.add_(log_os)
        diag = torch.addcmul(c["pad_f"], x[..., k + int(s.outputscale)].unsqueeze(-1), c["mask_f"])
        if grad:  # out of place: autograd keeps the exp's output
            Kf = t.exp()
            K = Kf + torch.diag_embed(diag.expand(Kf.shape[:-1]))
        else:
            Kf = t.exp_()
            K = Kf.clone() if signal else Kf
            K.diagonal(dim1=-2, dim2=-1).add_(diag)
        return (Kf if signal else None), K, inv_ls2

    def _train_cov(self, params: Tensor) -> Tensor:
        """``B x n x n`` covariance ``K + σ²I`` with masked rows/columns replaced by identity."""
        return self._train_parts(self._constrained(params)[0], params, signal=False)[1]

    def mll(self, params: Tensor | None = None) -> Tensor:
        r"""GPyTorch's ``ExactMarginalLogLikelihood`` (incl. priors) per agent: ``...`` (``... x p`` params).

        ``(log N(y | c, K + σ²I) + log priors) / n`` on the standardized outcomes
        and normalized inputs; ``-inf`` where the covariance is not positive definite.
        """
        return self._mll(self.params if params is None else params, False, 1.0)[0]

    def mll_and_grad(self, params: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r""":meth:`mll` and its gradient in the unconstrained parameters, in closed form.

        Returns ``(...,  ... x p)``; where the covariance is not positive definite the
        value is ``-inf`` and the gradient 0.

        With ``α = K⁻¹r``, ``∂ log N / ∂θ = ½ tr((ααᵀ − K⁻¹) ∂K/∂θ)`` and ``∂/∂c = Σα``
        (Rasmussen & Williams, eq. 5.9). ``K⁻¹`` comes from the Cholesky factor
        (``L⁻ᵀL⁻¹``): the trace needs its entries, and autograd's backward through
        ``cholesky_ex`` forms the same matrix. Why not autograd: its backward pass
        costs as much as the rest of a refit; this costs one factorization-sized
        product instead (``docs/design.md``).
        """
        return self._mll(self.params if params is None else params, True, 1.0)

    @overload
    def _mll(self, params: Tensor, with_grad: Literal[False], sign: float) -> tuple[Tensor, None]: ...
    @overload
    def _mll(self, params: Tensor, with_grad: Literal[True], sign: float) -> tuple[Tensor, Tensor]: ...
    def _mll(self, params: Tensor, with_grad: bool, sign: float) -> tuple[Tensor, Tensor | None]:
        r"""``sign ·`` :meth:`mll` (and its gradient): the fit minimizes ``−mll`` with ``sign = −1``
        at no extra cost. Written for few tensor operations (each is a kernel launch on a GPU, and
        the fit evaluates this a few hundred times): constants folded once (:meth:`_consts`), the
        signal variance's log taken from the parameters, the priors of all lengthscales and the
        noise as one vector expression, every quadratic form a batched product."""
        s, c = self.spec, self._consts()
        k = c["k"]
        x, e = self._constrained(params)
        Kf, K, inv_ls2 = self._train_parts(x, params, signal=with_grad)
        L, info = torch.linalg.cholesky_ex(K)
        r = (
            torch.addcmul(self.y, params[..., -1:], c["mask_f"], value=-1.0)
            if s.mean == "constant"
            else self.y.expand(K.shape[:-1])
        )  # y − c, 0 on masked entries
        r = r.unsqueeze(-1)
        if with_grad:
            # K⁻¹ = L⁻ᵀL⁻¹ by triangular solves: unlike cholesky_inverse/cholesky_solve they neither raise on a
            # failed factorization (masked below) nor read an error flag on the host (no CUDA sync), and an
            # agent's K⁻¹ does not depend on the batch (cholesky_inverse's batched CPU path does)
            eye = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
            Li = torch.linalg.solve_triangular(L, eye.expand_as(L), upper=False)
            Kinv = matmul(Li.mT, Li)
            alpha = matmul(Kinv, r)  # K⁻¹r; 0 on masked entries
            quad = matmul(r.mT, alpha).view(K.shape[:-2])
        else:
            z = torch.linalg.solve_triangular(L, r, upper=False)
            quad = matmul(z.mT, z).view(K.shape[:-2])
        # −n · mll = Σ log L_ii + ½ rᵀK⁻¹r + ½ n log 2π (− log priors)
        acc = torch.log(L.diagonal(dim1=-2, dim2=-1)).sum(-1).add_(quad, alpha=0.5).add_(c["const"])
        if s.priors:
            # LogNormal on the lengthscales and the noise: −log p = ½ z² + log x + const, z = (log x − loc)/scale
            # lengthscales and noise (without the signal variance between them); slices, not an
            # index list: a list is copied from the host (a synchronization, and no CUDA graph)
            skip_os = (lambda t: torch.cat([t[..., :k], t[..., k + 1 :]], -1)) if s.outputscale else (lambda t: t)
            xp = skip_os(x)
            lx = torch.log(xp)
            zp = torch.addcmul(c["prior_shift"], lx, c["prior_inv_scale"])
            acc = acc + torch.addcmul(lx, zp, zp, value=0.5).sum(-1)
        scale = c["inv_n"] * -sign  # value = sign · mll = −sign · acc / n
        ok = info == 0
        value = torch.where(ok, acc * scale, -sign * torch.inf)
        if not with_grad:
            return value, None
        # W = ααᵀ − K⁻¹ and GK = W ∘ K_f in K⁻¹'s memory (each fresh n x n batch costs a pass of page faults)
        W = Kinv.neg_()
        # ααᵀ elementwise, not as a rank-one product: a batch of one would take BLAS's other path
        W.addcmul_(alpha, alpha.mT)  # ... x n x n
        diagW = (W.diagonal(dim1=-2, dim2=-1) * c["mask_f"]).sum(-1)
        assert Kf is not None  # built with the gradient (signal=True)
        GK = W.mul_(Kf)  # zero outside the valid block
        # ∂(n·mll)/∂p: lengthscales ½ Σ GK D_j / ℓ_j³ · (ℓ_j − ℓ_min), i.e. ½ GD · ℓ⁻² · e/ℓ;
        # signal variance ½ Σ GK; noise ½ tr(W) e_σ²; mean Σα (accumulated as −n·∂mll, like acc)
        GD = matmul(GK.flatten(-2).unsqueeze(-2), self.sqdist.flatten(-2).mT).squeeze(-2)  # Σ_ik GK_ik D_jik: ... x k
        parts = [GD * (inv_ls2 * e[..., :k] / x[..., :k]).mul_(-0.5)]
        if s.outputscale:
            parts.append(GK.sum((-2, -1)).mul_(-0.5).unsqueeze(-1))
        parts.append((diagW * e[..., k + int(s.outputscale)]).mul_(-0.5).unsqueeze(-1))
        if s.mean == "constant":
            parts.append(alpha.sum(-2).neg_())
        grad = torch.cat(parts, -1)
        if s.priors:
            # ∂/∂p (½ z² + log x) = (z/scale + 1) · e/x
            gp = torch.addcmul(c["one"], zp, c["prior_inv_scale"])
            gp = gp * skip_os(e) / xp
            if s.outputscale:
                grad[..., :k] += gp[..., :k]
                grad[..., k + 1] += gp[..., k]
            else:
                grad[..., : k + 1] += gp
        grad = grad * scale.unsqueeze(-1)
        return value, torch.where(ok.unsqueeze(-1), grad, 0.0)

    def fit(self, maxiter: int = 60, restarts: Tensor | None = None, **options: Any) -> BatchedExactGP:
        r"""Maximize each agent's MLL from its current parameters (warm start).

        Args:
            maxiter: Iteration cap of the batched BFGS (every agent stops on its own before).
            restarts: Optional ``R x B x p`` further starting points; each agent
                keeps the best of its current parameters and its restarts (the
                authors' 10-restart fits), all optimized in one batch.
            options: Passed to :func:`~fbo_torch.optim.quasi_newton.minimize_batched`.

        Returns:
            ``self`` with fitted ``params``; ``converged`` holds the per-agent flags.
            On CUDA the whole fit is replayed as one CUDA graph
            (:mod:`fbo_torch.utils.cuda_graphs`).
        """
        maxiter = check_int("maxiter", maxiter, minimum=0)
        B, p = self.params.shape
        x0 = self.params.unsqueeze(0)
        if restarts is not None:
            x0 = torch.cat([x0, restarts.to(x0)], 0)  # (1+R) x B x p
        reps = x0.shape[0]
        opts = {"init_step": 0.5, "gtol": 1e-6, "ftol": 1e-10, **options}
        spec, dim = self.spec, self.dim

        def pure(
            X: Tensor, y: Tensor, mask: Tensor, num_valid: Tensor, start: Tensor, *prior: Tensor
        ) -> tuple[Tensor, ...]:
            data = BatchedExactGP._view(spec, dim, X, y, mask, num_valid, reps, (prior[0], prior[1]) if prior else None)

            def functions(
                gp: BatchedExactGP,
            ) -> tuple[Callable[[Tensor], tuple[Tensor, Tensor]], Callable[[Tensor], Tensor]]:
                def vg(x: Tensor) -> tuple[Tensor, Tensor]:
                    return gp._mll(x, True, -1.0)  # −mll and its gradient

                def values(xs: Tensor) -> Tensor:
                    with torch.no_grad():
                        f = gp._mll(xs, False, -1.0)[0]
                    return f.nan_to_num_(nan=torch.inf, posinf=torch.inf, neginf=-torch.inf)

                return vg, values

            vg, values = functions(data)
            res = minimize_batched(
                vg, start, values=values, maxiter=maxiter, restrict=lambda index: functions(data._subset(index)), **opts
            )
            return res.x, res.fun, res.converged

        tensors = (self.X, self.y, self.mask, self.num_valid, x0.reshape(reps * B, p), *(self.ls_prior or ()))
        key = (spec, dim, reps, maxiter, tuple(sorted(opts.items())), self.ls_prior is not None)
        if gpu_path(self.X.device):
            xs, fs, conv = _FIT_GRAPHS(pure, tensors, key)
        else:  # the MLL's gradient in closed form, the GP a fresh view of the tensors
            xs, fs, conv = without_autograd(pure, *tensors)
        x, f, conv = xs.view(reps, B, p), fs.view(reps, B), conv.view(reps, B)
        best = torch.argmin(torch.where(torch.isfinite(f), f, torch.inf), dim=0)  # B
        self.params = x.gather(0, best.view(1, B, 1).expand(1, B, p)).squeeze(0).detach()
        self.converged = conv.gather(0, best.view(1, B)).squeeze(0)
        self._chol = None
        return self

    @classmethod
    def _view(
        cls,
        spec: GPSpec,
        dim: int,
        X: Tensor,
        y: Tensor,
        mask: Tensor,
        num_valid: Tensor,
        reps: int = 1,
        ls_prior: tuple[Tensor, Tensor] | None = None,
    ) -> BatchedExactGP:
        """A bare GP on given tensors (what :meth:`mll` needs), its batch repeated ``reps`` times."""
        obj = cls.__new__(cls)
        obj.spec, obj.dim = spec, dim
        rep: Callable[[Tensor], Tensor] = (
            (lambda t: t.repeat(reps, *([1] * (t.ndim - 1)))) if reps > 1 else (lambda t: t)
        )
        obj.X, obj.y, obj.mask, obj.num_valid = rep(X), rep(y), rep(mask), rep(num_valid)
        obj.ls_prior = None if ls_prior is None else (rep(ls_prior[0]), rep(ls_prior[1]))
        obj._sqd = obj._bias = None
        return obj

    def _subset(self, index: Tensor) -> BatchedExactGP:
        """A bare GP of the agents ``index`` (what :meth:`mll` needs), sharing the cached distances."""
        prior = None if self.ls_prior is None else (self.ls_prior[0][index], self.ls_prior[1][index])
        obj = BatchedExactGP._view(
            self.spec, self.dim, self.X[index], self.y[index], self.mask[index], self.num_valid[index], 1, prior
        )
        obj._sqd = self.sqdist[index]
        obj._bias = self._pair_bias[index]
        return obj

    def random_params(self, keys: Tensor, num: int) -> Tensor:
        r"""``num x B x p`` random starting points (keyed; uniform in log-space boxes):
        lengthscales in ``[0.01, 2]`` (unit cube), signal variance in ``[0.1, 10]``, noise in
        ``[1e-4, 0.5]`` standardized units, constant mean 0. For restarts of ML fits."""
        B, p = self.params.shape
        u = kr.uniform(keys, num * p).view(B, num, p).transpose(0, 1)
        s, d = self.spec, self.dim
        k = d if s.ard else 1

        def logu(v: Tensor, lo: float, hi: float) -> Tensor:
            return math.log(lo) + v * (math.log(hi) - math.log(lo))

        ls = (
            torch.exp(logu(u[..., :k], 0.01, 2.0)).expand(num, B, d)
            if not s.ard
            else torch.exp(logu(u[..., :k], 0.01, 2.0))
        )
        i = k
        os_ = torch.exp(logu(u[..., i], 0.1, 10.0)) if s.outputscale else None
        i += int(s.outputscale)
        noise = torch.exp(logu(u[..., i], 1e-4, 0.5)) + s.noise_lower
        mean = torch.zeros_like(noise)
        return self.pack(ls + s.lengthscale_lower, noise, os_, mean).to(self.params)

    # ------------------------------------------------------------ posterior
    @property
    def hyperparameters(self) -> dict[str, Tensor]:
        """Constrained hyperparameters (standardized units) of every agent."""
        return self.unpack(self.params)

    @property
    def cholesky(self) -> Tensor:
        r"""``B x n x n`` Cholesky factor of ``K + σ²I`` at the current parameters."""
        if self._chol is None:
            K = self._train_cov(self.params)
            L, info = torch.linalg.cholesky_ex(K)
            # a failed factorization (not expected with σ² ≥ σ²_min) falls back to a jittered one
            jitter = 1e-6 * torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
            L2 = torch.linalg.cholesky_ex(K + jitter)[0]
            self._chol = torch.where((info == 0).view(-1, 1, 1), L, L2)
        return self._chol

    def loo_log_predictive(self) -> Tensor:
        r"""Each agent's leave-one-out log predictive density of its observations: ``B``.

        ``Σ_i log N(y_i | μ_{-i}, σ²_{-i})`` over the valid observations, on the
        standardized outcomes at the current hyperparameters, in closed form from one
        factorization: ``y_i − μ_{-i} = [K⁻¹r]_i / [K⁻¹]_ii`` and ``σ²_{-i} = 1 / [K⁻¹]_ii``
        with ``r = y − c`` (Rasmussen & Williams 2006, eqs. 5.10–5.12). Unlike the
        marginal likelihood at a MAP fit (:meth:`mll`), it holds no prior density: a
        narrower hyperparameter prior does not score higher unless the model it leads to
        predicts the agent's held-out observations better (how
        :meth:`~fbo_torch.federation.agents.Agents.current_gp` chooses between lengthscale
        priors).

        Returns:
            ``B`` sums of log densities (``-inf`` where the covariance is not positive definite).
        """
        K = self._train_cov(self.params)
        L, info = torch.linalg.cholesky_ex(K)
        eye = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
        Li = torch.linalg.solve_triangular(L, eye.expand_as(L), upper=False)
        kinv_diag = Li.square().sum(-2)  # [K⁻¹]_ii = Σ_j (L⁻¹)_ji²: B x n
        r = self.y - self.unpack(self.params)["mean"].unsqueeze(-1)
        r = torch.where(self.mask, r, 0.0).unsqueeze(-1)
        alpha = matmul(Li.mT, matmul(Li, r)).squeeze(-1)  # K⁻¹r
        log_p = 0.5 * (kinv_diag.log() - _LOG2PI) - 0.5 * alpha.square() / kinv_diag
        total = torch.where(self.mask, log_p, 0.0).sum(-1)
        return torch.where(info == 0, total, -torch.inf)

    def factored(self) -> FactoredGPs:
        """The agents' GPs at the current hyperparameters, factored (what posteriors and paths are built from)."""
        return FactoredGPs(
            self.bounds, self.X, self.y, self.mask, self.cholesky, self.hyperparameters, self.y_mean, self.y_std
        )

    def posterior_moments(self) -> BatchedGPPosterior:
        r"""The agents' posteriors at the current hyperparameters, factored once: a
        :class:`~fbo_torch.models.gp_posterior.BatchedGPPosterior`, callable on ``B x C x d``
        points (mean, variance and their input gradients)."""
        return BatchedGPPosterior.from_factor(self.factored())

    def posterior(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Posterior mean and variance of the latent function at ``B x C x d`` domain points.

        Returns:
            ``(mean, variance)``, ``B x C`` each, in the original outcome units: agent ``b``'s
            equal ``to_botorch(b).posterior(X[b])``'s ``mean`` and ``variance`` (no observation
            noise) to float64 round-off. For many evaluations, factor once with :meth:`posterior_moments`.
        """
        return self.posterior_moments()(X)

    def draw_paths(self, keys: Tensor, num_features: int = 256) -> GPThompsonPaths:
        r"""One Thompson sample (Matheron path) per agent, from the agents' keyed streams.

        Args:
            keys: ``B`` int64 keys (e.g. ``fold(agent_keys, round)``).
            num_features: ``F`` random features of the prior draw (even; BoTorch's default is 1024).

        Returns:
            :class:`~fbo_torch.sampling.gp_paths.GPThompsonPaths`, callable on ``B x C x d`` domain points.
        """
        F = check_int("num_features", num_features, minimum=2)
        if F % 2:
            raise ValueError(f"`num_features` must be even ([sin, cos] pairs), got {F}.")
        B, n, d = self.X.shape
        hp = self.hyperparameters
        dt = self.X.dtype
        z = kr.normal(keys, (F // 2) * d + F + n, dtype=dt)  # frequencies, weights, noise
        W = z[:, : (F // 2) * d].view(B, F // 2, d) / hp["lengthscale"].unsqueeze(-2)
        w = z[:, (F // 2) * d : (F // 2) * d + F]
        eps = z[:, (F // 2) * d + F :] * hp["noise"].sqrt().unsqueeze(-1)
        return GPThompsonPaths.from_draws(self.factored(), W, w, eps)

    def to_botorch(self, index: int | None = None) -> SingleTaskGP:
        r"""The equal BoTorch ``SingleTaskGP``, hyperparameters loaded: the export for users.

        The engine fits and samples the GPs as plain tensors; this returns the
        same model as BoTorch's ``SingleTaskGP`` (same kernel, mean, likelihood,
        ``Normalize``/``Standardize`` transforms and hyperparameters), whose
        posterior equals the engine's to float64 round-off (tests check it), for
        anything BoTorch offers (acquisition functions, ``draw_matheron_paths``,
        RGPE/TAF target models).

        Args:
            index: ``None``: all agents (``batch_shape = [B]``; every observation
                must be valid, a batched ``SingleTaskGP`` has no masks). An
                integer: agent ``index`` alone, unbatched, on its valid observations.

        Returns:
            A ``SingleTaskGP`` in eval mode with the engine's hyperparameters.
        """
        return to_single_task_gp(self.spec, self.factored(), index)


def log_lengthscales(params: Tensor, spec: str | GPSpec, dim: int) -> Tensor:
    r"""``... x k`` log lengthscales (unit-cube units; ``k = d`` with ARD, else 1) from ``... x p``
    unconstrained :class:`BatchedExactGP` parameters of a spec (``ℓ = ℓ_min + exp(p)``)."""
    s = get_spec(spec)
    k = dim if s.ard else 1
    return (params[..., :k].exp() + s.lengthscale_lower).log()


# GPSpec, GP_SPECS and get_spec live in fbo_torch.models.gp_spec; imported from here they still work
__all__ = ["GP_SPECS", "BatchedExactGP", "GPSpec", "get_spec", "log_lengthscales"]
