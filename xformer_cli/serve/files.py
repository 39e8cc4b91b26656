"""``POST /translate_file``'s parts that need no HTTP: which files are taken, their text,
and the bounded store that keeps translated files until ``GET /download_file/<name>``.

A stored file is removed when it is downloaded, or ``ttl`` seconds after it was stored,
whichever comes first; at most ``max_files`` files and ``max_bytes`` bytes wait at once
(past that, 503 until some are fetched or expire). The store's folder is a temporary one,
removed when the server stops.
"""

from __future__ import annotations

import codecs
import re
import secrets
import shutil
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import quote

from xformer_cli.serve.protocol import ApiError

# The format each kind of file is translated as: a .txt file line by line, an .html one whole.
FILE_FORMATS = {".txt": "text", ".html": "html"}
MEDIA_TYPES = {".txt": "text/plain; charset=utf-8", ".html": "text/html; charset=utf-8"}
_UNSAFE = re.compile(r"[^\w.-]+")  # letters and digits of any script stay: "Bericht über.txt"
_LINE_END = re.compile(r"\r\n|\r|\n")
_NOT_ASCII_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def file_kind(filename: str) -> str:
    """The file's suffix (``.txt`` or ``.html``); 400 for any other."""
    suffix = Path(filename).suffix.lower()
    if suffix not in FILE_FORMATS:
        kinds = ", ".join(FILE_FORMATS)
        raise ApiError(400, f"Invalid request: {filename or 'the file'!r} is not a supported file; send {kinds}")
    return suffix


def decode_text(data: bytes, filename: str) -> tuple[str, bool]:
    """(text, whether it began with a UTF-8 byte order mark); 400 for binary data (NUL bytes)
    or text that is not UTF-8."""
    if b"\x00" in data:
        raise ApiError(400, f"Invalid request: {filename!r} is a binary file (it holds NUL bytes); send UTF-8 text")
    bom = data.startswith(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8-sig"), bom
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"Invalid request: {filename!r} is not UTF-8 text (byte {exc.start})") from None


def split_lines(text: str) -> tuple[list[str], list[str]]:
    """(lines without their endings, endings): ``"".join(l + e ...)`` gives ``text`` back. Lines
    end at \\n, \\r\\n or \\r only: a form feed or U+2028 inside a line is the line's, translated
    with it as POST /translate translates it (``str.splitlines`` would cut there and lose it)."""
    lines, endings, at = [], [], 0
    for end in _LINE_END.finditer(text):
        lines.append(text[at:end.start()])
        endings.append(end.group())
        at = end.end()
    if at < len(text):
        lines.append(text[at:])
        endings.append("")
    return lines, endings


def download_name(filename: str, target: str, suffix: str) -> str:
    """``report.txt`` translated to German downloads as ``report.de.txt``."""
    stem = _UNSAFE.sub("_", Path(Path(filename).name).stem).strip("._") or "translation"
    return f"{stem[:100]}.{_NOT_ASCII_SAFE.sub('_', target)}{suffix}"


def content_disposition(name: str) -> str:
    """An attachment header for ``name``: an ASCII ``filename`` for old clients, and the name
    itself as RFC 6266's ``filename*`` when it is not ASCII."""
    plain = _NOT_ASCII_SAFE.sub("_", name)
    header = f'attachment; filename="{plain}"'
    return header if plain == name else f"{header}; filename*=UTF-8''{quote(name, safe='')}"


@dataclass
class _Stored:
    path: Path
    download_name: str
    size: int
    expires: float


class FileStore:
    """Translated files waiting for their download, in a temporary folder of bounded size."""

    def __init__(self, ttl: float = 600.0, max_files: int = 256, max_bytes: int = 256 << 20,
                 clock: Callable[[], float] = time.monotonic):
        self.ttl, self.max_files, self.max_bytes, self._clock = ttl, max_files, max_bytes, clock
        self._files: OrderedDict[str, _Stored] = OrderedDict()  # oldest first
        self._dir: Optional[Path] = None

    def put(self, data: bytes, download_name: str, suffix: str) -> str:
        """Store ``data``; the name to fetch it by. 503 while the store is full."""
        self.expire()
        if len(self._files) >= self.max_files or self.stored_bytes + len(data) > self.max_bytes:
            raise ApiError(503, "too many translated files wait for their download; retry shortly",
                           {"Retry-After": "10"})
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="xformer-serve-files-"))
        name = secrets.token_urlsafe(18) + suffix
        path = self._dir / name
        path.write_bytes(data)
        self._files[name] = _Stored(path, download_name, len(data), self._clock() + self.ttl)
        return name

    def take(self, name: str) -> tuple[bytes, str]:
        """(the file's bytes, its download name), removed from the store; 404 if unknown or expired."""
        self.expire()
        stored = self._files.pop(name, None)
        if stored is None:
            raise ApiError(404, "Invalid request: no such file (each is kept until downloaded once, or expires)")
        try:
            return stored.path.read_bytes(), stored.download_name
        finally:
            stored.path.unlink(missing_ok=True)

    def expire(self) -> None:
        now = self._clock()
        while self._files:
            name, stored = next(iter(self._files.items()))
            if stored.expires > now:
                break
            del self._files[name]
            stored.path.unlink(missing_ok=True)

    @property
    def stored_bytes(self) -> int:
        return sum(stored.size for stored in self._files.values())

    def __len__(self) -> int:
        return len(self._files)

    def close(self) -> None:
        """Remove every stored file and the folder."""
        self._files.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
