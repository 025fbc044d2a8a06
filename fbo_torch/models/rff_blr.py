r"""Bayesian linear regression on shared random Fourier features, for N agents at once.

With features ``φ`` and prior ``ω ~ N(0, I)``, agent ``n`` with data
``(Φ_n, y_n)`` and noise variance ``σ_n²`` has the weight posterior (FTS eq. 2-3)

    ω | D_n ~ N(ν_n, σ_n² Σ_n⁻¹),   Σ_n = Φ_nᵀΦ_n + σ_n² I,   ν_n = Σ_n⁻¹ Φ_nᵀ y_n,

and the predictive ``f(x) ~ N(φ(x)ᵀν_n, σ_n² φ(x)ᵀ Σ_n⁻¹ φ(x))`` (appendix B).

``RFFBayesianLinear`` holds all agents in one batch, in one of two exact
representations (every solve is triangular; no explicit inverse is formed):

* **weight space** (``representation="weight"``): ``Σ`` through its batched
  Cholesky factor ``L`` (``N x M x M``) and ``Φᵀy``. Appending one observation
  per agent is an ``O(M²)`` rank-one update of ``L``
  (:func:`cholesky_rank_one_update`), not a refit.
* **function space** (``representation="dual"``), the appendix-B form: the
  Cholesky factor ``L`` of ``K = ΦΦᵀ + σ²I`` (``N x n x n``) and the whitened
  ``V = L⁻¹Φ`` (``N x n x M``) and ``z = L⁻¹y``. Then ``ν = Vᵀz``, the
  covariance is ``σ²Σ⁻¹ = I − VᵀV`` (Woodbury), and ω is drawn by Matheron's
  rule ``ω = ω₀ + Vᵀ(z − Vω₀ − L⁻¹ε)`` with ``ω₀ ~ N(0, I)``, ``ε ~ N(0, σ²I)``,
  exactly ``N(ν, σ²Σ⁻¹)``. Appending an observation adds one row to ``L``,
  ``V`` and ``z`` with matrix-vector products only (``l = Vφ``,
  ``d = √(φᵀφ + σ² − lᵀl)``, ``v = (φ − Vᵀl)/d``, ``z' = (y − lᵀz)/d``): no
  triangular solve, ``O(nM)`` per agent. With ``n < M`` this is cheaper in time
  and memory (``N·n·M`` instead of ``N·M²`` numbers), which is what makes
  ``M = 1000`` with thousands of agents fit in memory.

``representation="auto"`` (default) picks the dual form when ``n < M``.

The factorizations and updates are those of
:mod:`fbo_torch.models.weight_posterior`, where the weight posterior every model
on the shared map uses is defined; :meth:`RFFBayesianLinear.weight_posterior`
returns it as an :class:`~fbo_torch.models.weight_posterior.RFFWeightPosterior`.

Conditioning on observations in BoTorch's other batch layouts (the fantasies
of knowledge gradient and integrated-variance acquisitions) gives a
:class:`~fbo_torch.models.rff_weight_model.ConditionedRFFBayesianLinear`: the base posterior plus ``k`` whitened
rows per batch entry, without copying the base model.
"""

from __future__ import annotations

import copy
from numbers import Real
from typing import Any

import torch
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform
from botorch.sampling.pathwise.paths import GeneralizedLinearPath
from botorch.sampling.pathwise.posterior_samplers import DrawMatheronPaths
from botorch.sampling.pathwise.utils import get_output_transform
from torch import Size, Tensor
from torch.nn import Module

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.models.rff_weight_model import ConditionedRFFBayesianLinear, _RFFWeightModel
from fbo_torch.models.weight_posterior import (
    RFFWeightPosterior,
    cholesky_rank_one_update,
    cholesky_solve_vec,
    function_space_factors,
    weight_space_factors,
    whitened_new_row,
)
from fbo_torch.protocol.input_space import input_bounds_of
from fbo_torch.protocol.messages import AgentMessage
from fbo_torch.sampling.draws import standard_normal
from fbo_torch.sampling.pathwise import RFFFeatureMap
from fbo_torch.utils.validation import (
    check_data_device,
    check_finite,
    check_floating,
    check_last_dim,
    check_positive,
    check_shape,
    check_tensor,
    warn_outside_unit_cube,
)

#: Bytes of ``M x M`` temporaries per chunk of agents in the weight-space update.
#: Chunking keeps temporaries below the allocator's large-allocation threshold
#: region, where every call otherwise pays fresh page faults.
CHUNK_BYTES = 4 * 2**20


