r"""Federated objectives: all agents' black-box functions, evaluated at once."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from fbo_torch.objectives.base import Objective
from fbo_torch.objectives.function_families import FunctionFamilyFederation
from fbo_torch.objectives.har import HARLogReg
from fbo_torch.objectives.landmine import LandmineSVM
from fbo_torch.objectives.search_space import Integer, Real, SearchSpace, TuningObjective
from fbo_torch.objectives.synthetic import GPSampleContinuousFederation, GPSampleGridFederation

#: Objective ``type`` names used in YAML configs -> "module:Class" (imported on demand).
REGISTRY = {
    "gp_grid": "fbo_torch.objectives.synthetic:GPSampleGridFederation",
    "gp_continuous": "fbo_torch.objectives.synthetic:GPSampleContinuousFederation",
    "function_families": "fbo_torch.objectives.function_families:FunctionFamilyFederation",
    "landmine": "fbo_torch.objectives.landmine:LandmineSVM",
    "har": "fbo_torch.objectives.har:HARLogReg",
    "digits_cnn": "fbo_torch.objectives.vision:DigitsCNN",
    "emnist_cnn": "fbo_torch.objectives.vision:EMNISTCNN",
}


def objective_class(type_name: str) -> type:
    """The objective class registered under ``type_name``."""
    if type_name not in REGISTRY:
        raise ValueError(f"unknown objective type {type_name!r}; expected one of {sorted(REGISTRY)}.")
    module, cls = REGISTRY[type_name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_objective(spec: dict[str, Any], device: str | None = None) -> Objective:
    """Build an objective from a config mapping ``{type: ..., **kwargs}``.

    ``device`` (the run's device) reaches objectives that compute on a device
    (the CNN objectives train there) unless ``spec`` names its own ``device``.
    """
    spec = dict(spec)
    cls = objective_class(spec.pop("type"))
    if device is not None and "device" not in spec and "device" in inspect.signature(cls.__init__).parameters:
        spec["device"] = device
    return cls(**spec)


__all__ = [
    "FunctionFamilyFederation",
    "GPSampleContinuousFederation",
    "GPSampleGridFederation",
    "HARLogReg",
    "Integer",
    "LandmineSVM",
    "Objective",
    "REGISTRY",
    "Real",
    "SearchSpace",
    "TuningObjective",
    "build_objective",
    "objective_class",
]
