"""The one exception type that means "the user gave us something wrong".

The CLI turns it into a single line on stderr and a non-zero exit code; anything
else is a bug and keeps its traceback.
"""


class XformerError(Exception):
    """A user-facing error: bad config key, missing file, corrupt checkpoint, ..."""

