r"""Opacus accountants by name, and the ε they report with fbo_torch's guards.

DP-FTS-DE (Dai et al., 2021) releases the server's aggregated RFF weights once
per round through a **Poisson-subsampled Gaussian mechanism**: each agent joins
the round with probability ``q`` (``sample_rate``), its clipped vector is summed
and Gaussian noise of standard deviation ``z · S`` is added (``z`` is the
``noise_multiplier``, ``S`` the clipping bound). An accountant records these
releases and converts the composition into an (ε, δ)-DP guarantee.

Accountants are Opacus' own ``IAccountant`` objects, created by name with
``opacus.accountants.create_accountant`` (:func:`new_accountant`); importing
:mod:`fbo_torch.privacy` adds ``"rdp-classic"`` and ``"ddg"`` to Opacus' registry
(:func:`register_when_opacus_loads`). The names fbo_torch uses (:data:`ACCOUNTANTS`):

================= ===========================================================
``"rdp"``         Opacus ``RDPAccountant`` (default, :data:`DEFAULT_ACCOUNTANT`):
                  RDP at fractional orders, tight conversion of Balle et al. (2020).
``"prv"``         Opacus ``PRVAccountant``: numerical composition of privacy loss
                  random variables (Gopi et al., 2021); tightest, reports an upper
                  bound. Its cost grows with the number of distinct ``(z, q)``
                  segments, not with their length.
``"gdp"``         Opacus ``GaussianAccountant`` (CLT approximation).
                  Experimental: it can *under*-estimate ε.
``"rdp-classic"`` The moments accountant as the DP-FTS-DE paper computes it
                  (:class:`~fbo_torch.privacy.rdp_classic.ClassicRDPAccountant`):
                  integer orders 2..256 and the classic conversion. Loosest; use
                  it to reproduce the papers' numbers.
================= ===========================================================

For the same run, typically ``prv ≤ rdp < rdp-classic``.

An accountant's state is its ``history``, Opacus' run-length list of
``(noise_multiplier, sample_rate, num_steps)`` triples (``len(accountant)``
is, as in Opacus, the number of such segments; :func:`num_releases` counts
releases). This module adds to Opacus, as functions on that state:

* :func:`get_epsilon` — ε with checked arguments, ``0`` with no releases and
  ``+inf`` once a release had ``noise_multiplier = 0`` (non-private FTS-DE),
  for any accountant; for ``"gdp"`` heterogeneous histories compose
  (:mod:`fbo_torch.privacy.analysis.gdp`), for ``"prv"`` a history beyond the
  memory of PRV's discretisation domain (tiny ``z``) falls back to the valid,
  looser RDP bound, and ``"rdp"`` caches the one-step RDP of each ``(z, q)``.
* :func:`append_release`, :func:`num_releases`, :func:`check_history` and
  :func:`check_accountant_state` — the run-length history and the checks of a
  saved state, with errors that name the bad argument.

Importing Opacus takes seconds (it imports its privacy engine and torch's
distributed package), so nothing in :mod:`fbo_torch.privacy` imports it before
it is needed: an accountant is created or ε computed, or Opacus' accountants
are imported by someone else (then fbo_torch's are registered with them).
A process that only checks privacy settings never imports it.
"""

from __future__ import annotations

import copy
import importlib.abc
import importlib.machinery
import math
import numbers
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

from fbo_torch.privacy.analysis.gdp import compute_eps_history
from fbo_torch.privacy.analysis.rdp import compute_rdp_history
from fbo_torch.utils.validation import check_int, check_positive, check_probability

if TYPE_CHECKING:
    from opacus.accountants import IAccountant

History = list[tuple[float, float, int]]

#: The accountant used when none is named.
DEFAULT_ACCOUNTANT = "rdp"

#: Names of the accountants fbo_torch reports ε with (all in Opacus' registry).
ACCOUNTANTS: tuple[str, ...] = ("rdp", "prv", "gdp", "rdp-classic")


# --------------------------------------------------------------------------- #
# argument checks
# --------------------------------------------------------------------------- #