def _agent_chunks(N: int, M: int, itemsize: int = 8) -> list[tuple[int, int]]:
    """Agent ranges whose ``M x M`` temporaries stay within :data:`CHUNK_BYTES`."""
    per = max(1, CHUNK_BYTES // max(1, M * M * itemsize))
    return [(lo, min(N, lo + per)) for lo in range(0, N, per)]


class RFFBayesianLinear(_RFFWeightModel):
    r"""RFF Bayesian linear regression posteriors for a batch of ``N`` agents.

    A BoTorch ``Model`` with ``batch_shape = [N]`` and one output. Agents may hold
    different numbers of observations: pad ``train_X``/``train_Y`` to a common
    ``n`` and pass ``lengths`` (valid prefix length per agent) or ``mask``
    (``N x n`` booleans). Padded entries are ignored and may hold anything,
    including NaN. ``n = 0`` (no data yet) is the prior ``ω ~ N(0, I)``.

    The BoTorch model contract: ``posterior`` (any batch layout, observation
    noise, posterior transforms), ``fantasize`` / ``condition_on_observations``
    (returning a :class:`ConditionedRFFBayesianLinear`, so knowledge gradient and
    integrated-variance acquisitions work), ``subset_output([0])``, input and
    outcome transforms given to the constructor, and a ``state_dict`` of tensors
    only that loads into a fresh model of the same agents whatever the number of
    observations (:meth:`update` grows storage; the state dict holds the used part).
    Pathwise sampling (``draw_matheron_paths``, ``PathwiseThompsonSampling``) draws
    paths ``φ(x)ᵀω`` with ``ω`` from :meth:`sample_weights`.

    Args:
        features: The shared :class:`~fbo_torch.features.RandomFourierFeatures`.
        train_X: ``N x n x d`` inputs (``n x d`` for a single, unbatched agent).
        train_Y: ``N x n x 1`` observations (``n x 1`` unbatched).
        noise_variance: ``σ² > 0``, a float or a tensor of ``N`` per-agent values,
            on the scale of the (outcome-transformed) observations.
        lengths: Optional ``N`` integers; agent ``i`` uses its first ``lengths[i]`` rows.
        mask: Optional ``N x n`` booleans marking valid rows (instead of ``lengths``).
        representation: ``"weight"``, ``"dual"`` or ``"auto"`` (dual when
            ``n < M``); both are exact and give the same posterior.
        input_transform: Optional BoTorch ``InputTransform``, fitted on
            ``train_X`` here and then fixed; the features see transformed inputs,
            so weight vectors ``ω`` live on the transformed input space
            (:meth:`messages` says which). Without one, training inputs outside
            the unit cube give an ``InputDataWarning``: the map's lengthscale is
            in the units of the inputs it sees.
        outcome_transform: Optional BoTorch ``OutcomeTransform`` (e.g.
            ``Standardize(m=1, batch_shape=[N])``), fitted on ``train_Y`` here and
            then fixed; ``ω`` and ``σ²`` are on the transformed scale and
            posteriors are un-transformed. Not with ``lengths``/``mask`` padding.

    Example:
        >>> rff = RandomFourierFeatures(dim=2, num_features=100, lengthscale=0.2, seed=0)
        >>> model = RFFBayesianLinear(rff, train_X, train_Y, noise_variance=1e-2)
        >>> omega = model.sample_weights()          # N x M, one draw per agent
        >>> post = model.posterior(torch.rand(5, 2, dtype=torch.float64))  # batch N
    """

    noise_variance: Tensor
    _train_X: Tensor
    _train_Y: Tensor
    _mask: Tensor
    _weight_mean: Tensor
    # the weight representation's factors
    _chol: Tensor
    rhs: Tensor
    # the dual representation's factors
    _V: Tensor
    _z: Tensor
    _kchol: Tensor

    def __init__(
        self,
        features: RandomFourierFeatures,
        train_X: Tensor,
        train_Y: Tensor,
        noise_variance: float | Tensor,
        lengths: Tensor | None = None,
        mask: Tensor | None = None,
        representation: str = "auto",
        input_transform: InputTransform | None = None,
        outcome_transform: OutcomeTransform | None = None,
    ) -> None:
        super().__init__()
        if representation not in ("auto", "weight", "dual"):
            raise ValueError(f"`representation` must be 'auto', 'weight' or 'dual', got {representation!r}.")
        if not isinstance(features, RandomFourierFeatures):
            raise TypeError(f"`features` must be a RandomFourierFeatures, got {type(features).__name__}.")
        check_tensor("train_X", train_X)
        check_tensor("train_Y", train_Y)
        check_floating("train_X", train_X)
        check_floating("train_Y", train_Y)
        check_data_device("train_X", train_X)
        check_data_device("train_Y", train_Y)
        if train_X.dtype != train_Y.dtype or train_X.device != train_Y.device:
            raise ValueError(
                f"`train_X` ({train_X.dtype}, {train_X.device}) and `train_Y` ({train_Y.dtype}, {train_Y.device}) "
                "must share one dtype and device (float64 for GP algebra); convert one of them."
            )
        if train_X.ndim == 2 and train_Y.ndim == 2:
            self._batched = False
            train_X, train_Y = train_X.unsqueeze(0), train_Y.unsqueeze(0)
            if mask is not None:
                mask = mask.unsqueeze(0)
        elif train_X.ndim == 3 and train_Y.ndim == 3:
            self._batched = True
        else:
            raise ValueError(
                "`train_X` and `train_Y` must be N x n x d and N x n x 1 (or n x d and n x 1), "
                f"got shapes {tuple(train_X.shape)} and {tuple(train_Y.shape)}."
            )
        N, n, d = train_X.shape
        if N == 0:
            raise ValueError("`train_X` holds N = 0 agents; an RFFBayesianLinear needs at least one agent.")
        if train_Y.shape != (N, n, 1):
            raise ValueError(
                f"`train_Y` must have shape {(N, n, 1) if self._batched else (n, 1)} to match "
                f"`train_X` {tuple(train_X.shape) if self._batched else (n, d)}, got "
                f"{tuple(train_Y.shape) if self._batched else tuple(train_Y.shape[1:])}."
            )
        check_last_dim("train_X", train_X, features.dim)
        valid = self._make_mask(N, n, lengths, mask, train_X.device)
        check_finite("train_X", torch.where(valid.unsqueeze(-1), train_X, 0.0))
        check_finite("train_Y", torch.where(valid.unsqueeze(-1), train_Y, 0.0))
        noise = _noise_tensor(noise_variance, N, train_X)

        if input_transform is None:
            warn_outside_unit_cube(
                "The training inputs of RFFBayesianLinear",
                torch.where(valid.unsqueeze(-1), train_X, 0.5),
                features.lengthscale,
            )
        # Module.__setattr__ registers it; `features` on the class is the read-only property reading it back
        Module.__setattr__(self, "features", features)
        self._given_transforms = {"input_transform": input_transform, "outcome_transform": outcome_transform}
        if input_transform is not None:
            self.input_transform = input_transform.to(train_X)
            self.input_transform.train()
            with torch.no_grad():
                tX = self.input_transform(train_X if self._batched else train_X[0])
            self.input_transform.eval()
            train_X = tX if self._batched else tX.unsqueeze(0)
        if outcome_transform is not None:
            if not bool(valid.all()):
                raise ValueError("`outcome_transform` cannot be combined with `lengths`/`mask` padding.")
            self.outcome_transform = outcome_transform.to(train_Y)
            self.outcome_transform.train()
            with torch.no_grad():
                tY, _ = self.outcome_transform(train_Y if self._batched else train_Y[0])
            self.outcome_transform.eval()
            train_Y = tY if self._batched else tY.unsqueeze(0)
        self.register_buffer("noise_variance", noise)
        # growable storage: column capacity >= n, the first _n columns are in use, so
        # appending an observation writes in place instead of copying everything
        self._n = n
        self.register_buffer("_train_X", train_X.detach().clone())
        self.register_buffer("_train_Y", train_Y.detach().clone())
        self.register_buffer("_mask", valid.clone())
        if representation == "auto":
            representation = "dual" if n < features.num_features else "weight"
        self.representation = representation
        self._register_factors(*self._factorize(self.train_X, self.train_Y, valid, noise))

    @property
    def _root(self) -> RFFBayesianLinear:
        return self

    @property
    def _mean_vector(self) -> Tensor:
        return self.weight_mean

    @property
    def _noise(self) -> Tensor:
        return self.noise_variance if self._batched else self.noise_variance[0]

    _FACTORS = {"weight": ("_chol", "rhs", "_weight_mean"), "dual": ("_V", "_z", "_kchol", "_weight_mean")}

    def _register_factors(self, *factors: Tensor) -> None:
        if self.representation == "weight":
            chol, rhs = factors
            self.register_buffer("_chol", chol)  # L with L Lᵀ = Σ
            self.register_buffer("rhs", rhs)  # Φᵀ y
            self.register_buffer("_weight_mean", cholesky_solve_vec(chol, rhs))
        else:
            V, z, kchol = factors
            self.register_buffer("_V", V)  # L⁻¹Φ, N x n x M (zero rows for padding)
            self.register_buffer("_z", z)  # L⁻¹y, N x n
            self.register_buffer("_kchol", kchol)  # L: chol of ΦΦᵀ + σ²I
            self.register_buffer("_weight_mean", (z.unsqueeze(-2) @ V).squeeze(-2))

    # ------------------------------------------------------- growable storage
    _GROW = {"_train_X": 1, "_train_Y": 1, "_mask": 1, "_V": 1, "_z": 1, "_kchol": 2}

    @property
    def train_X(self) -> Tensor:
        """``N x n x d`` inputs, input-transformed (padded entries are not used)."""
        return self._train_X[:, : self._n]

    @property
    def train_Y(self) -> Tensor:
        """``N x n x 1`` observations, outcome-transformed."""
        return self._train_Y[:, : self._n]

    @property
    def mask(self) -> Tensor:
        """``N x n`` booleans: which entries are observations."""
        return self._mask[:, : self._n]

    @property
    def V(self) -> Tensor:
        """Dual representation: whitened features ``L⁻¹Φ`` (``N x n x M``)."""
        return self._V[:, : self._n]

    @property
    def z(self) -> Tensor:
        """Dual representation: whitened observations ``L⁻¹y`` (``N x n``)."""
        return self._z[:, : self._n]

    @property
    def kchol(self) -> Tensor:
        """Dual representation: Cholesky factor of ``ΦΦᵀ + σ²I`` (``N x n x n``)."""
        return self._kchol[:, : self._n, : self._n]

    def reserve(self, extra: int) -> RFFBayesianLinear:
        r"""Pre-allocate storage for ``extra`` more observations per agent.

        :meth:`update` grows its storage geometrically (amortized O(1) appends),
        but each growth copies every agent's state. A loop that knows its
        horizon (``T`` rounds) can reserve it once so no update reallocates;
        the memory is what the model would hold after ``T`` updates anyway.
        Returns ``self``.
        """
        if isinstance(extra, bool) or not isinstance(extra, int) or extra < 0:
            raise ValueError(f"`extra` must be a non-negative int, got {extra!r}.")
        cap = self._train_X.shape[1]
        if self._n + extra > cap:
            self._grow(self._n + extra)
        return self

    def _reserve(self, extra: int) -> None:
        """Make room for ``extra`` more columns (capacity doubles, amortized O(1) appends)."""
        cap = self._train_X.shape[1]
        need = self._n + extra
        if need <= cap:
            return
        self._grow(max(need, 2 * cap, 8))

    def _grow(self, new_cap: int) -> None:
        for name, ndims in self._GROW.items():
            old = getattr(self, name, None)
            if old is None:
                continue
            shape = list(old.shape)
            for k in range(1, 1 + ndims):
                shape[k] = new_cap
            new = old.new_zeros(shape)
            idx = (slice(None),) + (slice(0, self._n),) * ndims
            new[idx] = old[idx]
            setattr(self, name, new)

    # ------------------------------------------------------------ state dict
    # Tensors only (no extra state), and only the used part of the growable storage,
    # so a model that has been update()d saves what a model refitted on the same
    # data would, and its state loads into a fresh model of the same agents.

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, ndims in self._GROW.items():
            key = prefix + name
            t = destination.get(key)
            if t is not None and t.shape[1] != self._n:
                destination[key] = t[(slice(None),) + (slice(0, self._n),) * ndims].clone()

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        incoming = [rep for rep, names in self._FACTORS.items() if prefix + names[0] in state_dict]
        if len(incoming) == 1 and incoming[0] != self.representation:
            for name in self._FACTORS[self.representation]:
                del self._buffers[name]
            self.representation = incoming[0]
            for name in self._FACTORS[self.representation]:
                self.register_buffer(name, torch.empty(0, dtype=self._train_X.dtype, device=self._train_X.device))
        X = state_dict.get(prefix + "_train_X")
        if isinstance(X, Tensor) and X.ndim == 3 and X.shape[0] == self._train_X.shape[0]:
            for name in self._GROW:
                t, own = state_dict.get(prefix + name), self._buffers.get(name)
                if isinstance(t, Tensor) and own is not None and (own.numel() == 0 or t.shape[0] == own.shape[0]):
                    self._buffers[name] = torch.empty(t.shape, dtype=own.dtype, device=own.device)
            for name in self._FACTORS[self.representation]:  # placeholders of a switched representation
                t, own = state_dict.get(prefix + name), self._buffers.get(name)
                if isinstance(t, Tensor) and own is not None and own.numel() == 0:
                    self._buffers[name] = torch.empty(t.shape, dtype=own.dtype, device=own.device)
            self._n = X.shape[1]
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    # ---------------------------------------------------------------- setup
    @staticmethod
    def _make_mask(N: int, n: int, lengths: Tensor | None, mask: Tensor | None, device: torch.device) -> Tensor:
        if lengths is not None and mask is not None:
            raise ValueError("Pass at most one of `lengths` and `mask`.")
        if mask is not None:
            check_tensor("mask", mask)
            if mask.dtype != torch.bool or mask.shape != (N, n):
                raise ValueError(
                    f"`mask` must be a bool tensor of shape {(N, n)}, got {mask.dtype} {tuple(mask.shape)}."
                )
            return mask.to(device)
        if lengths is None:
            return torch.ones(N, n, dtype=torch.bool, device=device)
        lengths = torch.as_tensor(lengths, device=device)
        if lengths.shape != (N,) or lengths.is_floating_point():
            raise ValueError(
                f"`lengths` must be {N} integers (one per agent), got {lengths.dtype} {tuple(lengths.shape)}."
            )
        if ((lengths < 0) | (lengths > n)).any():
            raise ValueError(f"`lengths` must lie in [0, n={n}], got {lengths.tolist()}.")
        return torch.arange(n, device=device).expand(N, n) < lengths.unsqueeze(-1)

    def _features_masked(self, X: Tensor, Y: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        Xs = torch.where(valid.unsqueeze(-1), X, 0.0)
        phi = self.features(Xs)
        phi = phi.mul_(valid.unsqueeze(-1)) if not phi.requires_grad else phi * valid.unsqueeze(-1)
        y = torch.where(valid, Y.squeeze(-1), 0.0)
        return phi, y

    def _factorize(self, X: Tensor, Y: Tensor, valid: Tensor, noise: Tensor) -> tuple[Tensor, ...]:
        phi, y = self._features_masked(X, Y, valid)
        if self.representation == "dual":
            return function_space_factors(phi, y, noise)
        return weight_space_factors(phi, y, noise)

    # ------------------------------------------------------------ properties
    @property
    def batch_shape(self) -> torch.Size:
        return torch.Size([self.num_agents]) if self._batched else torch.Size([])

    @property
    def num_agents(self) -> int:
        return self._weight_mean.shape[0]

    @property
    def chol(self) -> Tensor:
        r"""Batched Cholesky factor ``L`` of ``Σ = ΦᵀΦ + σ²I`` (``N x M x M``).

        Stored in the weight representation; formed on demand in the dual one.
        """
        if self.representation == "weight":
            return self._chol
        M = self.features.num_features
        phi = self.kchol @ self.V  # Φ = L V
        eye = torch.eye(M, dtype=phi.dtype, device=phi.device)
        return torch.linalg.cholesky(phi.mT @ phi + self.noise_variance.view(-1, 1, 1) * eye)

    @property
    def lengths(self) -> Tensor:
        """Number of observations of each agent (``N``)."""
        return self.mask.sum(-1)

    def _unbatch(self, t: Tensor) -> Tensor:
        return t if self._batched else t.squeeze(0)

    @property
    def weight_mean(self) -> Tensor:
        r"""Posterior mean ``ν`` of the weights, ``N x M`` (``M`` unbatched)."""
        return self._unbatch(self._weight_mean)

    @property
    def weight_precision_cholesky(self) -> Tensor:
        r"""Cholesky factor ``L`` of ``Σ = ΦᵀΦ + σ²I``, ``N x M x M``."""
        return self._unbatch(self.chol)

    def weight_covariance(self) -> Tensor:
        r"""Posterior covariance ``σ² Σ⁻¹`` of the weights, ``N x M x M``.

        Formed from the Cholesky factor (``cholesky_inverse``); meant for
        diagnostics and for messages that must carry it, not for the hot path.
        """
        if self.representation == "dual":  # Woodbury: σ²Σ⁻¹ = I − Φᵀ K⁻¹ Φ
            V = self.V
            eye = torch.eye(V.shape[-1], dtype=V.dtype, device=V.device)
            return self._unbatch(eye - V.mT @ V)
        cov = self.noise_variance.view(-1, 1, 1) * torch.cholesky_inverse(self.chol)
        return self._unbatch(cov)

    def weight_posterior(self) -> RFFWeightPosterior:
        r"""The weight posterior ``N(ν, σ²Σ⁻¹)`` as an :class:`~fbo_torch.models.weight_posterior.RFFWeightPosterior`
        (``batch_shape x M`` mean, ``batch_shape x M x M`` root ``σL⁻ᵀ``): what an agent sends for RGPE/TAF."""
        post = RFFWeightPosterior.from_precision_cholesky(self._weight_mean, self.chol, self.noise_variance)
        return RFFWeightPosterior(self._unbatch(post.mean), self._unbatch(post.root))

    # -------------------------------------------------------------- posterior
    def _mean_cov(self, phi: Tensor) -> tuple[Tensor, Tensor]:
        r"""Mean ``φν`` and covariance ``φCφᵀ`` for features ``... x q x M`` (batch broadcast with ``N``)."""
        nu = self.weight_mean
        if self.representation == "weight":
            chol, noise = self._unbatch(self._chol), self._noise.unsqueeze(-1).unsqueeze(-1)
            v = torch.linalg.solve_triangular(chol, phi.mT, upper=False)  # ... x M x q
            cov = noise * (v.mT @ v)
        else:  # appendix B: φᵀφ' − k̂ᵀ(K̂ + σ²I)⁻¹k̂' with L⁻¹k̂ = Vφ
            v = self._unbatch(self.V) @ phi.mT  # ... x n x q
            cov = phi @ phi.mT - v.mT @ v
        mean = (phi @ nu.unsqueeze(-1)).squeeze(-1)
        return mean, cov

    def _cov_apply(self, phi: Tensor) -> Tensor:
        r"""``φC`` (``... x k x M``) with ``C = σ²Σ⁻¹`` the weight covariance."""
        if self.representation == "weight":
            chol, noise = self._unbatch(self._chol), self._noise.unsqueeze(-1).unsqueeze(-1)
            return noise * torch.cholesky_solve(phi.mT, chol).mT
        V = self._unbatch(self.V)
        return phi - (V @ phi.mT).mT @ V

    # --------------------------------------------------------------- sampling
    def sample_weights(
        self,
        sample_shape: torch.Size = torch.Size(),
        generator: torch.Generator | None = None,
        base_samples: Tensor | None = None,
    ) -> Tensor:
        r"""Draw ``ω ~ N(ν, σ² Σ⁻¹)`` for every agent at once.

        ``ω = ν + σ L⁻ᵀ ε`` with ``ε ~ N(0, I)``: one batched triangular solve.

        Args:
            sample_shape: Leading shape of independent draws.
            generator: Optional ``torch.Generator`` for reproducible draws (its
                device may differ from the model's).
            base_samples: Optional ``*sample_shape x N x (M + n)`` standard
                normals to use instead of drawing (``n`` = stored observations;
                the weight representation uses the first ``M``, the dual one
                all ``M + n``). The draw is then a deterministic function of
                them, so callers with their own random streams (e.g. one keyed
                stream per agent) get the same ``ω`` however agents are batched.

        Returns:
            ``*sample_shape x N x M`` draws (``*sample_shape x M`` unbatched).
        """
        sample_shape = check_shape("sample_shape", sample_shape)
        N, M = self._weight_mean.shape
        n = self._n
        if base_samples is not None:
            check_tensor("base_samples", base_samples)
            if not self._batched:
                base_samples = base_samples.unsqueeze(-2)
            if base_samples.shape != sample_shape + torch.Size([N, M + n]):
                expected = tuple(sample_shape) + ((N,) if self._batched else ()) + (M + n,)
                raise ValueError(
                    f"`base_samples` must have shape {expected} (M + n = {M} + {n}), got {tuple(base_samples.shape)}."
                )
            base_samples = base_samples.to(self._weight_mean)
        if self.representation == "weight":
            if base_samples is None:
                eps = standard_normal(sample_shape + torch.Size([N, M, 1]), self._chol, generator)
            else:
                eps = base_samples[..., :M].unsqueeze(-1)
            z = torch.linalg.solve_triangular(self._chol.mT, eps, upper=True).squeeze(-1)
            omega = self._weight_mean + self.noise_variance.sqrt().unsqueeze(-1) * z
        else:  # Matheron's rule: ω = ω₀ + Vᵀ(z − Vω₀ − L⁻¹ε)
            V = self.V
            if base_samples is None:
                w0 = standard_normal(sample_shape + torch.Size([N, M]), V, generator)
                eps = standard_normal(sample_shape + torch.Size([N, n]), V, generator)
            else:
                w0, eps = base_samples[..., :M], base_samples[..., M:]
            eps = eps * self.noise_variance.sqrt().unsqueeze(-1) * self.mask.to(eps.dtype)
            kchol = self.kchol.contiguous()
            white = torch.linalg.solve_triangular(kchol, eps.unsqueeze(-1), upper=False).squeeze(-1)
            resid = self.z - (V @ w0.unsqueeze(-1)).squeeze(-1) - white  # ... x N x n
            # row-vector form zᵀV reads V in its storage order (Vᵀz would read it transposed)
            omega = w0 + (resid.unsqueeze(-2) @ V).squeeze(-2)
        return omega if self._batched else omega.squeeze(-2)

    def messages(
        self,
        generator: torch.Generator | None = None,
        base_samples: Tensor | None = None,
        agent_ids: list[int] | None = None,
    ) -> list[AgentMessage]:
        r"""One FTS message per agent: a draw ``ω_n`` of :meth:`sample_weights` and what a receiver needs to use it.

        Each :class:`~fbo_torch.protocol.AgentMessage` carries the map's
        fingerprint, the agent's number of observations and the ``input_bounds``
        of this model's input transform (``[0, 1]^d`` without one), so
        acquisitions evaluate ``φ(T(x))ᵀω`` on the inputs the weights were fitted
        on (:mod:`fbo_torch.protocol.input_space`). The input transform must be
        affine (``Normalize``, ``InputStandardize``); with another, send
        :meth:`sample_weights` and pass ``input_transform=`` to the acquisition.

        Args:
            generator: Optional ``torch.Generator`` for the draws.
            base_samples: Optional standard normals, as in :meth:`sample_weights`.
            agent_ids: The senders' ids (default ``0, …, N − 1``).

        Returns:
            ``N`` messages (one for an unbatched model).

        Example:
            >>> peers = RFFBayesianLinear(rff, X, Y, 1e-2, input_transform=Normalize(2, bounds=bounds))
            >>> acqf = FederatedThompsonSampling(gp, peers.messages(), rff, p_t=0.0)
        """
        self._check_transforms()
        N = self.num_agents
        ids = list(range(N)) if agent_ids is None else [int(i) for i in agent_ids]
        if len(ids) != N:
            raise ValueError(f"`agent_ids` must hold N = {N} ids, got {len(ids)}.")
        bounds = input_bounds_of(self._modules.get("input_transform"), self.features.dim)
        bounds = bounds.to(self._weight_mean).expand(N, 2, self.features.dim)
        omega = self.sample_weights(generator=generator, base_samples=base_samples).reshape(N, -1)
        counts = self.lengths.tolist()
        fp = self.features.fingerprint
        return [AgentMessage(omega[i], ids[i], int(counts[i]), fp, input_bounds=bounds[i]) for i in range(N)]

    # ----------------------------------------------------------------- update
    def update(self, X: Tensor, Y: Tensor, mask: Tensor | None = None, validate: bool = True) -> RFFBayesianLinear:
        r"""Add new observations in place with rank-one Cholesky updates.

        Args:
            X: ``N x k x d`` new inputs (``k x d`` unbatched); usually ``k = 1``.
                Untransformed: the model's input transform is applied here.
            Y: ``N x k x 1`` new observations (untransformed, like ``X``).
            mask: Optional ``N x k`` booleans; agents with ``False`` get no new point.
            validate: Check that the unmasked values are finite. The check reads a
                device tensor on the host (a synchronization on CUDA); engines that
                mask out failed evaluations themselves pass ``False``.

        Returns:
            ``self`` (updated), so calls can be chained.

        Cost is ``O(k M²)`` per agent; the result equals a refit on all data to
        round-off (tests check this).
        """
        check_tensor("X", X)
        check_tensor("Y", Y)
        if not self._batched:
            X, Y = X.unsqueeze(0), Y.unsqueeze(0)
            mask = mask.unsqueeze(0) if mask is not None else None
        N = self.num_agents
        if X.ndim != 3 or X.shape[0] != N or Y.shape != (N, X.shape[1], 1):
            raise ValueError(
                f"`X` and `Y` must be N x k x d and N x k x 1 with N = {N}, got {tuple(X.shape)} and {tuple(Y.shape)}."
            )
        check_last_dim("X", X, self.features.dim)
        k = X.shape[1]
        if mask is None:
            mask = torch.ones(N, k, dtype=torch.bool, device=self._weight_mean.device)
        elif mask.shape != (N, k) or mask.dtype != torch.bool:
            raise ValueError(f"`mask` must be a bool tensor of shape {(N, k)}, got {mask.dtype} {tuple(mask.shape)}.")
        like = self._weight_mean
        X, Y, mask = X.to(like), Y.to(like), mask.to(like.device)
        if validate:
            check_finite("X", torch.where(mask.unsqueeze(-1), X, 0.0))
            check_finite("Y", torch.where(mask.unsqueeze(-1), Y, 0.0))
        if self._uses_transforms():
            self._check_transforms()
            X = self.transform_inputs(X)
            Y, _ = self._transform_outcomes(Y, None, X)
        phi, y = self._features_masked(X, Y, mask)
        if self.representation == "weight":
            chol = self._chol
            for lo, hi in _agent_chunks(N, self.features.num_features):
                c = chol[lo:hi]
                for j in range(k):
                    c = cholesky_rank_one_update(c, phi[lo:hi, j])
                chol[lo:hi] = c  # in place: no second N x M x M buffer
            self._chol = chol
            self.rhs = self.rhs + (y.unsqueeze(-2) @ phi).squeeze(-2)
            self._weight_mean = cholesky_solve_vec(chol, self.rhs)
        self._reserve(k)
        n0 = self._n
        if self.representation == "dual":
            for j in range(k):
                n = n0 + j
                V, z = self._V[:, :n], self._z[:, :n]
                row, d = whitened_new_row(V, phi[:, j], self.noise_variance)
                self._V[:, n] = (phi[:, j] - (row.unsqueeze(-2) @ V).squeeze(-2)) / d.unsqueeze(-1)
                self._z[:, n] = (y[:, j] - (row * z).sum(-1)) / d
                self._kchol[:, n, :n] = row
                self._kchol[:, n, n] = d
                # ν = Vᵀz gains the new row's term: one pass over the new row, not over V
                self._weight_mean = self._weight_mean + self._V[:, n] * self._z[:, n].unsqueeze(-1)
        self._train_X[:, n0 : n0 + k] = X
        self._train_Y[:, n0 : n0 + k] = Y
        self._mask[:, n0 : n0 + k] = mask
        self._n = n0 + k
        return self

    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any
    ) -> _RFFWeightModel:
        r"""The model conditioned on ``(X, Y)``, as a new model (``self`` is unchanged).

        With ``X``/``Y`` in the model's own layout (``N x k x d`` / ``N x k x 1``,
        unbatched ``k x d`` / ``k x 1``) and no ``noise``, this is a copy of the
        model updated exactly with :meth:`update` (``mask`` may be passed). Any
        other BoTorch layout (e.g. the ``num_fantasies x batch x k x 1``
        observations of :meth:`fantasize`) gives a
        :class:`ConditionedRFFBayesianLinear`.
        """
        own = self.batch_shape
        if noise is None and X.shape[:-2] == own and Y.shape[:-2] == own and X.ndim == Y.ndim:
            new = copy.deepcopy(self, memo={id(self.features): self.features})
            return new.update(X, Y, mask=kwargs.get("mask"))
        return super().condition_on_observations(X, Y, noise=noise, **kwargs)

    def refit(self) -> RFFBayesianLinear:
        """Recompute the factorization from all stored data (reference path)."""
        self._train_X, self._train_Y, self._mask = self.train_X.clone(), self.train_Y.clone(), self.mask.clone()
        factors = self._factorize(self.train_X, self.train_Y, self.mask, self.noise_variance)
        self._register_factors(*factors)
        return self

    def _uses_transforms(self) -> bool:
        given = self._given_transforms
        return (
            given["input_transform"] is not None
            or given["outcome_transform"] is not None
            or "input_transform" in self._modules
            or "outcome_transform" in self._modules
        )


def _noise_tensor(noise_variance: Any, N: int, like: Tensor) -> Tensor:
    r"""``noise_variance`` as ``N`` positive values in ``like``'s dtype/device, or a clear error."""
    if isinstance(noise_variance, (str, bytes, bool)) or not isinstance(noise_variance, (Real, Tensor, list, tuple)):
        raise TypeError(
            "`noise_variance` must be a positive number or a tensor of per-agent values, "
            f"got {type(noise_variance).__name__} {noise_variance!r}."
        )
    try:
        noise = torch.as_tensor(noise_variance, dtype=like.dtype, device=like.device)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"`noise_variance` must be a number or a sequence of numbers, got {noise_variance!r}.") from err
    if noise.ndim == 0:
        noise = noise.expand(N).clone()
    elif noise.shape != (N,):
        raise ValueError(
            f"`noise_variance` must be a float or a tensor of {N} per-agent values, got shape {tuple(noise.shape)}."
        )
    check_positive("noise_variance", noise)
    return noise


# BoTorch's pathwise sampling (draw_matheron_paths, PathwiseThompsonSampling) draws exact posterior paths
@DrawMatheronPaths.register(RFFBayesianLinear)
def _draw_matheron_paths_rff_blr(
    model: RFFBayesianLinear, *, sample_shape: Size, **ignore: Any
) -> GeneralizedLinearPath:
    model._check_transforms()
    omega = model.sample_weights(Size(sample_shape))  # sample_shape x [N] x M
    uses_input_transform = "input_transform" in model._modules
    fmap = RFFFeatureMap(model.features, batch_shape=model.batch_shape)
    return GeneralizedLinearPath(
        feature_map=fmap,
        weight=omega,
        input_transform=model.transform_inputs if uses_input_transform else None,
        # botorch annotates get_output_transform's model as GPyTorchModel, but it reads only
        # `outcome_transform` and `num_outputs`, which RFFBayesianLinear has
        output_transform=get_output_transform(model),  # type: ignore[arg-type]
    )


# ConditionedRFFBayesianLinear lives in fbo_torch.models.rff_weight_model; imported from here it still works
__all__ = ["ConditionedRFFBayesianLinear", "RFFBayesianLinear"]
