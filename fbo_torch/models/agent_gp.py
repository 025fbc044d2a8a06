r"""Each agent's own exact GP, for a batch of agents at once.

On its own branch of FTS / DP-FTS-DE an agent maximizes a Thompson sample of its
exact GP posterior. Here all ``N`` agents' GPs are one batched BoTorch
``SingleTaskGP`` (``batch_shape = [N]``, SE/ARD kernel with BoTorch's default
priors, per-agent outcome standardization), fitted jointly with
``fit_gpytorch_mll`` (the batch MLL is a sum of independent terms, so one
L-BFGS-B run fits every agent), and sampled with BoTorch's pathwise (Matheron)
sampler so each sample is a function that can be evaluated and differentiated
anywhere.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from functools import partial

import torch
from botorch.exceptions.errors import ModelFittingError
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize
from botorch.models.transforms.outcome import Standardize
from botorch.sampling.pathwise import draw_kernel_feature_paths, draw_matheron_paths
from botorch.sampling.pathwise.paths import SamplePath
from gpytorch.kernels import Kernel
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch import Tensor

from fbo_torch.utils.validation import check_bounds, check_finite, check_floating, check_ndim

#: Parameter groups carried over when warm-starting from a previous fit.
HYPER_PREFIXES = ("covar_module.", "likelihood.", "mean_module.")


def build_agent_gps(
    train_X: Tensor,
    train_Y: Tensor,
    bounds: Tensor | None = None,
    covar_module: Kernel | None = None,
    train_Yvar: Tensor | None = None,
) -> SingleTaskGP:
    r"""Build (without fitting) a batched ``SingleTaskGP`` for ``N`` agents.

    Args:
        train_X: ``N x n x d`` inputs (every agent holds ``n`` observations).
        train_Y: ``N x n x 1`` observations.
        bounds: Optional ``2 x d`` domain bounds; when given, inputs are
            normalized to the unit cube with BoTorch's ``Normalize``.
        covar_module: Optional kernel (batch shape ``[N]``); default is
            BoTorch's RBF/ARD kernel with its dimension-scaled lengthscale prior.
        train_Yvar: Optional known noise variances ``N x n x 1``.

    Returns:
        A ``SingleTaskGP`` with ``batch_shape = [N]`` and ``Standardize`` outcomes.
    """
    check_ndim("train_X", train_X, 3, "N x n x d")
    check_ndim("train_Y", train_Y, 3, "N x n x 1")
    check_floating("train_X", train_X)
    check_floating("train_Y", train_Y)
    N, n, d = train_X.shape
    if train_Y.shape != (N, n, 1):
        raise ValueError(
            f"`train_Y` must have shape {(N, n, 1)} to match `train_X` {tuple(train_X.shape)}, "
            f"got {tuple(train_Y.shape)}."
        )
    check_finite("train_X", train_X)
    check_finite("train_Y", train_Y)
    return SingleTaskGP(
        train_X,
        train_Y,
        train_Yvar=train_Yvar,
        covar_module=covar_module,
        outcome_transform=Standardize(m=1, batch_shape=torch.Size([N])),
        input_transform=_input_transform(bounds, d, train_X),
    )


def _input_transform(bounds: Tensor | None, d: int, like: Tensor) -> Normalize | None:
    """``Normalize`` to the unit cube when ``bounds`` is given and is not already it."""
    if bounds is None:
        return None
    check_bounds("bounds", bounds, dim=d)
    bounds = bounds.to(like)
    if bool((bounds[0] == 0).all()) and bool((bounds[1] == 1).all()):
        return None
    return Normalize(d=d, bounds=bounds)


def build_single_gp(
    train_X: Tensor, train_Y: Tensor, bounds: Tensor | None = None, covar_module: Kernel | None = None
) -> SingleTaskGP:
    r"""One agent's unbatched GP (``n x d``, ``n x 1``), configured like :func:`build_agent_gps`."""
    check_ndim("train_X", train_X, 2, "n x d")
    check_ndim("train_Y", train_Y, 2, "n x 1")
    check_finite("train_Y", train_Y)
    return SingleTaskGP(
        train_X,
        train_Y,
        covar_module=covar_module,
        outcome_transform=Standardize(m=1),
        input_transform=_input_transform(bounds, train_X.shape[-1], train_X),
    )


