"""Multi30k's text files for the tests on any machine: the shared folder where it is there,
else files written once into a cache from the dataset configs/multi30k.yaml falls back to
(the Hugging Face Hub copy), read through the library's own fallback (PairSource)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import pytest

from xformer_cli.config import load_config
from xformer_cli.data.sources import PairSource
from xformer_cli.errors import XformerError

from helpers import ROOT

SPLITS = (("train", "train"), ("valid", "valid"), ("test", "test2016"))  # config role, file name
LANGS = ("en", "de")


def cache_root() -> Path:
    """$XFORMER_TEST_CACHE, else xformer/test-data in the user's cache folder."""
    if os.environ.get("XFORMER_TEST_CACHE"):
        return Path(os.environ["XFORMER_TEST_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xformer" / "test-data"


def multi30k_dir(local: Path, cache: Path, fallback: Optional[str] = None) -> Path:
    """``local`` where it holds the corpus; else ``cache``, written the first time from the
    config's fallback dataset (``fallback`` replaces it, e.g. with a save_to_disk copy)."""
    if (local / "train.en").is_file():
        return local
    if not cache.is_dir():  # the directory appears only once complete (see write_from_fallback)
        write_from_fallback(local, cache, fallback)
    return cache


def write_from_fallback(local: Path, cache: Path, fallback: Optional[str] = None) -> None:
    """Read each split as training would on a machine without ``local``, and write
    train / valid / test2016 .en / .de into ``cache``: into a temporary sibling first, renamed
    into place when complete, so that an interrupted write is never taken for the corpus."""
    sets = [f"data.{role}.prefix={local / name}" for role, name in SPLITS]
    sets += [f"data.{role}.fallback_dataset={fallback}" for role, _ in SPLITS] if fallback else []
    data = load_config(ROOT / "configs" / "multi30k.yaml", sets).data
    corpora = {"train": data.train[0], "valid": data.valid, "test": data.test}
    cache.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{cache.name}.", suffix=".partial", dir=cache.parent))
    try:
        for role, name in SPLITS:
            source = PairSource(corpora[role], data.src_lang, data.tgt_lang, role)
            _write_pairs(source, building / name)
        try:
            building.rename(cache)
        except OSError:
            if not cache.is_dir():  # not a concurrent run that finished first: a real failure
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)


def _write_pairs(source: PairSource, prefix: Path) -> None:
    """prefix.en and prefix.de, one cleaned pair a line, flushed to the disk."""
    paths = [prefix.with_name(f"{prefix.name}.{lang}") for lang in LANGS]
    with open(paths[0], "w", encoding="utf-8") as src, open(paths[1], "w", encoding="utf-8") as tgt:
        for s, t in source:
            src.write(s + "\n")
            tgt.write(t + "\n")
        for handle in (src, tgt):
            handle.flush()
            os.fsync(handle.fileno())


def multi30k_or_fail(local: Path, cache: Path, fallback: Optional[str] = None) -> Path:
    """multi30k_dir, or the test fails with one line saying how to point at the corpus."""
    try:
        return multi30k_dir(local, cache, fallback)
    except (XformerError, OSError) as exc:
        why = " ".join(str(exc).split()).split("; set XFORMER_DATA")[0]  # said below, for the tests
    # Failed outside the except block: pytest would print the chained exception too.
    pytest.fail(f"Multi30k for the tests: {why}. Set XFORMER_DATA to the folder that holds multi30k/ "
                "(train, valid, test2016 .en/.de), or run the unit tests alone: python -m pytest -m 'not slow'",
                pytrace=False)
