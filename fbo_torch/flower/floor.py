r"""The privacy floor a node owns: the least protection it accepts from a run config, and its worst-case ε.

The run config is written by whoever submits the run, and every node reads it;
the device's owner never sees it before it runs. A node's *floor* is its
owner's answer: node config keys (``--node-config``, or a ``[privacy]`` table
of a node config file, which Flower flattens into ``privacy.KEY``), checked by
the ClientApp against every run config before the agent does anything
(:meth:`PrivacyFloor.check`); a run config below the floor is refused with one
line naming the run config key and the node config key, and the server stops
contacting the node (:data:`~fbo_torch.flower.agent_node.REFUSALS`).

The keys are the fields of :class:`PrivacyFloor`, ``privacy.`` and kebab-case
(``privacy.min-noise-multiplier``, ``privacy.aggregation``, ``privacy.min-threshold``,
``privacy.max-dropout-tolerance``, ``privacy.max-epsilon``, ``privacy.delta``), each
declared and documented there once.

**ε against a malicious server** (:func:`worst_case_epsilons`). With signed
keys and the consistency round (:mod:`fbo_torch.flower.identity`,
:mod:`fbo_torch.flower.secagg`) a server that deviates from SecAgg+ still
learns, per round, the sum of a set of vectors of its choice that holds at
least ``t`` of them, ``t`` the Shamir threshold the node accepted (to remove a
node's self-mask it needs ``t`` shares of its seed, which only that node's
neighbours in the survivor set reveal, and the pairwise masks between
survivors cancel only in the sum over them); it drew the coins, so nothing is
amplified. A node answers each round at most once (:mod:`fbo_torch.flower.client_app`)
and at most ``T`` rounds, so ``T`` releases of ``t`` noise shares bound what
such a server learns: the ``"ddg"`` accountant with ``z_t = √(tσ²)/Δ₂`` and
``q = 1``. Against the other agents and outsiders the worst case is a sum of
``k_min`` vectors, of which a curious agent knows its own: ``k_min − 1``
shares, amplified by ``q``. Each agent that colludes with the server removes
its own share from either figure. Nothing here imports ``flwr``.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from fbo_torch.federation.release import get_release
from fbo_torch.federation.release import secure_epsilons as worst_case_epsilons
from fbo_torch.flower.config import FlowerRunConfig, read_value
from fbo_torch.privacy.accountants import check_delta, check_noise_multiplier
from fbo_torch.utils.schema import Choice, Integer, Number, Optional, Rule, check_fields, document, setting

#: The prefix of the floor's node config keys (the ``privacy.`` table).
PREFIX = "privacy."


class PrivacyFloorError(ValueError):
    """A run config below the node's privacy floor (or a floor that cannot be read); the message says which key."""


def _key(name: str) -> str:
    """The node config key of a floor field (``min_noise_multiplier`` -> ``privacy.min-noise-multiplier``)."""
    return PREFIX + name.replace("_", "-")


