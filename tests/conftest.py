import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")

HAS_CUDA = torch.cuda.is_available()

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one xdist worker per core: one torch thread each. Threads of two workers spinning
    # against each other (and against other jobs) slow small ops many times over; results do not depend
    # on the thread count (tests/utils/test_dispatch.py), and tests that need threads set them.
    torch.set_num_threads(1)
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_cuda)


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture
def figures(monkeypatch):
    """Every figure saved during the test (they are saved, then inspected)."""
    from matplotlib.figure import Figure

    saved = []
    real = Figure.savefig

    def spy(self, *args, **kwargs):
        saved.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return saved


@pytest.fixture(scope="module")
def small_dp_federation():
    """A small DP-FTS-DE setup that exercises every phase in seconds: seven agents in two regions,
    a refit every second round, chunks of 2-3 agents under a tiny `max_memory`. Returns
    ``(objective, settings, domain)``."""
    from fbo_torch.federation.settings import DPFTSDESettings
    from fbo_torch.objectives.synthetic import GPSampleContinuousFederation
    from fbo_torch.optim.domain import Domain

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