def check_accountant_name(name: Any) -> str:
    r"""``name`` as one of :data:`ACCOUNTANTS` (case and surrounding blanks ignored).

    Args:
        name: An accountant's name, e.g. ``"rdp"`` or ``" PRV "``.

    Returns:
        The name as it is written in :data:`ACCOUNTANTS`.

    Raises:
        TypeError: If ``name`` is not a string.
        ValueError: If ``name`` is unknown (the message lists the valid names).
    """
    if not isinstance(name, str):
        raise TypeError(f"`accountant` must be a string, got {type(name).__name__}.")
    key = name.strip().lower()
    if key not in ACCOUNTANTS:
        raise ValueError(f"Unknown `accountant` {name!r}; valid names are {', '.join(map(repr, ACCOUNTANTS))}.")
    return key


def check_noise_multiplier(value: Any, name: str = "noise_multiplier") -> float:
    r"""A noise multiplier ``z ≥ 0`` (finite) as a float."""
    check_positive(name, value, allow_zero=True)
    return float(value)


def check_sample_rate(value: Any, name: str = "sample_rate") -> float:
    r"""A sampling rate ``q ∈ (0, 1]`` as a float."""
    return check_probability(name, value, open_left=True)


def check_delta(value: Any, name: str = "delta") -> float:
    r"""A target ``δ ∈ (0, 1)`` as a float."""
    return check_probability(name, value, open_left=True, open_right=True)


def check_steps(value: Any, name: str = "steps", minimum: int = 0) -> int:
    r"""A number of releases ``≥ minimum`` as an int (numpy / torch integer scalars accepted)."""
    if not isinstance(value, bool) and isinstance(value, numbers.Integral):
        value = int(value)
    return check_int(name, value, minimum=minimum)


def check_history(history: Any) -> History:
    r"""A run-length history, checked: a list of ``(z ≥ 0, q ∈ (0, 1], num_steps ≥ 1)`` triples.

    Raises:
        TypeError: If ``history`` is not an iterable of triples.
        ValueError: If an entry is not a triple or holds an out-of-range value
            (the message names it, e.g. ``history[2].sample_rate``).
    """
    if isinstance(history, (str, bytes)) or not isinstance(history, Iterable):
        raise TypeError(
            "`history` must be a list of (noise_multiplier, sample_rate, num_steps) triples, "
            f"got {type(history).__name__}."
        )
    out: History = []
    for i, entry in enumerate(history):
        try:
            z, q, n = entry
        except (TypeError, ValueError):
            raise ValueError(
                f"`history[{i}]` must be a (noise_multiplier, sample_rate, num_steps) triple, got {entry!r}."
            ) from None
        out.append(
            (
                check_noise_multiplier(z, f"history[{i}].noise_multiplier"),
                check_sample_rate(q, f"history[{i}].sample_rate"),
                check_steps(n, f"history[{i}].num_steps", minimum=1),
            )
        )
    return out


def check_accountant_state(state_dict: Any, mechanism: str) -> History:
    r"""The checked history of an accountant's ``state_dict`` saved by ``mechanism``.

    Args:
        state_dict: Mapping with keys ``"history"`` and ``"mechanism"``, as
            ``IAccountant.state_dict`` returns.
        mechanism: The mechanism it must have been saved by.

    Returns:
        The history (see :func:`check_history`).

    Raises:
        ValueError: If the mapping is empty, lacks a key, holds a malformed
            history, or was saved by another mechanism.
    """
    if not state_dict:
        raise ValueError("`state_dict` is None or empty; cannot load it into a privacy accountant.")
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"`state_dict` must be a mapping, got {type(state_dict).__name__}.")
    for key in ("history", "mechanism"):
        if key not in state_dict:
            raise ValueError(f"`state_dict` has no key {key!r}; cannot load it into a privacy accountant.")
    if state_dict["mechanism"] != mechanism:
        raise ValueError(
            f"`state_dict` was saved by mechanism {state_dict['mechanism']!r}; it cannot be "
            f"loaded into a {mechanism!r} accountant."
        )
    return check_history(state_dict["history"])


# --------------------------------------------------------------------------- #
# Opacus, imported on first use
# --------------------------------------------------------------------------- #

#: The Opacus module whose registry fbo_torch's accountants join.
_OPACUS_ACCOUNTANTS = "opacus.accountants"


