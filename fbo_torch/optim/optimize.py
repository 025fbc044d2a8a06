r"""Optimize a batch of independent BoTorch acquisition functions in one call.

BoTorch's ``optimize_acqf`` maximizes *one* acquisition function; its
t-batches are restarts of that one problem, so an acquisition over a batched
model (``batch_shape = [B]``: one GP per agent, per seed or per task) cannot be
optimized with it (its values are ``b x B``, not ``b``: a shape error). A
federation, or a study of many seeds, has ``B`` independent problems to solve
every round, and solving them one ``optimize_acqf`` call at a time costs ``B``
times the launches, Python overhead and host round trips.

:func:`optimize_acqf_batched` solves all ``B`` at once with
:func:`~fbo_torch.optim.batched.maximize_batched` (per-problem Sobol raw points,
BoTorch's Boltzmann restart selection, batched box-constrained BFGS, every
problem converging on its own). It evaluates the acquisition on ``C x B x 1 x d``
inputs: BoTorch broadcasts the t-batch ``C x B`` against the model's batch
``B``, so row ``b`` is problem ``b``'s model, and the values ``C x B`` are
transposed to the ``B x C`` the maximizer takes; gradients come from autograd.

:func:`maximize_acquisition` maximizes one BoTorch acquisition over a
:class:`~fbo_torch.optim.domain.Domain` (``optimize_acqf`` on a box, exhaustively on a
finite one): what RGPE's and TAF's targets use, one run at a time.
"""

from __future__ import annotations

from typing import Any

import torch
from botorch.acquisition.acquisition import AcquisitionFunction
from botorch.optim.optimize import optimize_acqf
from torch import Tensor

from fbo_torch.optim.batched import REFINE, default_max_points, maximize_batched
from fbo_torch.optim.domain import Domain
from fbo_torch.utils.validation import check_int, check_tensor

#: ``options`` keys :func:`optimize_acqf_batched` accepts (those of ``optimize_acqf`` that apply, and the maximizer's).
OPTIONS = ("maxiter", "gtol", "ftol", "seed", "eta", "max_points", "refine")
#: Defaults of the options: SciPy's L-BFGS-B stopping rule, which ``optimize_acqf`` uses (``pgtol``, ``factr·eps``),
#: and 50 iterations. All restarts of all problems iterate until the slowest has converged (the acquisition
#: cannot be evaluated on a subset of the model's batch), so the cap bounds the time: restarts need a median of
#: 13-17 BFGS iterations and a 99th percentile of 36-58 on the benchmark's problems (B = 64), and a cap of 50
#: instead of 200 gave the same values to 1e-12 (docs/design.md).
DEFAULT_OPTIONS = {"maxiter": 50, "gtol": 1e-5, "ftol": 2.220446049250313e-09}


