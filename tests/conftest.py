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