def warm_start(model: SingleTaskGP, previous: SingleTaskGP | dict[str, Tensor]) -> SingleTaskGP:
    """Copy kernel, likelihood and mean hyperparameters of ``previous`` (a model
    or its ``state_dict``) into ``model``; data and outcome-transform statistics
    are not copied."""
    source = previous if isinstance(previous, dict) else previous.state_dict()
    state = {k: v for k, v in source.items() if k.startswith(HYPER_PREFIXES)}
    model.load_state_dict(state, strict=False)
    return model


def fit_agent_gps(
    train_X: Tensor,
    train_Y: Tensor,
    bounds: Tensor | None = None,
    covar_module: Kernel | None = None,
    previous: SingleTaskGP | dict[str, Tensor] | None = None,
    refit: bool = True,
    train_Yvar: Tensor | None = None,
) -> SingleTaskGP:
    r"""Build and fit a batch of exact GPs, one per agent.

    Args:
        train_X: ``N x n x d`` inputs.
        train_Y: ``N x n x 1`` observations.
        bounds: Optional ``2 x d`` domain bounds (inputs normalized to the unit cube).
        covar_module: Optional kernel; default RBF/ARD (BoTorch defaults).
        previous: A previously fitted model for the same agents (or its
            ``state_dict``); its hyperparameters initialize the new model.
        refit: If False and ``previous`` is given, reuse its hyperparameters
            without optimizing (cheap rounds between refits).
        train_Yvar: Optional known noise variances.

    Returns:
        The fitted model in eval mode. If the optimizer fails, a warning is
        issued and the initial (or warm-started) hyperparameters are kept.
    """
    model = build_agent_gps(train_X, train_Y, bounds=bounds, covar_module=covar_module, train_Yvar=train_Yvar)
    if previous is not None:
        warm_start(model, previous)
    if refit or previous is None:
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        try:
            with torch.enable_grad():  # fitting needs autograd even inside a no_grad caller
                fit_gpytorch_mll(mll)
        except ModelFittingError as err:  # keep going with the starting hyperparameters
            warnings.warn(f"GP hyperparameter fit failed ({err}); keeping the initial values.", stacklevel=2)
    return model.eval()


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def draw_thompson_paths(
    model: SingleTaskGP,
    sample_shape: torch.Size = torch.Size(),
    seed: int | None = None,
    num_features: int | None = None,
) -> SamplePath:
    r"""Draw Thompson samples of every agent's GP posterior as sample paths.

    Uses BoTorch's pathwise (Matheron) sampler: a random-feature prior draw plus
    an exact data update, so each path is a deterministic, differentiable
    function of its input.

    Args:
        model: A batched GP (``batch_shape = [N]``), e.g. from :func:`fit_agent_gps`.
        sample_shape: Shape of independent draws per agent.
        seed: Optional seed (the global RNG state is left untouched when given).
        num_features: Random features of the pathwise prior draw (BoTorch's
            default, 1024, when None); fewer is cheaper and coarser.

    Returns:
        A ``SamplePath``; called on ``N x C x d`` (or ``C x d``) inputs it
        returns ``*sample_shape x N x C`` values in the original outcome scale.
    """
    device = next(model.parameters()).device
    # no_grad: the paths' weights become constants, so the paths can be
    # differentiated w.r.t. their inputs any number of times (optimizers do)
    kwargs = {}
    if num_features is not None:
        kwargs["prior_sampler"] = partial(draw_kernel_feature_paths, num_features=int(num_features))
    with _seeded(seed, device), torch.no_grad():
        return draw_matheron_paths(model, sample_shape=torch.Size(sample_shape), **kwargs)
