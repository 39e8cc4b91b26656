"""Numbers the model learns to copy (data.number_augmentation; OpusTrainer's idea): a pair
whose two sides hold the same number, in digits or spelled out ("Two dogs" / "Zwei Hunde"),
gets a copy with that number replaced on both sides by the same random digits ("417 dogs" /
"417 Hunde"). Multi30k holds few digits, so a model trained on it alone has rarely seen one
to copy; these copies show it many, in the sentences it knows: ``rate`` copies of each such
pair on average, each with its own digits, written as each language writes them ("12,000" /
"12.000").

Which numbers correspond is eval-bleu's rule (``number_matching.py``): a mention on each side with a
value in common. Articles that are also the number one (German "ein", French "une") are left
alone: "ein Mann" is "a man", not "1 man"."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Optional

from xformer_cli.number_matching import Mention, mentions, separators

AUGMENTATION_VERSION = 2  # in the token cache's key: 2 drew 1-7 digits, grouped and with fractions

# How many digits a drawn number has: mostly short ones, as numbers in text are, and the longer
# ones the data lacks (years, house numbers, "1102", "12,000", "2,500,000").
DIGIT_COUNTS = (1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 6, 7)
GROUPED_SHARE = {4: 0.2, 5: 0.7, 6: 0.7, 7: 0.7}  # how often a long number is written in groups of three
DECIMAL_SHARE = 0.1  # how often a number gets a fraction ("3.5" / "3,5")
# Languages that group thousands with a space ("12 000"); the rest of the decimal-comma ones use "."
SPACE_GROUPED = frozenset({"fr", "cs", "sk", "pl", "ru", "uk", "sv", "fi", "nb", "no", "et", "lv", "lt", "hu", "bg"})


@dataclass(frozen=True)
class DrawnNumber:
    """A random number, written in each language's own way: "12,000.5" in English is
    "12.000,5" in German and "12 000,5" in French (the conventions eval-bleu reads)."""

    whole: str
    fraction: str = ""
    grouped: bool = False

    def written(self, lang: str) -> str:
        grouping, decimal = separators(lang)
        grouping = " " if lang.lower() in SPACE_GROUPED else grouping  # eval-bleu reads "12 000" as 12000 too
        whole = self.whole
        if self.grouped:
            head = len(whole) % 3 or 3
            whole = grouping.join([whole[:head]] + [whole[i:i + 3] for i in range(head, len(whole), 3)])
        return whole + (decimal + self.fraction if self.fraction else "")


def draw_number(rng: random.Random) -> DrawnNumber:
    """A number of 1-7 digits without a leading zero, sometimes grouped, sometimes with a fraction."""
    count = rng.choice(DIGIT_COUNTS)
    whole = str(rng.randrange(10 ** (count - 1) if count > 1 else 0, 10 ** count))
    fraction = str(rng.randrange(1, 10)) if count <= 3 and rng.random() < DECIMAL_SHARE else ""
    return DrawnNumber(whole, fraction, rng.random() < GROUPED_SHARE.get(count, 0.0))


def corresponding(src: str, tgt: str, src_lang: str, tgt_lang: str) -> list[tuple[Mention, Mention]]:
    """The numbers the two sides share: each source mention with the first target mention not
    yet taken that may be worth one of its values (left to right; articles never)."""
    targets = [m for m in mentions(tgt, tgt_lang) if not m.article]
    taken: set[int] = set()
    pairs = []
    for number in mentions(src, src_lang):
        if number.article:
            continue
        match = next((i for i, m in enumerate(targets) if i not in taken and m.values & number.values), None)
        if match is not None:
            taken.add(match)
            pairs.append((number, targets[match]))
    return pairs


def _replaced(text: str, spans: list[tuple[int, int, str]]) -> str:
    for start, end, digits in sorted(spans, reverse=True):
        text = text[:start] + digits + text[end:]
    return text


def augmented_pair(src: str, tgt: str, src_lang: str, tgt_lang: str, rng: random.Random) -> Optional[tuple[str, str]]:
    """The pair with each shared number replaced by the same random digits on both sides; None
    when the sides share no number."""
    shared = corresponding(src, tgt, src_lang, tgt_lang)
    return _with_drawn(src, tgt, shared, src_lang, tgt_lang, rng) if shared else None


def _with_drawn(src: str, tgt: str, shared: list[tuple[Mention, Mention]], src_lang: str, tgt_lang: str,
                rng: random.Random) -> tuple[str, str]:
    drawn = [draw_number(rng) for _ in shared]
    return (_replaced(src, [(s.start, s.end, d.written(src_lang)) for (s, _), d in zip(shared, drawn)]),
            _replaced(tgt, [(t.start, t.end, d.written(tgt_lang)) for (_, t), d in zip(shared, drawn)]))


def copies_of(rate: float, rng: random.Random) -> int:
    """How many copies a pair gets at ``rate`` copies a pair on average: its whole part, and
    one more with the probability of its fraction (0.3: a copy for 30% of the pairs; 2.5: two
    for every pair and a third for half of them)."""
    whole = int(rate)
    return whole + (rng.random() < rate - whole)


Spans = Callable[[str], list[tuple[int, int]]]


def _inside(mention: Mention, spans: list[tuple[int, int]]) -> bool:
    return any(start <= mention.start < end for start, end in spans)


def _outside(shared: list[tuple[Mention, Mention]], src: str, tgt: str, leave: Spans) -> list[tuple[Mention, Mention]]:
    """The shared numbers that are in no span ``leave`` finds, on either side."""
    src_spans, tgt_spans = leave(src), leave(tgt)
    return [(s, t) for s, t in shared if not _inside(s, src_spans) and not _inside(t, tgt_spans)]


def with_augmented(pairs: list[tuple[str, str]], rate: float, src_lang: str, tgt_lang: str,
                   rng: random.Random, leave: Optional[Spans] = None) -> tuple[list[tuple[str, str]], int]:
    """``pairs`` followed by augmented copies of each pair that shares a number, ``rate`` of
    them a pair on average, each with digits of its own; and how many copies were added.
    ``leave``: the spans of a text whose numbers stay as they are (quoted text, copied as written)."""
    added = []
    for src, tgt in pairs:
        copies = copies_of(rate, rng)
        shared = corresponding(src, tgt, src_lang, tgt_lang) if copies else []  # found once for all its copies
        if shared and leave is not None:
            shared = _outside(shared, src, tgt, leave)
        if shared:
            added.extend(_with_drawn(src, tgt, shared, src_lang, tgt_lang, rng) for _ in range(copies))
    return pairs + added, len(added)
