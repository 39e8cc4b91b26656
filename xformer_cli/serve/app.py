"""The HTTP API (a FastAPI app) over an engine and a micro-batcher.

    POST /translate   LibreTranslate's: {"q", "source", "target", "format", "api_key"} -> {"translatedText"}
    GET  /languages   LibreTranslate's: [{"code", "name", "targets"}, ...]
    GET  /health      {"status": "ok", "model": ..., ...}; 503 while shutting down
    GET  /            the web page

Every error is ``{"error": "..."}`` with a 4xx or 5xx status, never a traceback. The
batcher's worker thread starts with the app and, on shutdown (after uvicorn has let
in-flight requests finish), drains the queue and stops.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the handlers' annotations
# (``request: Request``, imported inside create_app so fastapi loads only when serving).
import asyncio
import contextlib
import hmac
from typing import Any, Callable, Optional

from xformer_cli.serve.batcher import Batcher, QueueFull, Stopped
from xformer_cli.serve.protocol import ApiError, Limits, languages, parse_body, parse_translate, translate_response


def create_app(
    engine: Any,
    *,
    limits: Optional[Limits] = None,
    api_key: Optional[str] = None,
    batcher: Optional[dict[str, Any]] = None,
    log: Callable[[str], None] = lambda message: None,
):
    """``engine``: a ``serve.engine.ServedModel`` (or anything with its fields and ``translate``);
    ``batcher``: keyword arguments of ``Batcher`` (max_wait, max_sentences, ...)."""
    from fastapi import FastAPI

    limits = limits or Limits()
    queue = Batcher(lambda texts, options: engine.translate(texts, **options), **(batcher or {}))
    if limits.max_texts > queue.max_queued:
        raise ValueError(f"max_texts ({limits.max_texts}) must not exceed the queue size ({queue.max_queued})")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        queue.start()
        try:
            yield
        finally:
            await asyncio.to_thread(queue.stop)

    app = FastAPI(title="xformer", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.batcher = queue
    app.state.engine = engine
    add_error_handlers(app)
    add_translate_route(app, engine, queue, limits, api_key, log)
    add_info_routes(app, engine, queue, served_info(engine, limits, api_key))
    return app


def error(status: int, message: str, headers: Optional[dict[str, str]] = None):
    """Every error's shape: ``{"error": message}``."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status, headers=headers)


def add_error_handlers(app) -> None:
    """Our own errors, FastAPI's (404, 405, ...) and invalid requests, all as ``{"error": ...}``."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return error(exc.status, exc.message, exc.headers)

    @app.exception_handler(HTTPException)  # 404, 405 and the like, in the same shape
    async def _http_error(request, exc: HTTPException):
        return error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        return error(400, "Invalid request")


def add_translate_route(app, engine: Any, queue: Batcher, limits: Limits, api_key: Optional[str],
                        log: Callable[[str], None]) -> None:
    """POST /translate: parse and check the request, queue its texts, answer when they are done."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    @app.post("/translate")
    async def translate(request: Request):
        fields = parse_body(await read_body(request, limits.max_body), request.headers.get("content-type", ""))
        check_api_key(api_key, fields.get("api_key"), request.headers)
        req = parse_translate(fields, engine.source, engine.target, limits)
        try:
            future = queue.submit(req.texts, **{**req.options(), "beam_size": req.beam_size or engine.beam_size})
        except QueueFull:
            raise ApiError(503, "the server is busy (its queue is full); retry shortly", {"Retry-After": "1"}) from None
        except Stopped:
            raise ApiError(503, "the server is shutting down", {"Retry-After": "5"}) from None
        try:
            result = await asyncio.wrap_future(future)
        except Exception as exc:  # noqa: BLE001 - the engine failed on this request: say so, live on
            log(f"error: translation failed: {type(exc).__name__}: {str(exc)[:200]}")
            return error(500, f"translation failed ({type(exc).__name__})")
        timing = f"queue;dur={result.wait_s * 1000:.1f}, decode;dur={result.decode_s * 1000:.1f}"
        return JSONResponse(translate_response(req, result.texts, engine.source),
                            headers={"Server-Timing": timing, "X-Batch-Texts": str(result.batch_texts)})


def served_info(engine: Any, limits: Limits, api_key: Optional[str]) -> dict[str, Any]:
    """What /health and the page show about the model and the limits."""
    return {
        "model": engine.name, "engine": engine.engine, "precision": engine.precision,
        "source": engine.source, "target": engine.target, "beam_size": engine.beam_size,
        "api_key_required": bool(api_key), "max_chars": limits.max_chars, "max_texts": limits.max_texts,
    }


def add_info_routes(app, engine: Any, queue: Batcher, info: dict[str, Any]) -> None:
    """GET /languages, GET /health (503 while stopping) and the page at /."""
    from fastapi.responses import HTMLResponse, JSONResponse

    from xformer_cli.serve.page import render_page

    @app.get("/languages")
    async def get_languages():
        return JSONResponse(languages(engine.source, engine.target))

    @app.get("/health")
    async def health():
        status = "stopping" if queue.stopping else "ok"
        body = {"status": status, **info, "queued": queue.queued, "batches": queue.batches,
                "texts": queue.texts_done, "requests": queue.jobs_done, "rejected": queue.rejected,
                "truncated_lines": engine.truncated_lines}
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    page = render_page(info)

    @app.get("/")
    async def index():
        return HTMLResponse(page)


async def read_body(request, limit: int) -> bytes:
    """The request body, refused with 413 past ``limit`` bytes before more is read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"Invalid request: the body has {declared} bytes; at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"Invalid request: the body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def check_api_key(expected: Optional[str], in_body: Any, headers) -> None:
    """403 unless ``expected`` is unset or given: in the body (LibreTranslate's ``api_key``),
    an ``X-API-Key`` header, or ``Authorization: Bearer KEY``."""
    if not expected:
        return
    given = in_body if isinstance(in_body, str) and in_body else headers.get("x-api-key", "")
    if not given:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else ""
    if not given:
        raise ApiError(403, "Invalid API key: this server needs one (api_key in the body, or an X-API-Key header)")
    if not hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8")):
        raise ApiError(403, "Invalid API key")

