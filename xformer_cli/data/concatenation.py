"""Longer training pairs made of shorter ones (data.concat_augmentation): a pair gets a copy
joined with another pair of its corpus, chosen at random, source after source and target after
target ("A dog runs. A man sits." / "Ein Hund rennt. Ein Mann sitzt.").

A model trained only on short sentences degenerates on longer input: it repeats pieces,
drops the second half, and loses the numbers it would copy in a short line. Multi30k's
captions are 12 words on average; news lines are twice that. Joined pairs show the model long
inputs whose translation it knows (Kondo et al. 2021, "Sentence Concatenation Approach to Data
Augmentation for NMT"; Nguyen et al. 2021, "Data Augmentation by Concatenation for Low-Resource
Translation"). Pairs are joined within a corpus only, so a tag that leads a corpus's pairs
(language, back-translation) stays true of the joined one."""

from __future__ import annotations

import random

from xformer_cli.data.number_augmentation import copies_of

CONCATENATION_VERSION = 1  # in the token cache's key


def joined(first: tuple[str, str], second: tuple[str, str]) -> tuple[str, str]:
    """Two pairs as one: each side's texts with a space between them."""
    return f"{first[0].rstrip()} {second[0].lstrip()}", f"{first[1].rstrip()} {second[1].lstrip()}"


def with_concatenated(pairs: list[tuple[str, str]], rate: float,
                      rng: random.Random) -> tuple[list[tuple[str, str]], int]:
    """``pairs`` followed by ``rate`` joined copies a pair on average (0.3: 30% of the pairs
    get one), each pair joined with another drawn from ``pairs``; and how many were added."""
    if len(pairs) < 2:
        return pairs, 0
    added = []
    for index, pair in enumerate(pairs):
        for _ in range(copies_of(rate, rng)):
            other = rng.randrange(len(pairs) - 1)
            added.append(joined(pair, pairs[other + (other >= index)]))  # never with itself
    return pairs + added, len(added)
