"""How many CPU cores this process may use (torch-free; the world's threads, sweep workers)."""

from __future__ import annotations

import os


def available_cores() -> int:
    """The cores in this process's affinity mask (all of the machine's where that is unknown)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
