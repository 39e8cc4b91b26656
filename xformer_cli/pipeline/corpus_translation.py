"""A corpus through an engine at corpus scale, resumable: the lines go in fixed chunks (chunk k
holds lines k*C to (k+1)*C - 1, each chunk one engine call, which sorts it by length into
batches), each chunk appended to two aligned files (the input lines as read, their
translations) and synced before the next. A killed run resumes after the last whole chunk:
the files are cut back to it, so no line is lost, doubled or cut, and every chunk is the
same engine call as in an uninterrupted run (sampling seeded per chunk), so the output is too.
Memory holds one chunk, never the file."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional

from xformer_cli.errors import XformerError
from xformer_cli.fileio import writing
from xformer_cli.textio import decode_line

if TYPE_CHECKING:
    from xformer_cli.number_matching import NumberAccuracy

# What a full disk's message promises of a translation stage's output; a redo that puts the old
# output back instead (pipeline/runner.py) takes the promise out.
RESUMES_THERE = " (a rerun resumes there)"


@dataclass
class TextLines:
    """The usable lines of a monolingual file: stripped, empty ones skipped and counted, a line
    that is not UTF-8 named (or skipped and counted with ``skip_invalid``), as training data is."""

    path: Path
    skip_invalid: bool = False
    max_lines: int = 0  # the first N usable lines; 0 = all
    dropped: Counter = field(default_factory=Counter)

    def __iter__(self) -> Iterator[str]:
        if not self.path.is_file():
            raise XformerError(f"{self.path} is a directory" if self.path.is_dir() else f"file not found: {self.path}")
        self.dropped = Counter()
        kept = 0
        with self.path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    line = decode_line(raw.rstrip(b"\r\n"), str(self.path), number,
                                       "fix the file, or set mono.skip_invalid_utf8: true to skip such lines")
                except XformerError:
                    if not self.skip_invalid:
                        raise
                    self.dropped["invalid UTF-8"] += 1
                    continue
                line = line.strip()
                if not line:
                    self.dropped["empty"] += 1
                    continue
                yield line
                kept += 1
                if kept == self.max_lines:
                    return


def complete_lines(path: Path) -> int:
    """Whole lines in ``path``: a last line without its newline (a write cut by a kill) is not one."""
    if not path.exists():
        return 0
    lines = 0
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            lines += block.count(b"\n")
    return lines


def _offset_of_line(path: Path, n: int) -> int:
    """The byte offset just after the ``n``-th newline of ``path`` (0 for n = 0)."""
    if n == 0:
        return 0
    seen = offset = 0
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            count = block.count(b"\n")
            if seen + count >= n:
                position = -1
                for _ in range(n - seen):
                    position = block.index(b"\n", position + 1)
                return offset + position + 1
            seen += count
            offset += len(block)
    raise ValueError(f"{path} has fewer than {n} lines")


def cut_to_lines(path: Path, n: int) -> None:
    """Cut ``path`` back to its first ``n`` lines (created empty when missing)."""
    with path.open("ab") as f:
        f.truncate(_offset_of_line(path, n))


@dataclass
class CorpusJob:
    """Which lines to translate and where the two aligned sides go."""

    lines: Iterable[str]
    inputs_path: Path  # the input lines as translated (one side of the new corpus)
    outputs_path: Path  # their translations (the other side)
    total: Optional[int] = None  # for the progress bar's ETA
    chunk_lines: int = 2000
    seed: int = 1  # sampling: chunk k draws with seed + k


def whole_chunks(inputs_path: Path, outputs_path: Path, chunk_lines: int) -> int:
    """Lines translated in whole chunks, in both files: where a resumed translation goes on."""
    done = min(complete_lines(inputs_path), complete_lines(outputs_path))
    return done - done % chunk_lines


def resume_point(job: CorpusJob) -> int:
    """Lines already translated in whole chunks; both files are cut back to them."""
    done = whole_chunks(job.inputs_path, job.outputs_path, job.chunk_lines)
    for path in (job.inputs_path, job.outputs_path):
        cut_to_lines(path, done)
    return done


def translate_corpus(job: CorpusJob, translate: Callable[[list[str], int], list[str]],
                     log: Callable[[str], None] = print, progress: bool = True) -> int:
    """Translate ``job.lines`` chunk by chunk with ``translate(lines, chunk_index)``, resuming
    after the chunks already written; returns the number of lines in the finished files."""
    from tqdm import tqdm

    done = resume_point(job)
    if done:
        log(f"resuming after line {done} of {job.outputs_path}")
    lines = iter(job.lines)
    for _ in range(done):
        if next(lines, None) is None:
            break
    bar = tqdm(total=job.total, initial=done, unit=" lines", disable=not progress, dynamic_ncols=True, smoothing=0.1)
    started, written = time.time(), done
    # Unbuffered: a write the disk refuses fails inside ``writing`` (its line names the file and where a rerun
    # resumes); a buffered file would try the same bytes again on close and replace that line with its own error.
    with job.inputs_path.open("ab", buffering=0) as fi, job.outputs_path.open("ab", buffering=0) as fo:
        chunk_index = done // job.chunk_lines
        while chunk := _take(lines, job.chunk_lines):
            outputs = translate(chunk, chunk_index)
            if len(outputs) != len(chunk):
                raise RuntimeError(f"the engine gave {len(outputs)} lines for {len(chunk)}")
            for handle, side, path in ((fi, chunk, job.inputs_path), (fo, outputs, job.outputs_path)):
                with writing(path, intact=f"the lines before {written + 1}{RESUMES_THERE}"):
                    _write_all(handle, "".join(_one_line(text) + "\n" for text in side).encode("utf-8"))
                    os.fsync(handle.fileno())
            written += len(chunk)
            chunk_index += 1
            bar.update(len(chunk))
    bar.close()
    rate = (written - done) / max(time.time() - started, 1e-9)
    log(f"translated {written - done} lines into {job.outputs_path} ({rate:.1f} lines/s; {written} in all)")
    return written


def _write_all(handle: Any, data: bytes) -> None:
    """``data`` into an unbuffered file, which may take part of it per call."""
    view = memoryview(data)
    while view:
        view = view[handle.write(view):]


def numbers_kept(job: CorpusJob, src_lang: str, tgt_lang: str) -> "NumberAccuracy":
    """eval-bleu's number accuracy of the finished files (a teacher's translations lose numbers a
    student would learn to lose; data.drop_number_mismatch drops those pairs), read line by line."""
    from xformer_cli.number_matching import number_accuracy

    with job.inputs_path.open(encoding="utf-8") as inputs, job.outputs_path.open(encoding="utf-8") as outputs:
        return number_accuracy((line.rstrip("\n") for line in inputs), (line.rstrip("\n") for line in outputs),
                               src_lang, tgt_lang)


def _take(lines: Iterator[str], n: int) -> list[str]:
    chunk = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == n:
            break
    return chunk


def _one_line(text: str) -> str:
    """A translation as one line: a line break inside it would shift every line after it."""
    return " ".join(text.splitlines()) if ("\n" in text or "\r" in text) else text
