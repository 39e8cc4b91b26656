"""Local data files (parquet, jsonl/json, tsv, csv): every value as written, every bad row named,
and the data known by its bytes."""

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xformer_cli.config import CorpusConfig
from xformer_cli.data.sources import PairSource
from xformer_cli.errors import XformerError


def pairs_of(path: Path, skip_invalid: bool = False, **columns) -> tuple[list, dict]:
    source = PairSource(CorpusConfig(data_files=str(path), **columns), "en", "de", skip_invalid=skip_invalid)
    return list(source), dict(source.dropped)


def test_text_formats_keep_every_value_as_written(tmp_path):
    """pandas read a lone carriage return inside a TSV field as a line end (the row cut in two, a
    half kept) and NA, None, null or nan as missing (the pair dropped as 'empty')."""
    tsv = tmp_path / "c.tsv"
    tsv.write_bytes(b'en\tde\nA man\rholds a sign.\tEin Mann h\xc3\xa4lt ein Schild.\nNA\tnull\nNone\tnan\n'
                    b'"quoted"\t"zitiert"\r\n')
    assert pairs_of(tsv) == ([("A man\rholds a sign.", "Ein Mann hält ein Schild."), ("NA", "null"),
                              ("None", "nan"), ('"quoted"', '"zitiert"')], {})
    csv_file = tmp_path / "c.csv"
    csv_file.write_bytes(b'\xef\xbb\xbfen,de\r\n"A, quoted","Ein ""Zitat"""\r\n\r\nN/A,x\r\n')
    assert pairs_of(csv_file) == ([("A, quoted", 'Ein "Zitat"'), ("N/A", "x")], {})
    array = tmp_path / "a.json"
    array.write_text(json.dumps([{"translation": {"en": "a dog", "de": "ein Hund"}}]), encoding="utf-8")
    assert pairs_of(array) == ([("a dog", "ein Hund")], {})


def test_a_glob_of_parquet_files_reads_them_in_order_and_their_columns_must_agree(tmp_path):
    pq.write_table(pa.table({"en": ["a", "b"], "de": ["x", None]}), tmp_path / "p-1.parquet")
    pq.write_table(pa.table({"en": ["c"], "de": ["z"]}), tmp_path / "p-2.parquet")
    assert pairs_of(tmp_path / "p-*.parquet") == ([("a", "x"), ("c", "z")], {"empty side": 1})
    assert len(PairSource(CorpusConfig(data_files=str(tmp_path / "p-*.parquet")), "en", "de")._dataset) == 3
    pq.write_table(pa.table({"en": ["d"], "fr": ["w"]}), tmp_path / "p-3.parquet")
    with pytest.raises(XformerError, match=r"p-3.parquet: columns en, fr differ from .*p-1.parquet's \(en, de\)$"):
        pairs_of(tmp_path / "p-*.parquet")


@pytest.mark.parametrize("name, content, message", [
    ("num.jsonl", '{"en": "a", "de": "b"}\n{"en": "1990", "de": 1990}\n', r"num.jsonl:2: column 'de' holds int \(1990\), not text$"),
    ("list.jsonl", '{"en": ["a"], "de": "b"}\n', r"list.jsonl:1: column 'en' holds list"),
    ("bad.jsonl", '{"en": "a", "de": "b"}\n{"en": oops}\n', r"bad.jsonl:2: not JSON \(Expecting value\)$"),
    ("row.jsonl", '["a", "b"]\n', r"row.jsonl:1: not a JSON object but list$"),
    ("lacks.jsonl", '{"en": "a", "de": "b"}\n{"en": "c"}\n', r"lacks.jsonl:2: no column 'de'$"),
    ("wmt.jsonl", '{"translation": {"en": "a", "de": "b"}}\n{"translation": "a dog"}\n',
     r"wmt.jsonl:2: column 'translation' holds str, not \{language: text\}$"),
    ("extra.tsv", "en\tde\na\tb\nc\td\te\n", r"extra.tsv:3: 3 fields, the header names 2 \(en, de\)$"),
    ("empty.tsv", "", r"empty.tsv is empty: a tsv file starts with a header line naming its columns$"),
    ("unquoted.csv", "en,de\na, b,c\n", r"unquoted.csv:2: 3 fields, the header names 2"),
])
def test_a_bad_row_is_one_line_naming_file_and_line(tmp_path, name, content, message):
    """These were tracebacks ('int' object has no attribute 'strip') or datasets' 'An error
    occurred while generating the dataset', the cause on a line of its own."""
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(XformerError, match=message) as caught:
        pairs_of(tmp_path / name)
    assert "\n" not in str(caught.value)


