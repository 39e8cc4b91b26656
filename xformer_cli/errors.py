"""The one exception type that means "the user gave us something wrong".

The CLI turns it into a single line on stderr and a non-zero exit code; anything
else is a bug and keeps its traceback.
"""

from typing import Any


class XformerError(Exception):
    """A user-facing error: bad config key, missing file, corrupt checkpoint, ..."""


# The full-disk helpers live in xformer_cli.fileio (which needs XformerError, hence not
# imported here); cli.py and train/trainer.py still import them from this module.
_MOVED_TO_FILEIO = frozenset({"disk_full", "disk_full_error", "writing"})


def __getattr__(name: str) -> Any:
    if name in _MOVED_TO_FILEIO:
        from xformer_cli import fileio

        return getattr(fileio, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
