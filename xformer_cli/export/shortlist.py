"""A lexical shortlist for a CTranslate2 export: for each source piece, the target pieces seen
with it most in the model's training pairs (by the Dice coefficient of their pair counts), plus
the target side's most frequent pieces, written as CTranslate2's vocabulary map (``vmap.txt``).

With it CTranslate2 scores, at each step, only the candidates of the batch's source pieces in
place of the whole vocabulary: the output layer is most of a one-layer decoder's step, so a
small student decodes faster (Marian's shortlists and the Firefox students do the same). A
search over the candidates alone can differ from the full one where the model would pick a
piece no source piece of the batch lists; the export records the shortlist, and an export
without one searches the whole vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from xformer_cli.errors import XformerError
from xformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

VMAP_FILE = "vmap.txt"  # the name CTranslate2 loads next to model.bin
CHUNK_PAIRS = 20_000  # pairs encoded and merged into the counts at once


@dataclass(frozen=True)
class ShortlistSettings:
    per_source: int = 20  # target candidates per source piece
    frequent: int = 100  # the target side's most frequent pieces, candidates for every batch
    max_pairs: int = 1_000_000  # training pairs counted at most (the first ones); 0 = all

    def check(self, where: str) -> None:
        if self.per_source < 1 or self.frequent < 0 or self.max_pairs < 0:
            raise XformerError(f"{where}: the shortlist needs per_source >= 1, frequent >= 0 and max_pairs >= 0")


@dataclass
class Shortlist:
    settings: ShortlistSettings
    frequent: list[int]  # target piece ids
    by_source: dict[int, list[int]]  # source piece id -> target piece ids, best first
    pairs: int  # training pairs counted


def build_shortlist(tokenizer: Tokenizer, pairs: Iterable[tuple[str, str]], settings: ShortlistSettings,
                    log: Callable[[str], None] = lambda _: None) -> Shortlist:
    """Count which target pieces come with each source piece (once a pair) and rank them; ``log``
    gets one line of what was found. The pair counts are merged chunk by chunk: memory grows
    with the distinct (source, target) piece pairs, not with the corpus."""
    settings.check("the shortlist")
    src_vocab, tgt_vocab = tokenizer.src.get_piece_size(), tokenizer.tgt.get_piece_size()
    src_counts, tgt_counts = np.zeros(src_vocab, np.int64), np.zeros(tgt_vocab, np.int64)
    tgt_tokens = np.zeros(tgt_vocab, np.int64)  # every occurrence, for the frequent list
    codes, together, seen = np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    for chunk in _chunks(pairs, settings.max_pairs):
        seen += len(chunk)
        sources = [np.unique(np.asarray(ids, np.int64)) for ids in tokenizer.encode_src([s for s, _ in chunk])]
        targets_all = [np.asarray(ids, np.int64) for ids in tokenizer.encode_tgt([t for _, t in chunk])]
        targets = [np.unique(ids) for ids in targets_all]
        for s, t, t_all in zip(sources, targets, targets_all):
            src_counts[s] += 1
            tgt_counts[t] += 1
            np.add.at(tgt_tokens, t_all, 1)
        chunk_codes = [np.add.outer(s * tgt_vocab, t).ravel() for s, t in zip(sources, targets) if len(s) and len(t)]
        codes, inverse = np.unique(np.concatenate([codes, *chunk_codes]), return_inverse=True)
        weights = np.concatenate([together, np.ones(len(inverse) - len(together), np.int64)])
        together = np.bincount(inverse.ravel(), weights=weights, minlength=len(codes)).astype(np.int64)
    if not seen:
        raise XformerError("the shortlist has no training pairs to count")
    found = Shortlist(settings, _frequent(tgt_tokens, settings.frequent),
                      _ranked(codes, together, src_counts, tgt_counts, tgt_vocab, settings.per_source), seen)
    log(f"shortlist: {len(found.by_source)} source pieces, up to {settings.per_source} candidates each, "
        f"{len(found.frequent)} in every batch, counted on {seen} training pairs")
    return found


def _chunks(pairs: Iterable[tuple[str, str]], max_pairs: int) -> Iterator[list[tuple[str, str]]]:
    chunk: list[tuple[str, str]] = []
    for n, pair in enumerate(pairs):
        if max_pairs and n >= max_pairs:
            break
        chunk.append(pair)
        if len(chunk) == CHUNK_PAIRS:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


NEVER_CANDIDATES = (PAD_ID, BOS_ID, EOS_ID, UNK_ID)  # never emitted (pad, bos) or always kept by CTranslate2


def _frequent(tgt_tokens: np.ndarray, how_many: int) -> list[int]:
    tgt_tokens = tgt_tokens.copy()
    tgt_tokens[list(NEVER_CANDIDATES)] = 0
    order = np.argsort(-tgt_tokens, kind="stable")[:how_many]
    return [int(i) for i in order if tgt_tokens[i] > 0]


def _ranked(codes: np.ndarray, together: np.ndarray, src_counts: np.ndarray, tgt_counts: np.ndarray,
            tgt_vocab: int, per_source: int) -> dict[int, list[int]]:
    """Each source piece's ``per_source`` target pieces of the highest Dice coefficient,
    2 * count(both) / (count(source) + count(target)), ties by piece id."""
    if not len(codes):
        return {}
    src, tgt = codes // tgt_vocab, codes % tgt_vocab
    keep = ~np.isin(tgt, NEVER_CANDIDATES)
    src, tgt, together = src[keep], tgt[keep], together[keep]
    dice = 2 * together / (src_counts[src] + tgt_counts[tgt])
    order = np.lexsort((tgt, -dice, src))  # by source, then best first
    src, tgt = src[order], tgt[order]
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])
    ends = np.r_[starts[1:], len(src)]
    return {int(src[a]): [int(t) for t in tgt[a:min(b, a + per_source)]] for a, b in zip(starts, ends)}


def write_vmap(path: Path, shortlist: Shortlist, tokenizer: Tokenizer) -> None:
    """CTranslate2's format: ``source n-gram<TAB>candidates`` a line; the empty source's
    candidates are in every batch's list."""
    src_piece, tgt_piece = tokenizer.src.id_to_piece, tokenizer.tgt.id_to_piece
    plain = lambda piece: not any(c.isspace() for c in piece)  # noqa: E731  (a space would split the line's fields)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\t" + " ".join(p for p in map(tgt_piece, shortlist.frequent) if plain(p)) + "\n")
        for s in sorted(shortlist.by_source):
            if plain(src_piece(s)):
                f.write(src_piece(s) + "\t" + " ".join(p for p in map(tgt_piece, shortlist.by_source[s]) if plain(p))
                        + "\n")


def candidates(shortlist: Shortlist, source_ids: Sequence[int]) -> set[int]:
    """The target pieces a sentence's search may pick under the shortlist (CTranslate2 adds
    unk, bos and eos, and takes the union over a batch)."""
    found = set(shortlist.frequent) | {UNK_ID, BOS_ID, EOS_ID}
    for s in source_ids:
        found.update(shortlist.by_source.get(s, ()))
    return found
