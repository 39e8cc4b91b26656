"""The one exception type that means "the user gave us something wrong".

The CLI turns it into a single line on stderr and a non-zero exit code; anything
else is a bug and keeps its traceback.
"""


class XformerError(Exception):
    """A user-facing error: bad config key, missing file, corrupt checkpoint, ..."""


# -- a full disk ---------------------------------------------------------------------------

import contextlib  # noqa: E402
import errno  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Iterator, Optional  # noqa: E402

_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from or while handling, is a full disk
    (torch's zip writer reports one as a RuntimeError raised while handling the OSError)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return True
        if isinstance(exc, RuntimeError) and "No space left on device" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def disk_full_error(path: "str | Path", needed: Optional[int] = None, intact: Optional[str] = None) -> XformerError:
    """One line: the file that could not be written, the space there and what is still safe."""
    path = Path(path)
    where = path.parent if path.parent.exists() else Path(".")
    try:
        free = f"{_size(shutil.disk_usage(where).free)} free"
    except OSError:
        free = "free space unknown"
    need = f", about {_size(needed)} needed" if needed else ""
    safe = f"; {intact}" if intact else ""
    return XformerError(f"could not write {path}: no space left on device ({free}{need}){safe}")


@contextlib.contextmanager
def writing(path: "str | Path", needed: Optional[int] = None, intact: Optional[str] = None) -> Iterator[None]:
    """Turn a full disk while writing ``path`` into one ``XformerError`` line (the caller's
    own clean-up, removing its temporary file, has run by the time this sees it)."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        if disk_full(exc):
            raise disk_full_error(path, needed, intact) from None
        raise
