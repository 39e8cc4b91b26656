"""The tokenized corpus on disk: built once per fingerprint, memory-mapped by every run.

Layout of ``<cache_dir>/<fingerprint>/``::

    src.bin, tgt.bin              token ids of every kept pair, back to back (uint16 or uint32)
    src.offsets.npy, tgt.offsets.npy   int64, n + 1 entries: pair i is bin[off[i]:off[i+1]]
    meta.json                     counts, what was dropped and why, what went into the fingerprint,
                                  the pairs kept from each source in order (``source_pairs``), and
                                  a hash of the ids (``content``: what a resumed run compares)

The fingerprint covers the data (each file's content hash, or the dataset's fingerprint), the
tokenizer model bytes and the filters, so any change builds a new cache and an unchanged
setup reuses the old one without tokenizing again. A build writes into a temporary
directory that is fsynced and renamed into place at the end (``fileio.atomic_directory``):
an interrupted build leaves nothing a later run would trust. Memory stays flat: pairs
stream in chunks, ids go straight to disk.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

import numpy as np

from xformer_cli.data.batching import Batch, collate_flat
from xformer_cli.data.concatenation import CONCATENATION_VERSION, with_concatenated
from xformer_cli.data.number_augmentation import AUGMENTATION_VERSION, with_augmented
from xformer_cli.data.number_filter import FILTER_VERSION, without_number_mismatch
from xformer_cli.data.quote_augmentation import QUOTE_AUGMENTATION_VERSION, quoted_spans, with_quotes_copied
from xformer_cli.data.sources import PairSource, describe
from xformer_cli.cpu_cores import available_cores
from xformer_cli.errors import XformerError
from xformer_cli.file_stamps import stamps_by_time
from xformer_cli.fileio import atomic_directory, make_folder, writing
from xformer_cli.tokenizer import Tokenizer

FORMAT_VERSION = 1
CHUNK_PAIRS = 50_000


# Fields a cache key holds only when set, each with the version of its rules
VERSIONED_FIELDS = (("drop_number_mismatch", "number_filter_version", FILTER_VERSION),
                    ("concat_augmentation", "concatenation_version", CONCATENATION_VERSION),
                    ("number_augmentation", "number_augmentation_version", AUGMENTATION_VERSION),
                    ("quote_augmentation", "quote_augmentation_version", QUOTE_AUGMENTATION_VERSION))


@dataclass(frozen=True)
class Filters:
    """What the cache keeps and adds besides the pairs as read."""

    max_len: int = 256  # pieces per side
    max_len_ratio: float = 0.0  # 0 = off
    dedup: bool = False
    number_augmentation: float = 0.0  # data.number_augmentation (data/number_augmentation.py)
    seed: int = 1  # which pairs it copies, joins, and the digits it draws
    concat_augmentation: float = 0.0  # data.concat_augmentation (data/concatenation.py)
    drop_number_mismatch: bool = False  # data.drop_number_mismatch (data/number_filter.py)
    quote_augmentation: float = 0.0  # data.quote_augmentation (data/quote_augmentation.py)

    def key(self) -> dict:
        """What the fingerprint takes: without augmentation or the number filter, the fields a
        cache always had (so caches built before them are still found); with one, the version
        of its rules."""
        fields = asdict(self)
        for name, version_key, version in VERSIONED_FIELDS:
            if getattr(self, name):
                fields[version_key] = version
            else:
                del fields[name]
        if not (self.number_augmentation or self.concat_augmentation or self.quote_augmentation):
            del fields["seed"]
        return fields

    def augmented(self, chunk: list[tuple[str, str]], src_lang: str, tgt_lang: str,
                  rng: random.Random) -> tuple[list[tuple[str, str]], Counter]:
        """The chunk with its number copies and its quote copies, both of the pairs as read (a
        quote's digits are text to copy, not a number to write as each language does: with
        quote copies on, number copies leave them alone), then its joined copies (which may
        join number copies: long lines with numbers); and how many of each were added."""
        added: Counter = Counter()
        read = len(chunk)
        if self.number_augmentation:
            leave = quoted_spans if self.quote_augmentation else None
            chunk, added["numbers"] = with_augmented(chunk, self.number_augmentation, src_lang, tgt_lang, rng, leave)
        if self.quote_augmentation:
            quoted, added["quotes"] = with_quotes_copied(chunk[:read], self.quote_augmentation, rng)
            chunk = chunk + quoted[read:]
        if self.concat_augmentation:
            chunk, added["joined"] = with_concatenated(chunk, self.concat_augmentation, rng)
        return chunk, added


def fingerprint(sources: Sequence[PairSource], tokenizer: Tokenizer, filters: Filters) -> str:
    h = hashlib.sha256(f"xformer-cache-v{FORMAT_VERSION}".encode())
    for source in sources:
        h.update(source.fingerprint().encode())
        for tag in source.lead_tags():  # the first source pieces of every pair (language tag, corpus tag)
            h.update(f"tag {tag}".encode())
    h.update(hashlib.sha256(tokenizer.src_model_bytes).digest())
    h.update(hashlib.sha256(tokenizer.tgt_model_bytes or b"joint").digest())
    for pieces in (tokenizer.vocab, tokenizer.tgt_vocab):  # vocab.json id spaces (imported models)
        if pieces is not None:
            h.update(hashlib.sha256("\n".join(pieces).encode()).digest())
    h.update(json.dumps(filters.key(), sort_keys=True).encode())
    return h.hexdigest()[:20]


class CacheDamaged(Exception):
    """A cache directory whose files do not fit together (cut off, edited, half copied)."""


class TokenCache:
    """Read side: memory-mapped ids and per-pair lengths; ``batch`` builds padded tensors."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        try:
            self.meta = json.loads((self.directory / "meta.json").read_text(encoding="utf-8"))
            dtype = np.dtype(self.meta["dtype"])
            self.src_offsets = np.load(self.directory / "src.offsets.npy", mmap_mode="r")
            self.tgt_offsets = np.load(self.directory / "tgt.offsets.npy", mmap_mode="r")
            self.src_ids = _memmap(self.directory / "src.bin", dtype)
            self.tgt_ids = _memmap(self.directory / "tgt.bin", dtype)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CacheDamaged(f"{type(exc).__name__}: {str(exc)[:80]}") from None
        for side, offsets, ids in (("src", self.src_offsets, self.src_ids), ("tgt", self.tgt_offsets, self.tgt_ids)):
            if offsets.ndim != 1 or len(offsets) != len(self.src_offsets) or len(offsets) == 0 or offsets[0] != 0 \
                    or offsets[-1] != len(ids) or np.any(np.diff(offsets) < 0):
                raise CacheDamaged(f"{side}.bin holds {len(ids)} ids, which its offsets do not describe")
        self.src_lens = np.diff(self.src_offsets).astype(np.int32)
        self.tgt_lens = np.diff(self.tgt_offsets).astype(np.int32)

    def __len__(self) -> int:
        return len(self.src_lens)

    @property
    def content(self) -> str:
        """The hash of the ids (``_content_hash``); "" in a cache built before it was recorded."""
        return self.meta.get("content", "")

    @property
    def source_pairs(self) -> Optional[list[int]]:
        """Pairs kept from each source, in order (the cache holds them back to back); None
        in a cache built before it was recorded."""
        return self.meta.get("source_pairs")

    def batch(self, indices: Iterable[int]) -> Batch:
        return collate_flat(self.src_ids, self.src_offsets, self.tgt_ids, self.tgt_offsets, np.asarray(indices))


