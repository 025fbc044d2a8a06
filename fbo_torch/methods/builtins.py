"""Imports every built-in algorithm's module, so each registers itself (:func:`~fbo_torch.methods.base.get_method`)."""

from fbo_torch.methods import fts, fts_de, peer_prior, rgpe, taf, transfer, ts

__all__ = ["fts", "fts_de", "peer_prior", "rgpe", "taf", "transfer", "ts"]
