"""What a stage leaves behind to be skipped or resumed: ``<run_dir>/<stage>/stage.json``
with the fingerprint of its inputs (settings, data files, upstream stages' fingerprints)
and whether it finished. Like the token cache: the same fingerprint and done means skip,
the same fingerprint not done means resume, another fingerprint means start the stage over."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from xformer_cli.errors import XformerError
from xformer_cli.fileio import atomic_file

RECORD = "stage.json"


def file_stamp(path: "str | Path") -> str:
    """A file's identity for a fingerprint: resolved path, size and modification time (what the
    token cache takes too: rewriting a corpus changes it, reading it does not)."""
    path = Path(path)
    if not path.is_file():
        raise XformerError(f"file not found: {path}")
    stat = path.stat()
    return f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"


def fingerprint(*parts: Any) -> str:
    """A short hash of JSON-able parts (dicts hashed with sorted keys)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass
class StageRecord:
    """One stage's folder and its record."""

    name: str
    directory: Path

    @property
    def path(self) -> Path:
        return self.directory / RECORD

    def read(self) -> Optional[dict]:
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # none yet, or damaged: the stage is done again
        return record if isinstance(record, dict) else None

    def done_with(self, fingerprint: str) -> bool:
        record = self.read()
        return bool(record and record.get("fingerprint") == fingerprint and record.get("done"))

    def fingerprint(self) -> Optional[str]:
        """The fingerprint of the stage's finished output, None when it has not finished."""
        record = self.read()
        return record.get("fingerprint") if record and record.get("done") else None

    def begin(self, fingerprint: str, fresh: bool = False) -> bool:
        """Make ready to run with ``fingerprint``; True when an unfinished run of the same
        inputs is there to resume. Another fingerprint's folder (or any, when ``fresh``) is
        removed first."""
        record = self.read()
        if not fresh and record is not None and record.get("fingerprint") == fingerprint and not record.get("done"):
            return True
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        self.write({"stage": self.name, "fingerprint": fingerprint, "done": False})
        return False

    def finish(self, fingerprint: str, **results: Any) -> None:
        self.write({"stage": self.name, "fingerprint": fingerprint, "done": True, **results})

    def write(self, record: dict) -> None:
        with atomic_file(self.path, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2, sort_keys=True)
            f.write("\n")