def test_a_parquet_column_of_numbers_is_named(tmp_path):
    pq.write_table(pa.table({"en": ["a"], "de": [7]}), tmp_path / "n.parquet")
    with pytest.raises(XformerError, match=r"n.parquet row 1: column 'de' holds int \(7\), not text$"):
        pairs_of(tmp_path / "n.parquet")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(XformerError, match=r"broken.parquet: not a readable parquet file"):
        pairs_of(tmp_path / "broken.parquet")


def test_invalid_utf8_in_a_data_file_is_named_or_skipped_and_counted(tmp_path):
    """It was a UnicodeDecodeError traceback from pyarrow, and data.skip_invalid_utf8 did nothing."""
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"en": "a", "de": "b"}\n{"en": "Stra\xdfe", "de": "x"}\n'.encode("latin-1"))
    with pytest.raises(XformerError, match=r"latin.jsonl:2: invalid UTF-8 .*data.skip_invalid_utf8: true$"):
        pairs_of(latin)
    assert pairs_of(latin, skip_invalid=True) == ([("a", "b")], {"invalid UTF-8": 1})


def test_a_data_file_is_known_by_its_bytes_not_its_time(tmp_path):
    """datasets keyed local files by modification time: an edit that kept it was trained on as
    the old text; a touch alone built the tokenizer and the cache again."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"en": "a dog", "de": "ein Hund"}\n', encoding="utf-8")

    def fingerprint() -> str:
        return PairSource(CorpusConfig(data_files=str(data)), "en", "de").fingerprint()

    before, stat = fingerprint(), data.stat()
    data.write_text('{"en": "a cat", "de": "eine Katze"}\n', encoding="utf-8")
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert fingerprint() != before
    assert pairs_of(data)[0] == [("a cat", "eine Katze")]
    edited = fingerprint()
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**10))
    assert fingerprint() == edited


def test_a_dataset_option_given_a_file_or_a_split_it_lacks_is_refused(tmp_path):
    from datasets import Dataset

    data = tmp_path / "d.jsonl"
    data.write_text('{"en": "a dog", "de": "ein Hund"}\n', encoding="utf-8")
    with pytest.raises(XformerError, match="d.jsonl is a file: data_files reads data files"):
        PairSource(CorpusConfig(dataset=str(data)), "en", "de")
    saved = tmp_path / "single"
    Dataset.from_dict({"en": ["a dog"], "de": ["ein Hund"]}).save_to_disk(str(saved))
    assert list(PairSource(CorpusConfig(dataset=str(saved)), "en", "de", role="valid")) == [("a dog", "ein Hund")]
    # valid asking for 'validation' by name read the whole (training) set
    with pytest.raises(XformerError, match="single was saved without splits: split 'validation' is not in it"):
        PairSource(CorpusConfig(dataset=str(saved), split="validation"), "en", "de", role="valid")


def test_a_header_with_spaces_and_a_json_array_after_a_blank_line_are_read(tmp_path):
    """'en, de' keyed the rows by 'de' and checked the config against ' de': no spelling worked;
    a .json array after a blank first line was parsed line by line ('not JSON')."""
    spaced = tmp_path / "s.csv"
    spaced.write_text("en, de\nA dog.,Ein Hund.\n", encoding="utf-8")
    assert pairs_of(spaced)[0] == [("A dog.", "Ein Hund.")]
    assert pairs_of(spaced, src_column="en", tgt_column="de")[0] == [("A dog.", "Ein Hund.")]
    array = tmp_path / "a.json"
    array.write_text("\n" + json.dumps([{"en": "a dog", "de": "ein Hund"}], indent=1), encoding="utf-8")
    assert pairs_of(array)[0] == [("a dog", "ein Hund")]
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(XformerError, match=f"^{empty} holds no JSON row$"):  # was: no 'translation' column (columns: )
        pairs_of(empty)


def test_a_data_file_is_one_source_however_the_config_spells_its_path(tmp_path, monkeypatch):
    """The fingerprint hashed the path as written: ./d.parquet and /abs/d.parquet trained the
    tokenizer and built the cache again; and a file of one column per language read by two pairs
    put its shared language into the tokenizer's sample twice (its key held both columns)."""
    pq.write_table(pa.table({"en": ["a dog"], "de": ["ein Hund"], "fr": ["un chien"]}), tmp_path / "d.parquet")
    monkeypatch.chdir(tmp_path)
    spellings = ["d.parquet", "./d.parquet", str(tmp_path / "d.parquet")]
    assert len({PairSource(CorpusConfig(data_files=s), "en", "de").fingerprint() for s in spellings}) == 1
    de, fr = (PairSource(CorpusConfig(data_files="d.parquet"), "en", tgt) for tgt in ("de", "fr"))
    assert de.side_key(0) == fr.side_key(0) and de.side_key(1) != fr.side_key(1)
