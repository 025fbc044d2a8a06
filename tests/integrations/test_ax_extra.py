"""Without the ``ax`` extra, every module of the Ax integration fails on import with one clear error."""

from __future__ import annotations

import importlib
import sys

import pytest

MODULES = ["ax", "ax_unit_cube", "ax_messages", "ax_node"]


@pytest.mark.parametrize("name", MODULES)
def test_missing_ax_names_the_extra(monkeypatch, name):
    for module in [m for m in sys.modules if m.startswith("ax.")]:  # Ax imported by an earlier test
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "ax", None)  # `import ax...` now raises ImportError, as without Ax
    for module in [m for m in sys.modules if m.startswith("fbo_torch.integrations.")]:
        monkeypatch.delitem(sys.modules, module)
    module = f"fbo_torch.integrations.{name}"
    with pytest.raises(ImportError, match=r"needs Ax .*pip install 'fbo_torch\[ax\]'") as info:
        importlib.import_module(module)
    assert str(info.value).startswith(f"{module} needs Ax")
    assert isinstance(info.value.__cause__, ImportError)
