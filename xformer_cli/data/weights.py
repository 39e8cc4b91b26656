"""Per-corpus weights: which cached pairs an epoch trains on (``data.train[i].weight``).

A weight is a sampling factor per epoch: ``w = k + f`` (k whole, 0 <= f < 1) takes every
pair of the corpus k times, plus round(f * n) of its n pairs drawn without replacement.
The draw is seeded with (seed, epoch, corpus), so an epoch's pairs, and with them its
batches and a resumed run's position, are the same whenever the epoch is rebuilt. With
every weight 1 there is no draw at all: the epoch is the whole cache, as without weights.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from xformer_cli.errors import XformerError

_STREAM = 0x5EED  # keeps these draws apart from make_batches' (seed, epoch) stream


def _split(n: int, weight: float) -> tuple[int, int]:
    """(whole passes over the corpus, pairs drawn besides) for a corpus of ``n`` pairs."""
    whole = int(weight)
    return whole, round((weight - whole) * n)


def epoch_indices(source_pairs: Optional[Sequence[int]], weights: Sequence[float], seed: int, epoch: int) -> Optional[np.ndarray]:
    """The cache indices epoch ``epoch`` trains on, sorted (batching orders them); None when
    every weight is 1 (the whole cache, once)."""
    if all(w == 1 for w in weights):
        return None
    if source_pairs is None or len(source_pairs) != len(weights):
        raise XformerError("the token cache does not record its pairs per corpus; delete data.cache_dir and train again")
    picked = []
    start = 0
    for corpus, (n, weight) in enumerate(zip(source_pairs, weights)):
        whole, extra = _split(n, weight)
        pairs = np.arange(start, start + n, dtype=np.int64)
        picked.extend([pairs] * whole)
        if extra:
            rng = np.random.default_rng([seed, epoch, corpus, _STREAM])
            picked.append(np.sort(rng.choice(pairs, size=extra, replace=False)))
        start += n
    indices = np.sort(np.concatenate(picked)) if picked else np.zeros(0, np.int64)
    if not len(indices):
        raise XformerError("data.train weights leave no pair to train on in an epoch; raise a weight")
    return indices


def to_cache_indices(batches: list, picked: Optional[np.ndarray]) -> list:
    """Batches made over the picked pairs' lengths (``lengths[picked]``), as cache indices;
    nested lists (packed rows) are mapped item by item."""
    if picked is None:
        return batches
    return [picked[b] if isinstance(b, np.ndarray) else to_cache_indices(b, picked) for b in batches]


def epoch_lengths(src_lens: np.ndarray, tgt_lens: np.ndarray, picked: Optional[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The lengths batching sees this epoch: all pairs, or the picked ones in order."""
    if picked is None:
        return src_lens, tgt_lens
    return src_lens[picked], tgt_lens[picked]


def epoch_pairs(cache, corpora: Sequence, seed: int, epoch: int) -> tuple[Optional[np.ndarray], np.ndarray, np.ndarray]:
    """(picked cache indices or None, their source lengths, their target lengths) for one
    epoch of ``cache`` (a ``TokenCache``) under the weights of ``corpora`` (data.train)."""
    picked = epoch_indices(cache.source_pairs, [c.weight for c in corpora], seed, epoch)
    return (picked, *epoch_lengths(cache.src_lens, cache.tgt_lens, picked))


def weighted(corpora: Sequence) -> bool:
    """Whether any corpus of data.train has a weight other than 1."""
    return any(c.weight != 1 for c in corpora)


def describe(source_pairs: Sequence[int], corpora: Sequence, names: Sequence[str]) -> str:
    """One log line: what an epoch takes from each corpus under its weight."""
    parts, total = [], 0
    for n, corpus, name in zip(source_pairs, corpora, names):
        whole, extra = _split(n, corpus.weight)
        taken = whole * n + extra
        total += taken
        parts.append(f"{taken} from {name} ({n} pairs x {corpus.weight:g})")
    return f"data: an epoch takes {total} pairs: " + ", ".join(parts)
