"""Checkpoints exported for the CTranslate2 engine, kept between runs.

``--precision auto`` picks CTranslate2 on most CPUs, so ``xformer translate -m best.pt``
would otherwise export the checkpoint again at every start. An export is kept under
``$XFORMER_CACHE`` (default ``~/.cache/xformer``) in ``ct2/``, named by a hash of the
checkpoint's path, size and modification time, the weight type and xformer's version: a
retrained ``best.pt`` gets a new name, and the older export of the same file is removed.
Exports are written whole or not at all (``export.common.write_directory``); at most
``KEEP`` are kept. Where the cache cannot be written, the export goes to a temporary
directory, removed once the engine has read it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Optional

from xformer_cli.export.format import is_export_directory

KEEP = 8  # exports kept in the cache at most, the least recently used removed first


def cache_root() -> Path:
    return Path(os.environ.get("XFORMER_CACHE") or Path.home() / ".cache" / "xformer") / "ct2"


def _names(checkpoint: Path, quantization: Optional[str]) -> tuple[str, str]:
    """(this file's prefix, this version's full name): the prefix finds its older exports."""
    from xformer_cli import __version__

    stat = checkpoint.stat()
    path_key = hashlib.sha256(str(checkpoint.resolve()).encode()).hexdigest()[:12]
    version_key = hashlib.sha256(f"{stat.st_size}|{stat.st_mtime_ns}|{__version__}".encode()).hexdigest()[:12]
    prefix = f"{checkpoint.stem}-{path_key}-{quantization or 'float32'}-"
    return prefix, prefix + version_key


@contextlib.contextmanager
def exported_checkpoint(checkpoint: Path, quantization: Optional[str],
                        log: Callable[[str], None] = lambda message: None) -> Iterator[Path]:
    """A CTranslate2 export of ``checkpoint`` for the duration of the block: the cached one,
    made first if need be."""
    from xformer_cli.export.ctranslate2 import export_ctranslate2

    root = cache_root()
    prefix, name = _names(checkpoint, quantization)
    target = root / name
    if is_export_directory(target) and (target / "model.bin").is_file():
        os.utime(target)  # recently used: kept longest
        yield target
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        writable = os.access(root, os.W_OK)
    except OSError:
        writable = False
    if not writable:
        log(f"exporting {checkpoint} for CTranslate2 (a temporary directory: {root} is not writable)")
        with tempfile.TemporaryDirectory(prefix="xformer-ct2-") as tmp:
            yield export_ctranslate2(checkpoint, Path(tmp) / "ct2", quantization=quantization)
        return
    log(f"exporting {checkpoint} for CTranslate2 (kept in {target} for the next run)")
    export_ctranslate2(checkpoint, target, quantization=quantization, force=True)
    _prune(root, prefix, keep=target)
    yield target


def _prune(root: Path, prefix: str, keep: Path) -> None:
    """Remove older exports of the same checkpoint, then the least recently used past ``KEEP``."""
    exports = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p != keep]
    stale = [p for p in exports if p.name.startswith(prefix)]
    rest = sorted((p for p in exports if p not in stale), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in stale + rest[KEEP - 1:]:
        shutil.rmtree(path, ignore_errors=True)
