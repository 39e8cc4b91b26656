"""Numbers the model learns to copy (data.number_augmentation; OpusTrainer's idea): a pair
whose two sides hold the same number, in digits or spelled out ("Two dogs" / "Zwei Hunde"),
gets a copy with that number replaced on both sides by the same random digits ("417 dogs" /
"417 Hunde"). Multi30k holds few digits, so a model trained on it alone has rarely seen one
to copy; these copies show it many, in the sentences it knows.

Which numbers correspond is eval-bleu's rule (``number_matching.py``): a mention on each side with a
value in common. Articles that are also the number one (German "ein", French "une") are left
alone: "ein Mann" is "a man", not "1 man"."""

from __future__ import annotations

import random
from typing import Optional

from xformer_cli.number_matching import Mention, mentions

# How many digits a drawn number has: mostly short ones, as numbers in text are, and some
# longer ones the data lacks (years, house numbers, "1102").
DIGIT_COUNTS = (1, 1, 1, 2, 2, 2, 3, 3, 4, 4)


def random_digits(rng: random.Random) -> str:
    """A number of 1-4 digits without a leading zero."""
    count = rng.choice(DIGIT_COUNTS)
    return str(rng.randrange(10 ** (count - 1) if count > 1 else 0, 10 ** count))


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
    if not shared:
        return None
    drawn = [random_digits(rng) for _ in shared]
    return (_replaced(src, [(s.start, s.end, d) for (s, _), d in zip(shared, drawn)]),
            _replaced(tgt, [(t.start, t.end, d) for (_, t), d in zip(shared, drawn)]))


def with_augmented(pairs: list[tuple[str, str]], rate: float, src_lang: str, tgt_lang: str,
                   rng: random.Random) -> tuple[list[tuple[str, str]], int]:
    """``pairs`` followed by an augmented copy of each pair that shares a number, drawn with
    probability ``rate``; and how many copies were added."""
    added = []
    for src, tgt in pairs:
        if rng.random() >= rate:
            continue
        copy = augmented_pair(src, tgt, src_lang, tgt_lang, rng)
        if copy is not None:
            added.append(copy)
    return pairs + added, len(added)
