r"""Random Fourier features shared by every agent of a federation.

The papers (FTS, Dai et al. 2020, appendix A; DP-FTS-DE, Dai et al. 2021) build
one feature map for the squared-exponential kernel
``k(x, x') = σ₀² exp(-‖(x - x') / ℓ‖² / 2)`` and have every agent use the *same*
map, so that a weight vector ``ω`` drawn by one agent means the same function
``φ(x)ᵀω`` to every other agent. Sharing the map amounts to sharing the spectral
samples ``s_i`` and phases ``b_i``, i.e. the first layer of a one-hidden-layer
network.

We write this map ourselves rather than reuse ``gpytorch.kernels.RFFKernel`` or
BoTorch's pathwise feature maps: those use ``[cos(Wx), sin(Wx)] / √D`` without
phases, draw from the global RNG, and carry no identity that a message could be
checked against. The papers' map is ``√(2σ₀²/M) · cos(Sx + b)`` with seeded draws.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from fbo_torch.utils.dispatch import gpu_path
from fbo_torch.utils.resources import check_memory
from fbo_torch.utils.validation import (
    check_device,
    check_finite,
    check_floating,
    check_int,
    check_last_dim,
    check_positive,
    check_tensor,
)

#: Bumped whenever the construction below changes, so old fingerprints never
#: match maps drawn differently.
_CONSTRUCTION_VERSION = 1


class RandomFourierFeatures(nn.Module):
    r"""The papers' random Fourier feature map ``φ: R^d → R^M``.

    Spectral samples ``s_i ~ N(0, diag(ℓ)^-2)`` (one lengthscale, or one per
    input dimension for ARD) and phases ``b_i ~ U(0, 2π)`` are drawn from a
    dedicated CPU generator seeded with ``seed`` in float64, and only then cast to
    ``dtype``/``device``. Every agent that builds the map with the same
    arguments therefore gets the identical map, whatever its device.

    ``φ(x) = √(2σ₀²/M) · cos(S x + b)`` with ``S`` the ``M x d`` matrix of
    spectral samples, so that ``E[φ(x)ᵀφ(x')] = σ₀² exp(-‖(x-x')/ℓ‖²/2)``.

    With ``normalize=True`` every feature vector is rescaled to
    ``‖φ(x)‖² = σ₀²``, i.e. ``k̂(x, x) = σ₀²`` exactly. **This is what the papers
    used** (FTS appendix A: "each set of random features φ(x) is then normalized
    such that ‖φ(x)‖² = σ₀²"; the authors' code does the same), and it is the
    default. ``normalize=False`` gives the plain Rahimi–Recht estimator, unbiased
    for the kernel.

    Args:
        dim: Input dimension ``d``.
        num_features: Number of features ``M``.
        lengthscale: Positive scalar, or a sequence/tensor of ``d`` positive
            values (ARD).
        outputscale: Signal variance ``σ₀² > 0``.
        seed: Integer seed that fixes ``S`` and ``b``.
        normalize: Rescale each ``φ(x)`` to squared norm ``σ₀²`` (papers' choice).
        dtype: Floating dtype of the stored parameters (float64 by default).
        device: Device of the stored parameters.

    Example:
        >>> rff = RandomFourierFeatures(dim=2, num_features=100, lengthscale=0.2, seed=7)
        >>> phi = rff(torch.rand(5, 2, dtype=torch.float64))  # 5 x 100
    """

    # buffers (registered in __init__; declared so a type checker knows them as tensors)
    spectral: Tensor
    phase: Tensor
    lengthscale: Tensor
    outputscale: Tensor
    seed_: Tensor
    normalize_: Tensor

    def __init__(
        self,
        dim: int,
        num_features: int,
        lengthscale: float | Sequence[float] | Tensor = 1.0,
        outputscale: float = 1.0,
        seed: int = 0,
        normalize: bool = True,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        dim = check_int("dim", dim, minimum=1)
        num_features = check_int("num_features", num_features, minimum=1)
        seed = check_int("seed", seed)
        if not -(2**63) <= seed < 2**63:
            raise ValueError(f"`seed` must fit in a signed 64-bit integer, got {seed}.")
        if not isinstance(normalize, bool):
            raise TypeError(f"`normalize` must be a bool, got {type(normalize).__name__}.")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"`dtype` must be a floating torch.dtype, got {dtype}.")
        device = check_device("device", device)
        ls = torch.as_tensor(lengthscale, dtype=torch.float64).detach().cpu().reshape(-1)
        if ls.numel() not in (1, dim):
            raise ValueError(f"`lengthscale` must be a scalar or have d = {dim} entries, got {ls.numel()}.")
        check_positive("lengthscale", ls)
        check_positive("outputscale", outputscale)
        # the spectral draws, their scaled copy and the stored buffers: refused before any is allocated
        check_memory(
            "`num_features`", 8.0 * 3 * num_features * (dim + 1), f"a map of {num_features} features in dimension {dim}"
        )

        gen = torch.Generator(device="cpu").manual_seed(seed)
        base = torch.randn(num_features, dim, generator=gen, dtype=torch.float64)
        phase = torch.rand(num_features, generator=gen, dtype=torch.float64) * (2 * math.pi)
        spectral = base / ls.expand(dim)

        self.dim = dim
        self.num_features = num_features
        self.seed = seed
        self.normalize = normalize
        # the float64 arguments, for config() (the buffers may be float32)
        self._config_scales = (ls.tolist(), float(outputscale))
        self.register_buffer("spectral", spectral.to(dtype=dtype, device=device))
        self.register_buffer("phase", phase.to(dtype=dtype, device=device))
        self.register_buffer("lengthscale", ls.expand(dim).clone().to(dtype=dtype, device=device))
        self.register_buffer("outputscale", torch.tensor(float(outputscale), dtype=dtype, device=device))
        # integer/bool buffers: not cast by .to(dtype); they make the state dict self-contained
        self.register_buffer("seed_", torch.tensor(seed, dtype=torch.int64, device=device))
        self.register_buffer("normalize_", torch.tensor(normalize, device=device))

    # ------------------------------------------------------------------ map
    def forward(self, X: Tensor) -> Tensor:
        r"""Map inputs ``... x d`` to features ``... x M``.

        The computation runs in ``X``'s dtype and on ``X``'s device. Non-finite
        inputs are refused on the CPU (``ValueError``); on a GPU (and with
        ``FBO_SYNC_FREE=1``) the check would wait for the device on every call, so
        there they give non-finite features.
        """
        check_tensor("X", X)
        check_floating("X", X)
        check_last_dim("X", X, self.dim)
        if not gpu_path(X.device):
            check_finite("X", X)
        S = self.spectral.to(dtype=X.dtype, device=X.device)
        b = self.phase.to(dtype=X.dtype, device=X.device)
        s0sq = self.outputscale.to(dtype=X.dtype, device=X.device)
        # one fused X Sᵀ + b; without autograd the cos and the scaling run in place (one buffer)
        lin = torch.addmm(b, X.reshape(-1, self.dim), S.transpose(-1, -2)).view(*X.shape[:-1], self.num_features)
        inplace = not (torch.is_grad_enabled() and (X.requires_grad or S.requires_grad or b.requires_grad))
        phi = lin.cos_() if inplace else torch.cos(lin)
        if self.normalize:
            scale = s0sq.sqrt() / phi.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(X.dtype).tiny)
        else:
            scale = torch.sqrt(2.0 * s0sq / self.num_features)
        return phi.mul_(scale) if inplace else phi * scale

    def kernel(self, X1: Tensor, X2: Tensor) -> Tensor:
        r"""Approximate kernel matrix ``φ(X1) φ(X2)ᵀ`` of shape ``... x n1 x n2``."""
        return self(X1) @ self(X2).transpose(-1, -2)

    # ------------------------------------------------------------- identity
    @property
    def fingerprint(self) -> str:
        r"""A stable 16-hex-digit hash of the map.

        Computed from the shape, the normalization flag and the parameter values
        rounded to float32, so maps built from the same arguments agree on any
        device and in float32 or float64, while a different seed, lengthscale,
        outputscale or ``M`` gives a different fingerprint.
        """
        h = hashlib.sha256()
        h.update(f"rff-v{_CONSTRUCTION_VERSION}|d={self.dim}|M={self.num_features}|norm={int(self.normalize)}".encode())
        for t in (self.spectral, self.phase, self.outputscale.reshape(1)):
            h.update(t.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    # ----------------------------------------------------------- state dict
    # The state dict holds tensors only (``spectral``, ``phase``, ``lengthscale``,
    # ``outputscale`` and the 0-d ``seed_`` / ``normalize_`` buffers), so BoTorch's
    # state-dict checkpoints (``fit_gpytorch_mll``) and Flower's ``ArrayRecord``
    # accept it. The Python attributes ``dim``, ``num_features``, ``seed`` and
    # ``normalize`` are kept in sync with it on load.

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
        spectral = state_dict.get(prefix + "spectral")
        if isinstance(spectral, Tensor) and tuple(spectral.shape) != (self.num_features, self.dim):
            raise ValueError(
                f"state_dict is for a map with (num_features, dim) = {tuple(spectral.shape)}, this module has "
                f"(num_features={self.num_features}, dim={self.dim})."
            )
        for key, positive in (("spectral", False), ("phase", False), ("lengthscale", True), ("outputscale", True)):
            value = state_dict.get(prefix + key)
            if isinstance(value, Tensor) and not (torch.isfinite(value).all() and (not positive or (value > 0).all())):
                raise ValueError(
                    f"`state_dict[{key!r}]` must be finite{' and > 0' if positive else ''}; it is not "
                    "the state of a feature map."
                )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        self.seed = int(self.seed_)
        self.normalize = bool(self.normalize_)
        self._config_scales = (self.lengthscale.double().cpu().tolist(), float(self.outputscale))

    def config(self) -> dict[str, Any]:
        r"""The constructor arguments as a JSON-able dict (``dtype`` as a string, no device).

        ``RandomFourierFeatures.from_config(rff.config())`` rebuilds the identical
        map (same fingerprint) on any machine; this is what a message's config
        record carries.
        """
        ls, outputscale = self._config_scales
        return {
            "dim": self.dim,
            "num_features": self.num_features,
            "lengthscale": ls[0] if all(v == ls[0] for v in ls) else ls,
            "outputscale": outputscale,
            "seed": self.seed,
            "normalize": self.normalize,
            "dtype": str(self.spectral.dtype).removeprefix("torch."),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], device: torch.device | str | None = None) -> RandomFourierFeatures:
        r"""Build a map from :meth:`config`'s dict (unknown keys are an error)."""
        if not isinstance(config, dict):
            raise TypeError(f"`config` must be a dict of constructor arguments, got {type(config).__name__}.")
        allowed = {"dim", "num_features", "lengthscale", "outputscale", "seed", "normalize", "dtype"}
        unknown = sorted(set(config) - allowed)
        if unknown:
            raise ValueError(f"`config` has unknown keys {unknown}; expected a subset of {sorted(allowed)}.")
        kwargs = dict(config)
        if isinstance(kwargs.get("dtype"), str):
            dtype = getattr(torch, kwargs["dtype"], None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"`config['dtype']` must name a torch dtype, got {config['dtype']!r}.")
            kwargs["dtype"] = dtype
        return cls(**kwargs, device=device)

    @classmethod
    def from_state_dict(
        cls, state_dict: dict[str, Any], device: torch.device | str | None = None
    ) -> RandomFourierFeatures:
        """Rebuild a map from a ``state_dict`` (e.g. one received over the wire)."""
        for key in ("spectral", "phase", "lengthscale", "outputscale", "seed_", "normalize_"):
            if not isinstance(state_dict.get(key), Tensor):
                raise ValueError(f"`state_dict` has no tensor {key!r}; it is not a RandomFourierFeatures state.")
        spectral = state_dict["spectral"]
        num_features, dim = spectral.shape
        rff = cls(
            dim=dim,
            num_features=num_features,
            seed=int(state_dict["seed_"]),
            normalize=bool(state_dict["normalize_"]),
            dtype=spectral.dtype,
            device=device if device is not None else spectral.device,
        )
        rff.load_state_dict(state_dict)
        return rff

    def extra_repr(self) -> str:
        ls = self.lengthscale
        ls_repr = f"{ls[0].item():.4g}" if bool((ls == ls[0]).all()) else str([round(v, 4) for v in ls.tolist()])
        return (
            f"dim={self.dim}, num_features={self.num_features}, lengthscale={ls_repr}, "
            f"outputscale={self.outputscale.item():.4g}, seed={self.seed}, normalize={self.normalize}, "
            f"fingerprint={self.fingerprint}"
        )
