r"""Experimental setups: the local engine (``"engine"``, the default), the papers' (``"paper"``) and the authors' code's (``"authors"``).

The FTS and DP-FTS-DE algorithms are the same in all three; what differs is how
each agent models and searches its own function, and how the landmine objective
is scored. ``setup: paper`` is what the papers describe with BoTorch's modern
GP (``modern`` is its former name, still accepted); ``setup: authors`` reproduces
the choices of the authors' released code (the FTS code of 2020 and the DP-FTS-DE
code of 2021; ``docs/design.md``, "Experiments", says where each comes from)::

    =========================  ========================  ==========================  ==========================================
    choice                     ``engine`` (default)      ``paper``                   ``authors``
    =========================  ========================  ==========================  ==========================================
    agent's GP                 BoTorch's model, noise    BoTorch's ``SingleTaskGP``  isotropic RBF, zero mean, raw outputs,
                               floor 1e-6, short-        (RBF/ARD, its priors, MAP   maximum likelihood (``gp_kernel="authors"``)
                               lengthscale prior         fit; ``"botorch"``)
                               (``"fbo"``)
    outputs                    per-agent log warps       as observed                 as observed
                               chosen by evidence
                               (``gp_warp: auto``)
    own acquisition            LogEI                     Thompson sample (Matheron   Thompson sample, 100 fresh random features
                                                         path, 256 features)
    hyperparameter refit       the method's              the method's                every 5 evaluations, from the current
                               ``gp_refit_every``        ``gp_refit_every``          values and 10 random restarts
    broadcast maximization     one per region (shared)   one per region (shared)     each agent with its own restarts
    a repeated query           kept                      kept                        replaced by a uniform random point
    landmine SVM score         AUC of decision_function  AUC of decision_function    AUC of Platt-scaled ``predict_proba``
    landmine search space      log-scale ``C``, ``γ``     log-scale ``C``, ``γ``       linear ``C ∈ [1e-4, 10]``, ``γ ∈ [1e-2, 10]``
    =========================  ========================  ==========================  ==========================================

Everything else (RFF features, weights, clipping, noise, accounting, ``p_t``,
initial points) is the same in all. In FTS experiments the other agents' TS
histories are built with the setup's GP choices too.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

#: What the papers' agents do alone (FTS and DP-FTS-DE with BoTorch's modern GP): a Thompson sample of
#: BoTorch's ``SingleTaskGP``, no output warp. ``paper`` and ``authors`` start from it.
PAPER: dict[str, Any] = {"gp_kernel": "botorch", "gp_warp": "none", "own_acquisition": "ts"}

#: Runner settings each setup sets (fields of ``DPFTSDESettings`` / ``FTSSettings``). ``engine`` sets
#: nothing: the settings' defaults are the local engine. ``modern`` is ``paper``'s former name.
SETUPS: dict[str, dict[str, Any]] = {
    "engine": {},
    "paper": dict(PAPER),
    "modern": dict(PAPER),
    "authors": {
        **PAPER,
        "gp_kernel": "authors",
        "gp_restarts": 10,
        "gp_warm_start": True,
        "gp_refit_every": 5,
        "gp_sample_features": 100,
        "repeated_query": "random",
        "broadcast_maximization": "per_agent",
    },
}
#: The setup of a configuration that names none.
DEFAULT_SETUP = "engine"

#: Objective arguments each setup sets, by objective type.
OBJECTIVE_SETUPS: dict[str, dict[str, dict[str, Any]]] = {
    "engine": {},
    "paper": {},
    "modern": {},
    "authors": {
        "landmine": {
            "scoring": "platt",
            "search_space": {
                "C": {"low": 1.0e-4, "high": 10.0, "log": False},
                "gamma": {"low": 1.0e-2, "high": 10.0, "log": False},
            },
        },
    },
}


def check_setup(name: str, key: str = "setup") -> str:
    """``name`` if it names a setup of :data:`SETUPS`, else a ``ValueError`` naming ``key``."""
    if name not in SETUPS:
        raise ValueError(f"`{key}` must be one of {sorted(SETUPS)}, got {name!r}.")
    return name


def setup_choices(setup: str, settings_cls: Any) -> dict[str, Any]:
    r"""The settings ``setup`` sets that ``settings_cls`` (a settings dataclass or instance) has.

    Fields the settings class does not have (e.g. ``broadcast_maximization`` for
    FTS) are skipped.
    """
    check_setup(setup)
    names = {f.name for f in dataclasses.fields(settings_cls)}
    return {k: v for k, v in SETUPS[setup].items() if k in names}


def apply_setup(settings: Any, setup: str, overrides: dict[str, Any] | None = None) -> Any:
    r"""``settings`` (a settings dataclass) with ``setup``'s choices (:func:`setup_choices`), then ``overrides``
    on top (again only the fields it has)."""
    names = {f.name for f in dataclasses.fields(settings)}
    changes = {**setup_choices(setup, settings), **{k: v for k, v in (overrides or {}).items() if k in names}}
    return dataclasses.replace(settings, **changes)


def objective_setup(objective_type: str, setup: str) -> dict[str, Any]:
    r"""Objective constructor arguments ``setup`` sets for ``objective_type`` (a copy)."""
    check_setup(setup)
    return copy.deepcopy(OBJECTIVE_SETUPS[setup].get(objective_type, {}))


__all__ = [
    "DEFAULT_SETUP",
    "OBJECTIVE_SETUPS",
    "PAPER",
    "SETUPS",
    "apply_setup",
    "check_setup",
    "objective_setup",
    "setup_choices",
]
