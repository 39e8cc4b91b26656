"""Reading parallel corpora from files or datasets: validate, stream, and say what was dropped.

Every source yields the same thing, (source, target) string pairs with surrounding
whitespace stripped, so plain files, Hugging Face datasets and parquet files are
interchangeable. Training corpora are streamed (never held in memory); valid and test
sets are small and read whole.
"""

from __future__ import annotations

import glob
import gzip
import zlib
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from xformer_cli.config import CorpusConfig
from xformer_cli.data.data_files import DataFiles, text_value
from xformer_cli.errors import XformerError
from xformer_cli.file_stamps import file_stamp
from xformer_cli.textio import count_lines, decode_line, without_bom

DEFAULT_SPLITS = {"train": "train", "valid": "validation", "test": "test"}


@dataclass
class ParallelCorpus:
    src: list[str]
    tgt: list[str]
    dropped: Counter = field(default_factory=Counter)  # reason -> count
    name: str = ""
    origin: str = ""  # where it was read from: a file, or dataset[split]
    files: tuple[Path, ...] = ()  # the files read (source, target), none for a dataset

    def __len__(self) -> int:
        return len(self.src)

    def report(self) -> str:
        return describe(self.name, len(self), self.dropped)


def describe(name: str, kept: int, dropped: Counter) -> str:
    text = f"{name}: {kept} pairs"
    if dropped:
        text += " (dropped " + ", ".join(f"{n} {why}" for why, n in sorted(dropped.items())) + ")"
    return text


# -- plain-text files ------------------------------------------------------------------

