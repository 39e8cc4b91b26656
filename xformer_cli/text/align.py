"""Where a position in a source sentence lands in its translation.

Used to carry inline HTML tags over and to place a glossary term whose placeholder the model
did not copy. A position is a character offset with a side: ``start`` (something is placed
before the text that follows, like ``<b>``) or ``end`` (after the text before it, like
``</b>``). Two aligners:

- ``AttentionAligner``: the model's encoder-decoder attention (the bergamot approach): the
  source piece next to the position is aligned to the target piece that attended to it most,
  and the position moves to that target word's start (or end).
- ``relative_offset``: the same fraction of the translation's length, snapped to a word
  boundary; for engines that give no attention.

Either way a word's edge punctuation stays outside a position whose source has none at that
side (``outside_punctuation``): "with <b>2 dogs</b>." gives "mit <b>2 Hunden</b>.", not
"<b>2 Hunden.</b>", since the target word "Hunden." carries the sentence's full stop.
"""

from __future__ import annotations

import unicodedata
from typing import Callable, Optional, Sequence

Position = tuple[int, str]  # (character offset, "start" | "end")
Aligner = Callable[[str, str, list[int], Sequence[Position]], list[int]]  # source, target, target tokens


def relative_offset(source: str, target: str, position: Position) -> int:
    """The same fraction of ``target`` as ``position`` is of ``source``, at a word boundary."""
    offset, side = position
    if not source or not target:
        return 0 if side == "start" or not target else len(target)
    at = round(offset / len(source) * len(target))
    return snap_to_word(target, min(max(at, 0), len(target)), side)


def snap_to_word(text: str, at: int, side: str) -> int:
    """The nearest word start (``start``) or word end (``end``) to ``at`` in ``text``."""
    bounds = word_bounds(text)
    if not bounds:
        return 0
    edges = [start for start, _ in bounds] if side == "start" else [end for _, end in bounds]
    return min(edges, key=lambda edge: (abs(edge - at), edge))


def word_bounds(text: str) -> list[tuple[int, int]]:
    bounds, start = [], None
    for i, char in enumerate(text + " "):
        if char.isspace():
            if start is not None:
                bounds.append((start, i))
                start = None
        elif start is None:
            start = i
    return bounds


def is_punctuation(char: str) -> bool:
    return unicodedata.category(char).startswith("P")


def outside_punctuation(source: str, target: str, position: Position, at: int) -> int:
    """``at`` (a word edge in ``target``) moved past the word's punctuation at that edge, when the
    source has no punctuation inside the position: an ``end`` after "dogs" in "dogs." lands
    before the target word's full stop, a ``start`` before "dogs" after an opening quote. A
    word of punctuation only, or punctuation the source also has there, stays as it is."""
    offset, side = position
    if side == "end":
        if 0 < offset <= len(source) and is_punctuation(source[offset - 1]):
            return at
        start = at
        while start > 0 and not target[start - 1].isspace():
            start -= 1
        trimmed = at
        while trimmed > start and is_punctuation(target[trimmed - 1]):
            trimmed -= 1
        return trimmed if trimmed > start else at
    if offset < len(source) and is_punctuation(source[offset]):
        return at
    end = at
    while end < len(target) and not target[end].isspace():
        end += 1
    trimmed = at
    while trimmed < end and is_punctuation(target[trimmed]):
        trimmed += 1
    return trimmed if trimmed < end else at


def relative_aligner(source: str, target: str, tokens: list[int], positions: Sequence[Position]) -> list[int]:
    return [outside_punctuation(source, target, position, relative_offset(source, target, position))
            for position in positions]


def piece_spans(pieces: Sequence[str]) -> list[tuple[int, int, bool]]:
    """(start, end, starts_a_word) of each SentencePiece piece in the detokenized text."""
    spans, at = [], 0
    for index, piece in enumerate(pieces):
        word = piece.startswith("▁")
        text = piece[1:] if word else piece
        if word and index:
            at += 1  # the space the piece's marker stands for
        spans.append((at, at + len(text), word or index == 0))
        at += len(text)
    return spans


