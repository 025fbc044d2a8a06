r"""DP-FTS-DE (Dai, Low & Jaillet 2021): ``algorithm: fts_de`` in a DP-FTS-DE experiment.

The papers' family: FTS (``num_regions: 1``, ``noise_multiplier: 0``), FTS-DE
(``num_regions > 1``), DP-FTS (``noise_multiplier > 0``) and DP-FTS-DE. Every agent
sends one ``ω`` draw per round to a server that Poisson-subsamples, clips, averages
per sub-region and adds Gaussian noise (:mod:`~fbo_torch.federation.server`); the
round itself is :class:`~fbo_torch.simulate.dp_fts_de.DPFTSDERunner`'s (and a
deployment's, :mod:`fbo_torch.flower`), which read this class's attributes.
"""

from __future__ import annotations

from typing import Any

from fbo_torch.methods.base import Method, register_method


@register_method
class FTSDE(Method):
    """The DP-FTS-DE family: a server aggregates the agents' draws per sub-region (private when ``z > 0``)."""

    name = "fts_de"
    aliases = ("dp-fts-de",)  # a Flower run config's `method`
    kinds = ("dp_fts_de",)
    message = "draw"

    @classmethod
    def check(cls, settings: Any) -> None:
        if getattr(settings, "reciprocity", False) is True:
            if getattr(settings, "aggregation", None) == "secure":
                raise ValueError(
                    "`reciprocity: true` cannot run with `aggregation: secure`: the server would need who followed "
                    "whom and whether it improved, and secure aggregation shows it only the sum of the messages."
                )
            raise ValueError(
                "`reciprocity` is not available in `experiment: dp_fts_de`: its agents follow the server's "
                "broadcast, which names no peer (use it in `experiment: fts`, `history.mode: together`)."
            )
        super().check(settings)

    @classmethod
    def is_private(cls, settings: Any) -> bool:
        return float(getattr(settings, "noise_multiplier", 0.0)) > 0


__all__ = ["FTSDE"]