def _memmap(path: Path, dtype: np.dtype) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def _chunks(pairs: Iterator[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    while True:
        chunk = list(itertools.islice(pairs, size))
        if not chunk:
            return
        yield chunk


def _flat(ids: Sequence[Sequence[int]], dtype: np.dtype, total: int) -> np.ndarray:
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=total)


def build_or_load(
    sources: Sequence[PairSource],
    tokenizer: Tokenizer,
    filters: Filters,
    cache_dir: str | Path,
    log: Callable[[str], None] = print,
    threads: int = 0,
    per_source: bool = False,
) -> tuple[TokenCache, bool]:
    """Returns the cache for this (data, tokenizer, filters) and whether it was reused.
    ``per_source``: the caller needs ``source_pairs`` (per-corpus weights), so a cache built
    before they were recorded is built again in its place."""
    cache_dir = Path(cache_dir)
    key = fingerprint(sources, tokenizer, filters)
    final = cache_dir / key
    outdated = False
    if not (final / "meta.json").is_file():
        _adopt_cache_keyed_by_time(sources, tokenizer, filters, final)
    if (final / "meta.json").is_file():
        try:
            cache = TokenCache(final)
        except CacheDamaged as why:
            log(f"cache: {final} is damaged ({why}); building it again")
            outdated = True
        else:
            if not per_source or cache.source_pairs is not None:
                return cache, True
            outdated = True
    make_folder(cache_dir, "the token cache (data.cache_dir)")
    _remove_abandoned_builds(cache_dir, key)
    building = f".{key}.building-{os.getpid()}"
    shutil.rmtree(cache_dir / building, ignore_errors=True)
    intact = "the partial cache was removed; nothing else was touched"
    try:
        with writing(final, intact=intact), atomic_directory(final, staging_name=building, replace=outdated) as tmp:
            meta = _build(sources, tokenizer, filters, tmp, log, threads)
            meta["fingerprint"] = key
            meta["content"] = _content_hash(tmp)
            _write_meta(tmp / "meta.json", meta)  # written last: its presence marks a finished build
    except FileExistsError:  # another process finished the same build first: use theirs
        if not (final / "meta.json").is_file():
            raise
    return TokenCache(final), False


def _adopt_cache_keyed_by_time(sources: Sequence[PairSource], tokenizer: Tokenizer, filters: Filters,
                               final: Path) -> None:
    """A cache of these very files built before file stamps hashed content (its key made of
    sizes and modification times) moves to ``final``, its key now, instead of being built again."""
    with stamps_by_time():
        old = final.with_name(fingerprint(sources, tokenizer, filters))
    if old == final or not (old / "meta.json").is_file():
        return
    try:  # its meta.json keeps the key it was built under: nothing reads it but a person
        os.rename(old, final)
    except OSError:
        pass  # another run moved or built it first, or it cannot move: found or built as usual


def _content_hash(folder: Path) -> str:
    """The built ids' hash: the same pairs give the same one from files at any path (the key
    names the paths), which is what a resumed run compares (``TokenCache.content``)."""
    digest = hashlib.blake2b(digest_size=10)
    for name in ("src.offsets.npy", "tgt.offsets.npy", "src.bin", "tgt.bin"):
        with open(folder / name, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _remove_abandoned_builds(cache_dir: Path, key: str) -> None:
    for stale in cache_dir.glob(f".{key}.building-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and _alive(int(pid)):
            continue
        shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_meta(path: Path, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)


def _build(sources, tokenizer: Tokenizer, filters: Filters, out: Path, log, threads: int) -> dict:
    started = time.time()
    dtype = np.dtype(np.uint16 if max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size) <= 65535 else np.uint32)
    threads = threads or available_cores()  # the cores this process may use, not the machine's
    dropped: Counter = Counter()
    seen: set[int] = set()
    src_lens: list[np.ndarray] = []
    tgt_lens: list[np.ndarray] = []
    read = 0
    augmented: Counter = Counter()
    source_pairs: list[int] = []
    with open(out / "src.bin", "wb") as fs, open(out / "tgt.bin", "wb") as ft:
        for index, source in enumerate(sources):
            source_pairs.append(0)
            tag = [tokenizer.tag_id(t) for t in source.lead_tags()] or None
            for number, chunk in enumerate(_chunks(iter(source), CHUNK_PAIRS)):
                read += len(chunk)
                chunk = _cleaned(chunk, source, filters, seen, dropped)
                chunk, added = filters.augmented(chunk, source.src_lang, source.tgt_lang,
                                                 random.Random(f"{filters.seed}:{index}:{number}"))
                augmented.update(added)
                src = tokenizer.src.encode([s for s, _ in chunk], num_threads=threads)
                if tag is not None:
                    src = [tag + ids if ids else ids for ids in src]
                tgt = tokenizer.tgt.encode([t for _, t in chunk], num_threads=threads)
                ls = np.fromiter(map(len, src), dtype=np.int64, count=len(src))
                lt = np.fromiter(map(len, tgt), dtype=np.int64, count=len(tgt))
                keep = _keep_mask(ls, lt, filters, dropped)
                if not keep.all():
                    idx = np.flatnonzero(keep).tolist()
                    src, tgt, ls, lt = [src[i] for i in idx], [tgt[i] for i in idx], ls[keep], lt[keep]
                _flat(src, dtype, int(ls.sum())).tofile(fs)
                _flat(tgt, dtype, int(lt.sum())).tofile(ft)
                src_lens.append(ls)
                tgt_lens.append(lt)
                source_pairs[-1] += len(ls)
            for reason, n in source.dropped.items():
                dropped[reason] += n
    all_src = np.concatenate(src_lens) if src_lens else np.zeros(0, np.int64)
    all_tgt = np.concatenate(tgt_lens) if tgt_lens else np.zeros(0, np.int64)
    if len(all_src) == 0:
        raise XformerError(describe("training data", 0, dropped) + ": nothing left to train on "
                           f"(check the files, data.max_len={filters.max_len} and data.max_len_ratio)")
    for name, lens in (("src", all_src), ("tgt", all_tgt)):
        np.save(out / f"{name}.offsets.npy", np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
    meta = {
        "format": FORMAT_VERSION, "dtype": dtype.name, "pairs": int(len(all_src)), "read": read,
        "dropped": dict(dropped), "src_tokens": int(all_src.sum()), "tgt_tokens": int(all_tgt.sum()),
        "sources": [s.name for s in sources], "source_pairs": source_pairs, "filters": asdict(filters),
        "seconds": round(time.time() - started, 2),
    }
    meta.update(_added_pairs(filters, augmented, log))
    log(f"cache: tokenized {describe('training data', meta['pairs'], dropped)} in {meta['seconds']:.1f}s")
    return meta


def _added_pairs(filters: Filters, added: Counter, log) -> dict:
    """What the augmentations added, for meta.json and said in a line each."""
    meta = {}
    if filters.number_augmentation:
        meta["number_augmented"] = added["numbers"]
        log(f"cache: {added['numbers']} pairs added with their shared numbers as random digits "
            "(data.number_augmentation)")
    if filters.quote_augmentation:
        meta["quote_augmented"] = added["quotes"]
        log(f"cache: {added['quotes']} pairs added with their quoted text as random words (data.quote_augmentation)")
    if filters.concat_augmentation:
        meta["joined"] = added["joined"]
        log(f"cache: {added['joined']} pairs added joined with another pair (data.concat_augmentation)")
    return meta


def _cleaned(chunk: list[tuple[str, str]], source: PairSource, filters: Filters, seen: set[int],
             dropped: Counter) -> list[tuple[str, str]]:
    """The chunk less the pairs the filters drop before tokenizing (each counted in ``dropped``)."""
    if filters.dedup:
        chunk = _drop_duplicates(chunk, seen, dropped, " ".join(source.lead_tags()) or None)
    if filters.drop_number_mismatch:
        chunk = without_number_mismatch(chunk, source.src_lang, source.tgt_lang, dropped)
    return chunk


def _drop_duplicates(chunk: list[tuple[str, str]], seen: set[int], dropped: Counter,
                     tag: Optional[str] = None) -> list[tuple[str, str]]:
    kept = []
    for pair in chunk:
        key = hash(pair if tag is None else (tag, *pair))  # salted per process, which is all one build needs
        if key in seen:
            dropped["duplicate"] += 1
            continue
        seen.add(key)
        kept.append(pair)
    return kept


def _keep_mask(ls: np.ndarray, lt: np.ndarray, filters: Filters, dropped: Counter) -> np.ndarray:
    keep = (ls > 0) & (lt > 0)
    dropped["empty after tokenization"] += int((~keep).sum())
    too_long = keep & ((ls > filters.max_len) | (lt > filters.max_len))
    dropped[f"longer than {filters.max_len} pieces"] += int(too_long.sum())
    keep &= ~too_long
    if filters.max_len_ratio:
        ratio = np.maximum(ls, lt) / np.maximum(np.minimum(ls, lt), 1)
        bad_ratio = keep & (ratio > filters.max_len_ratio)
        dropped[f"length ratio above {filters.max_len_ratio:g}"] += int(bad_ratio.sum())
        keep &= ~bad_ratio
    for reason in [r for r, n in dropped.items() if n == 0]:
        del dropped[reason]
    return keep
