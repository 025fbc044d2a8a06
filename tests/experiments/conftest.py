import pytest
from matplotlib.figure import Figure


@pytest.fixture
def figures(monkeypatch):
    """Every figure saved during the test (they are saved, then inspected)."""
    saved = []
    real = Figure.savefig

    def spy(self, *args, **kwargs):
        saved.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return saved
