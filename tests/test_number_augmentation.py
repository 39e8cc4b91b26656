"""data.number_augmentation: copies of pairs whose shared numbers become the same random
digits on both sides, so that the model learns to copy digits."""

from __future__ import annotations

import random
import re
from decimal import Decimal

import pytest

from helpers import pairs_sets
from xformer_cli.config import load_config
from xformer_cli.data.number_augmentation import (DrawnNumber, augmented_pair, copies_of, corresponding, draw_number,
                                                  with_augmented)
from xformer_cli.number_matching import mentions, source_numbers
from xformer_cli.errors import XformerError

PAIRS = [("Two dogs play in the snow.", "Zwei Hunde spielen im Schnee."),
         ("A man with three children and 2 bikes.", "Ein Mann mit drei Kindern und 2 Fahrrädern."),
         ("The 1102 bus drives past 93 people.", "Der Bus 1102 fährt an 93 Menschen vorbei."),
         ("Deux chiens.", "Zwei Hunde."),
         ("A man is riding a bicycle.", "Ein Mann fährt Fahrrad.")]


def test_shared_numbers_become_the_same_values_on_both_sides():
    for seed in range(60):  # enough draws for grouped, long and decimal numbers
        for src, tgt in PAIRS[:3]:
            new_src, new_tgt = augmented_pair(src, tgt, "en", "de", random.Random(seed))
            numbers = source_numbers(new_src, "en")
            assert len(numbers) == len(corresponding(src, tgt, "en", "de"))
            target_values = [m.values for m in mentions(new_tgt, "de") if not m.article]
            assert all(any(n.value in values for values in target_values) for n in numbers), (new_src, new_tgt)
    assert augmented_pair(*PAIRS[0], "en", "de", random.Random(1))[0].endswith(" dogs play in the snow.")


def test_a_drawn_number_is_written_as_each_language_writes_it():
    number = DrawnNumber("1250000", "5", grouped=True)
    assert (number.written("en"), number.written("de"), number.written("fr")) == ("1,250,000.5", "1.250.000,5",
                                                                                  "1 250 000,5")
    assert DrawnNumber("1102").written("de") == "1102" and DrawnNumber("12000", grouped=True).written("cs") == "12 000"
    for lang in ("en", "de", "fr"):  # eval-bleu reads each back as its value
        assert source_numbers(number.written(lang), lang)[0].value == Decimal("1250000.5")


def test_articles_and_pairs_without_a_shared_number_are_left_alone():
    assert augmented_pair(*PAIRS[4], "en", "de", random.Random(1)) is None  # "Ein" is an article here
    assert augmented_pair("Three dogs.", "Vier Hunde.", "en", "de", random.Random(1)) is None
    assert re.fullmatch(r"(\d+) chiens\. \1 Hunde\.", " ".join(augmented_pair(*PAIRS[3], "fr", "de", random.Random(1))))


def test_drawn_numbers_have_no_leading_zero_and_vary_in_length_and_form():
    drawn = [draw_number(random.Random(i)) for i in range(600)]
    assert all(d.whole == "0" or not d.whole.startswith("0") for d in drawn)
    assert {len(d.whole) for d in drawn} == set(range(1, 8))
    assert any(d.grouped for d in drawn) and any(d.fraction for d in drawn) and any(not d.grouped for d in drawn)


def test_the_rate_draws_copies_and_keeps_the_originals():
    pairs = PAIRS * 40
    none, added0 = with_augmented(pairs, 0.0, "en", "de", random.Random(1))
    assert none == pairs and added0 == 0
    every, added = with_augmented(pairs, 1.0, "en", "de", random.Random(1))
    assert every[:len(pairs)] == pairs and added == 3 * 40 + 0  # the French pair is read as English: no match
    half, some = with_augmented(pairs, 0.5, "en", "de", random.Random(1))
    assert 0.3 * added < some < 0.7 * added
    assert with_augmented(pairs, 0.5, "en", "de", random.Random(1)) == (half, some)  # seeded: the same copies
    more, three = with_augmented(pairs, 3.0, "en", "de", random.Random(1))
    assert three == 3 * added and len(set(more[len(pairs):])) > 0.9 * three  # each copy its own digits


def test_a_rate_above_one_is_whole_copies_and_a_chance_of_one_more():
    rng = random.Random(5)
    counts = [copies_of(2.25, rng) for _ in range(2000)]
    assert set(counts) == {2, 3} and 0.2 < counts.count(3) / len(counts) < 0.3
    assert {copies_of(1.0, rng) for _ in range(50)} == {1} and {copies_of(0.0, rng) for _ in range(50)} == {0}


def test_the_cache_adds_the_copies_and_rebuilds_when_the_rate_changes(tmp_path):
    from xformer_cli.data.prepare import prepare_data

    sets = pairs_sets(tmp_path, PAIRS * 20)
    plain = prepare_data(load_config(None, sets), lambda _: None).train
    said = []
    more = prepare_data(load_config(None, sets + ["data.number_augmentation=1.0"]), said.append)
    assert not more.cache_reused and len(more.train) == len(plain) + 3 * 20
    assert more.train.meta["number_augmented"] == 60 and any("random digits" in line for line in said)
    with pytest.raises(XformerError, match="data.number_augmentation"):
        load_config(None, sets + ["data.number_augmentation=9"])
    with pytest.raises(XformerError, match="data.number_augmentation"):
        load_config(None, sets + ["data.number_augmentation=-0.5"])
    twice = prepare_data(load_config(None, sets + ["data.number_augmentation=2"]), lambda _: None)
    assert not twice.cache_reused and len(twice.train) == len(plain) + 2 * 3 * 20
