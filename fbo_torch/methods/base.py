r"""One algorithm, one class: :class:`Method` and the registry of algorithms by name.

An algorithm (the YAML ``algorithm:``, a settings object's ``algorithm``) is a
subclass of :class:`Method` registered under its name, as Opacus registers its
accountants and BoTorch its pathwise samplers. The class says, in one place,

* what the algorithm is (class attributes): the experiment kinds it runs in,
  whether its agents hear from peers and what a peer sends, which histories and
  own acquisitions it supports, which settings only it reads;
* which settings it refuses (:meth:`Method.check`) and what a message costs
  (:meth:`Method.parameters_per_agent`);
* what its agents do in a round of the FTS simulator, for every run at once
  (:meth:`Method.receive`, :meth:`Method.step`, :meth:`Method.observed`) and the
  state a checkpoint keeps (:meth:`Method.state_dict`).

The runners (:mod:`fbo_torch.simulate`), the YAML checks (:mod:`fbo_torch.experiments`),
Flower (:mod:`fbo_torch.flower`) and the settings (:mod:`fbo_torch.federation.settings`)
look algorithms up here (:func:`get_method`) and read these attributes; none of them
switches on an algorithm's name. Adding an algorithm is one module with one
registered class (``docs/design.md``, "Adding an algorithm", has a worked example)::

    from fbo_torch.methods import Method, register_method

    @register_method
    class Greedy(Method):
        name = "greedy"
        def step(self, t):
            ...   # B x d queries and B sources (-1: the agent's own)
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any, ClassVar, TypeVar

from torch import Tensor

from fbo_torch.utils.validation import add_to_registry

#: The experiment kinds (the YAML's ``experiment:``) an algorithm may run in.
KINDS = ("fts", "dp_fts_de")
#: What a peer sends per message: nothing, one RFF weight draw ``ω``, or its whole RFF posterior.
MESSAGES = ("none", "draw", "posterior")
#: The agents' own acquisitions (``own_acquisition``).
OWN_ACQUISITIONS = ("ts", "logei", "ucb")
#: How the other agents of an FTS experiment got their observations (``history.mode``).
HISTORY_MODES = ("random", "ts", "together")


class Method:
    r"""An algorithm: what it is, what it refuses, and its round for every run at once.

    Attributes:
        name: The registry key (``algorithm:`` in YAML).
        kinds: Experiment kinds it runs in (:data:`KINDS`).
        message: What each peer sends per message (:data:`MESSAGES`); ``"none"``: the
            agents never hear from peers (standard TS).
        histories: The ``history.mode`` values it supports in an FTS experiment.
        own_acquisitions: The ``own_acquisition`` values it supports.
        uses: Settings fields that only this algorithm reads (the YAML refuses them on
            another algorithm's method).
        aliases: Other names it is known by (e.g. a Flower run config's ``method``).
        follows_peers: Whether its agents follow a named peer's message (a peer's index in
            ``sources``) and honour the runner's ``may_follow`` (``reciprocity: true``).
        fair_help: Whether it honours ``fairness: λ > 0`` (the runner's ``behind`` ranks).

    An instance lives inside an FTS runner (:class:`~fbo_torch.simulate.fts.FTSRunner`,
    ``self.runner``) and reads what the runner holds: the runs' agents
    (``runner.agents``), their peers (``runner.dist``, ``runner.peer_index``,
    ``runner.peer_runs``), the other agents (``runner.others``) and the shared map
    (``runner.features``). Its hooks are called for all ``R`` runs at once.

    Args:
        runner: The runner this method's agents belong to.
    """

    name: ClassVar[str] = ""
    kinds: ClassVar[tuple[str, ...]] = ("fts",)
    message: ClassVar[str] = "none"
    histories: ClassVar[tuple[str, ...]] = HISTORY_MODES
    own_acquisitions: ClassVar[tuple[str, ...]] = OWN_ACQUISITIONS
    uses: ClassVar[tuple[str, ...]] = ()
    aliases: ClassVar[tuple[str, ...]] = ()
    follows_peers: ClassVar[bool] = False
    fair_help: ClassVar[bool] = False

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    # ------------------------------------------------------------ what it is
    @classmethod
    def federated(cls) -> bool:
        """Whether the agents hear from peers (any message but ``"none"``)."""
        return cls.message != "none"

    @classmethod
    def check(cls, settings: Any) -> None:
        r"""Refuse settings this algorithm cannot run with (``ValueError`` naming the keys).

        The base checks ``own_acquisition`` against :attr:`~fbo_torch.methods.base.Method.own_acquisitions`,
        ``free_riders`` (only where peers send one draw) and ``reciprocity`` (only where agents follow a
        named peer, :attr:`~fbo_torch.methods.base.Method.follows_peers`); subclasses add their own rules and call it.
        """
        own = getattr(settings, "own_acquisition", None)
        if own is not None and own not in cls.own_acquisitions:
            raise ValueError(
                f"`own_acquisition` {own!r} does not work with algorithm {cls.name!r}; "
                f"expected one of {list(cls.own_acquisitions)}."
            )
        if getattr(settings, "free_riders", None) is not None and cls.message != "draw":
            raise ValueError(
                f"`free_riders` replaces the draw a peer sends; algorithm {cls.name!r}'s peers send "
                f"{'nothing' if cls.message == 'none' else 'their whole posterior'}."
            )
        if getattr(settings, "reciprocity", False) is True and not cls.follows_peers:
            raise ValueError(
                f"`reciprocity` decides whether an agent may follow a peer's message; algorithm {cls.name!r}'s "
                "agents follow none (it works with `algorithm: fts` and `transfer`)."
            )
        if (
            getattr(settings, "reciprocity_replays", False) is True
            and getattr(settings, "reciprocity", False) is not True
        ):
            raise ValueError(
                "`reciprocity_replays` bars agents that replay their messages from following; set `reciprocity: true`."
            )
        if getattr(settings, "fairness", 0.0) > 0 and not cls.fair_help:
            raise ValueError(f"`fairness` > 0 works with `algorithm: fts`; algorithm {cls.name!r} ignores it.")

    @classmethod
    def check_history(cls, settings: Any, mode: str) -> None:
        r"""Refuse a ``history.mode`` this algorithm cannot run with (``ValueError`` naming the keys).

        The base refuses modes outside :attr:`histories`; agents that optimize ``together``
        and exchange messages must do so every round; ``reciprocity`` needs them ``together``.
        """
        if mode not in cls.histories:
            raise ValueError(
                f"algorithm {cls.name!r} does not run with `history.mode: {mode}`; it supports {list(cls.histories)}."
            )
        if mode == "together" and cls.federated() and getattr(settings, "communication", None) == "one-shot":
            raise ValueError(
                "agents that optimize together (`history.mode: together`) send a fresh message every "
                "round; set `communication: every-round`."
            )
        if getattr(settings, "reciprocity", False) is True and mode != "together":
            raise ValueError(
                "`reciprocity` ties what an agent receives to what it sends, so every agent must both send and "
                f"follow: it needs `history.mode: together`, got {mode!r}."
            )
        if getattr(settings, "fairness", 0.0) > 0 and mode != "together":
            raise ValueError(
                "`fairness` ranks the incumbents of a federation's agents, so they must optimize together: "
                f"it needs `history.mode: together`, got {mode!r}."
            )

    @classmethod
    def parameters_per_agent(cls, settings: Any, dim: int) -> int:
        r"""Numbers each peer sends per message on ``dim`` inputs (``M`` for a draw, ``M + M²`` for a posterior)."""
        M = int(getattr(settings, "num_features", 0))
        return {"none": 0, "draw": M, "posterior": M + M * M}[cls.message]

    @classmethod
    def is_private(cls, settings: Any) -> bool:
        """Whether a run with ``settings`` releases differentially private messages (and accounts ε)."""
        return False

    # ------------------------------------------------------------------ round
    def receive(self, round: int) -> None:
        """Take the peers' messages of round ``round`` (before iteration ``round + 1``)."""

    def step(self, t: int) -> tuple[Tensor, Tensor]:
        r"""Iteration ``t`` for every run: ``(X_next, sources)``, ``R x d`` queries and ``R``
        sources (``-1``: the run's own proposal, else the index of the peer it followed)."""
        raise NotImplementedError(f"algorithm {self.name!r} has no simulator step")

    def observed(self, t: int, y: Tensor, ok: Tensor, sources: Tensor) -> None:
        r"""After iteration ``t``'s evaluations: ``y`` (``R`` observations, NaN where failed),
        ``ok`` (``R`` booleans) and the ``sources`` :meth:`step` returned."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this method's state (tensors on the host)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state."""


_MethodT = TypeVar("_MethodT", bound=type[Method])

#: Algorithm name -> its :class:`Method` class.
METHODS: dict[str, type[Method]] = {}


def register_method(cls: _MethodT) -> _MethodT:
    r"""Register a :class:`Method` subclass under its ``name`` (a class decorator).

    Raises:
        ValueError: The class has no name, a kind outside :data:`KINDS`, a message outside
            :data:`MESSAGES`, or its name is taken by another class.
    """
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise ValueError(f"`register_method` takes a Method subclass, got {cls!r}.")
    if not cls.name or not isinstance(cls.name, str):
        raise ValueError(f"{cls.__name__}.name must be a non-empty string (the algorithm's name).")
    if not cls.kinds or any(k not in KINDS for k in cls.kinds):
        raise ValueError(f"{cls.__name__}.kinds must be a non-empty subset of {KINDS}, got {cls.kinds!r}.")
    if cls.message not in MESSAGES:
        raise ValueError(f"{cls.__name__}.message must be one of {MESSAGES}, got {cls.message!r}.")
    add_to_registry(METHODS, cls.name, cls, "algorithm")
    return cls


def unregister_method(name: str) -> None:
    """Remove the algorithm ``name`` from the registry (e.g. one a test registered)."""
    METHODS.pop(name, None)


#: The built-in algorithms' modules (each registers its class when imported).
BUILTINS = (
    "fbo_torch.methods.ts",
    "fbo_torch.methods.fts",
    "fbo_torch.methods.peer_prior",
    "fbo_torch.methods.transfer",
    "fbo_torch.methods.rgpe",
    "fbo_torch.methods.taf",
    "fbo_torch.methods.fts_de",
)


def _load_builtins() -> None:
    """Import the :data:`BUILTINS` modules (once), which register themselves.

    They are named by module path and imported on the first lookup, as a plugin's entry point
    is: the registry depends on no algorithm. The algorithms are built from the runners'
    blocks (agents, features, fidelity), which read the settings, and the settings look
    their algorithm up here, so a registry that imported its algorithms would tie every
    layer of the package into one."""
    for module in BUILTINS:
        importlib.import_module(module)


def method_names(kind: str | None = None) -> list[str]:
    """The registered algorithms' names (those that run in experiment kind ``kind``)."""
    _load_builtins()
    return [n for n, c in METHODS.items() if kind is None or kind in c.kinds]


def get_method(name: Any, kind: str | None = None, key: str = "algorithm") -> type[Method]:
    r"""The :class:`Method` class registered as ``name``.

    Args:
        name: An algorithm's name.
        kind: Optional experiment kind the algorithm must run in.
        key: The setting's name in error messages.

    Returns:
        The registered :class:`Method` subclass.

    Raises:
        ValueError: ``name`` is not registered (for ``kind``), naming ``key`` and the choices.
    """
    names = method_names(kind)  # loads the built-ins
    cls = METHODS.get(name) if isinstance(name, str) else None
    if cls is None and isinstance(name, str):
        cls = next((c for c in METHODS.values() if name in c.aliases), None)
    if cls is None or (kind is not None and kind not in cls.kinds):
        where = f" in an `experiment: {kind}`" if kind is not None else ""
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"`{key}` must be one of {names}{where}, got {name!r}{hint}.")
    return cls


__all__ = [
    "BUILTINS",
    "HISTORY_MODES",
    "KINDS",
    "MESSAGES",
    "METHODS",
    "OWN_ACQUISITIONS",
    "Method",
    "get_method",
    "method_names",
    "register_method",
    "unregister_method",
]