def register_with_opacus() -> None:
    r"""Import Opacus' accountants and register fbo_torch's with them (idempotent).

    :class:`~fbo_torch.privacy.rdp_classic.ClassicRDPAccountant` (``"rdp-classic"``)
    and :class:`~fbo_torch.privacy.ddg.DistributedDiscreteGaussianAccountant`
    (``"ddg"``) register themselves when their modules are imported; this imports
    them, and with them Opacus.
    """
    import fbo_torch.privacy.ddg
    import fbo_torch.privacy.rdp_classic  # noqa: F401  (each registers its accountant on import)


def new_accountant(name: str) -> IAccountant:
    r"""A new Opacus accountant by one of fbo_torch's names for it.

    Args:
        name: One of :data:`ACCOUNTANTS` (checked by :func:`check_accountant_name`).

    Returns:
        ``opacus.accountants.create_accountant(name)``, with fbo_torch's accountants
        registered first (:func:`register_with_opacus`).
    """
    key = check_accountant_name(name)
    register_with_opacus()
    from opacus.accountants import create_accountant

    return create_accountant(key)


def is_accountant(accountant: object) -> TypeGuard[IAccountant]:
    r"""Whether ``accountant`` is an Opacus accountant (``IAccountant``); a name is not one, and is told
    apart without importing Opacus.

    Args:
        accountant: An accountant or a name of one.

    Returns:
        ``True`` for an Opacus ``IAccountant``.
    """
    if isinstance(accountant, str):
        return False
    from opacus.accountants import IAccountant

    return isinstance(accountant, IAccountant)


class _RegisterAfterExec(importlib.abc.Loader):
    """Executes ``opacus.accountants`` with its own loader, then registers fbo_torch's accountants."""

    def __init__(self, loader: importlib.abc.Loader, finder: _RegisterWhenOpacusLoads) -> None:
        self._loader, self._finder = loader, finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        register_with_opacus()

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...: the real loader's
        loader = self.__dict__.get("_loader")
        if loader is None:
            raise AttributeError(name)
        return getattr(loader, name)


