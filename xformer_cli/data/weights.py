"""Per-corpus and per-pair weights: which cached pairs an epoch trains on (``data.train[i].weight``,
``data.pairs[i].weight``, ``data.sampling_temperature``).

A weight is a sampling factor per epoch: ``w = k + f`` (k whole, 0 <= f < 1) takes every
pair of the corpus k times, plus round(f * n) of its n pairs drawn without replacement.
The draw is seeded with (seed, epoch, corpus), so an epoch's pairs, and with them its
batches and a resumed run's position, are the same whenever the epoch is rebuilt. With
every weight 1 there is no draw at all: the epoch is the whole cache, as without weights.

A multilingual config's pairs multiply their corpora's weights: by their own weight, or by
the factor temperature sampling gives them (``pair_factors``), computed from the pairs the
cache kept, so it is the same whenever the epoch is rebuilt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection, Optional, Sequence

import numpy as np

from xformer_cli.errors import XformerError

if TYPE_CHECKING:
    from xformer_cli.config import CorpusConfig, DataConfig
    from xformer_cli.data.cache import TokenCache

_STREAM = 0x5EED  # keeps these draws apart from make_batches' (seed, epoch) stream


def _split(n: int, weight: float) -> tuple[int, int]:
    """(whole passes over the corpus, pairs drawn besides) for a corpus of ``n`` pairs."""
    whole = int(weight)
    return whole, round((weight - whole) * n)


def epoch_indices(source_pairs: Optional[Sequence[int]], weights: Sequence[float], seed: int,
                  epoch: int) -> Optional[np.ndarray]:
    """The cache indices epoch ``epoch`` trains on, sorted (batching orders them); None when
    every weight is 1 (the whole cache, once)."""
    if all(w == 1 for w in weights):
        return None
    if source_pairs is None or len(source_pairs) != len(weights):
        raise XformerError("the token cache does not record its pairs per corpus; "
                           "delete data.cache_dir and train again")
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


def epoch_lengths(src_lens: np.ndarray, tgt_lens: np.ndarray,
                  picked: Optional[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The lengths batching sees this epoch: all pairs, or the picked ones in order."""
    if picked is None:
        return src_lens, tgt_lens
    return src_lens[picked], tgt_lens[picked]


def epoch_pairs(cache: TokenCache, data: DataConfig | Sequence[CorpusConfig], seed: int,
                epoch: int, left_out: Collection[int] = ()) -> tuple[Optional[np.ndarray], np.ndarray, np.ndarray]:
    """(picked cache indices or None, their source lengths, their target lengths) for one
    epoch of ``cache`` (a ``TokenCache``) under the weights of ``data``: the ``DataConfig``
    (pairs, their weights or the sampling temperature, and every corpus's weight), or, as
    before pairs, the list ``data.train``. The cached sources in ``left_out`` (their
    ``until`` reached) take no pair."""
    weights = [0.0 if i in left_out else w for i, w in enumerate(source_weights(data, cache.source_pairs))]
    picked = epoch_indices(cache.source_pairs, weights, seed, epoch)
    return (picked, *epoch_lengths(cache.src_lens, cache.tgt_lens, picked))


def source_weights(data: DataConfig | Sequence[CorpusConfig], source_pairs: Optional[Sequence[int]]) -> list[float]:
    """Each cached source's sampling factor: its corpus's weight times its pair's factor
    (``pair_factors``). The sources lie in the cache pair by pair, corpus by corpus."""
    if not hasattr(data, "directions"):  # the list data.train: one pair
        weights = [c.weight for c in data]
        if source_pairs is not None and len(source_pairs) != len(weights):
            raise XformerError(f"the token cache holds {len(source_pairs)} corpora, the weights name {len(weights)}: "
                               "pass the DataConfig (data.pairs)")
        return weights
    directions = data.directions()
    owners = [(i, corpus.weight) for i, pair in enumerate(directions) for corpus in pair.train]
    if source_pairs is None:
        return [w for _, w in owners]
    sizes = [0.0] * len(directions)
    for (i, weight), n in zip(owners, source_pairs):
        sizes[i] += weight * n
    factors = pair_factors(sizes, [p.weight for p in directions], data.sampling_temperature)
    return [weight * factors[i] for i, weight in owners]


def pair_factors(sizes: Sequence[float], weights: Sequence[float], temperature: float) -> list[float]:
    """Each pair's factor: its explicit weight; or, at a temperature T other than 1, what
    gives pair i the share n_i ** (1/T) / sum_k n_k ** (1/T) of an epoch as long as the data
    (sum_k n_k pairs). T = 1 with weights 1 takes the data as it is (factors exactly 1)."""
    if temperature == 1 or not any(sizes):
        return list(weights)
    total = sum(sizes)
    scaled = [n ** (1.0 / temperature) for n in sizes]
    norm = sum(scaled)
    return [total * s / (norm * n) if n else 1.0 for s, n in zip(scaled, sizes)]


def weighted(corpora: Sequence[CorpusConfig]) -> bool:
    """Whether any corpus of data.train has a weight other than 1 or ends before the run (``until``)."""
    return any(c.weight != 1 or c.until < 1 for c in corpora)


def source_untils(data: DataConfig) -> list[tuple[str, float]]:
    """Each cached source's (name, data.train until), in the cache's order: pair by pair, corpus by corpus."""
    directions = data.directions()
    return [(_corpus_name(corpus, i, len(pair.train), pair.name if len(directions) > 1 else ""), corpus.until)
            for pair in directions for i, corpus in enumerate(pair.train)]


def _corpus_name(corpus: CorpusConfig, i: int, n: int, pair: str) -> str:
    where = f"data.train[{i}]" if n > 1 else "data.train"
    what = corpus.prefix or corpus.src or corpus.dataset or corpus.data_files
    return (f"{pair} " if pair else "") + where + (f" ({what})" if what else "")


def data_weighted(data: DataConfig) -> bool:
    """Whether an epoch draws anything (a corpus or pair weight, or a sampling temperature)."""
    return data.sampling_temperature != 1 or any(p.weight != 1 or weighted(p.train) for p in data.directions())


def describe(source_pairs: Sequence[int], weights: Sequence[float], names: Sequence[str]) -> str:
    """One log line: what an epoch takes from each source under its weight."""
    parts, total = [], 0
    for n, weight, name in zip(source_pairs, weights, names):
        whole, extra = _split(n, weight)
        taken = whole * n + extra
        total += taken
        parts.append(f"{taken} from {name} ({n} pairs x {weight:.4g})")
    return f"data: an epoch takes {total} pairs: " + ", ".join(parts)
