"""data.number_augmentation: copies of pairs whose shared numbers become the same random
digits on both sides, so that the model learns to copy digits."""

from __future__ import annotations

import json
import random
import re

import pytest

from helpers import write_lines
from xformer_cli.config import load_config
from xformer_cli.data.number_augmentation import augmented_pair, corresponding, random_digits, with_augmented
from xformer_cli.errors import XformerError

PAIRS = [("Two dogs play in the snow.", "Zwei Hunde spielen im Schnee."),
         ("A man with three children and 2 bikes.", "Ein Mann mit drei Kindern und 2 Fahrrädern."),
         ("The 1102 bus drives past 93 people.", "Der Bus 1102 fährt an 93 Menschen vorbei."),
         ("Deux chiens.", "Zwei Hunde."),
         ("A man is riding a bicycle.", "Ein Mann fährt Fahrrad.")]


def test_shared_numbers_become_the_same_digits_on_both_sides():
    rng = random.Random(3)
    for src, tgt in PAIRS[:3]:
        new_src, new_tgt = augmented_pair(src, tgt, "en", "de", rng)
        digits_src, digits_tgt = re.findall(r"\d+", new_src), re.findall(r"\d+", new_tgt)
        assert sorted(digits_src) == sorted(digits_tgt) and digits_src
        assert len(digits_src) == len(corresponding(src, tgt, "en", "de"))
    assert augmented_pair(*PAIRS[0], "en", "de", random.Random(1))[0].endswith(" dogs play in the snow.")


def test_articles_and_pairs_without_a_shared_number_are_left_alone():
    assert augmented_pair(*PAIRS[4], "en", "de", random.Random(1)) is None  # "Ein" is an article here
    assert augmented_pair("Three dogs.", "Vier Hunde.", "en", "de", random.Random(1)) is None
    assert re.fullmatch(r"(\d+) chiens\. \1 Hunde\.", " ".join(augmented_pair(*PAIRS[3], "fr", "de", random.Random(1))))


def test_random_digits_have_no_leading_zero_and_vary_in_length():
    drawn = [random_digits(random.Random(i)) for i in range(400)]
    assert all(d == "0" or not d.startswith("0") for d in drawn)
    assert {len(d) for d in drawn} == {1, 2, 3, 4}


def test_the_rate_draws_copies_and_keeps_the_originals():
    pairs = PAIRS * 40
    none, added0 = with_augmented(pairs, 0.0, "en", "de", random.Random(1))
    assert none == pairs and added0 == 0
    every, added = with_augmented(pairs, 1.0, "en", "de", random.Random(1))
    assert every[:len(pairs)] == pairs and added == 3 * 40 + 0  # the French pair is read as English: no match
    half, some = with_augmented(pairs, 0.5, "en", "de", random.Random(1))
    assert 0.3 * added < some < 0.7 * added
    assert with_augmented(pairs, 0.5, "en", "de", random.Random(1)) == (half, some)  # seeded: the same copies


def test_the_cache_adds_the_copies_and_rebuilds_when_the_rate_changes(tmp_path):
    from xformer_cli.data.prepare import prepare_data

    write_lines(tmp_path / "t.en", [s for s, _ in PAIRS] * 20)
    write_lines(tmp_path / "t.de", [t for _, t in PAIRS] * 20)
    sets = [f"run_dir={tmp_path / 'run'}", f"data.train={json.dumps({'prefix': str(tmp_path / 't')})}",
            "data.valid=null", "data.test=null", "tokenizer.vocab_size=100"]
    plain = prepare_data(load_config(None, sets), lambda _: None).train
    said = []
    more = prepare_data(load_config(None, sets + ["data.number_augmentation=1.0"]), said.append)
    assert not more.cache_reused and len(more.train) == len(plain) + 3 * 20
    assert more.train.meta["number_augmented"] == 60 and any("random digits" in line for line in said)
    with pytest.raises(XformerError, match="data.number_augmentation"):
        load_config(None, sets + ["data.number_augmentation=2"])
