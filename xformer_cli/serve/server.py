"""Run the app under uvicorn until SIGTERM or Ctrl-C, then drain and exit cleanly.

On SIGTERM (or SIGINT) uvicorn stops accepting connections, lets in-flight requests
finish (at most ``graceful_timeout`` seconds), then runs the app's shutdown, which
drains the batcher's queue and stops its worker. The process then exits 0.
"""

from __future__ import annotations

import json
import signal
import socket
from typing import Any, Callable, Optional, Sequence

from xformer_cli.errors import XformerError
from xformer_cli.serve.cors import check_origin
from xformer_cli.serve.protocol import Limits

MAX_WAIT_MS = 10_000  # --max-wait-ms at most: past a few seconds a client gives up before its batch leaves
MISSING = "xformer serve needs FastAPI and uvicorn: pip install 'xformer[serve]'"


def require_server_packages() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise XformerError(MISSING) from None


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free one); one-line errors."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, IndexError) as exc:
        raise XformerError(f"cannot listen on {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise XformerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def uvicorn_config(app: Any, *, access_log: bool = False, graceful_timeout: Optional[float] = 30.0,
                   log_level: str = "info") -> Any:
    """uvicorn's config for ``app``, whose HTTP protocol answers a request it cannot parse with
    a JSON 400 as the app answers every other bad request (uvicorn's own is text/plain)."""
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="on",
                            timeout_graceful_shutdown=graceful_timeout, server_header=False)
    config.load()  # picks the protocol (httptools or h11); Server.run keeps a loaded config
    config.http_protocol_class = json_bad_requests(config.http_protocol_class)
    return config


def json_bad_requests(protocol: type) -> type:
    """``protocol`` (one of uvicorn's HTTP implementations) with its 400 for unparseable
    bytes sent as JSON; the connection is closed after it, as uvicorn closes it."""

    class JsonBadRequests(protocol):  # type: ignore[misc, valid-type]
        def send_400_response(self, msg: str) -> None:
            body = json.dumps({"error": f"malformed HTTP request: {msg}"}).encode("utf-8")
            defaults = b"".join(name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers)
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\n" + defaults + b"content-type: application/json\r\n"
                                 b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
            self.transport.close()

    return _bounded_head(JsonBadRequests) if _parses_with_httptools(protocol) else JsonBadRequests


HEAD_LIMIT = 16 << 10  # a request's line and headers at most: h11 bounds them so (its default); httptools not


def _parses_with_httptools(protocol: type) -> bool:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is not installed: uvicorn takes h11
        return False
    return issubclass(protocol, HttpToolsProtocol)


def _bounded_head(protocol: type) -> type:
    """``protocol`` (uvicorn's httptools one) with a request head past HEAD_LIMIT answered 400 and
    the connection closed: httptools joins a header's pieces without a bound, in quadratic time, so
    one client streaming an endless header slowed every other request 20-50 times and grew memory."""

    class BoundedHead(protocol):  # type: ignore[misc, valid-type]
        in_head, head_bytes = True, 0

        def on_message_begin(self) -> None:
            self.in_head, self.head_bytes = True, 0
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self.in_head = False
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)  # at most one read (64 KiB) past the limit is parsed
            if self.in_head and not self.transport.is_closing():
                self.head_bytes += len(data)
                if self.head_bytes > HEAD_LIMIT:
                    self.send_400_response(f"the request line and headers are over {HEAD_LIMIT} bytes")

    return BoundedHead


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run(app: Any, host: str = "127.0.0.1", port: int = 5000, *, access_log: bool = False,
        graceful_timeout: Optional[float] = 30.0, log: Callable[[str], None] = print, banner: str = "") -> None:
    import uvicorn

    sock = listen(host, port)
    server = uvicorn.Server(uvicorn_config(app, access_log=access_log, graceful_timeout=graceful_timeout))
    log(f"{banner}serving on {url_of(sock)} (SIGTERM or Ctrl-C: finish the requests in flight, then exit)")
    # uvicorn re-raises the signal that stopped it once it has shut down; a server that
    # drained cleanly should exit 0, so that re-raised signal lands here and is dropped.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    if not server.started:
        raise XformerError("the server did not start (see the log above)")