def spells(pieces: Sequence[str], text: str) -> bool:
    """Whether the pieces spell ``text`` exactly (no normalization, unknown or byte pieces), so
    that offsets counted on them are offsets of ``text``."""
    return "".join(pieces).replace("▁", " ").lstrip(" ") == text


def word_of_piece(spans: Sequence[tuple[int, int, bool]]) -> list[int]:
    """For each piece: the number of the word it belongs to."""
    numbers, word = [], -1
    for _, _, starts_word in spans:
        word += bool(starts_word) or word < 0
        numbers.append(word)
    return numbers


def scale(index: int, count: int, other_count: int) -> int:
    """Word ``index`` of ``count`` words as an index of ``other_count`` words, by proportion."""
    if count <= 1 or other_count <= 1:
        return 0 if index <= 0 or count <= 1 else other_count - 1
    return min(round(index * (other_count - 1) / (count - 1)), other_count - 1)


class AttentionAligner:
    """Aligns with ``weights(source, target tokens)``: (target pieces, source pieces) attention.
    Results are always word boundaries of the detokenized target: where the pieces do not spell
    the text (unknown pieces, normalization), words are matched by number instead of offset."""

    def __init__(self, weights: Callable[[str, list[int]], Optional[object]], src_pieces: Callable[[str], list[str]],
                 tgt_pieces: Callable[[list[int]], list[str]]):
        self.weights = weights
        self.src_pieces = src_pieces
        self.tgt_pieces = tgt_pieces

    def __call__(self, source: str, target: str, tokens: list[int], positions: Sequence[Position]) -> list[int]:
        matrix = self.weights(source, tokens) if tokens and positions else None
        if matrix is None:
            return relative_aligner(source, target, tokens, positions)
        src_pieces, tgt_pieces = self.src_pieces(source), self.tgt_pieces(tokens)
        if not src_pieces or not tgt_pieces or not word_bounds(target):
            return relative_aligner(source, target, tokens, positions)
        src_exact, tgt_exact = spells(src_pieces, source), spells(tgt_pieces, target)
        src, tgt = piece_spans(src_pieces[: matrix.shape[1]]), piece_spans(tgt_pieces[: matrix.shape[0]])
        out = []
        for offset, side in positions:
            piece = self._source_piece(offset, side, src, source, src_exact)
            if piece is None:
                out.append(len(target) if side == "start" else 0)
                continue
            best = int(matrix[: len(tgt), piece].argmax())
            at = self._target_offset(best, side, tgt, target, tgt_exact)
            out.append(outside_punctuation(source, target, (offset, side), at))
        return out

    @staticmethod
    def _source_piece(offset: int, side: str, src, source: str, exact: bool) -> Optional[int]:
        """The source piece right after (``start``) or before (``end``) ``offset``."""
        if not exact:  # offsets of the text are not the pieces': go by word number
            bounds, words = word_bounds(source), word_of_piece(src)
            if side == "start":
                after = [i for i, (start, end) in enumerate(bounds) if end > offset]
            else:
                after = [i for i, (start, end) in enumerate(bounds) if start < offset][-1:]
            if not after:
                return None
            word = scale(after[0], len(bounds), words[-1] + 1)
            matching = [i for i, number in enumerate(words) if number == word]
            return matching[0] if side == "start" else matching[-1]
        if side == "start":
            after = [i for i, (start, _, _) in enumerate(src) if start >= offset]
            return after[0] if after else None
        before = [i for i, (_, end, _) in enumerate(src) if end <= offset]
        return before[-1] if before else None

    @staticmethod
    def _target_offset(best: int, side: str, tgt, target: str, exact: bool) -> int:
        """The start (``start``) or end (``end``) of the target word holding piece ``best``."""
        words = word_of_piece(tgt)
        if exact:
            pieces = [i for i, number in enumerate(words) if number == words[best]]
            return min(tgt[pieces[0]][0] if side == "start" else tgt[pieces[-1]][1], len(target))
        bounds = word_bounds(target)
        start, end = bounds[scale(words[best], words[-1] + 1, len(bounds))]
        return start if side == "start" else end