@document
@dataclass(frozen=True)
class PrivacyFloor:
    r"""A node's floor (see the module docstring for the keys): each field is a ``privacy.`` node config key."""

    min_noise_multiplier: float = setting(
        0.0,
        "Smallest ``noise-multiplier`` ``z`` accepted (0: any).",
        Rule(lambda key, value: check_noise_multiplier(value, key), -1.0),
    )
    aggregation: str = setting(
        "",
        '``secure``: refuse ``aggregation = "central"`` (the server would see this agent\'s ω); ``central``; '
        "empty: either.",
        Choice(("", "secure", "central")),
    )
    min_threshold: int = setting(
        0,
        "Smallest SecAgg+ threshold accepted (shares that reconstruct a secret, so the fewest vectors any sum "
        "the server learns holds; 0: the protocol's own minimum).",
        Integer(minimum=0),
    )
    max_dropout_tolerance: float | None = setting(
        None, "Largest ``dropout-tolerance`` accepted (None: any).", Optional(Number(strict=False))
    )
    max_epsilon: float | None = setting(
        None,
        "Largest ε this node accepts for the whole run: with secure aggregation the worst case against a "
        "deviating server, centrally the release's (None: no budget of the node's own).",
        Optional(Number()),
    )
    delta: float | None = setting(
        None,
        "δ of ``max_epsilon`` (None: the run's).",
        Optional(Rule(lambda key, value: check_delta(value, key), 1.5)),
    )

    def __post_init__(self) -> None:
        try:
            check_fields(self, spell=_key)
        except (TypeError, ValueError) as err:
            raise PrivacyFloorError(f"node config: {err}") from None

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any]) -> PrivacyFloor:
        """The floor a node config sets (``privacy.KEY`` keys; unknown ``privacy.`` keys are an error)."""
        given = {str(k)[len(PREFIX) :]: v for k, v in node_config.items() if str(k).startswith(PREFIX)}
        unknown = sorted(set(given) - set(KEYS))
        if unknown:
            raise PrivacyFloorError(
                f"unknown node config key(s) {[PREFIX + k for k in unknown]}; the privacy floor takes "
                f"{[PREFIX + k for k in KEYS]}."
            )
        hints = typing.get_type_hints(cls)
        values = {}
        for key, value in given.items():
            name = key.replace("-", "_")
            try:  # as a run config's values are read, but a 0 is a 0 here (a floor of 0 is no budget to drop)
                values[name] = read_value(PREFIX + key, name, value, hints[name], "node config", zero_is_none=False)
            except ValueError as err:
                raise PrivacyFloorError(str(err)) from None
        if isinstance(values.get("aggregation"), str):
            values["aggregation"] = values["aggregation"].strip()
        return cls(**values)

    def required_threshold(self, config: FlowerRunConfig) -> int:
        """The fewest shares this node lets reconstruct a secret in ``config``'s secure rounds."""
        return max(2, self.min_threshold, config.secure_threshold())

    def epsilon(self, config: FlowerRunConfig) -> float:
        r"""The largest ε a run of ``config`` can cost this node, at this floor's δ: the release mechanism's
        worst case over ``T`` releases (:meth:`~fbo_torch.federation.release.ReleaseMechanism.worst_case_epsilon`):
        a secure sum's against a server that deviates from SecAgg+ (with :meth:`required_threshold`) or the
        other agents, a central release's by the run's accountant (the server is trusted with ω there)."""
        s = config.settings
        delta = self.delta if self.delta is not None else config.ledger_delta
        T = int(s.num_iterations)
        if not s.method.federated() or T == 0:  # the algorithm's say: its agents send nothing of their data
            return 0.0
        if not s.is_private:
            return math.inf
        release = get_release(s.aggregation).accounting(s, config.num_agents)
        return release.worst_case_epsilon(T, delta, config.privacy.accountant, self.required_threshold(config))

    def check(self, config: FlowerRunConfig, agent_id: int) -> None:
        r"""Refuse ``config`` if it is below this floor.

        Raises:
            PrivacyFloorError: One line naming the run config key and the node config key.
        """
        s = config.settings
        if not s.method.federated():  # the algorithm's say (TS): the agent sends nothing of its data
            return
        who = f"agent {int(agent_id)} refuses the run"
        if s.noise_multiplier < self.min_noise_multiplier:
            raise PrivacyFloorError(
                f"{who}: run config `noise-multiplier` = {s.noise_multiplier:g} is below this node's "
                f"`{PREFIX}min-noise-multiplier` = {self.min_noise_multiplier:g}."
            )
        if self.aggregation and s.aggregation != self.aggregation:
            raise PrivacyFloorError(
                f'{who}: run config `aggregation` = "{s.aggregation}", this node requires `{PREFIX}aggregation` = '
                f'"{self.aggregation}".'
            )
        secure_sum = not get_release(s.aggregation).sees_messages
        if secure_sum:
            if self.max_dropout_tolerance is not None and s.dropout_tolerance > self.max_dropout_tolerance:
                raise PrivacyFloorError(
                    f"{who}: run config `dropout-tolerance` = {s.dropout_tolerance:g} is above this node's "
                    f"`{PREFIX}max-dropout-tolerance` = {self.max_dropout_tolerance:g}."
                )
            t = config.secure_threshold()
            if t < self.min_threshold:
                raise PrivacyFloorError(
                    f"{who}: its secure rounds' threshold is {t} (run config `secagg-threshold`, "
                    f"`dropout-tolerance`), below this node's `{PREFIX}min-threshold` = {self.min_threshold}."
                )
        if self.max_epsilon is not None:
            eps = self.epsilon(config)
            if eps > self.max_epsilon:
                where = "against a server that deviates from SecAgg+" if secure_sum else "released"
                raise PrivacyFloorError(
                    f"{who}: {int(s.num_iterations)} rounds (run config `num-rounds`, `noise-multiplier`, "
                    f"`sample-rate`) can cost it epsilon = {eps:.4g} ({where}), above this node's "
                    f"`{PREFIX}max-epsilon` = {self.max_epsilon:g}."
                )


#: The floor's node config keys (after :data:`PREFIX`): its fields, kebab-case.
KEYS = tuple(f.name.replace("_", "-") for f in fields(PrivacyFloor))

__all__ = ["KEYS", "PREFIX", "PrivacyFloor", "PrivacyFloorError", "worst_case_epsilons"]