class _RegisterWhenOpacusLoads(importlib.abc.MetaPathFinder):
    """Finds ``opacus.accountants`` as the other finders do, with a loader that then registers ours."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _OPACUS_ACCOUNTANTS:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(fullname, path, target)
            if spec is not None:
                if spec.loader is None:
                    return None
                spec.loader = _RegisterAfterExec(spec.loader, self)
                return spec
        return None


def register_when_opacus_loads() -> None:
    r"""Register fbo_torch's accountants with Opacus now if it is imported, else as soon as it is.

    What importing :mod:`fbo_torch.privacy` does, so that Opacus' own tools
    (``create_accountant``, ``get_noise_multiplier``, ``PrivacyEngine``) accept
    ``"rdp-classic"`` and ``"ddg"`` without this process importing Opacus before
    it needs it: until then a finder on ``sys.meta_path`` waits for
    ``opacus.accountants``, and registers them once that module has run.
    """
    if _OPACUS_ACCOUNTANTS in sys.modules:
        register_with_opacus()
    elif not any(isinstance(finder, _RegisterWhenOpacusLoads) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterWhenOpacusLoads())


# --------------------------------------------------------------------------- #
# run-length history
# --------------------------------------------------------------------------- #


def num_releases(history: Iterable[tuple[float, float, int]]) -> int:
    r"""Total number of releases in a run-length history (Opacus' ``len`` counts segments).

    Args:
        history: ``(noise_multiplier, sample_rate, releases)`` segments, as Opacus' accountants keep them.

    Returns:
        The number of releases.
    """
    return sum(int(n) for _, _, n in history)


def append_release(history: Iterable[tuple[float, float, int]], noise_multiplier: float, sample_rate: float) -> History:
    r"""A new history with one more release, merged as Opacus' ``RDPAccountant.step`` merges it.

    Consecutive releases with equal ``(z, q)`` share one segment. Unlike
    ``GaussianAccountant.step``, a change of ``(z, q)`` starts a new segment
    (the GDP analysis here composes them).

    Args:
        history: The history so far (not modified).
        noise_multiplier: ``z ≥ 0`` of the release.
        sample_rate: ``q ∈ (0, 1]`` of the release.

    Returns:
        The extended history (a new list).
    """
    z, q = check_noise_multiplier(noise_multiplier), check_sample_rate(sample_rate)
    out = list(history)
    if out and tuple(out[-1][:2]) == (z, q):
        last_z, last_q, n = out[-1]
        out[-1] = (last_z, last_q, n + 1)
    else:
        out.append((z, q, 1))
    return out


# --------------------------------------------------------------------------- #
# epsilon
# --------------------------------------------------------------------------- #


def _with_history(accountant: IAccountant, history: History) -> IAccountant:
    trial = copy.copy(accountant)
    trial.history = list(history)
    return trial


def _epsilon_opacus(accountant: IAccountant, history: History, delta: float, **kwargs: Any) -> float:
    return float(_with_history(accountant, history).get_epsilon(delta, **kwargs))


def _epsilon_rdp(accountant: IAccountant, history: History, delta: float, alphas: Any = None) -> float:
    # Opacus' RDPAccountant.get_epsilon, with the one-step RDP of each (z, q) cached
    from opacus.accountants.analysis.rdp import get_privacy_spent

    orders = [float(a) for a in (accountant.DEFAULT_ALPHAS if alphas is None else alphas)]
    eps, _ = get_privacy_spent(orders=orders, rdp=compute_rdp_history(history, orders), delta=delta)
    return float(eps)


def _epsilon_prv(accountant: IAccountant, history: History, delta: float, **kwargs: Any) -> float:
    for key in ("eps_error", "delta_error"):
        if kwargs.get(key) is not None:
            check_positive(key, kwargs[key])
    try:
        with np.errstate(all="ignore"):
            return _epsilon_opacus(accountant, history, delta, **kwargs)
    except MemoryError:
        # Tiny noise multipliers make the PRV discretisation domain astronomically
        # large. The RDP bound is still a valid (looser) guarantee.
        warnings.warn(
            "PRV accounting ran out of memory for this history (very small noise multiplier?); "
            "reporting the RDP bound instead, which is valid but looser.",
            RuntimeWarning,
            stacklevel=3,
        )
        from opacus.accountants import RDPAccountant

        return _epsilon_rdp(RDPAccountant(), history, delta)


def _epsilon_gdp(accountant: IAccountant, history: History, delta: float) -> float:
    return compute_eps_history(history, delta)


def _epsilon_of(accountant: IAccountant) -> Callable[..., float]:
    # how ε is computed for an accountant of exactly these classes; any other one is asked itself
    from opacus.accountants import GaussianAccountant, PRVAccountant, RDPAccountant

    special: dict[type[IAccountant], Callable[..., float]] = {
        RDPAccountant: _epsilon_rdp,
        PRVAccountant: _epsilon_prv,
        GaussianAccountant: _epsilon_gdp,
    }
    return special.get(type(accountant), _epsilon_opacus)


def get_epsilon(
    accountant: IAccountant,
    delta: float,
    *,
    history: Iterable[tuple[float, float, int]] | None = None,
    **kwargs: Any,
) -> float:
    r"""Privacy budget ε an Opacus accountant has spent, for a target δ.

    The accountant is not modified.

    Args:
        accountant: An Opacus ``IAccountant`` (e.g. from
            ``opacus.accountants.create_accountant(name)``).
        delta: Target ``δ ∈ (0, 1)`` (the papers use ``1/N^1.1`` for ``N`` agents).
        history: Evaluate this run-length history instead of the accountant's own.
        **kwargs: Options of that accountant's ``get_epsilon`` (``alphas`` for
            ``"rdp"`` and ``"rdp-classic"``, ``eps_error`` / ``delta_error`` for ``"prv"``).

    Returns:
        ``ε ≥ 0`` as a Python float: ``0.0`` with no releases, ``+inf`` if any
        release had ``noise_multiplier = 0``.

    Raises:
        ValueError: If ``delta`` or the history is out of range.
    """
    if not is_accountant(accountant):
        raise TypeError(f"`accountant` must be an Opacus IAccountant, got {type(accountant).__name__}.")
    delta = check_delta(delta)
    history = check_history(accountant.history if history is None else history)
    if not history:
        return 0.0
    if any(z == 0.0 for z, _, _ in history):
        return math.inf
    return float(_epsilon_of(accountant)(accountant, history, delta, **kwargs))


__all__ = [
    "ACCOUNTANTS",
    "DEFAULT_ACCOUNTANT",
    "append_release",
    "check_accountant_name",
    "check_accountant_state",
    "check_history",
    "get_epsilon",
    "is_accountant",
    "new_accountant",
    "num_releases",
    "register_when_opacus_loads",
    "register_with_opacus",
]
