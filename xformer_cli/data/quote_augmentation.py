"""Quoted text the model learns to copy (data.quote_augmentation): a pair whose two sides quote
as many spans ('a sign that says "Welcome Bikers."' / 'ein Schild mit der Aufschrift „Welcome
Bikers“') gets copies with each quoted span replaced by the same random text on both sides
('"Kelo Harbor 41"' / '„Kelo Harbor 41“').

Captions quote what a sign or a shirt says, and the translation keeps it as written. A model
sees too few of them to learn that: the main job turns "Asian Pacific 2007" into „S“ (a quote
with its first piece), and a student distilled from it learns the same from the teacher's
output. The copies show it quotes of words from the corpus, made-up names and digits, copied
piece by piece whatever they are.

Quotes are found by their marks, each opening mark with the closing marks its languages use
(English "..." and “...”, German „...“, French «...», »...« as German books write it); a single
quote is an apostrophe too often to count. A full stop (or ,!?;:) that ends a quote stays, as
English puts it inside ('"Welcome Bikers."') and German outside. The i-th quoted span of one side
goes with the i-th of the other; a pair whose sides quote different numbers of spans is left
alone."""

from __future__ import annotations

import random

from xformer_cli.data.number_augmentation import copies_of, draw_number

QUOTE_AUGMENTATION_VERSION = 2  # in the token cache's key: 2 keeps a quote's closing full stop, its digits as written

CLOSING = {'"': '"', "“": '”"', "„": '“”"', "«": "»", "»": "«"}  # opening mark -> the marks that close it
CLOSING_PUNCTUATION = ".,!?;:"  # left out of a span: the copy keeps it where the sentence had it
LONGEST_QUOTE = 80  # characters: a longer "quote" is more likely two stray marks around a clause
WORD_COUNTS = (1, 1, 2, 2, 2, 3, 3, 4)  # words in a drawn quote: sign texts and names are short
CONSONANTS = "bcdfghklmnprstvz"
VOWELS = "aeiou"


def quoted_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of the text inside each pair of quote marks, left to right: the marks, the
    spaces inside them and a closing full stop (or ,!?;:) left out."""
    spans = []
    i = 0
    while i < len(text):
        closing = CLOSING.get(text[i])
        if closing is not None:
            end = next((j for j in range(i + 1, len(text)) if text[j] in closing), -1)
            if end > 0:  # a pair of marks, taken together even when empty or too long: its closing mark opens nothing
                inner = text[i + 1:end]
                if inner.strip() and len(inner) <= LONGEST_QUOTE and "\n" not in inner:
                    # the spaces inside (French « ... ») stay out of the span
                    start = i + 1 + len(inner) - len(inner.lstrip())
                    words = inner.strip().rstrip(CLOSING_PUNCTUATION) or inner.strip()
                    spans.append((start, start + len(words)))
                i = end + 1
                continue
        i += 1
    return spans


def _made_up(rng: random.Random) -> str:
    """A pronounceable made-up word, most often one no corpus holds ("Kelo"): a name the model
    can only copy."""
    word = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(rng.randint(1, 3)))
    return word + (rng.choice(CONSONANTS) if rng.random() < 0.5 else "")


def draw_quote(rng: random.Random, words: list[str]) -> str:
    """1-4 words, each a word of the corpus, a made-up one or digits, in the casing signs use."""
    drawn = []
    for _ in range(rng.choice(WORD_COUNTS)):
        kind = rng.random()
        if kind < 0.15:
            drawn.append(draw_number(rng).whole)
            continue
        word = rng.choice(words) if words and kind >= 0.4 else _made_up(rng)
        casing = rng.random()
        drawn.append(word.upper() if casing < 0.1 else word.capitalize() if casing < 0.7 else word)
    return " ".join(drawn)


def corpus_words(pairs: list[tuple[str, str]]) -> list[str]:
    """The distinct words (letters only) of the pairs' source sides, in the order first seen
    (a set's order would change with the process's hash seed, and with it the drawn quotes)."""
    return list(dict.fromkeys(w for src, _ in pairs for w in src.split() if w.isalpha()))


def _replaced(text: str, spans: list[tuple[int, int]], quotes: list[str]) -> str:
    for (start, end), quote in sorted(zip(spans, quotes), reverse=True):
        text = text[:start] + quote + text[end:]
    return text


def with_quotes_copied(pairs: list[tuple[str, str]], rate: float,
                       rng: random.Random) -> tuple[list[tuple[str, str]], int]:
    """``pairs`` followed by ``rate`` copies on average of each pair whose sides quote as many
    spans, each span replaced by the same drawn text on both sides; and how many were added."""
    words: list[str] = []
    added = []
    for src, tgt in pairs:
        copies = copies_of(rate, rng)
        src_spans = quoted_spans(src) if copies else []
        tgt_spans = quoted_spans(tgt) if src_spans else []
        if not src_spans or len(src_spans) != len(tgt_spans):
            continue
        words = words or corpus_words(pairs)  # read once, and only for a chunk that quotes
        for _ in range(copies):
            quotes = [draw_quote(rng, words) for _ in src_spans]
            added.append((_replaced(src, src_spans, quotes), _replaced(tgt, tgt_spans, quotes)))
    return pairs + added, len(added)
