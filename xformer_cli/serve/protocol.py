"""LibreTranslate's request and response shapes, checked: pure functions, no HTTP.

``POST /translate`` takes ``{"q": "text" | ["text", ...], "source": "en", "target": "de",
"format": "text", "api_key": "..."}`` (JSON, or an HTML form) and answers
``{"translatedText": "..." | [...]}``; errors are ``{"error": "..."}`` with a 4xx status.
``format: "html"`` translates the text of HTML and keeps its markup; ``alternatives: N``
answers N more translations from the n-best lists. Beyond LibreTranslate: ``beam_size`` (1 =
greedy; default: the model's), ``glossary`` ({"source term": "target term"}) and
``split_sentences`` (default true).
``source: "auto"`` means the model's one source language, or, for a multilingual model, the one
of its sources (for the target asked for) that the text is found in; the app refuses a text
plainly in another (``serve/detect.py``). A direction the model lacks is a 400 that names
the ones it has.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import parse_qs

from xformer_cli.languages import Languages

LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek", "en": "English",
    "es": "Spanish", "et": "Estonian", "fi": "Finnish", "fr": "French", "hi": "Hindi", "hu": "Hungarian",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian", "nl": "Dutch",
    "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sv": "Swedish", "tr": "Turkish",
    "uk": "Ukrainian", "zh": "Chinese",
}


class ApiError(Exception):
    """An answer other than 200: ``status`` and the message for ``{"error": ...}``."""

    def __init__(self, status: int, message: str, headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass
class Limits:
    max_chars: int = 5000  # characters per text
    max_texts: int = 64  # texts per request
    max_body: int = 0  # bytes per request body; 0: room for max_texts texts of max_chars \uXXXX escapes
    max_beam: int = 16

    def __post_init__(self):
        if not self.max_body:
            self.max_body = max(1 << 20, self.max_texts * self.max_chars * 6 + (64 << 10))


@dataclass
class TranslateRequest:
    texts: list[str]
    batch: bool  # q was a list: answer with a list
    source: str
    target: str
    beam_size: Optional[int]
    alternatives: int
    format: str = "text"
    glossary: tuple = ()  # sorted (source, target) pairs
    split_sentences: bool = True
    detected: Optional[list[dict]] = None  # source "auto": each text's {"language", "confidence"}

    def options(self) -> dict[str, Any]:
        """What decodes differently (the batcher's key); defaults left out."""
        given: dict[str, Any] = {"beam_size": self.beam_size}
        if self.format != "text":
            given["format"] = self.format
        if self.glossary:
            given["glossary"] = self.glossary
        if self.alternatives:
            given["alternatives"] = self.alternatives
        if not self.split_sentences:
            given["split_sentences"] = False
        return given


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code.split("-")[0].lower(), code)


def languages(model: Languages) -> list[dict[str, Any]]:
    """``GET /languages``: every language of the model (sources first) with the targets it
    translates to, one entry per direction the model has."""
    codes = model.codes
    return [{"code": code, "name": language_name(code), "targets": [t for s, t in model.pairs if s == code]}
            for code in codes]


def parse_body(body: bytes, content_type: str) -> dict[str, Any]:
    """The fields of a URL-encoded form, or of a JSON body (any other content type, and a
    "form" that starts with "{" or "[": ``curl -d '{...}'`` labels JSON as a form)."""
    is_form = content_type.split(";")[0].strip().lower() == "application/x-www-form-urlencoded"
    if is_form and not body.lstrip()[:1] in (b"{", b"["):
        try:
            # errors="strict": a percent-encoded byte that is not UTF-8 (q=%FF) is refused too
            form = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False, errors="strict")
        except UnicodeDecodeError:
            raise ApiError(400, "Invalid request: the form is not UTF-8") from None
        return {key: values if key == "q" and len(values) > 1 else values[-1] for key, values in form.items()}
    if not body.strip():
        raise ApiError(400, "Invalid request: empty body; "
                            "send JSON like {\"q\": \"Hello\", \"source\": \"en\", \"target\": \"de\"}")
    try:
        fields = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"Invalid request: the body is not valid JSON ({str(exc)[:80]})") from None
    except RecursionError:  # {"q": [[[[...]]]]} nested past Python's stack
        raise ApiError(400, "Invalid request: the JSON is nested too deeply") from None
    if not isinstance(fields, dict):
        raise ApiError(400, "Invalid request: the body must be a JSON object")
    try:  # JSON's \ud800 escapes decode to lone surrogates, which no text can hold
        json.dumps(fields, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "Invalid request: the JSON holds a lone surrogate (\\ud800-\\udfff): "
                            "not valid Unicode") from None
    except RecursionError:
        raise ApiError(400, "Invalid request: the JSON is nested too deeply") from None
    return fields


