r"""Experimental setups: our defaults (``"modern"``) and the authors' (``"authors"``).

The DP-FTS-DE and FTS algorithms are the same in both; what differs is how each
agent models and searches its own function, and how the landmine objective is
scored. ``setup: authors`` reproduces the choices of the authors' released code
(the FTS code of 2020 and the DP-FTS-DE code of 2021; ``docs/design.md``, "Experiments",
says where each comes from)::

    =====================================  =====================================  ==========================================
    choice                                 ``modern`` (default)                   ``authors``
    =====================================  =====================================  ==========================================
    agent's GP                             BoTorch's ``SingleTaskGP`` model: RBF  isotropic RBF, zero mean, raw outputs,
                                           with ARD and BoTorch's priors,         maximum likelihood (``gp_kernel="authors"``)
                                           standardized outputs, MAP fit
                                           (``"botorch"``)
    hyperparameter refit                   the method's ``gp_refit_every`` (FTS:  every 5 evaluations, from the current
                                           every evaluation; DP-FTS-DE: every 5;  values and 10 random restarts
                                           see :mod:`~fbo_torch.federation.settings`),
                                           from the default initialization
                                           (as BoTorch)
    own Thompson sample                    Matheron path, 256 random features     100 fresh random features
    broadcast maximization                 one search per region, shared by all   each agent searches the broadcast with its
                                           agents following it (``"shared"``)      own random restarts (``"per_agent"``)
    a query that repeats an observed one   kept                                   replaced by a uniform random point
    landmine SVM score                     AUC of ``decision_function``           AUC of Platt-scaled ``predict_proba``
    landmine search space                  log-scale ``C``, ``γ``                  linear ``C ∈ [1e-4, 10]``, ``γ ∈ [1e-2, 10]``
    =====================================  =====================================  ==========================================

Everything else (RFF features, weights, clipping, noise, accounting, ``p_t``,
initial points) is the same in both. In FTS experiments the other agents' TS
histories are built with the setup's GP choices too.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

#: Runner settings each setup sets (fields of ``DPFTSDESettings`` / ``FTSSettings``).
SETUPS: dict[str, dict[str, Any]] = {
    "modern": {},
    "authors": {
        "gp_kernel": "authors",
        "gp_restarts": 10,
        "gp_warm_start": True,
        "gp_refit_every": 5,
        "gp_sample_features": 100,
        "repeated_query": "random",
        "broadcast_maximization": "per_agent",
    },
}

#: Objective arguments each setup sets, by objective type.
OBJECTIVE_SETUPS: dict[str, dict[str, dict[str, Any]]] = {
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


__all__ = ["OBJECTIVE_SETUPS", "SETUPS", "apply_setup", "check_setup", "objective_setup", "setup_choices"]
