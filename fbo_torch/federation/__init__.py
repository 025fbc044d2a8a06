from fbo_torch.federation.aggregator import AggregationRecord, DPAggregator, clip_vectors
from fbo_torch.federation.input_space import MessageSpace, input_bounds_of, resolve_message_space
from fbo_torch.federation.messages import AgentMessage, PosteriorMessage, stack_omegas
from fbo_torch.federation.partition import SubRegionPartition, default_splits
from fbo_torch.federation.schedules import OWN, AgentDistribution, PtSchedule, draw_sources
from fbo_torch.federation.weights import ExplorationWeights, exploration_weights

__all__ = [
    "OWN",
    "AgentDistribution",
    "AgentMessage",
    "AggregationRecord",
    "DPAggregator",
    "ExplorationWeights",
    "MessageSpace",
    "PosteriorMessage",
    "PtSchedule",
    "SubRegionPartition",
    "clip_vectors",
    "default_splits",
    "draw_sources",
    "exploration_weights",
    "input_bounds_of",
    "resolve_message_space",
    "stack_omegas",
]
