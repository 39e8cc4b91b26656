"""data.quote_augmentation: copies of training pairs that quote the same spans on both sides,
each span replaced by the same random words, so that a model learns to copy what a sign says
instead of writing „S“."""

from __future__ import annotations

import random

import pytest

from helpers import pairs_sets
from xformer_cli.config import load_config
from xformer_cli.data.cache import Filters
from xformer_cli.data.quote_augmentation import (QUOTE_AUGMENTATION_VERSION, corpus_words, draw_quote,
                                                 quoted_spans, with_quotes_copied)
from xformer_cli.errors import XformerError

QUOTED = [(f'A man {i} holds a sign that says "Welcome Bikers."', f"Ein Mann {i} hält ein Schild mit der "
           "Aufschrift „Welcome Bikers“.") for i in range(40)]
PLAIN = [(f"A dog {i} runs.", f"Ein Hund {i} rennt.") for i in range(40)]


def inner(text: str) -> list[str]:
    return [text[start:end] for start, end in quoted_spans(text)]


def test_quotes_are_found_by_each_languages_marks_and_apostrophes_are_not_quotes():
    assert inner('A sign says "Open" and “Closed!”.') == ["Open", "Closed"]  # closing punctuation stays out
    assert inner("Ein „Open“-Schild und »Zu«.") == ["Open", "Zu"]
    assert inner("Il dit « bonjour » puis part.") == ["bonjour"]  # the spaces inside stay out of the span
    assert inner("It's Terrible's 'deli'.") == []
    assert inner('An unclosed " mark.') == [] and inner('An empty "" or " " pair.') == []
    assert inner('A "' + "x" * 200 + '" is no quote') == []  # two stray marks around a clause
    assert inner('A "' + "x" * 200 + '" and a "sign".') == ["sign"]  # ... whose closing mark opens nothing


def test_each_copy_quotes_the_same_drawn_words_on_both_sides_and_the_rest_stays():
    pairs = QUOTED + PLAIN
    out, added = with_quotes_copied(pairs, 2.0, random.Random(3))
    assert out[:len(pairs)] == pairs and added == 2 * len(QUOTED) == len(out) - len(pairs)
    drawn = []
    for src, tgt in out[len(pairs):]:
        (quote,), (same,) = inner(src), inner(tgt)
        assert quote == same and quote != "Welcome Bikers."
        assert src.endswith(f'holds a sign that says "{quote}."')  # the quote's full stop stays
        assert tgt.endswith(f"hält ein Schild mit der Aufschrift „{quote}“.")
        drawn.append(quote)
    assert len(set(drawn)) > 0.9 * added  # each copy draws its own words
    assert any(any(c.isdigit() for c in q) for q in drawn)  # digits among them
    assert with_quotes_copied(pairs, 2.0, random.Random(3)) == (out, added)  # seeded: the same copies


def test_pairs_whose_sides_quote_different_numbers_of_spans_get_no_copy():
    lost = [('A shirt that says "Asian Pacific 2007".', "Ein T-Shirt mit Aufschrift.")]
    two = [('"Hi" and "Bye" signs.', "Schilder mit „Hallo“.")]
    assert with_quotes_copied(lost + two + PLAIN, 4.0, random.Random(1)) == (lost + two + PLAIN, 0)
    assert with_quotes_copied(QUOTED, 0.0, random.Random(1)) == (QUOTED, 0)


def test_drawn_quotes_take_words_of_the_corpus_made_up_names_and_digits():
    words = corpus_words(PLAIN + [("Cats sit, dogs run.", "x")])
    assert words == ["A", "dog", "Cats", "dogs"]  # letters only ("runs." and "sit," are not), first seen first
    rng = random.Random(5)
    quotes = [draw_quote(rng, ["dog"]) for _ in range(300)]
    flat = [w for q in quotes for w in q.split()]
    assert all(1 <= len(q.split()) <= 4 for q in quotes)
    assert {"dog", "Dog", "DOG"} <= set(flat)
    assert any(w.isdigit() for w in flat) and any(w.isalpha() and w.lower() != "dog" for w in flat)


def test_number_copies_never_rewrite_a_quote_copys_digits():
    pairs = [(f'Shirt {i} says "Team 9" and 3 dogs sit.', f"Hemd {i} mit „Team 9“ und 3 Hunde sitzen.")
             for i in range(200)]
    out, added = Filters(number_augmentation=2.0, quote_augmentation=2.0).augmented(pairs, "en", "de",
                                                                                     random.Random(1))
    assert added["quotes"] == 400 and added["numbers"] == 400  # the "3" outside the quote is copied
    assert all(inner(src) == inner(tgt) for src, tgt in out)  # "12,000" / „12.000“ would be no copy
    assert all(inner(src) == ["Team 9"] for src, _ in out[:200 + 400])  # the number copies leave the quote alone
    plain, _ = Filters(number_augmentation=2.0).augmented(pairs, "en", "de", random.Random(1))
    assert plain[:200] == pairs and any(inner(src) != ["Team 9"] for src, _ in plain[200:])  # as before without


def test_the_cache_adds_the_copies_says_so_and_keeps_old_fingerprints_when_off(tmp_path):
    from xformer_cli.data.prepare import prepare_data

    sets = pairs_sets(tmp_path, QUOTED + PLAIN, vocab_size=120)
    plain = prepare_data(load_config(None, sets), lambda _: None)
    said: list[str] = []
    more = prepare_data(load_config(None, sets + ["data.quote_augmentation=2"]), said.append)
    assert not more.cache_reused and len(more.train) == len(plain.train) + 2 * len(QUOTED)
    assert more.train.meta["quote_augmented"] == 80 and any("quoted text as random words" in s for s in said)
    assert prepare_data(load_config(None, sets + ["data.quote_augmentation=2"]), lambda _: None).cache_reused
    assert "quote_augmentation" not in Filters().key() and "seed" not in Filters().key()
    assert Filters(quote_augmentation=1.0).key()["quote_augmentation_version"] == QUOTE_AUGMENTATION_VERSION
    for bad in ("9", "-1", "many"):
        with pytest.raises(XformerError, match="data.quote_augmentation"):
            load_config(None, sets + [f"data.quote_augmentation={bad}"])
