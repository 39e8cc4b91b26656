"""A file's identity in a fingerprint (the token cache's, the tokenizer's, each pipeline stage's).

The stamp is the resolved path, the size and a SHA-256 of the bytes: a data folder copied or
provisioned again (new modification times, the same bytes) keeps every cache and finished stage
made from it, and a file rewritten in place, even to the same size within the same second, does
not. Each file is hashed once per process for each (device, inode, size, mtime, ctime).

Records and caches made before content hashes stamped size and modification time;
``stamps_by_time`` brings that form back for recognising them (and upgrading them once).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from pathlib import Path
from typing import Iterator

from xformer_cli.errors import XformerError

_BY_TIME = contextvars.ContextVar("stamps_by_time", default=False)
_DIGESTS: dict[tuple[int, int, int, int, int], str] = {}
_CHUNK = 1 << 20


def file_stamp(path: "str | Path") -> str:
    """``path``'s identity for a fingerprint (resolved path, size, content hash); one line when
    the file is not there or cannot be read."""
    path = Path(path)
    if not path.is_file():
        raise XformerError(f"file not found: {path}")
    stat = path.stat()
    if _BY_TIME.get():
        return f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = _sha256(path)
    return f"{path.resolve()}|{stat.st_size}|sha256:{_DIGESTS[key]}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise XformerError(f"cannot read {path}: {exc.strerror or exc}") from None
    return digest.hexdigest()


@contextlib.contextmanager
def stamps_by_time() -> Iterator[None]:
    """Inside: ``file_stamp`` as versions before content hashes wrote it (path, size, mtime), to
    recognise the records and caches they made."""
    token = _BY_TIME.set(True)
    try:
        yield
    finally:
        _BY_TIME.reset(token)
