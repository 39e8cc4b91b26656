"""How many cores this process may use: torch-free, so the engine factory (which chooses
before torch is imported) and the CTranslate2 engine (which the factory imports) share it."""

from __future__ import annotations

import os


THREADS_PER_CORE = 8  # past it threads only wait for each other; thousands crash or hang OpenMP


def available_cores() -> int:
    """The cores this process may run on (its affinity: a container's or taskset's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def thread_limit() -> int:
    """The most threads a setting may ask for: THREADS_PER_CORE for each core this process may use."""
    return THREADS_PER_CORE * available_cores()


def too_many_threads(threads: int, what: str) -> str:
    """"" when ``threads`` is within thread_limit(), else the one line that refuses ``what``."""
    if threads <= thread_limit():
        return ""
    return (f"{what} is {threads}: at most {thread_limit()} ({THREADS_PER_CORE} a core; this process may use "
            f"{available_cores()})")
