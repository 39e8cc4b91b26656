"""data.concat_augmentation: copies of training pairs joined with another pair of their corpus,
so that a model trained on short sentences has seen long inputs."""

from __future__ import annotations

import random

import pytest

from helpers import pairs_sets
from xformer_cli.config import load_config
from xformer_cli.data.concatenation import joined, with_concatenated
from xformer_cli.errors import XformerError

PAIRS = [(f"A dog number {i} runs.", f"Ein Hund Nummer {i} rennt.") for i in range(50)]


def test_a_joined_pair_is_both_sources_then_both_targets():
    assert joined(("A dog runs. ", "Ein Hund rennt."), (" Two cats.", "Zwei Katzen.")) == \
        ("A dog runs. Two cats.", "Ein Hund rennt. Zwei Katzen.")


def test_the_rate_adds_joined_copies_of_two_different_pairs_and_keeps_the_originals():
    none, zero = with_concatenated(PAIRS, 0.0, random.Random(1))
    assert none == PAIRS and zero == 0
    every, added = with_concatenated(PAIRS, 1.0, random.Random(1))
    assert every[:len(PAIRS)] == PAIRS and added == len(PAIRS) == len(every) - len(PAIRS)
    for index, (src, tgt) in enumerate(every[len(PAIRS):]):
        first, second = src.split(". ")
        assert first == f"A dog number {index} runs" and second != f"A dog number {index} runs."  # never itself
        other = int(second.split()[3])
        assert tgt == f"Ein Hund Nummer {index} rennt. Ein Hund Nummer {other} rennt."  # the same pair on both sides
    assert len({src for src, _ in every[len(PAIRS):]}) > 0.8 * added  # partners drawn, not one fixed
    some = with_concatenated(PAIRS * 20, 0.3, random.Random(2))[1]
    assert 0.2 * 1000 < some < 0.4 * 1000
    assert with_concatenated(PAIRS * 20, 0.3, random.Random(2))[1] == some  # seeded: the same copies
    assert with_concatenated(PAIRS[:1], 1.0, random.Random(1)) == (PAIRS[:1], 0)  # nothing to join with


def test_the_cache_adds_the_joined_pairs_and_rebuilds_when_the_rate_changes(tmp_path):
    from xformer_cli.data.prepare import prepare_data

    sets = pairs_sets(tmp_path, PAIRS)
    plain = prepare_data(load_config(None, sets), lambda _: None)
    said = []
    more = prepare_data(load_config(None, sets + ["data.concat_augmentation=1.0"]), said.append)
    assert not more.cache_reused and len(more.train) == 2 * len(plain.train)
    assert more.train.meta["joined"] == len(PAIRS) and any("joined with another pair" in line for line in said)
    assert more.train.src_lens.max() >= 2 * plain.train.src_lens.min() - 1  # the joined ones are long
    assert more.train.src_lens[len(PAIRS):].min() > plain.train.src_lens.max()
    again = prepare_data(load_config(None, sets + ["data.concat_augmentation=1.0"]), lambda _: None)
    assert again.cache_reused
    for bad in ("3", "-0.5"):
        with pytest.raises(XformerError, match="data.concat_augmentation"):
            load_config(None, sets + [f"data.concat_augmentation={bad}"])
