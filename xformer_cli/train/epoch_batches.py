"""Which pairs go into each batch of an epoch, and the shape a loaded batch has.

The loop asks a plan for an epoch's batches over the lengths of the pairs the epoch trains on
(index arrays into those lengths; (seed, epoch) fix them, so a position in the list is resumable)
and for each batch's host tensors. ``TokenBudgetPlan``
is the default: batches as wide as their longest pair. ``BucketPlan`` (``train.length_bucket``)
pads every batch to one of a small declared set of shapes, so compiled code and CUDA graphs
are built once per shape. ``PackedPlan`` (``train.batching: packed``) gives every batch ONE
shape, several pairs back to back in a row (``data/packing.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection, Optional, Protocol, Sequence

import numpy as np

from xformer_cli.data.batching import Batch, bucket_shape, declared_shapes, make_batches, make_bucketed_batches, shard
from xformer_cli.data.packing import (PackedBatch, PackedRows, PackShape, collate_packed, make_packed_batches,
                                      pack_shape)
from xformer_cli.data.weights import epoch_pairs, to_cache_indices

if TYPE_CHECKING:
    from xformer_cli.config import CorpusConfig, DataConfig
    from xformer_cli.data.cache import TokenCache


class TrainingData(Protocol):
    """What a plan reads: the pairs' lengths, and their tensors by index."""

    @property
    def src_lens(self) -> np.ndarray: ...

    @property
    def tgt_lens(self) -> np.ndarray: ...

    def batch(self, indices: np.ndarray) -> Batch: ...


class BatchPlan(Protocol):
    static_shapes: bool  # every batch has one of a few fixed shapes (compiled code may specialise)

    def batches(self, epoch: int, src_lens: np.ndarray, tgt_lens: np.ndarray) -> list: ...

    def load(self, indices: np.ndarray) -> Batch: ...

    def declared(self, max_len: int) -> list[tuple[int, int]]: ...


class TokenBudgetPlan:
    """``make_batches``: batch size x longest side <= max_tokens; shapes vary batch to batch."""

    static_shapes = False

    def __init__(self, data: TrainingData, max_tokens: int, seed: int):
        self.data, self.max_tokens, self.seed = data, max_tokens, seed

    def batches(self, epoch: int, src_lens: np.ndarray, tgt_lens: np.ndarray) -> list[np.ndarray]:
        return make_batches(src_lens, tgt_lens, self.max_tokens, self.seed, epoch)

    def load(self, indices: np.ndarray) -> Batch:
        return self.data.batch(indices)

    def declared(self, max_len: int) -> list[tuple[int, int]]:
        return []  # any shape


class BucketPlan:
    """``make_bucketed_batches``: each batch padded to the declared (rows, width) of its widest pair."""

    static_shapes = True

    def __init__(self, data: TrainingData, max_tokens: int, step: int, seed: int):
        self.data, self.max_tokens, self.step, self.seed = data, max_tokens, step, seed

    def batches(self, epoch: int, src_lens: np.ndarray, tgt_lens: np.ndarray) -> list[np.ndarray]:
        return make_bucketed_batches(src_lens, tgt_lens, self.max_tokens, self.step, self.seed, epoch)

    def shape(self, indices: np.ndarray) -> tuple[int, int]:
        widest = int(max(self.data.src_lens[indices].max(), self.data.tgt_lens[indices].max())) + 1
        return bucket_shape(widest, self.max_tokens, self.step)

    def load(self, indices: np.ndarray) -> Batch:
        return self.data.batch(indices).padded_to(*self.shape(indices))

    def declared(self, max_len: int) -> list[tuple[int, int]]:
        """Every (rows, width) a batch of pairs up to ``max_len`` pieces a side can have."""
        return declared_shapes(max_len, self.max_tokens, self.step)


class PackedPlan:
    """``make_packed_batches``: rows of several pairs, every batch (rows, source width, target width)."""

    static_shapes = True

    def __init__(self, data: TokenCache, max_tokens: int, seed: int):
        self.data, self.seed = data, seed
        self.shape: PackShape = pack_shape(data.src_lens, data.tgt_lens, max_tokens)

    def batches(self, epoch: int, src_lens: np.ndarray, tgt_lens: np.ndarray) -> list:
        return make_packed_batches(src_lens, tgt_lens, self.shape, self.seed, epoch)

    def load(self, rows: PackedRows) -> PackedBatch:
        d = self.data
        return collate_packed(d.src_ids, d.src_offsets, d.tgt_ids, d.tgt_offsets, rows, self.shape)

    def declared(self, max_len: int) -> list[tuple[int, int]]:
        return [(self.shape.rows, self.shape.src_width, self.shape.tgt_width)]


def plan_for(data: TrainingData, max_tokens: int, length_bucket: int, seed: int,
             batching: str = "dynamic") -> BatchPlan:
    """The plan the config asks for: packed rows, buckets when ``length_bucket`` > 0, else token budgets."""
    if batching == "packed":
        return PackedPlan(data, max_tokens, seed)
    if length_bucket > 0:
        return BucketPlan(data, max_tokens, length_bucket, seed)
    return TokenBudgetPlan(data, max_tokens, seed)


def epoch_share(plan: BatchPlan, cache: TokenCache, data: DataConfig | Sequence[CorpusConfig], seed: int, epoch: int,
                rank: int = 0, world_size: int = 1, left_out: Collection[int] = ()) -> list:
    """This rank's batches of ``epoch`` (cache indices): the pairs the weights of ``data`` (the
    DataConfig: corpus weights, pair weights or temperature) pick for the epoch, less the cached
    sources ``left_out``, batched by ``plan``, cut to a multiple of the ranks (every rank takes the
    same number of steps) and shared out."""
    picked, src_lens, tgt_lens = epoch_pairs(cache, data, seed, epoch, left_out)
    batches = to_cache_indices(plan.batches(epoch, src_lens, tgt_lens), picked)
    if world_size > 1:
        usable = len(batches) // world_size * world_size
        batches = shard(batches[:usable], rank, world_size)
    return batches


def widest_pair(data: TrainingData) -> int:
    """Token slots (+ eos/bos) of the longest side of any pair: the widest batch an epoch can hold."""
    longest: Optional[int] = None
    if len(data.src_lens):
        longest = int(max(data.src_lens.max(), data.tgt_lens.max()))
    return (longest or 0) + 1
