from fbo_torch.federation.messages import AgentMessage, PosteriorMessage, stack_omegas

__all__ = ["AgentMessage", "PosteriorMessage", "stack_omegas"]
