"""data.drop_number_mismatch: training pairs whose numbers disagree (a teacher's translation
that lost a source number, or invented digits) are dropped before training, by eval-bleu's rules."""

from __future__ import annotations

from collections import Counter

import pytest

from helpers import pairs_sets
from xformer_cli.config import load_config
from xformer_cli.data.cache import Filters
from xformer_cli.data.number_filter import FILTER_VERSION, INVENTED, LOST, number_mismatch, without_number_mismatch
from xformer_cli.errors import XformerError


@pytest.mark.parametrize("src, tgt", [
    ("2 men run.", "Zwei Männer rennen."),  # a number word of the target language keeps it
    ("Two men run.", "2 Männer rennen."),  # digits for a number the source spells out
    ("1,102 people wait.", "1.102 Menschen warten."),  # each language's separators
    ("3.5 liters.", "3,5 Liter."),
    ("2,000 people.", "2 000 Menschen."),  # grouped with a space
    ("The 3rd man.", "Der dritte Mann."),  # an ordinal
    ("About 12 kids and 5 dogs.", "Etwa zwölf Kinder und 5 Hunde."),
    ("A man runs.", "Ein Mann rennt."),  # no digits at all
])
def test_pairs_whose_numbers_agree_are_kept(src, tgt):
    assert number_mismatch(src, tgt, "en", "de") is None


@pytest.mark.parametrize("src, tgt, why", [
    ("A man with 2 dogs.", "Ein Mann mit Hunden.", LOST),
    ("The number 1102 runs.", "Die Nummer 110 rennt.", LOST),  # a wrong copy loses the number
    ("A 9 and a 0 on a cake.", "Eine 2 2 auf einem Kuchen.", LOST),
    ("2 dogs and 3 cats.", "Zwei Hunde und Katzen.", LOST),  # one of two lost
    ("A man runs.", "Ein Mann mit der Nummer 5 rennt.", INVENTED),
    ("Two men.", "2 Männer mit 7 Hunden.", INVENTED),
    ("At the 2012 games.", "Bei den Spielen 2012 2012 2012.", INVENTED),  # a teacher's loop on a number it copied
    ("At the 100 games.", "Bei den Spielen 100 100 100.", INVENTED),  # read as one grouped number, not 100
    ("3 dogs.", "3.000 Hunde.", INVENTED),  # German grouping: 3000
    ("5 cats.", "5.5 Katzen.", INVENTED),  # neither German reading: 5 and 5, one of them the source's
    ("It costs 3 euros.", "Es kostet 3,7 Euro.", INVENTED),  # German decimal comma: 3.7
])
def test_pairs_whose_numbers_disagree_say_why(src, tgt, why):
    assert number_mismatch(src, tgt, "en", "de") == why


def test_the_filter_keeps_the_order_and_counts_each_reason():
    pairs = [("1 dog.", "1 Hund."), ("2 dogs.", "Hunde."), ("A cat.", "Eine Katze."), ("A dog.", "3 Hunde."),
             ("4 cats.", "Vier Katzen.")]
    dropped: Counter = Counter()
    assert without_number_mismatch(pairs, "en", "de", dropped) == [pairs[0], pairs[2], pairs[4]]
    assert dropped == Counter({LOST: 1, INVENTED: 1})


def test_the_cache_drops_them_says_so_and_keeps_old_fingerprints_when_off(tmp_path):
    from xformer_cli.data.prepare import prepare_data

    good = [(f"A dog with {i} legs runs.", f"Ein Hund mit {i} Beinen rennt.") for i in range(30)]
    lost = [(f"A cat with {i} toys sits.", "Eine Katze mit Spielzeug sitzt.") for i in range(2, 12)]  # "Eine" is 1
    sets = pairs_sets(tmp_path, good + lost)
    plain = prepare_data(load_config(None, sets), lambda _: None)
    said: list[str] = []
    sets += ["data.drop_number_mismatch=true", "data.number_augmentation=1.0"]
    filtered = prepare_data(load_config(None, sets), said.append)
    assert not filtered.cache_reused and len(plain.train) == 40
    assert filtered.train.meta["dropped"] == {LOST: 10}
    assert filtered.train.meta["number_augmented"] == 30  # copies of the kept pairs only
    assert len(filtered.train) == 30 + 30 and any(f"10 {LOST}" in line for line in said)
    assert "drop_number_mismatch" not in Filters().key() and "number_filter_version" not in Filters().key()
    assert Filters(drop_number_mismatch=True).key()["number_filter_version"] == FILTER_VERSION
    with pytest.raises(XformerError, match="data.drop_number_mismatch"):
        load_config(None, sets + ["data.drop_number_mismatch=maybe"])
