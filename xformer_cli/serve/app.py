"""The HTTP API (a FastAPI app) over an engine and a micro-batcher.

    POST /translate   LibreTranslate's: {"q", "source", "target", "format", "api_key"} -> {"translatedText"}
    GET  /languages   LibreTranslate's: [{"code", "name", "targets"}, ...], every direction the model has
    GET  /health      {"status": "ok", "model": ..., ...}; 503 while shutting down
    GET  /            the web page
    and LibreTranslate's POST /detect, GET /frontend/settings, POST /translate_file and
    GET /download_file/NAME (``serve/extras.py``)

Every error is ``{"error": "..."}`` with a 4xx or 5xx status, never a traceback, whatever
the request (deeply nested JSON included) and whatever went wrong. A client that closes
its connection before its answer has its queued texts dropped (``serve/queueing.py``).
CORS headers only with ``cors`` origins (``serve/cors.py``). The batcher's worker thread
starts with the app and, on shutdown (after uvicorn has let in-flight requests finish),
drains the queue and stops.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the handlers' annotations
# (``request: Request``, imported inside create_app so fastapi loads only when serving).
import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from xformer_cli.languages import Languages
from xformer_cli.serve.batcher import Batcher, Translation
from xformer_cli.serve.detect import auto_sources
from xformer_cli.serve.files import FileStore
from xformer_cli.serve.protocol import (ApiError, Limits, TranslateRequest, languages, parse_translate,
                                        translate_response)
from xformer_cli.serve.queueing import ClientGone, run_translation
from xformer_cli.serve.reading import check_api_key, read_fields

if TYPE_CHECKING:  # fastapi loads only when serving: the names below are quoted
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from starlette.types import ASGIApp, Receive, Scope, Send

    from xformer_cli.serve.extras import TranslateFields


def create_app(
    engine: Any,
    *,
    limits: Optional[Limits] = None,
    api_key: Optional[str] = None,
    batcher: Optional[dict[str, Any]] = None,
    log: Callable[[str], None] = lambda message: None,
    cors: Sequence[str] = (),
    max_file_bytes: int = 1 << 20,
    files: Optional[FileStore] = None,
) -> "FastAPI":
    """``engine``: a ``serve.engine.ServedModel`` (or anything with its fields and ``translate``);
    ``batcher``: keyword arguments of ``Batcher`` (max_wait, max_sentences, ...); ``cors``:
    the origins allowed to call from a browser (``*``: any; none: no CORS headers);
    ``max_file_bytes``: the largest POST /translate_file upload; ``files``: where translated
    files wait for their download."""
    from fastapi import FastAPI

    from xformer_cli.serve.cors import CorsMiddleware, check_origin
    from xformer_cli.serve.extras import add_detect_route, add_file_routes, add_settings_route

    limits = limits or Limits()
    queue = Batcher(lambda texts, options, wanted: engine.translate(texts, **options, wanted=wanted), **(batcher or {}))
    if limits.max_texts > queue.max_queued:
        raise ValueError(f"max_texts ({limits.max_texts}) must not exceed the queue size ({queue.max_queued})")

    store = files or FileStore(max_bytes=max(256 << 20, 16 * max_file_bytes))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        queue.start()
        try:
            yield
        finally:
            await asyncio.to_thread(queue.stop)
            store.close()

    app = FastAPI(title="xformer", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.batcher = queue
    app.state.engine = engine
    app.state.files = store
    app.add_middleware(Unexpected, log=log)  # added first: inside the CORS middleware
    if cors:  # checked now: starlette builds its middleware at the first request
        app.add_middleware(CorsMiddleware, origins=[check_origin(origin) for origin in cors])
    add_error_handlers(app)
    translate_fields = translation_call(engine, queue, log)
    add_translate_route(app, engine, limits, api_key, translate_fields)
    add_info_routes(app, engine, queue, served_info(engine, limits, api_key))
    add_detect_route(app, limits, api_key)
    add_settings_route(app, engine, limits, api_key)
    add_file_routes(app, limits, api_key, store, max_file_bytes, translate_fields)
    return app


def error(status: int, message: str, headers: Optional[dict[str, str]] = None) -> "JSONResponse":
    """Every error's shape: ``{"error": message}``."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status, headers=headers)


