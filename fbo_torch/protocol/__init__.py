r"""What agents and the server exchange, and the rules both sides follow to do it.

The layer below the models: :mod:`fbo_torch.models`, :mod:`fbo_torch.acquisition`,
:mod:`fbo_torch.federation` (the simulator's agents and server), :mod:`fbo_torch.flower`
and :mod:`fbo_torch.integrations` import it, and it imports none of them (``tests/test_imports.py``).

* :mod:`~fbo_torch.protocol.messages` — what an agent sends (:class:`AgentMessage`,
  :class:`PosteriorMessage`), with its communication cost;
* :mod:`~fbo_torch.protocol.input_space` — the input space a message's weights were
  fitted on (:class:`MessageSpace`);
* :mod:`~fbo_torch.protocol.schedules` — whose message an agent follows: ``p_t``
  (:class:`PtSchedule`) and ``P_N`` (:class:`AgentDistribution`, :func:`draw_sources`);
* :mod:`~fbo_torch.protocol.fidelity` — ``P_N`` learned from how well each peer's
  message predicts an agent's own observations;
* :mod:`~fbo_torch.protocol.reciprocity` — the free-rider test (which peers' messages improve
  their followers less often than the others') and reciprocity built on it, or on how helpful the
  receivers score each peer's messages;
* :mod:`~fbo_torch.protocol.fairness` — fair help (``fairness: λ``): agents behind follow more, and
  towards the leaders;
* :mod:`~fbo_torch.protocol.message_average` — a receiver's running average of a peer's messages;
* :mod:`~fbo_torch.protocol.partition` and :mod:`~fbo_torch.protocol.weights` — DP-FTS-DE's
  sub-regions (:class:`SubRegionPartition`) and exploration weights (:class:`ExplorationWeights`);
* :mod:`~fbo_torch.protocol.keys` — the keys of a federation's public random streams;
* :mod:`~fbo_torch.protocol.randomness` — where the server's Poisson coins and noise come from
  (keyed for research, secret for a deployment).
"""

from fbo_torch.protocol.input_space import MessageSpace, input_bounds_of, resolve_message_space
from fbo_torch.protocol.messages import AgentMessage, PosteriorMessage, stack_omegas
from fbo_torch.protocol.partition import SubRegionPartition, default_splits
from fbo_torch.protocol.schedules import OWN, AgentDistribution, PtSchedule, draw_sources
from fbo_torch.protocol.weights import ExplorationWeights, exploration_weights

__all__ = [
    "OWN",
    "AgentDistribution",
    "AgentMessage",
    "ExplorationWeights",
    "MessageSpace",
    "PosteriorMessage",
    "PtSchedule",
    "SubRegionPartition",
    "default_splits",
    "draw_sources",
    "exploration_weights",
    "input_bounds_of",
    "resolve_message_space",
    "stack_omegas",
]
