"""Process set-up details of runtime.World."""

from __future__ import annotations

import platform

from fedmpi.runtime.world import keep_freed_memory


def test_keep_freed_memory_applies_on_glibc_and_can_be_turned_off(monkeypatch):
    assert keep_freed_memory() is (platform.libc_ver()[0] == "glibc")
    monkeypatch.setenv("FEDMPI_MALLOC", "default")
    assert keep_freed_memory() is False
