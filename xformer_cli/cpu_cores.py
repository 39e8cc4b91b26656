"""How many cores this process may use: torch-free, so the engine factory (which chooses
before torch is imported) and the CTranslate2 engine (which the factory imports) share it."""

from __future__ import annotations

import os


def available_cores() -> int:
    """The cores this process may run on (its affinity: a container's or taskset's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
