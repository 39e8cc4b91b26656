"""The lexical shortlist of a CTranslate2 export: which target pieces each source piece lists,
the vocabulary map written for CTranslate2, and an export's search kept to the candidates."""

import json
import random

import pytest

from xformer_cli.errors import XformerError
from xformer_cli.export.shortlist import (VMAP_FILE, ShortlistSettings, build_shortlist, candidates,
                                          write_vmap)
from xformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

from helpers import head, tiny_checkpoint

WORDS = {"dog": "Hund", "cat": "Katze", "man": "Mann", "woman": "Frau", "red": "rot", "blue": "blau",
         "runs": "rennt", "sleeps": "schläft", "house": "Haus", "tree": "Baum"}


def _pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Word-for-word pairs: each English word always comes with its German one."""
    rng = random.Random(seed)
    english = list(WORDS)
    pairs = []
    for _ in range(n):
        words = rng.sample(english, 4)
        pairs.append((" ".join(words), " ".join(WORDS[w] for w in words)))
    return pairs


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    pairs = _pairs(400)
    return Tokenizer.train([s for s, _ in pairs], [t for _, t in pairs], joint=True, vocab_size=60)


def _piece(tokenizer: Tokenizer, word: str) -> int:
    (piece,) = [i for i in tokenizer.encode_src([word])[0] if i != EOS_ID]
    return piece


def test_a_source_piece_lists_the_target_pieces_that_come_with_it_first(tokenizer):
    found = build_shortlist(tokenizer, _pairs(300), ShortlistSettings(per_source=3, frequent=5))
    assert found.pairs == 300
    for english, german in (("dog", "Hund"), ("tree", "Baum"), ("sleeps", "schläft")):
        listed = found.by_source[_piece(tokenizer, english)]
        assert len(listed) <= 3
        assert tokenizer.tgt.id_to_piece(listed[0]) == tokenizer.tgt.id_to_piece(_piece(tokenizer, german))
    assert len(found.frequent) == 5
    every = set(found.frequent).union(*found.by_source.values())
    assert not every & {PAD_ID, BOS_ID, EOS_ID, UNK_ID}  # never emitted, or kept by CTranslate2 anyway


def test_max_pairs_bounds_what_is_counted_and_bad_settings_are_refused(tokenizer):
    assert build_shortlist(tokenizer, _pairs(300), ShortlistSettings(max_pairs=50)).pairs == 50
    with pytest.raises(XformerError, match="per_source >= 1"):
        build_shortlist(tokenizer, _pairs(10), ShortlistSettings(per_source=0))
    with pytest.raises(XformerError, match="no training pairs"):
        build_shortlist(tokenizer, [], ShortlistSettings())
    # A side that encodes to no pieces counts as a pair with nothing to list.
    assert build_shortlist(tokenizer, _pairs(20) + [("dog", ""), ("", "Hund")], ShortlistSettings()).pairs == 22
    assert build_shortlist(tokenizer, [("", "")], ShortlistSettings()).by_source == {}


def test_the_vocabulary_map_is_ctranslate2s_format(tokenizer, tmp_path):
    found = build_shortlist(tokenizer, _pairs(300), ShortlistSettings(per_source=2, frequent=4))
    write_vmap(tmp_path / VMAP_FILE, found, tokenizer)
    lines = (tmp_path / VMAP_FILE).read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("\t") and len(lines[0].split("\t")[1].split(" ")) == 4  # every batch's candidates
    rows = dict(line.split("\t") for line in lines[1:])
    assert len(rows) == len(found.by_source)
    dog = tokenizer.src.id_to_piece(_piece(tokenizer, "dog"))
    assert rows[dog].split(" ") == [tokenizer.tgt.id_to_piece(t) for t in found.by_source[_piece(tokenizer, "dog")]]


@pytest.mark.slow
def test_an_export_with_a_shortlist_searches_only_its_candidates(multi30k, tmp_path):
    pytest.importorskip("ctranslate2")
    from xformer_cli.decode.ct2_engine import CTranslate2Translator
    from xformer_cli.export.common import load_for_export
    from xformer_cli.export.ctranslate2 import export_ctranslate2

    checkpoint = tiny_checkpoint(multi30k, tmp_path / "last.pt", pairs=30, steps=100)
    loaded = load_for_export(checkpoint, "CTranslate2")
    tokenizer, pairs = loaded[1], list(zip(head(multi30k / "train.en", 30), head(multi30k / "train.de", 30)))
    sentences = [s for s, _ in pairs]
    full = CTranslate2Translator.from_directory(export_ctranslate2(checkpoint, tmp_path / "full", loaded=loaded))
    assert not full.shortlist
    expected = full.translate(sentences, beam_size=1)

    wide = build_shortlist(tokenizer, pairs, ShortlistSettings(per_source=300, frequent=300))
    listed = CTranslate2Translator.from_directory(
        export_ctranslate2(checkpoint, tmp_path / "wide", loaded=loaded, shortlist=wide))
    assert listed.shortlist and listed.translate(sentences, beam_size=1) == expected  # every piece a candidate

    narrow = build_shortlist(tokenizer, pairs, ShortlistSettings(per_source=1, frequent=0))
    out = export_ctranslate2(checkpoint, tmp_path / "narrow", loaded=loaded, shortlist=narrow)
    info = json.loads((out / "xformer_export.json").read_text())
    assert info["shortlist"] == {"per_source": 1, "frequent": 0, "max_pairs": 1_000_000, "pairs": 30,
                                 "file": VMAP_FILE}
    engine = CTranslate2Translator.from_directory(out)
    opts = engine.options(beam_size=1)
    changed = 0
    for sentence, before in zip(sentences, expected):
        (hyp,) = engine.search([sentence], opts)[0][:1]  # one sentence a batch: its own candidates
        allowed = candidates(narrow, tokenizer.encode_src([sentence])[0])
        assert set(hyp.tokens) <= allowed
        changed += engine.detokenize(hyp) != before
    assert changed > 0  # one candidate a source piece is too few for these sentences


@pytest.mark.slow
def test_xformer_export_shortlist_counts_the_checkpoints_training_data(multi30k, tmp_path):
    pytest.importorskip("ctranslate2")
    from helpers import xformer

    checkpoint = tiny_checkpoint(multi30k, tmp_path / "last.pt", pairs=30, steps=0)
    proc = xformer("export", "-m", checkpoint, "-o", tmp_path / "ct2", "--shortlist", "--shortlist-per-source", "5")
    assert proc.returncode == 0, proc.stderr.decode()
    info = json.loads((tmp_path / "ct2" / "xformer_export.json").read_text())
    pairs = sum(1 for line in (multi30k / "train.en").read_text(encoding="utf-8").splitlines() if line.strip())
    assert info["shortlist"]["per_source"] == 5 and info["shortlist"]["pairs"] == min(pairs, 1_000_000)
    assert (tmp_path / "ct2" / VMAP_FILE).is_file() and "shortlist:" in proc.stderr.decode()
    for args, said in ((["--format", "huggingface", "--shortlist"], "--shortlist is for --format ctranslate2"),
                       (["--shortlist", "--shortlist-per-source", "0"], "per_source >= 1"),
                       (["--shortlist-per-source", "-5"], "size the shortlist: give --shortlist too")):
        proc = xformer("export", "-m", checkpoint, "-o", tmp_path / "refused", *args)
        assert proc.returncode != 0 and said in proc.stderr.decode() and "Traceback" not in proc.stderr.decode()
        assert not (tmp_path / "refused").exists()
    proc = xformer("export", "-m", checkpoint, "-o", tmp_path / "ct2", "--shortlist")  # not empty: refused first
    assert proc.returncode != 0 and "is not empty" in proc.stderr.decode() and "shortlist:" not in proc.stderr.decode()
    assert (tmp_path / "ct2" / VMAP_FILE).is_file()  # the earlier export is untouched


def test_the_training_pairs_take_turns_between_corpora(tmp_path):
    from xformer_cli.config import CorpusConfig, DataConfig
    from xformer_cli.data.directions import training_pairs

    for name, n in (("big", 5), ("small", 2)):
        (tmp_path / f"{name}.en").write_text("".join(f"{name} {i}\n" for i in range(n)))
        (tmp_path / f"{name}.de").write_text("".join(f"{name} {i} de\n" for i in range(n)))
    data = DataConfig(train=[CorpusConfig(prefix=str(tmp_path / "big")), CorpusConfig(prefix=str(tmp_path / "small"))])
    got = [s for s, _ in training_pairs(data, lambda _: None)]
    assert got == ["big 0", "small 0", "big 1", "small 1", "big 2", "big 3", "big 4"]  # a cap keeps both corpora
