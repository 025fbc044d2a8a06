r"""Settings shared by every method of the runners: the shared features and the agents' GPs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.federation.schedules import PtSchedule
from fbo_torch.models.batched_gp import GP_SPECS
from fbo_torch.utils.validation import check_int, check_probability


@dataclass
class MethodSettings:
    r"""Fields common to :class:`~fbo_torch.runners.fts.FTSSettings` and
    :class:`~fbo_torch.runners.dp_fts_de.DPFTSDESettings`.

    Attributes:
        num_iterations: BO iterations (rounds) ``T`` after initialization.
        num_init: Random initial points per agent.
        num_features: ``M``, random Fourier features shared by all agents.
        rff_lengthscale / rff_outputscale / rff_seed / rff_normalize: The shared map.
        rff_noise_variance: ``σ²`` in the agents' RFF posteriors.
        p_t / p1_equals_p2: Probability of using the own GP (see :class:`PtSchedule`).
        gp_kernel / gp_refit_every: The agents' own GPs: a name in
            :data:`~fbo_torch.models.batched_gp.GP_SPECS` (``"botorch"``: BoTorch's
            ``SingleTaskGP``; ``"rbf"``: scaled RBF/ARD by maximum likelihood) and how
            often hyperparameters are re-fitted (every ``k`` GP updates; 0: only once).
        gp_fit_maxiter: Iteration cap of the batched hyperparameter fit.
        gp_restarts: Random restarts of each refit besides its first start (the
            authors' GPy fits used 10), optimized in the same batch; the best kept.
        gp_warm_start: Start each refit from the current hyperparameters (``True``)
            or from the model's default initialization, as a fresh BoTorch
            ``SingleTaskGP`` + ``fit_gpytorch_mll`` does (``False``, default).
            Measured on Hartmann-3 (72 agents, 25 iterations, refit every
            iteration): warm starts locked 13 agents in the local optimum (regret
            > 0.1), fresh starts 6 — a warm start keeps a lengthscale that the
            early data favoured.
        repeated_query: ``"keep"``, or ``"random"``: a query that repeats one of
            the agent's earlier queries is replaced by a uniform random point
            (the authors' code does this).
        gp_sample_features: Random features of the pathwise prior in each GP
            Thompson sample (256; None: BoTorch's default, 1024, about 4x slower;
            the reference implementation used 100 features for its own samples).
        faults: Fault injection for robustness studies, ``{eval_failure_rate: r,
            dropout_rate: r}``: each agent's evaluation fails (returns NaN) with
            probability ``eval_failure_rate`` per round, and each agent's message
            is lost with probability ``dropout_rate`` per round.
    """

    num_iterations: int = 50
    num_init: int = 1
    num_features: int = 100
    rff_lengthscale: float = 0.03
    rff_outputscale: float = 1.0
    rff_seed: int = 0
    rff_normalize: bool = True
    rff_noise_variance: float = 0.01
    p_t: Any = "1-1/sqrt(t)"
    p1_equals_p2: bool = True
    gp_kernel: str = "botorch"
    gp_refit_every: int = 1
    gp_sample_features: int | None = 256
    gp_fit_maxiter: int = 60
    gp_restarts: int = 0
    gp_warm_start: bool = False
    repeated_query: str = "keep"
    faults: dict | None = None

    def __post_init__(self) -> None:
        check_int("num_iterations", self.num_iterations, minimum=1)
        check_int("num_init", self.num_init, minimum=1)
        check_int("num_features", self.num_features, minimum=1)
        check_int("gp_refit_every", self.gp_refit_every, minimum=0)
        check_int("gp_fit_maxiter", self.gp_fit_maxiter, minimum=0)
        check_int("gp_restarts", self.gp_restarts, minimum=0)
        if not isinstance(self.gp_warm_start, bool):
            raise ValueError(f"`gp_warm_start` must be true or false, got {self.gp_warm_start!r}.")
        if self.repeated_query not in ("keep", "random"):
            raise ValueError(f"`repeated_query` must be 'keep' or 'random', got {self.repeated_query!r}.")
        if self.gp_sample_features is not None:
            check_int("gp_sample_features", self.gp_sample_features, minimum=2)
            if self.gp_sample_features % 2:
                raise ValueError(f"`gp_sample_features` must be even ([sin, cos] pairs), got {self.gp_sample_features}.")
        if self.gp_kernel not in GP_SPECS:
            raise ValueError(f"`gp_kernel` must be one of {sorted(GP_SPECS)}, got {self.gp_kernel!r}.")
        self.fault_rates()  # validates
        PtSchedule(self.p_t, self.p1_equals_p2)  # validates

    def fault_rates(self) -> tuple[float, float]:
        """``(eval_failure_rate, dropout_rate)`` from :attr:`faults` (validated)."""
        f = self.faults or {}
        if not isinstance(f, dict):
            raise ValueError(f"`faults` must be a mapping {{eval_failure_rate, dropout_rate}}, got {f!r}.")
        unknown = set(f) - {"eval_failure_rate", "dropout_rate"}
        if unknown:
            raise ValueError(f"`faults` has unknown key(s) {sorted(unknown)}; allowed: eval_failure_rate, dropout_rate.")
        ev = check_probability("faults.eval_failure_rate", f.get("eval_failure_rate", 0.0), open_right=True)
        dr = check_probability("faults.dropout_rate", f.get("dropout_rate", 0.0), open_right=True)
        return ev, dr

    def features(self, dim: int, device: torch.device | str | None = None) -> RandomFourierFeatures:
        """The shared random-feature map these settings describe."""
        return RandomFourierFeatures(
            dim, self.num_features, lengthscale=self.rff_lengthscale, outputscale=self.rff_outputscale,
            seed=self.rff_seed, normalize=self.rff_normalize, device=device,
        )
