import pytest

from fbo_torch.federation.settings import DPFTSDESettings
from fbo_torch.objectives.synthetic import GPSampleContinuousFederation
from fbo_torch.optim.domain import Domain


@pytest.fixture(scope="module")
def small_dp_federation():
    """A small DP-FTS-DE setup that exercises every phase in seconds: seven agents in two regions,
    a refit every second round, chunks of 2-3 agents under a tiny `max_memory`. Returns
    ``(objective, settings, domain)``."""
    obj = GPSampleContinuousFederation(
        dim=2, agents_per_group=7, perturbation=0.05, num_basis=128, lengthscale=0.2, seed=3
    )
    s = DPFTSDESettings(
        num_iterations=3,
        num_init=4,
        num_regions=2,
        num_features=30,
        sample_rate=0.5,
        noise_multiplier=1.0,
        clip_norm=5.0,
        gp_refit_every=2,
        gp_sample_features=64,
        const_rounds=1,
        decay_rounds=2,
    )
    dom = Domain(obj.bounds, raw_samples=64, num_restarts=3, maxiter=8, raw_samples_rff=64, num_restarts_rff=2)
    return obj, s, dom
