"""A file's identity in a fingerprint (the token cache's, the tokenizer's, each pipeline stage's).

The stamp is the resolved path, the size and a SHA-256 of the bytes: a data folder copied or
provisioned again (new modification times, the same bytes) keeps every cache and finished stage
made from it at the same path, and a file rewritten in place, even to the same size within the
same second, does not. A file is hashed once per process for each (device, inode, size, mtime,
ctime) once those are some seconds old (a younger file may change within one clock tick and keep
them: it is hashed at each call, as git treats a "racy" file).

Records and caches made before content hashes stamped size and modification time;
``stamps_by_time`` brings that form back for recognising them (and upgrading them once).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import time
from pathlib import Path
from typing import Iterator

from xformer_cli.errors import XformerError

_BY_TIME = contextvars.ContextVar("stamps_by_time", default=False)
_DIGESTS: dict[tuple[int, int, int, int, int], str] = {}
_CHUNK = 1 << 20
_SETTLED_NS = 3 * 10**9  # coarser than any file system's timestamps that matter here (FAT: 2 s)


def file_stamp(path: "str | Path") -> str:
    """``path``'s identity for a fingerprint (resolved path, size, content hash); one line when
    the file is not there or cannot be read."""
    path = Path(path)
    if not path.is_file():
        raise XformerError(f"file not found: {path}")
    stat = path.stat()
    if _BY_TIME.get():
        return f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    key = _key(stat)
    digest = _DIGESTS.get(key)
    if digest is None:
        digest = _sha256(path)
        if time.time_ns() - max(stat.st_mtime_ns, stat.st_ctime_ns) > _SETTLED_NS and _key(path.stat()) == key:
            _DIGESTS[key] = digest  # unchanged while it was read, and past the clock's tick
    return f"{path.resolve()}|{stat.st_size}|sha256:{digest}"


def _key(stat: os.stat_result) -> tuple[int, int, int, int, int]:
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


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
