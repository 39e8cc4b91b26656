"""Line-exact text input and output for translation: the line count never drifts.

Input is split on '\\n' only (never on the other characters ``str.splitlines`` treats as
breaks), a line that is not UTF-8 is an error naming file and line (or, when asked, its
undecodable bytes become U+FFFD), and it is read lazily so any size streams in bounded
memory. Output to a file is written whole or not at all (``fileio.atomic_file``): a failed
run never truncates an earlier result.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import sys
from pathlib import Path
from typing import IO, Iterator, Optional

from xformer_cli.errors import XformerError
from xformer_cli.fileio import atomic_file, unchanged_or, writing


def _is_std(path: Optional[Path]) -> bool:
    return path is None or str(path) == "-"


def iter_lines(path: Optional[Path], replace_invalid: bool = False, remedy: str = "fix the input") -> Iterator[str]:
    """Lines of a file (or stdin for None / "-"), without their line ends. Bytes that are not
    UTF-8 stop the reading with the file and line named, or with ``replace_invalid`` are read
    as U+FFFD (the line count stays; what the line said there is lost). ``remedy`` ends the error."""
    if _is_std(path):
        handle = sys.stdin.buffer
    else:
        if path.is_dir() or not path.exists():  # a pipe or /dev/stdin is read as a file is
            raise XformerError(f"input {path} is a directory" if path.is_dir() else f"input file not found: {path}")
        handle = path.open("rb")
    with contextlib.closing(handle) if handle is not sys.stdin.buffer else contextlib.nullcontext():
        name = "stdin" if _is_std(path) else str(path)
        number = 0
        try:
            for number, raw in enumerate(handle, start=1):  # binary iteration splits on b"\n" only
                raw = without_bom(raw.rstrip(b"\n").rstrip(b"\r"), number)
                yield raw.decode("utf-8", errors="replace") if replace_invalid else decode_line(raw, name, number,
                                                                                                  remedy)
        except OSError as exc:  # a device or file that fails mid-read (EIO): named, not a traceback
            raise XformerError(f"cannot read {name} after line {number}: {exc.strerror or exc}") from None


def without_bom(raw: bytes, number: int) -> bytes:
    """Line ``number`` of a file without a UTF-8 byte-order mark at the file's start: it marks the
    file, it is no text (a glossary's first term, a hypothesis's first word)."""
    return raw[len(codecs.BOM_UTF8):] if number == 1 and raw.startswith(codecs.BOM_UTF8) else raw


def decode_line(raw: bytes, name: str, number: int, remedy: str) -> str:
    """``raw`` as UTF-8; bytes that are not are one line naming ``name`` and line ``number``,
    ended by ``remedy`` (what to do about it)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise XformerError(f"{name}:{number}: invalid UTF-8 ({exc.reason} at byte {exc.start}); {remedy}") from None


def count_lines(path: Path) -> int:
    """Lines ``iter_lines`` will give (a final line without '\\n' counts), for progress bars."""
    count, last = 0, b"\n"
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


@contextlib.contextmanager
def open_output(path: Optional[Path]) -> Iterator[IO[str]]:
    """stdout, or a file that appears (atomically) only when the block succeeds."""
    if _is_std(path):
        yield sys.stdout
        sys.stdout.flush()
        return
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise XformerError(f"output directory does not exist: {directory}")
    intact = unchanged_or(path, "no partial file was left")
    with writing(path, intact=intact), atomic_file(path, "w", encoding="utf-8", newline="\n") as handle:
        yield handle


def write_lines(lines: list[str], path: Optional[Path]) -> None:
    with open_output(path) as handle:
        handle.writelines(line + "\n" for line in lines)


def complete_rows(path: Path) -> list[tuple[str, dict]]:
    """(line, row) for each whole JSON object line of a .jsonl file (a run's metrics.jsonl); a
    line a kill cut off, without its newline, is left out. A file that cannot be read raises."""
    text = path.read_text(encoding="utf-8", errors="replace")
    rows = []
    for line in text.splitlines(keepends=True):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if line.endswith("\n") and isinstance(row, dict):
            rows.append((line, row))
    return rows
