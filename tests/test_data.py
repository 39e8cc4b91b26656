import gzip

import numpy as np
import pytest

from xformer_cli.data.batching import collate, collate_flat, make_batches
from xformer_cli.config import CorpusConfig
from xformer_cli.data.sources import load_corpus
from xformer_cli.errors import XformerError

from helpers import write_lines


def read_whole(src, tgt, name: str = "train"):
    """Two aligned files read whole, as a valid or test set is (data.sources.load_corpus)."""
    return load_corpus(CorpusConfig(src=str(src), tgt=str(tgt)), "en", "de", name)


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    src = write_lines(tmp_path / "a.en", ["one", "two", "three"])
    tgt = write_lines(tmp_path / "a.de", ["eins", "zwei"])
    with pytest.raises(XformerError) as info:
        read_whole(src, tgt)
    assert str(info.value) == f"line counts differ: {src} has 3 lines, {tgt} has 2"


def test_empty_sides_are_dropped_and_counted(tmp_path):
    src = write_lines(tmp_path / "a.en", ["one", "", "three", "four"])
    tgt = write_lines(tmp_path / "a.de", ["eins", "zwei", "  ", "vier"])
    corpus = read_whole(src, tgt, name="train")
    assert corpus.src == ["one", "four"] and corpus.tgt == ["eins", "vier"]
    assert corpus.dropped["empty side"] == 2
    assert corpus.report() == "train: 2 pairs (dropped 2 empty side)"


def test_invalid_utf8_names_file_and_line(tmp_path):
    src = tmp_path / "a.en"
    src.write_bytes(b"fine\nbad \xff byte\n")
    tgt = write_lines(tmp_path / "a.de", ["gut", "schlecht"])
    with pytest.raises(XformerError, match=rf"{src}:2: invalid UTF-8"):
        read_whole(src, tgt)


def test_gzip_files_read_like_plain_ones(tmp_path):
    with gzip.open(tmp_path / "a.en.gz", "wt", encoding="utf-8") as handle:
        handle.write("hello\nworld\n")
    tgt = write_lines(tmp_path / "a.de", ["hallo", "welt"])
    assert read_whole(tmp_path / "a.en.gz", tgt).src == ["hello", "world"]


def test_batches_respect_max_tokens_and_cover_every_example_once():
    rng = np.random.default_rng(0)
    src_lens, tgt_lens = rng.integers(1, 60, 2000), rng.integers(1, 60, 2000)
    batches = make_batches(src_lens, tgt_lens, max_tokens=500, seed=3, epoch=1)
    for b in batches:
        assert len(b) * (max(src_lens[b].max(), tgt_lens[b].max()) + 1) <= 500
    assert sorted(np.concatenate(batches).tolist()) == list(range(2000))
    real = (src_lens + 1).sum()
    slots = sum(len(b) * (src_lens[b].max() + 1) for b in batches)
    assert real / slots > 0.85  # sorting by length keeps padding low, on the source side first


def test_batches_are_sorted_by_source_length_first():
    """The source side is the one sorted first (target-first batches, each of one target
    length, cost BLEU under beam search): with lengths that correlate as a corpus's do, its
    padding is the smaller, and the target side's stays small."""
    rng = np.random.default_rng(0)
    src_lens = rng.integers(3, 40, 5000)
    tgt_lens = np.maximum(1, src_lens + rng.integers(-4, 5, 5000))
    batches = make_batches(src_lens, tgt_lens, max_tokens=1000, seed=1, epoch=0)
    efficiency = {side: (lens + 1).sum() / sum(len(b) * (lens[b].max() + 1) for b in batches)
                  for side, lens in (("src", src_lens), ("tgt", tgt_lens))}
    assert efficiency["src"] > 0.98 and efficiency["src"] > efficiency["tgt"] + 0.03 and efficiency["tgt"] > 0.85


def test_batch_order_is_seeded():
    lens = np.arange(1, 301) % 37 + 1
    a = make_batches(lens, lens, 200, seed=1, epoch=1)
    b = make_batches(lens, lens, 200, seed=1, epoch=1)
    c = make_batches(lens, lens, 200, seed=1, epoch=2)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert [x.tolist() for x in a] != [x.tolist() for x in c]


def test_collate_adds_bos_eos_and_counts_target_tokens():
    batch = collate([[5, 6], [7]], [[8, 9, 10], [11]])
    assert batch.src.tolist() == [[5, 6, 3], [7, 3, 0]]
    assert batch.tgt_in.tolist() == [[2, 8, 9, 10], [2, 11, 0, 0]]
    assert batch.tgt_out.tolist() == [[8, 9, 10, 3], [11, 3, 0, 0]]
    assert batch.n_tokens == 6


def test_flat_collate_equals_the_list_collate():
    rng = np.random.default_rng(2)
    seqs_src = [rng.integers(4, 100, rng.integers(1, 9)).tolist() for _ in range(30)]
    seqs_tgt = [rng.integers(4, 100, rng.integers(1, 9)).tolist() for _ in range(30)]
    flat_src = np.array([t for s in seqs_src for t in s], dtype=np.uint16)
    flat_tgt = np.array([t for s in seqs_tgt for t in s], dtype=np.uint16)
    off_src = np.concatenate([[0], np.cumsum([len(s) for s in seqs_src])])
    off_tgt = np.concatenate([[0], np.cumsum([len(s) for s in seqs_tgt])])
    pick = np.array([3, 17, 0, 29, 8])
    fast = collate_flat(flat_src, off_src, flat_tgt, off_tgt, pick)
    slow = collate([seqs_src[i] for i in pick], [seqs_tgt[i] for i in pick])
    for name in ("src", "tgt_in", "tgt_out"):
        assert getattr(fast, name).tolist() == getattr(slow, name).tolist(), name
    assert fast.n_tokens == slow.n_tokens
