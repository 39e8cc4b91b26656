"""One translation call of a request through the batcher, dropped if its client goes away.

``run_translation`` queues a request's texts and waits for them while listening for the
client's disconnect: a client that closes its connection before its answer has its texts
taken out of the queue, or, when they are being decoded, dropped by the engine at its next
step (``Batcher.withdraw``), so nobody can make the server work for nobody. POST /translate
and POST /translate_file both call it.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any, Callable

from xformer_cli.serve.batcher import Batcher, QueueFull, Stopped, Translation
from xformer_cli.serve.protocol import ApiError


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


async def _disconnected(receive: Callable) -> None:
    """Returns once the ASGI server reports the client's disconnect. The body has been read
    already, so the next message is that disconnect (or the end of the response)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_answered(request: Any, queue: Batcher, future: "Future[Translation]") -> Translation:
    """The future's result; if the client leaves first, withdraw its job and raise ClientGone."""
    answer = asyncio.wrap_future(future)
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the handler itself was cancelled: nobody waits for these texts
        queue.withdraw(future)
        raise
    finally:
        gone.cancel()
    if answer.done():
        return answer.result()
    queue.withdraw(future)  # still queued: it leaves the queue; running: the engine drops its texts
    answer.cancel()
    raise ClientGone()


async def run_translation(request: Any, queue: Batcher, texts: list[str], options: dict[str, Any],
                          log: Callable[[str], None]) -> Translation:
    """Queue ``texts`` with the engine ``options`` and wait for them; 503 when the queue is
    full or stopping, 500 when the engine fails; ClientGone when the client left."""
    try:
        future = queue.submit(texts, **options)
    except QueueFull:
        raise ApiError(503, "the server is busy (its queue is full); retry shortly", {"Retry-After": "1"}) from None
    except Stopped:
        raise ApiError(503, "the server is shutting down", {"Retry-After": "5"}) from None
    try:
        return await until_answered(request, queue, future)
    except ClientGone:
        raise
    except Exception as exc:  # noqa: BLE001 - the engine failed on this request: say so, live on
        log(f"error: translation failed: {type(exc).__name__}: {str(exc)[:200]}")
        raise ApiError(500, f"translation failed ({type(exc).__name__})") from None
