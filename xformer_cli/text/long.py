"""Sentences longer than the model's input limit, cut into parts it can translate.

A sentence over the limit is cut at every clause boundary (after , ; : or a dash); only
short clauses are packed together, up to ``limit // CLAUSE_SHARE`` pieces: a model trained on
sentences keeps a clause-sized part whole, while parts packed up to the hard limit lost most of
their content on the Multi30k model (scripts/bench_text.py measures it). A clause still over
the limit is cut at word boundaries (windows of words). Every part is translated and the
translations are joined with a space, so no real text is dropped. A word longer than the
limit on its own (a 3000-character token with no spaces) stays one part, which the engine
cuts with its counted warning (``decode.inputs.encode_lines``): that bound against garbage
stays.
"""

from __future__ import annotations

import re
from typing import Callable

CLAUSE_END = re.compile(r"(?<=[,;:])\s+|\s+(?=[–—-]\s)")
WORD_GAP = re.compile(r"\s+")
CLAUSE_SHARE = 8  # short clauses are packed up to this share of the limit


def cut_sentence(sentence: str, count: Callable[[str], int], limit: int) -> list[str]:
    """``sentence`` as consecutive parts (their own whitespace stripped) of at most ``limit``
    pieces each by ``count``, cut at every clause boundary (short clauses packed) first and
    word boundaries next; a sentence within ``limit`` stays whole."""
    if limit <= 0 or len(sentence) < limit or count(sentence) <= limit:
        return [sentence]
    parts: list[str] = []
    for clause in _pack(_pieces(sentence, CLAUSE_END), count, max(limit // CLAUSE_SHARE, 1)):
        if count(clause) <= limit:
            parts.append(clause)
        else:
            parts.extend(_pack(_pieces(clause, WORD_GAP), count, limit))
    return parts


def _pieces(text: str, boundary: re.Pattern) -> list[str]:
    return [piece for piece in boundary.split(text) if piece.strip()]


def _pack(pieces: list[str], count: Callable[[str], int], limit: int) -> list[str]:
    """Consecutive pieces joined with spaces while the result stays within ``limit``."""
    packed: list[str] = []
    current = ""
    for piece in pieces:
        candidate = f"{current} {piece}" if current else piece
        if current and count(candidate) > limit:
            packed.append(current)
            current = piece
        else:
            current = candidate
    if current:
        packed.append(current)
    return packed
