r"""The export of the batched GPs to BoTorch: the equal ``SingleTaskGP`` with the fitted hyperparameters.

The engine fits and samples the agents' GPs as plain tensors
(:class:`~fbo_torch.models.batched_gp.BatchedExactGP`); :func:`to_single_task_gp`
returns the same model as BoTorch's ``SingleTaskGP`` (same kernel, mean,
likelihood, ``Normalize``/``Standardize`` transforms and hyperparameters), whose
posterior equals the engine's to float64 round-off (tests check it), for anything
BoTorch offers (acquisition functions, ``draw_matheron_paths``, RGPE/TAF target
models).
"""

from __future__ import annotations

from typing import Any

import torch
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize
from botorch.models.transforms.outcome import Standardize
from gpytorch.constraints import GreaterThan
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, ZeroMean
from gpytorch.priors import LogNormalPrior

from fbo_torch.models.gp_posterior import FactoredGPs
from fbo_torch.models.gp_spec import GPSpec


def to_single_task_gp(spec: GPSpec, gp: FactoredGPs, index: int | None = None) -> SingleTaskGP:
    r"""The BoTorch ``SingleTaskGP`` equal to factored GPs of ``spec``, hyperparameters loaded.

    Args:
        spec: The GPs' :class:`~fbo_torch.models.gp_spec.GPSpec`.
        gp: The GPs (``B`` of them), e.g. ``BatchedExactGP.factored()``.
        index: ``None``: all agents (``batch_shape = [B]``; every observation
            must be valid, a batched ``SingleTaskGP`` has no masks). An
            integer: agent ``index`` alone, unbatched, on its valid observations.

    Returns:
        A ``SingleTaskGP`` in eval mode with the GPs' hyperparameters.
    """
    s, d = spec, gp.X.shape[-1]
    hp = gp.hyperparameters
    if index is None:
        if not bool(gp.mask.all()):
            raise ValueError(
                "to_botorch() needs every observation valid; this GP has masked entries "
                "(use to_botorch(index) for one agent)."
            )
        X, y, y_mean, y_std = gp.X, gp.y, gp.y_mean.unsqueeze(-1), gp.y_std.unsqueeze(-1)
        bs = torch.Size([gp.X.shape[0]])
    else:
        keep = gp.mask[index]
        X, y = gp.X[index, keep], gp.y[index, keep]
        y_mean, y_std = gp.y_mean[index], gp.y_std[index]
        hp = {k: v[index] for k, v in hp.items()}
        bs = torch.Size([])
    Xo = gp.bounds[0] + X * (gp.bounds[1] - gp.bounds[0])
    Yo = (y * y_std + y_mean).unsqueeze(-1)
    kwargs: dict[str, Any] = {}
    botorch_default = (
        s.priors
        and not s.outputscale
        and s.ard
        and s.lengthscale_lower == 0.025
        and s.noise_lower == 1e-4
        and s.ls_prior_median is None
        and s.ls_prior_scale is None
    )
    if not botorch_default:
        ls_prior = noise_prior = None
        if s.priors:  # the spec's LogNormal priors, as BoTorch's default model attaches its own
            loc, scale = s.ls_prior(d)
            ls_prior, noise_prior = LogNormalPrior(loc, scale), LogNormalPrior(-4.0, 1.0)
        base = RBFKernel(
            ard_num_dims=d if s.ard else None,
            batch_shape=bs,
            lengthscale_prior=ls_prior,
            lengthscale_constraint=GreaterThan(s.lengthscale_lower),
        )
        kwargs["covar_module"] = ScaleKernel(base, batch_shape=bs) if s.outputscale else base
        kwargs["likelihood"] = GaussianLikelihood(
            batch_shape=bs, noise_prior=noise_prior, noise_constraint=GreaterThan(s.noise_lower)
        )
    if s.mean == "zero":
        kwargs["mean_module"] = ZeroMean(batch_shape=bs)
    elif "covar_module" in kwargs:
        kwargs["mean_module"] = ConstantMean(batch_shape=bs)
    lo, hi = gp.bounds[0], gp.bounds[1]
    unit = bool((lo == 0).all()) and bool((hi == 1).all())
    model = SingleTaskGP(
        Xo,
        Yo,
        outcome_transform=Standardize(m=1, batch_shape=bs) if s.standardize else None,
        input_transform=None if unit else Normalize(d=d, bounds=gp.bounds),
        **kwargs,
    )
    covar = model.covar_module
    base = covar.base_kernel if s.outputscale else covar
    ls = hp["lengthscale"] if s.ard else hp["lengthscale"][..., :1]
    base.lengthscale = ls.unsqueeze(-2)
    if s.outputscale:
        covar.outputscale = hp["outputscale"]
    model.likelihood.noise = hp["noise"].unsqueeze(-1)
    if s.mean == "constant":
        model.mean_module.constant = hp["mean"].reshape(model.mean_module.constant.shape)
    return model.eval()


__all__ = ["to_single_task_gp"]