def corpus_paths(corpus: CorpusConfig, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    """``prefix`` + ``.en`` / ``.de`` (or ``.en.gz``), or the two paths given."""
    if corpus.src and corpus.tgt:
        return Path(corpus.src), Path(corpus.tgt)
    if not corpus.prefix:
        raise XformerError("a corpus needs 'prefix' or both 'src' and 'tgt'")
    paths = []
    for lang in (src_lang, tgt_lang):
        plain = Path(f"{corpus.prefix}.{lang}")
        zipped = Path(f"{corpus.prefix}.{lang}.gz")
        paths.append(zipped if not plain.exists() and zipped.exists() else plain)
    return paths[0], paths[1]


def _open_binary(path: Path):
    if path.is_dir():
        raise XformerError(f"{path} is a directory, not a text file")
    if not path.exists():  # a pipe or /dev/stdin is read as a file is (training checks for files itself)
        raise XformerError(f"file not found: {path}")
    return _Gzipped(path) if path.suffix == ".gz" else open(path, "rb")


class _Gzipped:
    """A .gz file's lines; one that is not gzip, or cut off, is an error naming it."""

    def __init__(self, path: Path):
        self.path, self.handle = path, gzip.open(path, "rb")

    def __enter__(self) -> "_Gzipped":
        return self

    def __exit__(self, *exc) -> None:
        self.handle.close()

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        try:
            return next(self.handle)
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
            raise XformerError(f"{self.path}: not a readable gzip file ({exc})") from None


def _decode(raw: bytes, path: Path, number: int, skip_invalid: bool,
            remedy: str = "fix the file or set data.skip_invalid_utf8: true") -> Optional[str]:
    raw = without_bom(raw, number)
    if skip_invalid:
        try:
            return raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            return None
    return decode_line(raw, str(path), number, remedy).rstrip("\r\n")


def read_lines(path: Path) -> Iterator[str]:
    """Lines without their newline; invalid UTF-8 is an error naming file and line."""
    with _open_binary(path) as handle:
        for number, raw in enumerate(handle, start=1):
            yield _decode(raw, path, number, skip_invalid=False, remedy="fix the file")  # type: ignore[misc]


def _text_pairs(src_path: Path, tgt_path: Path, skip_invalid: bool, dropped: Counter) -> Iterator[tuple[str, str]]:
    with _open_binary(src_path) as fs, _open_binary(tgt_path) as ft:
        number = 0
        for number, (a, b) in enumerate(zip_longest(fs, ft), start=1):
            if a is None or b is None:
                n_src = number - 1 + (a is not None) + sum(1 for _ in fs)
                n_tgt = number - 1 + (b is not None) + sum(1 for _ in ft)
                raise XformerError(f"line counts differ: {src_path} has {n_src} lines, {tgt_path} has {n_tgt}")
            s, t = _decode(a, src_path, number, skip_invalid), _decode(b, tgt_path, number, skip_invalid)
            if s is None or t is None:
                dropped["invalid UTF-8"] += 1
                continue
            yield s, t


# -- datasets and data files ---------------------------------------------------------------

def data_file_paths(data_files: str) -> list[Path]:
    """The files ``data_files`` names: one path, or a glob pattern's matches in order."""
    pattern = any(ch in data_files for ch in "*?[")
    # glob.glob, not Path().glob: an absolute pattern ("/data/wmt/*.parquet") is the usual one
    return sorted(map(Path, glob.glob(data_files))) if pattern else [Path(data_files)]


def open_dataset(corpus: CorpusConfig, split: str) -> "DataFiles | Any":
    """Local data files (data/data_files.py), or a ``datasets.Dataset`` (memory-mapped Arrow)
    for a hub name or a saved directory."""
    if corpus.data_files:
        files = data_file_paths(corpus.data_files)
        if not files or not all(f.is_file() for f in files):
            raise XformerError(f"data files not found: {corpus.data_files}")
        return DataFiles(files)
    import datasets

    datasets.disable_progress_bars()
    path = Path(corpus.dataset)  # type: ignore[arg-type]
    if path.is_file():
        raise XformerError(f"dataset {path} is a file: data_files reads data files (dataset takes a Hub name or a "
                           "save_to_disk folder)")
    try:
        if path.is_dir():
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise XformerError(f"dataset {path} has no split '{split}' (splits: {', '.join(loaded)})")
                return loaded[split]
            if corpus.split:  # a split asked for by name in a dataset saved without splits: all of it was read
                raise XformerError(f"dataset {path} was saved without splits: split '{corpus.split}' is not in it "
                                   "(leave split out to read all of it)")
            return loaded
        return datasets.load_dataset(corpus.dataset, corpus.dataset_config, split=split)
    except XformerError:
        raise
    except Exception as exc:  # datasets raises many types; the user needs its first line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise XformerError(f"dataset {corpus.dataset} (split '{split}'): {first[:300]}") from None


def _columns(ds, corpus: CorpusConfig, src_lang: str, tgt_lang: str, what: str) -> tuple[str, Optional[str]]:
    """('translation', None) for WMT's schema, else the two column names."""
    names = list(ds.column_names)
    if corpus.src_column:
        missing = [c for c in (corpus.src_column, corpus.tgt_column) if c not in names]
        if missing:
            raise XformerError(f"{what} has no column '{missing[0]}' (columns: {', '.join(names)})")
        return corpus.src_column, corpus.tgt_column
    if "translation" in names:
        if isinstance(ds, DataFiles):
            langs = ds.languages("translation")
        else:
            feature = ds.features["translation"]
            langs = list(getattr(feature, "languages", None) or feature.keys())
        missing = [lang for lang in (src_lang, tgt_lang) if lang not in langs]
        if missing:
            raise XformerError(f"{what} has no '{missing[0]}' in its translation column "
                               f"(languages: {', '.join(langs)})")
        return "translation", None
    if src_lang in names and tgt_lang in names:
        return src_lang, tgt_lang
    raise XformerError(f"{what}: no 'translation' column and no columns '{src_lang}'/'{tgt_lang}' "
                       f"(columns: {', '.join(names)}); set src_column and tgt_column")


def _dataset_pairs(ds, columns: tuple[str, Optional[str]], src_lang: str, tgt_lang: str,
                   name: str) -> Iterator[tuple[str, str]]:
    wanted = [column for column in columns if column is not None]
    number = 0
    for batch in ds.iter(batch_size=2000):
        for values in zip(*(batch[column] for column in wanted)):
            number += 1
            yield _pair(dict(zip(wanted, values)), columns, src_lang, tgt_lang, f"{name} row {number}")


def _file_pairs(files: DataFiles, columns: tuple[str, Optional[str]], src_lang: str, tgt_lang: str,
                skip_invalid: bool, dropped: Counter) -> Iterator[tuple[str, str]]:
    for row, where in files.rows(skip_invalid, dropped):
        yield _pair(row, columns, src_lang, tgt_lang, where)


def _pair(row: dict, columns: tuple[str, Optional[str]], src_lang: str, tgt_lang: str, where: str) -> tuple[str, str]:
    """(source, target) of one row: two columns, or WMT's translation column of {lang: text}."""
    first, second = columns
    missing = next((c for c in (first, second) if c is not None and c not in row), None)
    if missing is not None:
        raise XformerError(f"{where}: no column '{missing}'")
    if second is not None:
        return text_value(row[first], first, where), text_value(row[second], second, where)
    cell = row[first]
    if cell is not None and not isinstance(cell, dict):
        raise XformerError(f"{where}: column '{first}' holds {type(cell).__name__}, not {{language: text}}")
    cell = cell or {}
    return (text_value(cell.get(src_lang), f"{first}.{src_lang}", where),
            text_value(cell.get(tgt_lang), f"{first}.{tgt_lang}", where))


# -- one interface over all of them ---------------------------------------------------------

class PairSource:
    """A re-iterable stream of cleaned pairs from one corpus; ``dropped`` counts what was skipped."""

    def __init__(self, corpus: CorpusConfig, src_lang: str, tgt_lang: str, role: str = "train",
                 skip_invalid: bool = False):
        self.corpus, self.src_lang, self.tgt_lang, self.skip_invalid = corpus, src_lang, tgt_lang, skip_invalid
        self.split = corpus.split or DEFAULT_SPLITS.get(role, role)
        self.dropped: Counter = Counter()
        self._dataset = None
        self.notice: Optional[str] = None  # one line for the log, when the source is not the one configured
        self.tag: Optional[str] = None  # a multilingual model's target-language tag, the first source piece
        self.pair = 0  # its direction's index in data.directions()
        if corpus.dataset or corpus.data_files:
            self.name = self.origin = f"{corpus.dataset or corpus.data_files}[{self.split}]"
            self._place = _place(corpus)
            self._dataset = open_dataset(corpus, self.split)
            self._columns = _columns(self._dataset, corpus, src_lang, tgt_lang, self.name)
        else:
            self.paths = corpus_paths(corpus, src_lang, tgt_lang)
            missing = next((path for path in self.paths if not path.is_file()), None)
            # Only a missing folder (a machine without the local copy) falls back: a missing file
            # in an existing folder is a typo, which should not quietly read another corpus.
            if missing is not None and corpus.fallback_dataset and not missing.parent.exists():
                self._open_fallback(missing)
            elif missing is not None:
                raise XformerError(f"{missing} is a directory, not a text file" if missing.is_dir()
                                   else f"file not found: {missing}")
            else:
                self.name = f"{self.paths[0]}"

    def _open_fallback(self, missing: Path) -> None:
        """The local files are not there: read the configured dataset (the Hub, cached by
        ``datasets``) instead, and say so; when that fails too, say how to point at the files."""
        fallback = CorpusConfig(dataset=self.corpus.fallback_dataset, split=self.corpus.split)
        self.name = self.origin = f"{fallback.dataset}[{self.split}]"
        self._place = _place(fallback)
        try:
            self._dataset = open_dataset(fallback, self.split)
        except XformerError as exc:
            raise XformerError(f"{missing} not found, and {self.name} could not be read instead ({exc}); "
                               "set XFORMER_DATA (or the corpus prefix) to the folder that holds the corpus") from None
        self._columns = _columns(self._dataset, fallback, self.src_lang, self.tgt_lang, self.name)
        self.notice = f"data: {missing} not found; reading {self.name} through Hugging Face datasets instead"

    def __iter__(self) -> Iterator[tuple[str, str]]:
        self.dropped = Counter()
        if isinstance(self._dataset, DataFiles):
            raw = _file_pairs(self._dataset, self._columns, self.src_lang, self.tgt_lang, self.skip_invalid,
                              self.dropped)
        elif self._dataset is not None:
            raw = _dataset_pairs(self._dataset, self._columns, self.src_lang, self.tgt_lang, self.name)
        else:
            raw = _text_pairs(self.paths[0], self.paths[1], self.skip_invalid, self.dropped)
        kept = 0
        for s, t in raw:
            s, t = s.strip(), t.strip()
            if not s or not t:
                self.dropped["empty side"] += 1
                continue
            yield s, t
            kept += 1
            if kept == self.corpus.max_pairs:
                return

    def line_estimate(self) -> Optional[int]:
        """About how many pairs iterating gives, without reading them: the source file's lines
        or the dataset's rows (lines dropped while reading are still counted); None for a
        streamed dataset. For progress bars."""
        if self._dataset is not None:
            try:
                found = len(self._dataset)
            except TypeError:
                return None
        else:
            found = count_lines(self.paths[0]) if self.paths[0].suffix != ".gz" else _gzip_lines(self.paths[0])
        return min(found, self.corpus.max_pairs) if self.corpus.max_pairs else found

    def lead_tags(self) -> list[str]:
        """The pieces that lead every source line: the target-language tag of a multilingual
        model, then the corpus's own (data.train[i].tag, e.g. <bt> for back-translations)."""
        return [tag for tag in (self.tag, self.corpus.tag) if tag is not None]

    def side_key(self, side: int) -> str:
        """Names the text of one side (0 source, 1 target) wherever it is read: the same file,
        or the same dataset column, read for two pairs gives the same key."""
        if self._dataset is not None:
            # where it is read from, not self.name: a multilingual run puts the pair's name before that
            src_column, tgt_column = self._columns  # the one column read for this side (each language's own)
            column = (src_column, tgt_column)[side] if tgt_column is not None else \
                f"{src_column}.{(self.src_lang, self.tgt_lang)[side]}"
            return f"{self._place}[{self.split}]|{column}"
        return str(self.paths[side].resolve())

    @property
    def files(self) -> tuple[Path, ...]:
        """The files read (source, target); none for a dataset."""
        return tuple(self.paths) if self._dataset is None else ()

    def side(self, side: int) -> Iterator[str]:
        """One side's sentences, as the pairs give them."""
        return (pair[side] for pair in self)

    def fingerprint(self) -> str:
        """Changes when the data changes: each file's content (``file_stamp``), or the dataset's own fingerprint."""
        h = hashlib.sha256()
        # where it is, not how the config spells it (./d.parquet and /abs/d.parquet: one cache)
        if isinstance(self._dataset, DataFiles):  # the files' bytes, not their times (datasets' own key)
            h.update(f"{self._place}[{self.split}]|{self._columns}|{self._dataset.stamps()}".encode())
        elif self._dataset is not None:
            h.update(f"{self._place}[{self.split}]|{self._columns}|{self._dataset._fingerprint}".encode())
        else:
            for path in self.paths:
                h.update(file_stamp(path).encode())
        h.update(f"{self.src_lang}>{self.tgt_lang}|{self.skip_invalid}".encode())
        if self.corpus.max_pairs:
            h.update(f"|first {self.corpus.max_pairs}".encode())
        return h.hexdigest()


def _place(corpus: CorpusConfig) -> str:
    """Where a dataset or data files corpus is, however the config spells it: the resolved files,
    the resolved folder of a dataset saved to disk, or the Hub name."""
    if corpus.data_files:
        return ",".join(str(path.resolve()) for path in data_file_paths(corpus.data_files))
    folder = Path(corpus.dataset or "")
    return str(folder.resolve()) if folder.is_dir() else str(corpus.dataset)


def _gzip_lines(path: Path) -> int:
    """A .gz file's lines as reading gives them (its compressed bytes' newlines are noise)."""
    with _Gzipped(path) as handle:
        return sum(1 for _ in handle)


def open_sources(corpora: Sequence[CorpusConfig], src_lang: str, tgt_lang: str, role: str,
                 skip_invalid: bool = False) -> list[PairSource]:
    return [PairSource(c, src_lang, tgt_lang, role, skip_invalid) for c in corpora]


def load_corpus(corpus: Optional[CorpusConfig], src_lang: str, tgt_lang: str, name: str, skip_invalid: bool = False,
                log: Optional[Callable[[str], None]] = None) -> Optional[ParallelCorpus]:
    """Read a small corpus (valid, test) whole."""
    if corpus is None:
        return None
    source = PairSource(corpus, src_lang, tgt_lang, name, skip_invalid)
    if source.notice and log is not None:
        log(source.notice)
    pairs = list(source)
    if not pairs:
        raise XformerError(f"{name} corpus {source.name} is empty after dropping empty pairs")
    return ParallelCorpus([s for s, _ in pairs], [t for _, t in pairs], source.dropped, name, source.name,
                          source.files)
