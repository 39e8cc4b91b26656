"""Reading parallel corpora: validate, drop what cannot be used, say what was dropped."""

from __future__ import annotations

import gzip
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from xformer_cli.config import CorpusConfig
from xformer_cli.errors import XformerError


@dataclass
class ParallelCorpus:
    src: list[str]
    tgt: list[str]
    dropped: Counter = field(default_factory=Counter)  # reason -> count
    name: str = ""

    def __len__(self) -> int:
        return len(self.src)

    def report(self) -> str:
        kept = f"{self.name}: {len(self)} pairs"
        if not self.dropped:
            return kept
        return kept + " (dropped " + ", ".join(f"{n} {why}" for why, n in sorted(self.dropped.items())) + ")"


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


def read_lines(path: Path) -> Iterator[str]:
    """Lines without their newline; invalid UTF-8 is an error naming file and line."""
    if not path.is_file():
        raise XformerError(f"file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                yield raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise XformerError(f"{path}:{number}: invalid UTF-8 ({exc.reason} at byte {exc.start})") from None


def read_parallel(src_path: Path, tgt_path: Path, name: str = "") -> ParallelCorpus:
    """Read aligned files; mismatched line counts are an error, empty sides are dropped."""
    src_lines = list(read_lines(src_path))
    tgt_lines = list(read_lines(tgt_path))
    if len(src_lines) != len(tgt_lines):
        raise XformerError(
            f"line counts differ: {src_path} has {len(src_lines)} lines, {tgt_path} has {len(tgt_lines)}"
        )
    corpus = ParallelCorpus([], [], name=name or str(src_path))
    for s, t in zip(src_lines, tgt_lines):
        s, t = s.strip(), t.strip()
        if not s or not t:
            corpus.dropped["empty side"] += 1
            continue
        corpus.src.append(s)
        corpus.tgt.append(t)
    return corpus


def load_corpus(corpus: Optional[CorpusConfig], src_lang: str, tgt_lang: str, name: str) -> Optional[ParallelCorpus]:
    if corpus is None:
        return None
    src_path, tgt_path = corpus_paths(corpus, src_lang, tgt_lang)
    loaded = read_parallel(src_path, tgt_path, name=name)
    if len(loaded) == 0:
        raise XformerError(f"{name} corpus is empty after dropping empty pairs: {src_path}, {tgt_path}")
    return loaded
