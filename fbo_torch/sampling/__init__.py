r"""Sample paths: functions drawn from a posterior, evaluated (and differentiated) as batched tensors.

* :mod:`fbo_torch.sampling.rff_paths` — :class:`RFFSamplePaths`, ``x ↦ φ(x)ᵀω_b`` on the
  shared random-feature map (messages, broadcasts, RFF posterior draws);
* :mod:`fbo_torch.sampling.gp_paths` — :class:`GPThompsonPaths`, Matheron paths of a batch
  of exact GPs (each agent's own Thompson sample);
* :mod:`fbo_torch.sampling.pathwise` — :class:`~fbo_torch.sampling.pathwise.RFFFeatureMap`, the
  shared map as BoTorch's pathwise ``FeatureMap``, with which fbo_torch's models and kernel
  register with BoTorch's pathwise sampling (``draw_matheron_paths``, ``PathwiseThompsonSampling``).
"""

from fbo_torch.sampling.gp_paths import GPThompsonPaths
from fbo_torch.sampling.rff_paths import RFFSamplePaths

__all__ = ["GPThompsonPaths", "RFFSamplePaths"]
