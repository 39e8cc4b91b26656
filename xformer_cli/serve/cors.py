"""CORS, off unless ``--cors ORIGIN`` (repeatable, or ``*``): which web pages of other
origins may call the API from a browser.

A request from an allowed origin gets ``Access-Control-Allow-Origin`` (and the headers a
page may read: ``Server-Timing``, ``X-Batch-Texts``, ``Retry-After``); a preflight
(``OPTIONS`` with ``Access-Control-Request-Method``) from one is answered 204 with the
methods and headers allowed, and from any other origin 403 in JSON. No credentials
(cookies) are allowed: the API key travels in a header or the body. A pure ASGI middleware,
so it sees every answer of the app, errors included.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # starlette loads only when serving
    from starlette.types import ASGIApp, Receive, Scope, Send

_ORIGIN = re.compile(r"^https?://[^/\s]+$")
ALLOW_METHODS = "GET, POST, OPTIONS"
ALLOW_HEADERS = "Content-Type, X-API-Key, Authorization"
EXPOSE_HEADERS = "Server-Timing, X-Batch-Texts, Retry-After"


def check_origin(origin: str) -> str:
    """``*`` or ``scheme://host[:port]`` (no path, no trailing slash); ValueError otherwise."""
    if origin != "*" and not _ORIGIN.match(origin):
        raise ValueError(f"--cors {origin!r}: give an origin such as https://example.org or "
                         "http://localhost:8080, or *")
    return origin


def _header(scope: dict[str, Any], name: bytes) -> "str | None":
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class CorsMiddleware:
    def __init__(self, app: ASGIApp, origins: Sequence[str]):
        self.app = app
        self.any = "*" in origins
        self.origins = frozenset(check_origin(origin) for origin in origins)

    def _allow(self, origin: str) -> list[tuple[bytes, bytes]]:
        if self.any:
            return [(b"access-control-allow-origin", b"*")]
        return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origin = _header(scope, b"origin") if scope["type"] == "http" else None
        if origin is None:
            return await self.app(scope, receive, send)
        allowed = self.any or origin in self.origins
        if scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method") is not None:
            return await self._preflight(origin, allowed, send)
        if not allowed:
            return await self.app(scope, receive, send)

        async def send_with_cors(message) -> None:
            if message["type"] == "http.response.start":
                headers = (list(message.get("headers", ())) + self._allow(origin)
                           + [(b"access-control-expose-headers", EXPOSE_HEADERS.encode())])
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    async def _preflight(self, origin: str, allowed: bool, send) -> None:
        if allowed:
            status, body = 204, b""
            headers = self._allow(origin) + [(b"access-control-allow-methods", ALLOW_METHODS.encode()),
                                             (b"access-control-allow-headers", ALLOW_HEADERS.encode()),
                                             (b"access-control-max-age", b"600")]
        else:
            status, headers = 403, [(b"content-type", b"application/json")]
            body = json.dumps({"error": f"CORS: origin {origin} is not allowed (see xformer serve --cors)"}).encode()
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
