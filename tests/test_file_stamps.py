"""A file's identity in the fingerprints (token cache, tokenizer, pipeline stages) is its bytes:
new modification times (a data folder copied or provisioned again) keep what was made from it,
a rewrite does not, and what versions before content hashes made is recognised once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import pairs_sets, write_lines
from xformer_cli.config import load_config
from xformer_cli.errors import XformerError
from xformer_cli.file_stamps import file_stamp, stamps_by_time


def _new_times(*paths: Path) -> None:
    for path in paths:
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns + 7 * 10**9, stat.st_mtime_ns + 7 * 10**9))


def test_new_times_keep_a_files_stamp_and_a_rewrite_of_the_same_size_and_time_does_not(tmp_path):
    corpus = tmp_path / "train.de"
    corpus.write_text("Ein Hund.\n", encoding="utf-8")
    first = file_stamp(corpus)
    _new_times(corpus)
    assert file_stamp(corpus) == first
    mtime = corpus.stat().st_mtime_ns
    corpus.write_text("Ein Hut.!\n", encoding="utf-8")  # the same size, its time put back
    os.utime(corpus, ns=(mtime, mtime))
    assert file_stamp(corpus) != first
    with stamps_by_time():
        assert file_stamp(corpus) == f"{corpus.resolve()}|10|{mtime}"  # where size and time saw no change
    assert file_stamp(corpus).startswith(f"{corpus.resolve()}|10|sha256:")


def test_stamps_by_time_are_the_earlier_versions_form_and_a_missing_file_is_one_line(tmp_path):
    corpus = tmp_path / "train.de"
    corpus.write_text("Ein Hund.\n", encoding="utf-8")
    with stamps_by_time():
        assert file_stamp(corpus) == f"{corpus.resolve()}|10|{corpus.stat().st_mtime_ns}"
    assert "sha256:" in file_stamp(corpus)  # only inside
    with pytest.raises(XformerError, match="file not found: .*gone.de"):
        file_stamp(tmp_path / "gone.de")


PAIRS = [(f"A dog runs {i} times.", f"Ein Hund rennt {i} Mal.") for i in range(40)]


def _prepared(sets: list[str]) -> tuple[object, list[str]]:
    from xformer_cli.data.prepare import prepare_data

    said: list[str] = []
    return prepare_data(load_config(None, sets), said.append), said


def test_the_tokenizer_and_token_cache_stay_through_new_times_and_go_with_new_text(tmp_path):
    sets = pairs_sets(tmp_path, PAIRS)
    first, _ = _prepared(sets)
    _new_times(tmp_path / "t.en", tmp_path / "t.de")
    again, said = _prepared(sets)
    assert again.cache_reused and again.train.directory == first.train.directory
    assert any(line.startswith("tokenizer: reusing") for line in said)
    write_lines(tmp_path / "t.de", [tgt for _, tgt in PAIRS[:-1]] + ["Ein Hund rennt nie."])
    changed, said = _prepared(sets)
    assert not changed.cache_reused and not any(line.startswith("tokenizer: reusing") for line in said)


def test_a_tokenizer_and_cache_made_before_content_hashes_are_taken_over_not_made_again(tmp_path):
    sets = pairs_sets(tmp_path, PAIRS)
    with stamps_by_time():  # as an earlier version made them
        old, _ = _prepared(sets)
    settings = tmp_path / "run" / "tokenizer" / "settings.json"
    old_settings = settings.read_text(encoding="utf-8")
    now, said = _prepared(sets)
    assert now.cache_reused and any(line.startswith("tokenizer: reusing") for line in said)
    assert now.train.directory != old.train.directory and not old.train.directory.exists()  # moved to its new key
    assert len(now.train) == len(PAIRS)
    assert settings.read_text(encoding="utf-8") != old_settings  # written anew, as this version writes it
    _new_times(tmp_path / "t.en", tmp_path / "t.de")  # from now on the bytes count, not the times
    later, _ = _prepared(sets)
    assert later.cache_reused and later.train.directory == now.train.directory
