r"""An Ax agent's data and its FTS message.

:func:`objective_data` reads an experiment's observations as unit-cube inputs
(:class:`~fbo_torch.integrations.ax_unit_cube.UnitCube`) and the objective Ax
maximizes; :func:`agent_message` draws the agent's
:class:`~fbo_torch.protocol.AgentMessage` from them.

Requires the ``ax`` extra (``pip install 'fbo_torch[ax]'``, Python >= 3.11).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fbo_torch.integrations._ax_extra import ax_missing

try:
    from ax.core.data import Data
    from ax.core.experiment import Experiment
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ax_missing(__name__) from err

from botorch.models.transforms.outcome import Standardize

from fbo_torch.features import RandomFourierFeatures
from fbo_torch.integrations.ax_unit_cube import UnitCube, _check_features
from fbo_torch.models.rff_blr import RFFBayesianLinear
from fbo_torch.protocol.messages import AgentMessage
from fbo_torch.utils.validation import check_positive

__all__ = ["agent_message", "objective_data", "objective_weights"]


def objective_weights(experiment: Experiment) -> dict[str, float]:
    r"""``{metric signature: weight}`` of the expression Ax maximizes (``"-loss"``: ``{"loss": -1}``).

    Args:
        experiment: An Ax ``Experiment`` with a single-objective optimization config.

    Returns:
        ``{metric signature: weight}``.

    Raises:
        ValueError: No optimization config, a multi-objective one, or one with
            outcome constraints.
    """
    config = experiment.optimization_config
    if config is None:
        raise ValueError("The experiment has no objective: call Client.configure_optimization(objective=...) first.")
    objective = config.objective
    if objective.is_multi_objective:
        raise ValueError(f"FTS on Ax needs a single objective, got the multi-objective {objective.expression!r}.")
    if config.all_constraints:
        raise ValueError(
            "FTS on Ax does not handle outcome constraints; remove "
            f"{[str(c) for c in config.all_constraints]} from the optimization config."
        )
    return {sig: float(w) for sig, w in objective.metric_weights}


def objective_data(
    experiment: Experiment, data: Data | None = None, cube: UnitCube | None = None
) -> tuple[Tensor, Tensor]:
    r"""The experiment's observations as ``(X, Y)`` on the unit cube, ``Y`` to maximize.

    ``Y`` is Ax's objective expression evaluated on each arm's latest data:
    ``"acc"`` gives ``acc``, ``"-loss"`` gives ``-loss``, ``"2*a - b"`` gives
    ``2a - b`` (the expression Ax maximizes). Arms missing an objective metric
    are left out; repeated observations of an arm in one trial are averaged.

    Args:
        experiment: An Ax ``Experiment`` with a single (or scalarized) objective.
        data: Its data (``experiment.lookup_data()`` if ``None``).
        cube: Its :class:`~fbo_torch.integrations.ax_unit_cube.UnitCube` (built from the search space if ``None``).

    Returns:
        ``X``: ``n x d`` float64 unit-cube inputs; ``Y``: ``n x 1`` float64.

    Raises:
        ValueError: An unsupported objective (see :func:`objective_weights`).
    """
    cube = cube if cube is not None else UnitCube.from_search_space(experiment.search_space)
    weights = objective_weights(experiment)
    df = (data if data is not None else experiment.lookup_data()).df
    df = df[df["metric_signature"].isin(list(weights))]
    if len(df) == 0:
        return torch.empty(0, cube.dim, dtype=torch.float64), torch.empty(0, 1, dtype=torch.float64)
    table = df.pivot_table(index=["trial_index", "arm_name"], columns="metric_signature", values="mean")
    if set(table.columns) != set(weights):
        table = table.iloc[0:0]
    table = table.dropna()
    y = sum(float(w) * table[sig].to_numpy(dtype="float64") for sig, w in weights.items())
    arms = experiment.arms_by_name
    X = cube.to_unit([arms[arm].parameters for _, arm in table.index])
    Y = torch.as_tensor(y, dtype=torch.float64).reshape(-1, 1)
    return X, Y


def agent_message(
    experiment: Experiment,
    features: RandomFourierFeatures,
    agent_id: int,
    noise_variance: float = 1e-2,
    generator: torch.Generator | None = None,
    data: Data | None = None,
) -> AgentMessage:
    r"""An agent's FTS message: ``ω ~ N(ν, σ²Σ⁻¹)`` from its experiment's data.

    The :class:`~fbo_torch.models.RFFBayesianLinear` posterior on
    ``(φ(X), standardize(Y))`` with ``X, Y`` from :func:`objective_data`, so
    ``φ(x)ᵀω`` is a Thompson sample of the agent's objective to maximize.

    Args:
        experiment: The agent's Ax experiment (with at least one observation).
        features: The shared map (``dim`` = the number of coordinates of the
            :class:`~fbo_torch.integrations.ax_unit_cube.UnitCube`).
        agent_id: The sender's index, carried by the message.
        noise_variance: ``σ²`` on the standardized outputs.
        generator: Optional ``torch.Generator`` for the draw.
        data: The experiment's data (``experiment.lookup_data()`` if ``None``).

    Returns:
        The agent's :class:`~fbo_torch.protocol.AgentMessage`.

    Raises:
        ValueError: An unsupported experiment (see :class:`~fbo_torch.integrations.ax_unit_cube.UnitCube`,
            :func:`objective_data`), a map of the wrong dimension, or no observation.
    """
    check_positive("noise_variance", noise_variance)
    cube = UnitCube.from_search_space(experiment.search_space)
    features = _check_features(features, cube)
    X, Y = objective_data(experiment, data, cube)
    if X.shape[0] == 0:
        raise ValueError(
            f"Agent {agent_id}'s experiment has no observation of its objective yet: it has nothing to send."
        )
    like = features.spectral
    model = RFFBayesianLinear(features, X.to(like), Y.to(like), noise_variance, outcome_transform=Standardize(m=1))
    omega = model.sample_weights(generator=generator)
    return AgentMessage(
        omega=omega, agent_id=int(agent_id), num_observations=X.shape[0], fingerprint=features.fingerprint
    )
