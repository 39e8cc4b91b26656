"""Local data files (``data_files``: parquet, jsonl/json, tsv, csv) read row by row, as plain text is.

Read here, not through ``datasets``' builders: its cache knows a local file by its modification
time (an edited file kept the same was read stale, a touched one was built again), pandas read a
lone carriage return inside a TSV field as a line end and the words NA, None, null or nan as
missing, and an error lost the file's line. Here a text format is split on '\\n' only, every
value is taken as written, invalid UTF-8 and a row of the wrong shape name file and line (or,
with data.skip_invalid_utf8, an undecodable line is dropped and counted), and the fingerprint
is each file's bytes (``file_stamp``).
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Optional

from xformer_cli.errors import XformerError
from xformer_cli.file_stamps import file_stamp
from xformer_cli.textio import count_lines, decode_line, without_bom

FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".tsv": "tsv", ".csv": "csv"}
Row = dict[str, Any]


class DataFiles:
    """The rows of one or more files of one format, with the columns the first file names."""

    def __init__(self, files: list[Path]):
        self.files = files
        suffix = files[0].suffix.lower()
        if suffix not in FORMATS:
            raise XformerError(f"{files[0]}: unsupported data file type (use parquet, jsonl, json, tsv or csv)")
        self.format = FORMATS[suffix]
        other = next((f for f in files if FORMATS.get(f.suffix.lower()) != self.format), None)
        if other is not None:
            raise XformerError(f"{other}: another format than {files[0]}: give one kind of data file")
        if self.format == "parquet":  # each file's schema first: a damaged file is named before it is read
            names = [_parquet_columns(f) for f in files]
            other = next((f for f, n in zip(files, names) if n != names[0]), None)
            if other is not None:
                raise XformerError(f"{other}: columns {', '.join(names[files.index(other)])} differ from "
                                   f"{files[0]}'s ({', '.join(names[0])})")
        self.first_row: Row = next(self._rows(files[0], Counter(), skip_invalid=True), {})
        if self.format == "json" and not self.first_row:  # its columns come from its first row
            raise XformerError(f"{files[0]} holds no JSON row")
        if self.format == "parquet":
            self.column_names = names[0]
        elif self.format == "json":
            self.column_names = list(self.first_row)
        else:
            self.column_names = self._header(files[0])

    def languages(self, column: str) -> list[str]:
        """The keys of a dict column (WMT's ``translation``) as its first row holds them."""
        value = self.first_row.get(column)
        return list(value) if isinstance(value, dict) else []

    def rows(self, skip_invalid: bool, dropped: Counter) -> Iterator[tuple[Row, str]]:
        """(row, where: FILE:LINE or FILE row N) for every row of every file, in order."""
        for path in self.files:
            yield from self._placed_rows(path, dropped, skip_invalid)

    def __len__(self) -> int:
        """Rows, or for a text format about as many (its lines, less each header)."""
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return sum(pq.ParquetFile(f).metadata.num_rows for f in self.files)
        header = 1 if self.format in ("tsv", "csv") else 0
        return sum(max(count_lines(f) - header, 0) for f in self.files)

    def stamps(self) -> list[str]:
        return [file_stamp(f) for f in self.files]

    def _rows(self, path: Path, dropped: Counter, skip_invalid: bool) -> Iterator[Row]:
        return (row for row, _ in self._placed_rows(path, dropped, skip_invalid))

    def _placed_rows(self, path: Path, dropped: Counter, skip_invalid: bool) -> Iterator[tuple[Row, str]]:
        if self.format == "parquet":
            return _parquet_rows(path)
        lines = _decoded_lines(path, dropped, skip_invalid)
        if self.format == "json":
            return _json_rows(path, lines)
        return _table_rows(path, lines, self.format)

    def _header(self, path: Path) -> list[str]:
        for _, line in _decoded_lines(path, Counter(), skip_invalid=False):
            return [name.strip() for name in _split_table_line(line, self.format)]  # as _table_rows keys the rows
        raise XformerError(f"{path} is empty: a {self.format} file starts with a header line naming its columns")


def _decoded_lines(path: Path, dropped: Counter, skip_invalid: bool) -> Iterator[tuple[int, str]]:
    """(line number, text with its '\\n') for each line, split on '\\n' only; a '\\r' before it is
    dropped (CRLF files)."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            raw = without_bom(raw, number)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                if skip_invalid:
                    dropped["invalid UTF-8"] += 1
                    continue
                text = decode_line(raw, str(path), number, "fix the file or set data.skip_invalid_utf8: true")
            yield number, text[:-2] + "\n" if text.endswith("\r\n") else text


def _json_rows(path: Path, lines: Iterator[tuple[int, str]]) -> Iterator[tuple[Row, str]]:
    """JSON lines, one object a line; or a .json file holding one array of objects."""
    first = True
    for number, line in lines:
        if not line.strip():
            continue
        if first and line.lstrip().startswith("[") and path.suffix.lower() == ".json":  # blank lines before it too
            yield from _json_array(path, line + "".join(text for _, text in lines))
            return
        first = False
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise XformerError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise XformerError(f"{path}:{number}: not a JSON object but {type(row).__name__}")
        yield row, f"{path}:{number}"


def _json_array(path: Path, text: str) -> Iterator[tuple[Row, str]]:
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise XformerError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    for index, row in enumerate(rows if isinstance(rows, list) else [rows], start=1):
        if not isinstance(row, dict):
            raise XformerError(f"{path} item {index}: not a JSON object but {type(row).__name__}")
        yield row, f"{path} item {index}"


def _split_table_line(line: str, form: str) -> list[str]:
    if form == "tsv":
        return line.rstrip("\n").split("\t")
    return next(csv.reader([line]), [])


def _table_rows(path: Path, lines: Iterator[tuple[int, str]], form: str) -> Iterator[tuple[Row, str]]:
    """A header line naming the columns, then rows of as many fields: TSV as corpora ship it (no
    quoting: a quote is text), CSV with its quoting (a quoted field may hold line breaks)."""
    numbered = iter(lines)
    here = [0]

    def texts() -> Iterator[str]:
        for number, text in numbered:
            here[0] = number
            yield text

    reader = (_split_table_line(line, form) for line in texts()) if form == "tsv" else csv.reader(texts())
    header: Optional[list[str]] = None
    for fields in reader:
        if header is None:
            header = [name.strip() for name in fields]
            continue
        if fields == [] or fields == [""]:
            continue  # a blank line
        if len(fields) != len(header):
            raise XformerError(f"{path}:{here[0]}: {len(fields)} fields, the header names {len(header)} "
                               f"({', '.join(header)})")
        yield dict(zip(header, fields)), f"{path}:{here[0]}"


def _parquet_columns(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    try:
        return list(pq.ParquetFile(path).schema_arrow.names)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise XformerError(f"{path}: not a readable parquet file ({str(exc).splitlines()[0][:200]})") from None


def _parquet_rows(path: Path) -> Iterator[tuple[Row, str]]:
    import pyarrow.parquet as pq

    number = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=2000):
        for row in batch.to_pylist():
            number += 1
            yield row, f"{path} row {number}"


def text_value(value: Any, column: str, where: str) -> str:
    """A cell as text: a string as it is, a missing one as ''; anything else (a number, a list)
    is refused naming its place, not read as text it never was."""
    if value is None or isinstance(value, str):
        return value or ""
    raise XformerError(f"{where}: column '{column}' holds {type(value).__name__} ({str(value)[:40]}), not text")
