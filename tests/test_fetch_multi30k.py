"""scripts/fetch_multi30k.py on a stand-in of upstream's repository (gzip files under a local
folder, read through file:// URLs as the real https ones are): task 1 byte for byte, task 2's
captions made into the monolingual files, kept files kept, a failed download one line."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("fetch_multi30k", ROOT / "scripts" / "fetch_multi30k.py")
fetch_multi30k = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(fetch_multi30k)


def upstream(tmp_path: Path) -> str:
    """A data/ folder as multi30k/dataset has it, a few lines a file; its file:// URL."""
    data = tmp_path / "upstream" / "data"
    task1, task2 = data / "task1" / "raw", data / "task2" / "raw"
    task1.mkdir(parents=True)
    task2.mkdir(parents=True)
    for split in ("train", "val", *fetch_multi30k.HELD_OUT[1:]):
        for lang in fetch_multi30k.LANGUAGES:
            text = f"{split} {lang} one\n{split} {lang} two\u2028still two\n"  # a Unicode line break inside a line
            (task1 / f"{split}.{lang}.gz").write_bytes(gzip.compress(text.encode()))
    captions = {1: ["A dog runs.", "", "val de one", " A cat. "], 2: ["A dog runs.", "train de one", "A cat."],
                3: ["test_2017_mscoco de two\u2028still two"], 4: ["A bird."], 5: ["   "]}
    for k, lines in captions.items():
        for lang in ("de", "en"):
            text = "".join(line.replace(" de ", f" {lang} ") + "\n" for line in lines)
            (task2 / f"train.{k}.{lang}.gz").write_bytes(gzip.compress(text.encode()))
    return data.as_uri() + "/"


def test_task1_byte_for_byte_and_the_monolingual_captions_cleaned(tmp_path):
    base, out = upstream(tmp_path), tmp_path / "data"
    assert fetch_multi30k.main(["--out", str(out), "--base-url", base]) == 0
    folder = out / "multi30k"
    assert (folder / "test2016.cs").read_bytes() == gzip.decompress(
        (tmp_path / "upstream/data/task1/raw/test_2016_flickr.cs.gz").read_bytes())
    assert len((folder / "train.de").read_text(encoding="utf-8").split("\n")) == 3  # 2 lines: not split at U+2028
    # in order, stripped, once each; no empty line, no valid/test sentence (in any test set), mono.en none of train.en
    assert (folder / "mono.de").read_text(encoding="utf-8").split("\n") == ["A dog runs.", "A cat.", "train de one",
                                                                             "A bird.", ""]
    assert (folder / "mono.en").read_text(encoding="utf-8").split("\n") == ["A dog runs.", "A cat.", "A bird.", ""]


def test_files_there_are_kept_unless_forced_and_a_failed_download_is_one_line(tmp_path, capsys):
    base, out = upstream(tmp_path), tmp_path / "data"
    (out / "multi30k").mkdir(parents=True)
    (out / "multi30k" / "mono.de").write_text("mine\n", encoding="utf-8")
    assert fetch_multi30k.main(["--out", str(out), "--base-url", base]) == 0
    assert (out / "multi30k" / "mono.de").read_text(encoding="utf-8") == "mine\n"
    assert "kept " in capsys.readouterr().out
    assert fetch_multi30k.main(["--out", str(out), "--base-url", base, "--force"]) == 0
    assert (out / "multi30k" / "mono.de").read_text(encoding="utf-8").startswith("A dog runs.\n")
    (tmp_path / "upstream/data/task2/raw/train.3.de.gz").unlink()  # a download that fails midway
    (out / "multi30k" / "mono.de").unlink()
    assert fetch_multi30k.main(["--out", str(out), "--base-url", base]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: could not download ") and "train.3.de.gz" in error and "\n" not in error
    assert not (out / "multi30k" / "mono.de").exists()  # nothing half-written
    assert (out / "multi30k" / "train.de").exists()  # and what was written is kept


@pytest.mark.parametrize("corrupt", [b"not gzip at all", gzip.compress(b"\xff\xfe bad\n", mtime=0)],
                         ids=["not gzip", "not UTF-8"])
def test_a_damaged_download_is_one_line(tmp_path, capsys, corrupt):
    base = upstream(tmp_path)
    (tmp_path / "upstream/data/task2/raw/train.1.en.gz").write_bytes(corrupt)
    assert fetch_multi30k.main(["--out", str(tmp_path / "data"), "--base-url", base]) == 1
    error = capsys.readouterr().err.strip()
    assert "train.1.en" in error and ("not a whole gzip file" in error or "not UTF-8" in error) and "\n" not in error
