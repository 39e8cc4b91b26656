"""A background thread that loads the next items while the caller works on this one."""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator, Sequence, TypeVar

T = TypeVar("T")
U = TypeVar("U")
_DONE = object()


def prefetch(items: Sequence[T], load: Callable[[T], U], depth: int = 2) -> Iterator[tuple[T, U]]:
    """(item, load(item)) in order, with the next ``depth`` loads done by a background thread
    so the accelerator never waits on batch assembly. Errors in the thread surface here."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(value) -> bool:
        while not stop.is_set():
            try:
                ready.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False  # the consumer has gone

    def work() -> None:
        try:
            for item in items:
                if not put((item, load(item))):
                    return
        except BaseException as exc:  # hand it to the consumer
            put(exc)
            return
        put(_DONE)

    thread = threading.Thread(target=work, daemon=True, name="xformer-prefetch")
    thread.start()
    try:
        while True:
            got = ready.get()
            if got is _DONE:
                return
            if isinstance(got, BaseException):
                raise got
            yield got
    finally:
        stop.set()
        thread.join()
