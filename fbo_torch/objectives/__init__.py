r"""Federated objectives: all agents' black-box functions, evaluated at once."""

from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any

from fbo_torch.objectives.base import Objective, as_objective, check_objective_class
from fbo_torch.objectives.function_families import FunctionFamilyFederation
from fbo_torch.objectives.har import HARLogReg
from fbo_torch.objectives.landmine import LandmineSVM
from fbo_torch.objectives.search_space import Integer, Real, SearchSpace, TuningObjective
from fbo_torch.objectives.synthetic import GPSampleContinuousFederation, GPSampleGridFederation
from fbo_torch.utils.resources import check_memory

#: Objective ``type`` names used in YAML configs -> "module:Class" (imported on demand).
REGISTRY: dict[str, type | str] = {
    "gp_grid": "fbo_torch.objectives.synthetic:GPSampleGridFederation",
    "gp_continuous": "fbo_torch.objectives.synthetic:GPSampleContinuousFederation",
    "function_families": "fbo_torch.objectives.function_families:FunctionFamilyFederation",
    "tetci2019": "fbo_torch.objectives.tetci2019:Tetci2019",
    "gecco2020": "fbo_torch.objectives.gecco2020:Gecco2020",
    "landmine": "fbo_torch.objectives.landmine:LandmineSVM",
    "har": "fbo_torch.objectives.har:HARLogReg",
    "digits_cnn": "fbo_torch.objectives.vision:DigitsCNN",
    "emnist_cnn": "fbo_torch.objectives.vision:EMNISTCNN",
}


def _import_class(path: str) -> Any:
    r"""The object ``path`` (``"package.module:ClassName"``) names; a one-line ``ValueError`` when the
    module cannot be imported or has no such attribute."""
    module_name, _, qualname = path.partition(":")
    if (
        not module_name
        or not qualname
        or ":" in qualname
        or not all(part.isidentifier() for part in module_name.split(".") + qualname.split("."))
    ):
        raise ValueError(f"{path!r} is not of the form 'package.module:ClassName'.")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and (module_name == err.name or module_name.startswith(err.name + ".")):
            raise ValueError(
                f"cannot import module {module_name!r} for {path!r} (no module named {err.name!r}); install it, "
                "put its folder on PYTHONPATH, or run from the folder that holds it."
            ) from None
        raise ValueError(f"importing module {module_name!r} for {path!r} failed: {err}") from None
    except Exception as err:  # the module's own code failed (SyntaxError, a missing dependency, ...)
        raise ValueError(
            f"importing module {module_name!r} for {path!r} failed: {type(err).__name__}: "
            f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        ) from None
    obj: Any = module
    for part in qualname.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"module {module_name!r} has no attribute {qualname!r}{hint}.")
        obj = getattr(obj, part)
    return obj


def objective_class(type_name: str) -> type:
    r"""The objective class of a YAML ``objective.type``.

    Args:
        type_name: A name in :data:`REGISTRY` (built in, or added with :func:`register`),
            or ``"package.module:ClassName"`` for a class of your own that follows the
            objective protocol (:mod:`fbo_torch.objectives.base`).

    Returns:
        The objective class.

    Raises:
        ValueError: An unknown name, a module that cannot be imported, a missing class,
            or a class that is not an objective; the message is one line.
    """
    if not isinstance(type_name, str):
        raise ValueError(f"must be a string (a registered name or 'package.module:ClassName'), got {type_name!r}.")
    if type_name in REGISTRY:
        entry = REGISTRY[type_name]
        cls = _import_class(entry) if isinstance(entry, str) else entry
    elif ":" in type_name:
        cls = _import_class(type_name)
    else:
        close = difflib.get_close_matches(type_name, list(REGISTRY), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"unknown objective type {type_name!r}{hint}; expected one of {sorted(REGISTRY)}, a name registered "
            "with fbo_torch.objectives.register(), or 'package.module:ClassName' for your own class."
        )
    try:
        return check_objective_class(cls, repr(type_name))
    except TypeError as err:
        raise ValueError(str(err)) from None


def register(name: str, cls: type | str, replace: bool = False) -> None:
    r"""Make ``objective: {type: NAME}`` build ``cls`` in experiment files run from this process.

    Args:
        name: The YAML name (an identifier-like string without ``:``).
        cls: An objective class (see :mod:`fbo_torch.objectives.base`), or its
            ``"package.module:ClassName"`` path (imported when used).
        replace: Allow replacing a name already registered.

    Example:
        >>> from fbo_torch.objectives import register
        >>> register("my_cnn", MyCNN)  # doctest: +SKIP
    """
    if not isinstance(name, str) or not name or ":" in name or name.strip() != name:
        raise ValueError(f"`name` must be a non-empty string without ':' or surrounding spaces, got {name!r}.")
    if name in REGISTRY and not replace:
        raise ValueError(f"objective type {name!r} is already registered ({REGISTRY[name]!r}); pass replace=True.")
    if not isinstance(cls, str):
        try:
            check_objective_class(cls, f"`cls` ({getattr(cls, '__qualname__', cls)!r})")
        except TypeError as err:
            raise ValueError(str(err)) from None
    REGISTRY[name] = cls


def build_objective(spec: dict[str, Any], device: str | None = None) -> Objective:
    """Build an objective from a config mapping ``{type: ..., **kwargs}``.

    ``device`` (the run's device) reaches objectives that compute on a device
    (the CNN objectives train there) unless ``spec`` names its own ``device``.
    An instance of a class that follows the objective protocol without subclassing
    :class:`Objective` is wrapped (:func:`~fbo_torch.objectives.base.as_objective`).

    Args:
        spec: ``{"type": name, **kwargs}``: a registered name or ``"module:Class"``, and its
            constructor's keyword arguments.
        device: The run's device, passed to a constructor that takes ``device`` unless ``spec`` has one.

    Returns:
        The :class:`Objective` (a protocol-following instance wrapped in one).
    """
    spec = dict(spec)
    type_name = spec.pop("type")
    cls = objective_class(type_name)
    if device is not None and "device" not in spec and "device" in inspect.signature(cls).parameters:
        spec["device"] = device
    check_objective_memory(cls, spec, type_name)
    return as_objective(cls(**spec), f"the {type_name!r} objective")


def check_objective_memory(cls: Any, kwargs: dict[str, Any], type_name: str) -> None:
    r"""Refuse, naming the argument of the largest term, an objective whose
    :meth:`~fbo_torch.objectives.base.Objective.memory_estimate` exceeds the machine's free memory
    (:class:`~fbo_torch.utils.resources.MemoryLimitError`, before anything is allocated)."""
    estimate = getattr(cls, "memory_estimate", None)
    terms = estimate(**kwargs) if callable(estimate) else {}
    if terms:
        key = max(terms, key=terms.__getitem__)
        check_memory(f"`{key}`", sum(terms.values()), f"the {type_name!r} objective")


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
    "register",
]
