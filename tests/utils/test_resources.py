"""The memory a process may use, as the system reports it, and refusals that name the setting."""

import pytest

from fbo_torch.utils import resources
from fbo_torch.utils.resources import MemoryLimitError, available_memory, check_memory


def test_available_memory_follows_the_system_then_the_override(monkeypatch):
    monkeypatch.delenv("FBO_MEMORY_LIMIT", raising=False)
    have = available_memory()
    assert have is None or have > 0
    for text, value in (("1G", 1 << 30), ("512m", 512 << 20), ("2.5GiB", int(2.5 * (1 << 30))), ("4096", 4096)):
        monkeypatch.setenv("FBO_MEMORY_LIMIT", text)
        assert available_memory() == value
    monkeypatch.setenv("FBO_MEMORY_LIMIT", "lots")
    with pytest.raises(MemoryLimitError, match=r"\$FBO_MEMORY_LIMIT must be a number of bytes"):
        available_memory()


def test_without_proc_the_page_count_answers_and_without_anything_nothing_is_refused(monkeypatch):
    monkeypatch.delenv("FBO_MEMORY_LIMIT", raising=False)
    monkeypatch.setattr(resources, "_meminfo", lambda: None)
    monkeypatch.setattr(resources, "_cgroup", lambda: None)
    monkeypatch.setattr(resources, "_sysconf", lambda: 3 << 30)
    assert available_memory() == 3 << 30
    monkeypatch.setattr(resources, "_sysconf", lambda: None)
    monkeypatch.setattr(resources, "_psutil", lambda: None)
    assert available_memory() is None
    check_memory("`x`", 1e30, "anything")  # the system does not say: not refused


def test_a_cgroup_limit_lowers_what_the_machine_reports(monkeypatch):
    monkeypatch.delenv("FBO_MEMORY_LIMIT", raising=False)
    monkeypatch.setattr(resources, "_meminfo", lambda: 8 << 30)
    monkeypatch.setattr(resources, "_cgroup", lambda: 1 << 30)
    assert available_memory() == 1 << 30
    with pytest.raises(
        MemoryLimitError,
        match=r"^`num_iterations`: 7 things needs about 2.0 GiB, more than the "
        r"1.0 GiB this machine has free",
    ):
        check_memory("`num_iterations`", 2 << 30, "7 things")
