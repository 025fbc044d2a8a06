r"""Which exact GP the agents use: :class:`GPSpec` and the named configurations :data:`GP_SPECS`.

A spec fixes the model of :class:`~fbo_torch.models.batched_gp.BatchedExactGP`
(kernel, mean, priors, constraints, outcome standardization, starting values);
``"botorch"`` is BoTorch's default ``SingleTaskGP``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GPSpec:
    r"""Which exact GP the agents use.

    Attributes:
        ard: One lengthscale per input dimension (else one shared).
        outputscale: Learn a signal variance (``ScaleKernel``); else it is 1 in
            standardized units (BoTorch's default ``SingleTaskGP``).
        mean: ``"constant"`` (learned) or ``"zero"``.
        priors: BoTorch's priors (LogNormal on lengthscales and noise) — a MAP
            fit; without, maximum likelihood.
        standardize: Fit on per-agent standardized outcomes (BoTorch's ``Standardize``).
        lengthscale_lower / noise_lower: Lower bounds (constraints).
        lengthscale_init / outputscale_init / noise_init: Starting values
            (``None``: the prior's mode, as BoTorch initializes).
        ls_prior_median: The lengthscale prior's median per ``√d`` (the median is
            ``ls_prior_median·√d``); ``None``: BoTorch's (``e^√2·√d``).
        ls_prior_scale: The lengthscale prior's LogNormal scale; ``None``: BoTorch's (``√3``).
    """

    ard: bool = True
    outputscale: bool = False
    mean: str = "constant"
    priors: bool = True
    standardize: bool = True
    lengthscale_lower: float = 0.025
    noise_lower: float = 1e-4
    lengthscale_init: float | None = None
    outputscale_init: float = 1.0
    noise_init: float | None = None
    ls_prior_median: float | None = None
    ls_prior_scale: float | None = None

    def __post_init__(self) -> None:
        if self.mean not in ("constant", "zero"):
            raise ValueError(f"`mean` must be 'constant' or 'zero', got {self.mean!r}.")
        if not (self.lengthscale_lower >= 0 and self.noise_lower >= 0):
            raise ValueError("`lengthscale_lower` and `noise_lower` must be >= 0.")

    def num_params(self, dim: int) -> int:
        """Length of the unconstrained parameter vector for ``dim`` inputs."""
        return (dim if self.ard else 1) + int(self.outputscale) + 1 + int(self.mean == "constant")

    def ls_prior(self, dim: int) -> tuple[float, float]:
        """The LogNormal lengthscale prior (loc, scale): BoTorch's dimension-scaled one
        (median ``e^√2·√d``, scale ``√3``) unless ``ls_prior_median`` (the median is
        ``ls_prior_median·√d``) / ``ls_prior_scale`` are set."""
        if self.ls_prior_median is None:
            loc = math.sqrt(2.0) + 0.5 * math.log(dim)
        else:
            loc = math.log(self.ls_prior_median) + 0.5 * math.log(dim)
        scale = math.sqrt(3.0) if self.ls_prior_scale is None else self.ls_prior_scale
        return loc, scale


#: Named GP configurations. ``"botorch"``: BoTorch's default ``SingleTaskGP``
#: (RBF/ARD, dimension-scaled LogNormal lengthscale prior, LogNormal(-4, 1)
#: noise prior, constant mean, standardized outcomes). ``"rbf"``: a scaled
#: RBF/ARD kernel fitted by maximum likelihood (GPyTorch's default
#: constraints), like the authors' GPy models but with ARD. ``"authors"``: the
#: authors' GPy ``GPRegression`` — isotropic RBF with a signal variance, zero
#: mean, raw (unstandardized) outputs, maximum likelihood, GPy's starting
#: values (variance 1, lengthscale 1, noise 1). ``"fbo"``: BoTorch's model with a
#: noise floor of ``1e-6`` instead of ``1e-4`` (standardized units) and a LogNormal
#: lengthscale prior of median ``0.115·√d`` (unit-cube units) and scale ``0.75``
#: instead of BoTorch's median ``e^√2·√d`` and scale ``√3``. On a noiseless black
#: box whose values span orders of magnitude BoTorch's floor (1% of the outputs'
#: standard deviation) hides the last orders of improvement near the optimum, and
#: with 10–30 points BoTorch's long-lengthscale prior fits a smooth trend and
#: explores the box's corners; the noise prior is BoTorch's, so noisy data still
#: fit their noise (``docs/design.md``, "The local engine", has the measurements).
GP_SPECS: dict[str, GPSpec] = {
    "botorch": GPSpec(),
    "rbf": GPSpec(
        ard=True,
        outputscale=True,
        priors=False,
        lengthscale_lower=1e-3,
        noise_lower=1e-4,
        lengthscale_init=math.log(2.0) + 1e-3,
        outputscale_init=math.log(2.0),
        noise_init=math.log(2.0) + 1e-4,
    ),
    "fbo": GPSpec(noise_lower=1e-6, ls_prior_median=0.115, ls_prior_scale=0.75),
    "authors": GPSpec(
        ard=False,
        outputscale=True,
        mean="zero",
        priors=False,
        standardize=False,
        lengthscale_lower=1e-4,
        noise_lower=1e-6,
        lengthscale_init=1.0,
        outputscale_init=1.0,
        noise_init=1.0,
    ),
}


def get_spec(spec: str | GPSpec) -> GPSpec:
    """A :class:`GPSpec` from a name in :data:`GP_SPECS` or a spec."""
    if isinstance(spec, GPSpec):
        return spec
    if spec not in GP_SPECS:
        raise ValueError(f"Unknown GP spec {spec!r}; expected one of {sorted(GP_SPECS)} or a GPSpec.")
    return GP_SPECS[spec]


__all__ = ["GP_SPECS", "GPSpec", "get_spec"]
