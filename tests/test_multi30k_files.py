"""The multi30k fixture on a fresh machine: without the shared folder, the text files are written
once from the config's fallback dataset (here a save_to_disk copy in the Hub's schema, so no
network), reused after that, never trusted half-written, and a failure is one line."""

import pytest
from datasets import Dataset, DatasetDict

from xformer_cli.errors import XformerError

from multi30k_files import SPLITS, cache_root, multi30k_dir, multi30k_or_fail

from helpers import write_lines

PAIRS = [(f"  A dog number {i} runs. ", f"Ein Hund Nummer {i} rennt.") for i in range(12)]
SPLIT_ROWS = {"train": PAIRS[:8], "validation": PAIRS[8:10], "test": PAIRS[10:]}
FILE_ROWS = {"train": PAIRS[:8], "valid": PAIRS[8:10], "test2016": PAIRS[10:]}


def hub_copy(path, splits=("train", "validation", "test")):
    """bentrevett/multi30k's schema: columns en and de, splits train / validation / test."""
    def table(rows):
        return Dataset.from_dict({"en": [s for s, _ in rows], "de": [t for _, t in rows]})

    DatasetDict({split: table(SPLIT_ROWS[split]) for split in splits}).save_to_disk(str(path))
    return str(path)


def test_files_are_written_from_the_fallback_then_reused(tmp_path):
    local, cache = tmp_path / "data" / "multi30k", tmp_path / "cache" / "multi30k"
    assert multi30k_dir(local, cache, fallback=hub_copy(tmp_path / "hub")) == cache
    for name, rows in FILE_ROWS.items():  # the library's cleaning: sides stripped
        assert (cache / f"{name}.en").read_text(encoding="utf-8").splitlines() == [s.strip() for s, _ in rows]
        assert (cache / f"{name}.de").read_text(encoding="utf-8").splitlines() == [t for _, t in rows]
    assert sorted(p.name for p in cache.parent.iterdir()) == ["multi30k"]  # no temporary folder left
    written = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    # Reused: a fallback that no longer exists is never read.
    assert multi30k_dir(local, cache, fallback=str(tmp_path / "gone")) == cache
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == written


def test_the_local_folder_wins_and_the_cache_is_not_written(tmp_path):
    local, cache = tmp_path / "data" / "multi30k", tmp_path / "cache" / "multi30k"
    local.mkdir(parents=True)
    write_lines(local / "train.en", ["A dog."])
    assert multi30k_dir(local, cache, fallback=str(tmp_path / "gone")) == local
    assert not cache.parent.exists()


def test_an_interrupted_write_is_never_trusted(tmp_path):
    local, cache = tmp_path / "data" / "multi30k", tmp_path / "cache" / "multi30k"
    with pytest.raises(XformerError, match="has no split 'test'"):  # fails after train and valid were written
        multi30k_dir(local, cache, fallback=hub_copy(tmp_path / "partial", splits=("train", "validation")))
    assert not cache.exists() and list(cache.parent.iterdir()) == []
    assert multi30k_dir(local, cache, fallback=hub_copy(tmp_path / "hub")) == cache
    assert all((cache / f"{name}.{lang}").is_file() for _, name in SPLITS for lang in ("en", "de"))


def test_neither_the_folder_nor_the_fallback_is_one_line_saying_how_to_set_xformer_data(tmp_path):
    local, cache = tmp_path / "data" / "multi30k", tmp_path / "cache" / "multi30k"
    with pytest.raises(pytest.fail.Exception) as info:
        multi30k_or_fail(local, cache, fallback=str(tmp_path / "gone"))
    message = str(info.value)
    assert "\n" not in message and str(local / "train.en") in message
    assert "Set XFORMER_DATA to the folder that holds multi30k/" in message
    assert not cache.exists()


def test_the_cache_folder_is_chosen_by_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("XFORMER_TEST_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    monkeypatch.delenv("XFORMER_TEST_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "xformer" / "test-data"
