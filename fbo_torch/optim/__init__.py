from fbo_torch.optim.batched import maximize_batched, maximize_discrete, score_chunked
from fbo_torch.optim.domain import Domain

__all__ = ["Domain", "maximize_batched", "maximize_discrete", "score_chunked"]