class Unexpected:
    """Anything no handler turned into an answer (a bug): one log line and a JSON 500. A pure
    ASGI middleware inside the CORS one, so a browser can read this answer too (starlette's
    own last-resort handler sits outside every middleware)."""

    def __init__(self, app: "ASGIApp", log: Callable[[str], None]):
        self.app, self.log = app, log

    async def __call__(self, scope: "Scope", receive: "Receive", send: "Send") -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watched(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except asyncio.CancelledError:  # the graceful shutdown's time ran out on this request (a stalled client)
            if started:
                raise
            self.log(f"{scope.get('method')} {scope.get('path')}: unfinished when the server stopped; answered 503")
            await error(503, "the server is shutting down; try again")(scope, receive, send)
        except Exception as exc:  # noqa: BLE001 - the server answers and lives on
            self.log(f"error: {scope.get('method')} {scope.get('path')} failed: {type(exc).__name__}: {str(exc)[:200]}")
            if started:  # half an answer is out: nothing JSON can follow it
                raise
            await error(500, f"internal error ({type(exc).__name__})")(scope, receive, send)


def add_error_handlers(app: "FastAPI") -> None:
    """Our own errors, FastAPI's (404, 405, ...), invalid requests and clients gone, all as
    ``{"error": ...}`` (anything else: ``Unexpected``)."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return error(exc.status, exc.message, exc.headers)

    @app.exception_handler(HTTPException)  # 404, 405 and the like, in the same shape
    async def _http_error(request, exc: HTTPException):
        return error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        return error(400, "Invalid request")

    @app.exception_handler(ClientGone)
    @app.exception_handler(ClientDisconnect)
    async def _gone(request, exc: Exception):  # nobody reads it: the status is for the access log
        return error(499, "the client closed the connection")


def served_languages(engine: Any) -> Languages:
    """The directions ``engine`` serves: its ``languages``, else its one pair source -> target."""
    return getattr(engine, "languages", None) or Languages.of([(engine.source, engine.target)])


def decode_options(req: TranslateRequest, engine: Any) -> dict[str, Any]:
    """The engine options a request asks for; requests share an engine call only when equal.
    A model of several directions is told the target (its tag) and the source (sentence rules)."""
    options = {**req.options(), "beam_size": req.beam_size or engine.beam_size}
    if len(served_languages(engine).pairs) > 1:
        source = req.detected[0]["language"] if req.detected else req.source
        options.update(target=req.target, source=source)
    return options


def translation_call(engine: Any, queue: Batcher, log: Callable[[str], None]) -> "TranslateFields":
    """``translate_fields(request, fields, limits) -> (TranslateRequest, Translation)``: check
    a /translate request's fields and translate its texts; POST /translate_file calls it too."""
    model = served_languages(engine)

    async def translate_fields(request, fields: dict[str, Any], limits: Limits) -> tuple[TranslateRequest, Translation]:
        req = parse_translate(fields, model, limits)
        if req.source == "auto":  # among the model's sources for the target, unless the text is plainly another
            req.detected = await asyncio.to_thread(auto_sources, req.texts, model.sources_into(req.target), req.batch,
                                                   fields.get("format") == "html")
        result = await run_translation(request, queue, req.texts, decode_options(req, engine), log)
        return req, result

    return translate_fields


def add_translate_route(app: "FastAPI", engine: Any, limits: Limits, api_key: Optional[str],
                        translate_fields: "TranslateFields") -> None:
    """POST /translate: parse and check the request, queue its texts, answer when they are done."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    @app.post("/translate")
    async def translate(request: Request):
        fields = await read_fields(request, limits.max_body, max_fields=limits.max_texts + 20)  # q once a text
        check_api_key(api_key, fields.get("api_key"), request.headers)
        req, result = await translate_fields(request, fields, limits)
        timing = f"queue;dur={result.wait_s * 1000:.1f}, decode;dur={result.decode_s * 1000:.1f}"
        return JSONResponse(translate_response(req, result.texts, req.detected),
                            headers={"Server-Timing": timing, "X-Batch-Texts": str(result.batch_texts)})


def served_info(engine: Any, limits: Limits, api_key: Optional[str]) -> dict[str, Any]:
    """What /health and the page show about the model and the limits."""
    return {
        "model": engine.name, "engine": engine.engine, "precision": engine.precision,
        "source": engine.source, "target": engine.target, "beam_size": engine.beam_size,
        "pairs": [list(pair) for pair in served_languages(engine).pairs],
        "api_key_required": bool(api_key), "max_chars": limits.max_chars, "max_texts": limits.max_texts,
    }


def add_info_routes(app: "FastAPI", engine: Any, queue: Batcher, info: dict[str, Any]) -> None:
    """GET /languages, GET /health (503 while stopping) and the page at /."""
    from fastapi.responses import HTMLResponse, JSONResponse

    from xformer_cli.serve.page import render_page

    @app.api_route("/languages", methods=["GET", "HEAD"])  # HEAD: what monitors and health checks send
    async def get_languages():
        return JSONResponse(languages(served_languages(engine)))

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        status = "stopping" if queue.stopping else "ok"
        body = {"status": status, **info, "queued": queue.queued, "batches": queue.batches,
                "texts": queue.texts_done, "requests": queue.jobs_done, "rejected": queue.rejected,
                "dropped": queue.dropped, "abandoned": queue.abandoned,
                "truncated_lines": engine.truncated_lines}
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    page = render_page(info)

    @app.api_route("/", methods=["GET", "HEAD"])
    async def index():
        return HTMLResponse(page)
