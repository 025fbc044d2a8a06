from fbo_torch.optim.batched import maximize_batched, maximize_discrete, score_chunked

__all__ = ["maximize_batched", "maximize_discrete", "score_chunked"]