def check_settings(port: int, graceful_timeout: Optional[float], limits: Optional[Limits],
                   batcher: Optional[dict[str, Any]], max_file_bytes: int, cors: Sequence[str]) -> list[str]:
    """The server's settings checked before anything loads, each refusal naming its option; the
    CORS origins normalised."""
    batcher = batcher or {}
    counts = [*(getattr(limits, key) for key in ("max_chars", "max_texts") if limits is not None),
              *(batcher[key] for key in ("max_sentences", "max_tokens", "max_queued") if key in batcher)]
    if min(counts, default=1) < 1 or batcher.get("max_wait", 0) < 0:
        raise XformerError("--max-batch, --max-batch-tokens, --max-queue, --max-chars and --max-texts must be at "
                           "least 1; --max-wait-ms at least 0")
    wait_ms = batcher.get("max_wait", 0) * 1000
    if not wait_ms <= MAX_WAIT_MS:  # nan and inf too: a batch that waits for ever answers nobody
        raise XformerError(f"--max-wait-ms must be at most {MAX_WAIT_MS} (a batch waits that long for company), "
                           f"not {wait_ms:g}")
    if limits is not None and limits.max_texts > batcher.get("max_queued", limits.max_texts):
        raise XformerError(f"--max-texts ({limits.max_texts}) cannot exceed --max-queue ({batcher['max_queued']})")
    if max_file_bytes < 1:
        raise XformerError("--max-file-bytes must be at least 1")
    if not 0 <= port <= 65535:  # the socket layer would take it modulo 65536: another port than asked for
        raise XformerError(f"--port must be 0 to 65535, not {port}")
    if graceful_timeout is not None and not 0 <= graceful_timeout < float("inf"):
        raise XformerError(f"--graceful-timeout must be 0 or more seconds, not {graceful_timeout:g}")
    try:
        return [check_origin(origin) for origin in cors]
    except ValueError as exc:
        raise XformerError(str(exc)) from None


def serve(model: str, *, engine: str = "auto", device: str = "auto", precision: str = "auto",
          source: Optional[str] = None, target: Optional[str] = None, name: Optional[str] = None,
          host: str = "127.0.0.1", port: int = 5000, api_key: Optional[str] = None, threads: int = 0,
          limits: Optional[Limits] = None, batcher: Optional[dict[str, Any]] = None, access_log: bool = False,
          graceful_timeout: Optional[float] = 30.0, log: Callable[[str], None] = print,
          glossary: Any = None, cors: Sequence[str] = (), max_file_bytes: int = 1 << 20) -> None:
    """``xformer serve``: check the settings, load the model, build the app, serve until told
    to stop. ``limits``: a request's (``protocol.Limits``); ``batcher``: ``Batcher``'s keyword
    arguments (max_wait in seconds, max_sentences, max_tokens, max_queued)."""
    cors = check_settings(port, graceful_timeout, limits, batcher, max_file_bytes, cors)
    require_server_packages()
    from xformer_cli.serve.app import create_app
    from xformer_cli.serve.engine import load_served_model

    loaded = load_served_model(model, engine, device=device, precision=precision, source=source, target=target,
                         name=name, threads=threads, serving=True, log=log, glossary=glossary)
    app = create_app(loaded, limits=limits, api_key=api_key, batcher=batcher, log=log, cors=cors,
                     max_file_bytes=max_file_bytes)
    directions = loaded.languages.describe() if loaded.languages else f"{loaded.source}->{loaded.target}"
    banner = (f"{loaded.name} ({loaded.engine}, {loaded.precision}, {directions}, "
              f"{loaded.threads} thread{'s' if loaded.threads > 1 else ''}): ")
    run(app, host, port, access_log=access_log, graceful_timeout=graceful_timeout, log=log, banner=banner)
