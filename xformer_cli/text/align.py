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
"""

from __future__ import annotations

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


def relative_aligner(source: str, target: str, tokens: list[int], positions: Sequence[Position]) -> list[int]:
    return [relative_offset(source, target, position) for position in positions]


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


class AttentionAligner:
    """Aligns with ``weights(source, target tokens)``: (target pieces, source pieces) attention."""

    def __init__(self, weights: Callable[[str, list[int]], Optional[object]], src_pieces: Callable[[str], list[str]],
                 tgt_pieces: Callable[[list[int]], list[str]]):
        self.weights = weights
        self.src_pieces = src_pieces
        self.tgt_pieces = tgt_pieces

    def __call__(self, source: str, target: str, tokens: list[int], positions: Sequence[Position]) -> list[int]:
        matrix = self.weights(source, tokens) if tokens and positions else None
        if matrix is None:
            return relative_aligner(source, target, tokens, positions)
        src = piece_spans(self.src_pieces(source))[: matrix.shape[1]]
        tgt = piece_spans(self.tgt_pieces(tokens))[: matrix.shape[0]]
        if not src or not tgt:
            return relative_aligner(source, target, tokens, positions)
        return [self._one(offset, side, src, tgt, matrix, target) for offset, side in positions]

    @staticmethod
    def _one(offset: int, side: str, src, tgt, matrix, target: str) -> int:
        if side == "start":
            after = [i for i, (start, _, _) in enumerate(src) if start >= offset]
            if not after:
                return len(target)
            piece = after[0]
        else:
            before = [i for i, (_, end, _) in enumerate(src) if end <= offset]
            if not before:
                return 0
            piece = before[-1]
        best = int(matrix[: len(tgt), piece].argmax())
        word_start = max(i for i in range(best + 1) if tgt[i][2])
        if side == "start":
            return min(tgt[word_start][0], len(target))
        word_end = best
        while word_end + 1 < len(tgt) and not tgt[word_end + 1][2]:
            word_end += 1
        return min(tgt[word_end][1], len(target))
