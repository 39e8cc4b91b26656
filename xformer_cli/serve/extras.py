"""LibreTranslate's other endpoints, beside POST /translate:

    POST /detect              {"q": "..."} -> [{"confidence": 96.9, "language": "de"}, ...]
    GET  /frontend/settings   what LibreTranslate's web frontend reads (limits, files, languages)
    POST /translate_file      multipart file (.txt, .html), source, target, api_key
                              -> {"translatedFileUrl": ".../download_file/NAME"}
    GET  /download_file/NAME  the translated file, once (then it is removed)

A file's text goes through the same call as POST /translate (``translate_fields``): a .txt
file line by line, ``max_texts`` lines per call, an .html file in pieces of about ``max_chars``
cut between blocks, so a long file waits its turn between other clients' requests instead of
holding the engine.
"""

# No ``from __future__ import annotations``: FastAPI reads the handlers' annotations.
import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional

from xformer_cli.serve.batcher import Translation
from xformer_cli.serve.detect import OtherLanguage, candidates
from xformer_cli.serve.files import (FILE_FORMATS, MEDIA_TYPES, FileStore, content_disposition, decode_text,
                                     download_name, file_kind, split_lines)
from xformer_cli.serve.protocol import ApiError, Limits, TranslateRequest, language_name
from xformer_cli.serve.reading import Upload, check_api_key, read_fields, read_form
from xformer_cli.text.html import parse_html, split_html

if TYPE_CHECKING:  # fastapi loads only when serving: the names below are quoted
    from fastapi import FastAPI
    from starlette.requests import Request

# (request, fields, limits) -> (the parsed request, its Translation): POST /translate's call
TranslateFields = Callable[["Request", dict[str, Any], Limits], Awaitable[tuple[TranslateRequest, Translation]]]
FRONTEND_TIMEOUT_MS = 300  # the page's pause after the last keystroke before it asks


def add_detect_route(app: "FastAPI", limits: Limits, api_key: Optional[str]) -> None:
    from fastapi import Request
    from fastapi.responses import JSONResponse

    @app.post("/detect")
    async def detect(request: Request):
        fields = await read_fields(request, limits.max_body)
        check_api_key(api_key, fields.get("api_key"), request.headers)
        q = fields.get("q")
        texts = q if isinstance(q, list) else [q]
        if q is None or not all(isinstance(text, str) for text in texts):
            raise ApiError(400, "Invalid request: missing q parameter (a string)")
        text = "\n".join(texts)
        if not text.strip():
            raise ApiError(400, "Invalid request: q is empty")
        if len(text) > limits.max_chars:
            raise ApiError(400, f"Invalid request: a text of {len(text)} characters; at most {limits.max_chars}")
        return JSONResponse(await asyncio.to_thread(candidates, text))


def frontend_settings(engine: Any, limits: Limits, api_key: Optional[str]) -> dict[str, Any]:
    """LibreTranslate's ``GET /frontend/settings``."""
    return {
        "charLimit": limits.max_chars,
        "frontendTimeout": FRONTEND_TIMEOUT_MS,
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": list(FILE_FORMATS),
        "apiKeys": bool(api_key),
        "keyRequired": bool(api_key),
        "language": {
            "source": {"code": engine.source, "name": language_name(engine.source)},
            "target": {"code": engine.target, "name": language_name(engine.target)},
        },
    }


def add_settings_route(app: "FastAPI", engine: Any, limits: Limits, api_key: Optional[str]) -> None:
    from fastapi.responses import JSONResponse

    settings = frontend_settings(engine, limits, api_key)

    @app.get("/frontend/settings")
    async def get_settings():
        return JSONResponse(settings)


def output_text(out: Any) -> str:
    """The translation of one text: the engine gives a string, or a ``text.TextResult``."""
    return getattr(out, "text", out)


