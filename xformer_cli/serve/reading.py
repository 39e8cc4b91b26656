"""Reading a request: its body within a byte limit, its fields (JSON, a form, or the query
string), a multipart upload, and the API key check.

LibreTranslate reads its fields from the body or the URL's query string alike (Flask's
``request.values``), and clients rely on it: ``deep-translator`` posts its fields as query
parameters with an empty body. So do we: body fields win over query fields of the same name.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional
from urllib.parse import unquote_to_bytes

from xformer_cli.serve.protocol import ApiError, parse_body

if TYPE_CHECKING:  # starlette loads only when serving
    from starlette.requests import Request


async def read_body(request: Request, limit: int) -> bytes:
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


def query_fields(request: Request) -> dict[str, Any]:
    """The query string's fields; ``q`` given more than once is a list, as in a form. A
    percent-encoded byte that is not UTF-8 (q=%FF) is refused, as in a form body (starlette
    would read it as U+FFFD)."""
    try:
        unquote_to_bytes(request.scope.get("query_string", b"").replace(b"+", b" ")).decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "Invalid request: the query string is not UTF-8") from None
    return _collect(request.query_params.multi_items())


def _collect(items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """(name, value) pairs as fields: the last value of a name wins, but ``q`` given more than
    once is the list of its texts."""
    fields: dict[str, Any] = {}
    for key, value in items:
        if key == "q" and key in fields:
            fields[key] = (fields[key] if isinstance(fields[key], list) else [fields[key]]) + [value]
        else:
            fields[key] = value
    return fields


async def read_fields(request: Request, limit: int, max_fields: int = 20) -> dict[str, Any]:
    """The request's fields: the body's (JSON, a form, or a multipart form as a browser's
    FormData sends it), over the query string's."""
    body = await read_body(request, limit)
    query = query_fields(request)
    if query and not body.strip():
        return query
    content_type = request.headers.get("content-type", "")
    if _media_type(content_type) != "multipart/form-data" or body.lstrip()[:1] in (b"{", b"["):
        return {**query, **parse_body(body, content_type)}  # JSON whatever its content type
    return {**query, **_collect(await _multipart(request, body, max_files=0, max_fields=max_fields))}


def _media_type(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


async def _multipart(request: Request, body: bytes, max_files: int, max_fields: int = 20) -> list[tuple[str, Any]]:
    """The fields of a multipart (or URL-encoded) ``body``: (name, a string or an ``Upload``)."""
    from starlette.requests import Request

    sent = False

    async def replay():  # the body once more, for starlette's form parser
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(max_files=max_files, max_fields=max_fields)
    except AssertionError:  # python-multipart is missing
        raise ApiError(500, "forms and uploads need python-multipart: pip install 'xformer[serve]'") from None
    except Exception as exc:  # noqa: BLE001 - a malformed multipart body is the client's error
        detail = str(getattr(exc, 'detail', exc))[:80]
        raise ApiError(400, f"Invalid request: the form could not be read ({detail})") from None
    try:
        fields = [(key, value if isinstance(value, str) else Upload(value.filename or "", await value.read()))
                  for key, value in form.multi_items()]
    finally:
        await form.close()
    multipart = _media_type(request.headers.get("content-type", "")) == "multipart/form-data"
    for key, value in fields if multipart else ():
        # starlette reads a text field that is not UTF-8 as latin-1: its text, written as UTF-8, is not the body's
        if isinstance(value, str) and value.encode("utf-8", "surrogatepass") not in body:
            raise ApiError(400, f"Invalid request: the form field {key!r} is not UTF-8")
    return fields


@dataclass
class Upload:
    """A file field of a form."""

    filename: str
    data: bytes


async def read_form(request: Request, limit: int) -> dict[str, Any]:
    """A multipart (or URL-encoded) form of at most ``limit`` bytes, over the query string's
    fields: field name -> a string or an ``Upload``; 400 when the body is not such a form."""
    body = await read_body(request, limit)
    forms = ("multipart/form-data", "application/x-www-form-urlencoded")
    if _media_type(request.headers.get("content-type", "")) not in forms:
        raise ApiError(400, "Invalid request: send the file as multipart/form-data (fields file, source, target)")
    fields: dict[str, Any] = query_fields(request)
    fields.update(await _multipart(request, body, max_files=1))
    return fields


def check_api_key(expected: Optional[str], in_body: Any, headers: Mapping[str, str]) -> None:
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