def optimize_acqf_batched(
    acq_function: AcquisitionFunction,
    bounds: Tensor,
    q: int = 1,
    num_restarts: int = 8,
    raw_samples: int = 512,
    options: dict[str, Any] | None = None,
    num_problems: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Maximize ``B`` independent acquisition functions, one per batch entry of the model, in one call.

    Any BoTorch acquisition that maps ``t_batch x 1 x d`` to ``t_batch`` over a
    model with ``batch_shape = [B]`` qualifies: analytic ones
    (``UpperConfidenceBound``, ``LogExpectedImprovement``, ``PosteriorMean``, ...)
    and MC ones with ``q = 1``. Per-problem incumbents ``best_f`` have shape
    ``B x 1`` in BoTorch's broadcasting (``train_Y.amax(-2)``); a ``best_f`` of
    shape ``B`` is read as ``B x 1`` during the call (and left as it was). Problem ``b`` is the
    acquisition of the model's ``b``-th GP; with ``bounds`` of shape ``B x 2 x d``
    each problem has its own box. Runs where the model is (CPU or GPU).

    Args:
        acq_function: The acquisition over a batched model (``model.batch_shape = [B]``).
        bounds: ``2 x d`` (shared) or ``B x 2 x d`` (per problem) bounds; moved to the
            model's device and dtype.
        q: Candidates per problem: only ``q = 1`` (one point per problem; for ``q > 1``
            call ``optimize_acqf`` per problem).
        num_restarts: Restarts refined per problem (as ``optimize_acqf``).
        raw_samples: Raw (Sobol) points scored per problem to choose the restarts.
        options: ``maxiter`` (BFGS iterations, default 50: :data:`DEFAULT_OPTIONS`), ``gtol`` / ``ftol`` (its
            stopping rule, by default SciPy's L-BFGS-B's as in ``optimize_acqf``:
            projected gradient 1e-5 in unit-cube coordinates, relative decrease
            2.2e-9), ``seed`` (int: the raw
            points and restart selection; else ``generator``), ``eta`` (Boltzmann
            temperature, default 1), ``max_points`` (cap on ``B x C`` points per
            acquisition call while scoring: memory), ``refine`` (``"qn"``, ``"adam"``,
            ``"lbfgsb"`` or ``None``; see :func:`~fbo_torch.optim.batched.maximize_batched`).
        num_problems: ``B`` when the model has no ``batch_shape`` (checked against it otherwise).
        generator: Optional ``torch.Generator`` for the problems' random streams.

    Returns:
        ``(candidates, values)``: ``B x 1 x d`` maximizers and the ``B`` acquisition
        values there (problem ``b``'s acquisition at ``candidates[b]``).

    Example:
        >>> gp = SingleTaskGP(train_X, train_Y)        # train_X: B x n x d, one GP per problem
        >>> fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
        >>> acqf = LogExpectedImprovement(gp, best_f=train_Y.amax(-2))   # best_f: B x 1
        >>> X, values = optimize_acqf_batched(acqf, bounds, num_restarts=8, raw_samples=512)   # B x 1 x d, B
    """
    if not isinstance(acq_function, AcquisitionFunction):
        raise TypeError(f"`acq_function` must be a BoTorch AcquisitionFunction, got {type(acq_function).__name__}.")
    check_tensor("bounds", bounds)
    q = check_int("q", q, minimum=1)
    if q != 1:
        raise ValueError(f"optimize_acqf_batched returns one candidate per problem (q = 1), got q = {q}.")
    B = _num_problems(acq_function, num_problems)
    opts = {**DEFAULT_OPTIONS, **(options or {})}
    unknown = sorted(set(opts) - set(OPTIONS))
    if unknown:
        raise ValueError(f"`options` has unknown keys {unknown}; expected a subset of {list(OPTIONS)}.")
    if opts.get("refine", "qn") not in REFINE:
        raise ValueError(f"`options['refine']` must be one of {REFINE}, got {opts['refine']!r}.")
    if "seed" in opts:
        if generator is not None:
            raise ValueError("Pass `options['seed']` or `generator`, not both.")
        generator = torch.Generator().manual_seed(check_int("options['seed']", opts.pop("seed")))
    like = _model_tensor(acq_function)
    if like is not None:
        bounds = bounds.to(dtype=like.dtype, device=like.device)
    if not bounds.is_floating_point():
        raise TypeError(f"`bounds` must be a floating-point tensor, got dtype {bounds.dtype}.")

    best_f = getattr(acq_function, "best_f", None)
    column_best_f = best_f if isinstance(best_f, Tensor) and best_f.shape == (B,) else None

    def values(X: Tensor) -> Tensor:  # B x C x d -> B x C
        out = acq_function(X.transpose(0, 1).unsqueeze(-2))  # C x B x 1 x d: t-batch C x B, model batch B
        if out.shape != (X.shape[1], B):
            raise ValueError(
                f"`acq_function` returned values of shape {tuple(out.shape)} on {X.shape[1]} x {B} x 1 x d inputs; "
                f"expected {(X.shape[1], B)} (t-batch x problems): its model must have batch_shape [{B}]."
            )
        return out.transpose(0, 1)

    if column_best_f is not None:  # mean is t-batch x B x 1: problem b's incumbent must sit in row b
        acq_function.best_f = column_best_f.unsqueeze(-1)
    try:
        X, v = maximize_batched(
            values,
            bounds,
            batch_size=B if bounds.ndim == 2 else None,
            raw_samples=raw_samples,
            num_restarts=num_restarts,
            generator=generator,
            **opts,
        )
    finally:
        if column_best_f is not None:
            acq_function.best_f = column_best_f
    return X.unsqueeze(-2), v


def _num_problems(acq_function: AcquisitionFunction, num_problems: int | None) -> int:
    model = getattr(acq_function, "model", None)
    try:
        shape = None if model is None else torch.Size(model.batch_shape)
    except (AttributeError, NotImplementedError):
        shape = None
    if shape is not None and len(shape) != 1:
        raise ValueError(
            f"`acq_function`'s model has batch_shape {tuple(shape)}; optimize_acqf_batched needs one batch "
            "dimension (batch_shape = [B], one GP per problem, e.g. SingleTaskGP with B x n x d train_X)."
        )
    if num_problems is not None:
        num_problems = check_int("num_problems", num_problems, minimum=1)
        if shape is not None and shape[0] != num_problems:
            raise ValueError(f"`num_problems` = {num_problems} but the model has batch_shape [{shape[0]}].")
        return num_problems
    if shape is None:
        raise ValueError("`acq_function` has no model batch_shape to read B from: pass `num_problems`.")
    return int(shape[0])


def _model_tensor(acq_function: AcquisitionFunction) -> Tensor | None:
    """A floating tensor of the acquisition's model (its device and dtype), if any."""
    for t in (*acq_function.parameters(), *acq_function.buffers()):
        if t.is_floating_point():
            return t
    inputs = getattr(getattr(acq_function, "model", None), "train_inputs", None)
    return inputs[0] if inputs else None


def derive_seed(generator: torch.Generator) -> int:
    """A fresh integer seed drawn from ``generator`` (for libraries that use the global RNG)."""
    return int(torch.randint(2**62, (1,), generator=generator, device=generator.device).item())


def maximize_acquisition(acqf: Any, domain: Domain, generator: torch.Generator | None = None) -> Tensor:
    r"""Maximize one BoTorch acquisition function (``b x 1 x d -> b``) over ``domain``.

    Exact on a finite domain (scored in chunks); ``optimize_acqf`` on a box.
    Returns the ``d``-vector maximizer.
    """
    if domain.candidates is not None:
        C = domain.candidates
        chunk = max(1, domain.max_points or default_max_points(C.device))
        with torch.no_grad():
            vals = torch.cat([acqf(C[s : s + chunk].unsqueeze(-2)) for s in range(0, C.shape[0], chunk)])
        return C[vals.argmax()]
    seed = derive_seed(generator) if generator is not None else None
    with torch.random.fork_rng(enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        X, _ = optimize_acqf(acqf, domain.bounds, q=1, num_restarts=domain.num_restarts, raw_samples=domain.raw_samples)
    return X.squeeze(0).detach()


__all__ = ["DEFAULT_OPTIONS", "OPTIONS", "derive_seed", "maximize_acquisition", "optimize_acqf_batched"]
