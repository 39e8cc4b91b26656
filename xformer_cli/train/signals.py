"""SIGINT/SIGTERM during training: finish the step, save, exit."""

from __future__ import annotations

import signal
import threading
from typing import Optional


class StopSignals:
    """SIGINT/SIGTERM ask the loop to finish its step, save and exit (a second one kills).
    Inside the ``with`` block ``received`` holds the first signal's number; the previous
    handlers come back on the way out."""

    def __init__(self):
        self.received: Optional[int] = None
        self._previous: dict = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():  # Python allows handlers only there
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
