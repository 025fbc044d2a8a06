r"""The simulator's and a deployment's agents and server: what each computes in a round.

* :mod:`~fbo_torch.federation.agents` — every agent's step, batched (:class:`~fbo_torch.federation.agents.Agents`);
* :mod:`~fbo_torch.federation.server` — the DP-FTS-DE server's round (``plan``, ``release``);
* :mod:`~fbo_torch.federation.release` — the release mechanisms behind one interface
  (:class:`~fbo_torch.federation.release.ReleaseMechanism`), registered by the settings' ``aggregation``;
  their arithmetic in :mod:`~fbo_torch.federation.aggregator` (central Gaussian, :class:`DPAggregator`) and
  :mod:`~fbo_torch.federation.secure` (secure aggregation with distributed discrete Gaussian noise);
* :mod:`~fbo_torch.federation.settings` — the settings both are built from;
* :mod:`~fbo_torch.federation.faults` and :mod:`~fbo_torch.federation.evaluation_failures` — failures,
  dropouts and hostile agents; :mod:`~fbo_torch.federation.chunks` — rounds in memory-sized chunks.

What agents and server exchange (messages, schedules, partitions, weights, keys, randomness) is
:mod:`fbo_torch.protocol`; its public names are re-exported here.
"""

from fbo_torch.federation.aggregator import AggregationRecord, DPAggregator, clip_vectors
from fbo_torch.federation.release import RELEASES, ReleaseMechanism, get_release, register_release
from fbo_torch.protocol import *  # noqa: F403  (the protocol's public names, listed once, in its __all__)
from fbo_torch.protocol import __all__ as _protocol_names

__all__ = [
    "RELEASES",
    "AggregationRecord",
    "DPAggregator",
    "ReleaseMechanism",
    "clip_vectors",
    "get_release",
    "register_release",
    *_protocol_names,
]