def _int_field(fields: dict[str, Any], name: str, low: int, high: int) -> Optional[int]:
    value = fields.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()):
        value = int(value)  # form fields are strings (ASCII digits only: "²" and "٣" are not numbers here)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(400, f"Invalid request: {name} must be an integer from {low} to {high}")
    return value


def parse_translate(fields: dict[str, Any], model: Languages, limits: Limits) -> TranslateRequest:
    """Check a ``/translate`` request against the model's directions and ``limits``; the
    request's codes become the model's (fra -> fr)."""
    q = fields.get("q")
    if q is None:
        raise ApiError(400, "Invalid request: missing q parameter")
    batch = isinstance(q, list)
    texts = q if batch else [q]
    if not all(isinstance(text, str) for text in texts):
        raise ApiError(400, "Invalid request: q must be a string or a list of strings")
    if not texts or not any(text.strip() for text in texts):
        raise ApiError(400, "Invalid request: q is empty")
    if len(texts) > limits.max_texts:
        raise ApiError(400, f"Invalid request: {len(texts)} texts in one request; at most {limits.max_texts}")
    longest = max(len(text) for text in texts)
    if longest > limits.max_chars:
        raise ApiError(400, f"Invalid request: a text of {longest} characters; at most {limits.max_chars} per text")
    for name in ("source", "target"):
        if not fields.get(name):
            raise ApiError(400, f"Invalid request: missing {name} parameter")
        if not isinstance(fields[name], str):
            raise ApiError(400, f"Invalid request: {name} must be a language code")
    src, tgt = check_direction(fields["source"], fields["target"], model)
    fmt = fields.get("format") or "text"
    if fmt not in ("text", "html"):
        raise ApiError(400, f"Invalid request: format {str(fmt)[:20]!r} is not supported; only text or html")
    split = fields.get("split_sentences", True)
    if isinstance(split, str):  # a form's field: its words for true and false, anything else refused
        split = {"true": True, "1": True, "yes": True, "on": True,
                 "false": False, "0": False, "no": False, "off": False}.get(split.strip().lower(), split)
    if not isinstance(split, bool):
        raise ApiError(400, "Invalid request: split_sentences must be true or false")
    beam = _int_field(fields, "beam_size", 1, limits.max_beam)
    return TranslateRequest(
        texts=texts,
        batch=batch,
        source=src,
        target=tgt,
        beam_size=beam,
        alternatives=_int_field(fields, "alternatives", 0, limits.max_beam - 1) or 0,
        format=fmt,
        glossary=_glossary_field(fields.get("glossary")),
        split_sentences=split,
    )


def check_direction(source: str, target: str, model: Languages) -> tuple[str, str]:
    """(source or "auto", target) as the model names them; a direction the model was not
    trained on (zero-shot included) is a 400 naming the ones it has."""
    tgt = model.find(target, model.targets)
    src = "auto" if source == "auto" else model.find(source, model.sources)
    if tgt is None or src is None or (src != "auto" and not model.trained(src, tgt)):
        raise ApiError(400, f"{source}->{target} is not supported: this model translates {model.describe()}")
    return src, tgt


def _glossary_field(value: Any) -> tuple:
    """A request's glossary: a JSON object of non-empty strings (a form sends it as JSON text)."""
    if value is None or value == "" or value == {}:
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the interpreter's depth
            raise ApiError(400, "Invalid request: glossary must be a JSON object "
                                "{\"source term\": \"target term\"}") from None
    if not isinstance(value, dict) or len(value) > 1000 or not all(
            isinstance(k, str) and isinstance(v, str) and k.strip() and v.strip() and len(k) + len(v) <= 500
            for k, v in value.items()):
        raise ApiError(400, "Invalid request: glossary must be a JSON object of at most 1000 non-empty "
                            "source and target terms {\"source term\": \"target term\"}")
    return tuple(sorted((k.strip(), v.strip()) for k, v in value.items()))


def translate_response(request: TranslateRequest, outputs: list[Any],
                       detected: Optional[list[dict]] = None) -> dict[str, Any]:
    """``outputs``: one translation per text: a string, or a ``text.TextResult`` (with
    alternatives); ``detected``: for ``source: "auto"``, each text's {"language", "confidence"}."""
    texts = [getattr(out, "text", out) for out in outputs]
    body: dict[str, Any] = {"translatedText": texts if request.batch else texts[0]}
    if request.alternatives:
        alternatives = [list(getattr(out, "alternatives", []))[: request.alternatives] for out in outputs]
        body["alternatives"] = alternatives if request.batch else alternatives[0]
    if request.source == "auto" and detected is not None:
        body["detectedLanguage"] = detected if request.batch else detected[0]
    return body