async def translate_text_file(request: "Request", text: str, fields: dict[str, Any], limits: Limits,
                              translate_fields: TranslateFields) -> str:
    """A .txt file's translation: line by line (blank lines kept), line endings as they were."""
    lines, endings = split_lines(text)
    for number, line in enumerate(lines, 1):
        if len(line) > limits.max_chars:
            raise ApiError(400, f"Invalid request: line {number} of the file has {len(line)} characters; "
                                f"at most {limits.max_chars}")
    todo = [at for at, line in enumerate(lines) if line.strip()]
    if not todo:
        raise ApiError(400, "Invalid request: the file has no text")
    out = list(lines)
    for start in range(0, len(todo), limits.max_texts):
        chunk = todo[start:start + limits.max_texts]
        try:
            _, result = await translate_fields(request, {**fields, "q": [lines[at] for at in chunk]}, limits)
        except OtherLanguage as exc:  # q[i] of a chunk means nothing to the file's owner: its line does
            raise exc.naming(f"line {chunk[exc.at] + 1} of the file") from None
        for at, translated in zip(chunk, result.texts):
            out[at] = output_text(translated)
    return "".join(line + ending for line, ending in zip(out, endings))


def _html_pieces(text: str, max_chars: int) -> list[tuple[str, bool]]:
    """(piece, whether it holds text to translate): ``split_html``'s pieces of the page."""
    return [(piece, bool(parse_html(piece).segments)) for piece in split_html(text, max_chars)]


async def translate_html_file(request: "Request", text: str, fields: dict[str, Any], limits: Limits,
                              translate_fields: TranslateFields) -> str:
    """An .html file's translation: piece by piece, each one text of a /translate call (the
    pieces' markup kept byte for byte, as the whole page's is); parsed off the event loop."""
    document_limits = replace(limits, max_chars=len(text), max_texts=1)  # a piece is the whole page at most
    out = []
    for piece, has_text in await asyncio.to_thread(_html_pieces, text, limits.max_chars):
        if has_text:
            _, result = await translate_fields(request, {**fields, "q": piece}, document_limits)
            piece = output_text(result.texts[0])
        out.append(piece)
    return "".join(out)


def add_file_routes(app: "FastAPI", limits: Limits, api_key: Optional[str], store: FileStore, max_file_bytes: int,
                    translate_fields: TranslateFields) -> None:
    from fastapi import Request
    from fastapi.responses import JSONResponse, Response

    @app.post("/translate_file")
    async def translate_file(request: Request):
        form = await read_form(request, max_file_bytes + (64 << 10))  # room for the other fields
        check_api_key(api_key, form.get("api_key"), request.headers)
        upload = form.get("file")
        if not isinstance(upload, Upload):
            raise ApiError(400, "Invalid request: missing file (a multipart file field named file)")
        suffix = file_kind(upload.filename)
        if len(upload.data) > max_file_bytes:
            raise ApiError(413, f"Invalid request: the file has {len(upload.data)} bytes; at most {max_file_bytes}")
        text, bom = decode_text(upload.data, upload.filename)
        fields = {key: form.get(key) for key in ("source", "target")}
        fields["format"] = FILE_FORMATS[suffix]
        read = translate_text_file if fields["format"] == "text" else translate_html_file
        translated = await read(request, text, fields, limits, translate_fields)
        data = ("\ufeff" if bom else "").encode("utf-8") + translated.encode("utf-8")
        name = store.put(data, download_name(upload.filename, str(fields["target"]), suffix), suffix)
        return JSONResponse({"translatedFileUrl": str(request.url_for("download_file", name=name))})

    @app.get("/download_file/{name}", name="download_file")
    async def download_file(name: str):
        data, filename = store.take(name)
        media_type = MEDIA_TYPES.get(f".{filename.rsplit('.', 1)[-1]}", "application/octet-stream")
        return Response(data, media_type=media_type,
                        headers={"Content-Disposition": content_disposition(filename)})
