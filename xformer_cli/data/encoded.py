"""A small parallel corpus held as piece ids in memory: the validation set (the training
corpus lives in the token cache, ``data/cache.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from xformer_cli.data.batching import Batch, collate
from xformer_cli.data.sources import ParallelCorpus
from xformer_cli.tokenizer import Tokenizer


@dataclass
class EncodedCorpus:
    src: list[list[int]]
    tgt: list[list[int]]
    raw_tgt: list[str]  # detokenized references, for BLEU

    @property
    def src_lens(self) -> np.ndarray:
        return np.fromiter((len(s) for s in self.src), dtype=np.int64, count=len(self.src))

    @property
    def tgt_lens(self) -> np.ndarray:
        return np.fromiter((len(t) for t in self.tgt), dtype=np.int64, count=len(self.tgt))

    def batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        return collate([self.src[i] for i in indices], [self.tgt[i] for i in indices])


def encode_corpus(corpus: ParallelCorpus, tokenizer: Tokenizer, max_len: Optional[int] = None) -> EncodedCorpus:
    """Pairs with an empty side left out; with ``max_len``, pairs with a longer side too
    (counted in ``corpus.dropped``)."""
    src, tgt = tokenizer.encode_src(corpus.src), tokenizer.encode_tgt(corpus.tgt)
    keep = [i for i in range(len(src)) if src[i] and tgt[i]]
    if max_len is not None:
        over = [i for i in keep if len(src[i]) > max_len or len(tgt[i]) > max_len]
        if over:
            corpus.dropped[f"longer than {max_len} pieces"] += len(over)
            drop = set(over)
            keep = [i for i in keep if i not in drop]
    return EncodedCorpus([src[i] for i in keep], [tgt[i] for i in keep], [corpus.tgt[i] for i in keep])
