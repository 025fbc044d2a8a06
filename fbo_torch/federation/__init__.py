from fbo_torch.federation.messages import AgentMessage, PosteriorMessage, stack_omegas
from fbo_torch.federation.partition import SubRegionPartition, default_splits
from fbo_torch.federation.schedules import OWN, AgentDistribution, PtSchedule, draw_sources

__all__ = [
    "OWN",
    "AgentDistribution",
    "AgentMessage",
    "PosteriorMessage",
    "PtSchedule",
    "SubRegionPartition",
    "default_splits",
    "draw_sources",
    "stack_omegas",
]
