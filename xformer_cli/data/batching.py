"""Token-budget batching: length-sorted, padding counted, order seeded per epoch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from xformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Batch:
    src: Tensor  # (B, S) source ids + eos, padded
    tgt_in: Tensor  # (B, T) bos + target ids, padded
    tgt_out: Tensor  # (B, T) target ids + eos, padded
    n_tokens: int  # real target tokens (what the loss is normalised by)

    def pin(self) -> "Batch":
        """Page-locked host memory, so the copy to the GPU can overlap compute."""
        return Batch(self.src.pin_memory(), self.tgt_in.pin_memory(), self.tgt_out.pin_memory(), self.n_tokens)

    def padded_to(self, rows: int, width: int) -> "Batch":
        """This batch grown to ``rows`` x ``width`` on both sides (a declared bucket shape):
        padding columns, then filler rows (source eos, target bos, nothing to predict), so
        the loss and n_tokens are those of the real rows."""
        def grow(t: Tensor, first: int) -> Tensor:
            out = torch.full((rows, width), PAD_ID, dtype=t.dtype)
            out[: t.size(0), : t.size(1)] = t
            out[t.size(0) :, 0] = first
            return out

        return Batch(grow(self.src, EOS_ID), grow(self.tgt_in, BOS_ID), grow(self.tgt_out, PAD_ID), self.n_tokens)

    def to(self, device: torch.device) -> "Batch":
        nb = device.type == "cuda"
        return Batch(self.src.to(device, non_blocking=nb), self.tgt_in.to(device, non_blocking=nb),
                     self.tgt_out.to(device, non_blocking=nb), self.n_tokens)

    def with_start_token(self, bos_id: int) -> "Batch":
        """Decoder inputs that start with ``bos_id`` (model.bos_id: Marian's models start from
        pad) instead of the cache's BOS_ID."""
        if bos_id != BOS_ID:
            self.tgt_in[:, 0] = bos_id
        return self


def make_batches(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int = 0, epoch: int = 0, shuffle: bool = True
) -> list[np.ndarray]:
    """Group example indices so that batch_size * longest side (+1 for eos/bos) <= max_tokens.

    Examples are sorted by length, the source's first (ties broken by a seeded shuffle), so a
    batch holds similar lengths and little padding. Sorted by the target's first, the target
    side (the dearer: the decoder, the output layer and the loss) carried almost no padding,
    but models trained on batches of one target length each lost valid BLEU under beam search
    (docs/benchmarks/training-recipe.md, "An output layer over the target side's pieces"). The batch order is then
    shuffled with the same seed, so (seed, epoch) fixes the whole epoch and a batch index is a resumable position.
    A single example longer than ``max_tokens`` forms a batch of its own. Memory is a few
    integers per example, whatever the corpus size.
    """
    src_lens = np.asarray(src_lens, dtype=np.int64)
    tgt_lens = np.asarray(tgt_lens, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch])
    tie = rng.permutation(len(src_lens)) if shuffle else np.arange(len(src_lens))
    order = np.lexsort((tie, tgt_lens, src_lens))
    bounds = batch_bounds(np.maximum(src_lens, tgt_lens)[order] + 1, max_tokens)
    batches = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def bucket_shape(width: int, max_tokens: int, step: int) -> tuple[int, int]:
    """(rows, padded width) of the bucket for sentences up to ``width`` slots (+ eos/bos): the
    width rounded up to a multiple of ``step``, and as many rows as ``max_tokens`` allows
    (at least one)."""
    padded = -(-width // step) * step
    return max(1, max_tokens // padded), padded


def declared_shapes(max_len: int, max_tokens: int, step: int) -> list[tuple[int, int]]:
    """Every (rows, width) a bucketed batch can have for pairs of up to ``max_len`` pieces a side."""
    return [bucket_shape(width, max_tokens, step) for width in range(step, max_len + 1 + step, step)]


def make_bucketed_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, step: int, seed: int = 0,
                          epoch: int = 0, shuffle: bool = True) -> list[np.ndarray]:
    """Batches whose shape comes from a small declared set (``declared_shapes``), so compiled
    code and CUDA graphs are built once per shape: pairs are sorted by their wider side,
    each bucket is cut into batches of its fixed row count, and a bucket's leftover pairs
    join the next bucket (so few batches an epoch have rows to spare).
    A batch's shape is ``bucket_shape`` of its widest pair; ``Batch.padded_to`` fills it.
    Like ``make_batches``, (seed, epoch) fixes the whole epoch."""
    widths = np.maximum(np.asarray(src_lens, dtype=np.int64), np.asarray(tgt_lens, dtype=np.int64)) + 1
    rng = np.random.default_rng([seed, epoch])
    tie = rng.permutation(len(widths)) if shuffle else np.arange(len(widths))
    order = np.lexsort((tie, widths))
    buckets = -(-widths[order] // step) * step
    batches: list[np.ndarray] = []
    waiting = order[:0]
    edges = np.flatnonzero(np.diff(buckets)) + 1
    for members, width in zip(np.split(order, edges), buckets[np.r_[0, edges]] if len(order) else []):
        rows, _ = bucket_shape(int(width), max_tokens, step)
        pool = np.concatenate([waiting, members])
        full = len(pool) // rows * rows
        batches.extend(np.split(pool[:full], full // rows) if full else [])
        waiting = pool[full:]
    if len(waiting):
        batches.append(waiting)
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def batch_bounds(widths: "np.ndarray | Sequence[int]", max_slots: int,
                 max_sentences: Optional[int] = None) -> list[int]:
    """Cut points of consecutive batches over ``widths`` (token slots per sentence, in batch
    order) such that batch size * widest <= ``max_slots`` and size <= ``max_sentences``; a
    sentence wider than ``max_slots`` goes alone. The one batching rule that training
    (``make_batches``) and translation (``token_batches``) share."""
    widths = np.asarray(widths, dtype=np.int64)
    cap = max_sentences or len(widths) or 1
    bounds = [0]
    start, longest = 0, 0
    for offset in range(0, len(widths), 1 << 16):  # tolist in pieces: flat memory on huge corpora
        for i, width in enumerate(widths[offset : offset + (1 << 16)].tolist(), start=offset):
            longest_if_added = max(longest, width)
            if i > start and (i - start >= cap or longest_if_added * (i - start + 1) > max_slots):
                bounds.append(i)
                start, longest_if_added = i, width
            longest = longest_if_added
    if len(widths):
        bounds.append(len(widths))
    return bounds


def token_batches(lengths: Sequence[int], order: Sequence[int], max_sentences: int, max_slots: int) -> list[list[int]]:
    """Cut ``order`` (indices sorted by length) into batches of at most ``max_sentences``
    sentences and ``max_slots`` padded source tokens (+ eos); a longer sentence goes alone."""
    order = list(order)
    bounds = batch_bounds([lengths[i] + 1 for i in order], max_slots, max_sentences)
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def shard(batches: Sequence[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """This rank's share for data-parallel training: disjoint across ranks, together complete."""
    return list(batches[rank::world_size])


def padding_efficiency(batches: Sequence[np.ndarray], src_lens: np.ndarray, tgt_lens: np.ndarray) -> float:
    """Real tokens over token slots, both sides, eos/bos included: a figure for
    scripts/bench_batching.py and scripts/bench_data.py (training does not compute it)."""
    real = slots = 0
    for b in batches:
        s, t = src_lens[b] + 1, tgt_lens[b] + 1
        real += int(s.sum() + t.sum())
        slots += len(b) * int(s.max() + t.max())
    return real / max(slots, 1)


def pad(sequences: Sequence[Sequence[int]], prefix: Sequence[int] = (), suffix: Sequence[int] = ()) -> Tensor:
    width = max(len(s) for s in sequences) + len(prefix) + len(suffix)
    out = torch.full((len(sequences), width), PAD_ID, dtype=torch.long)
    for row, seq in enumerate(sequences):
        full = [*prefix, *seq, *suffix]
        out[row, : len(full)] = torch.tensor(full, dtype=torch.long)
    return out


def collate(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> Batch:
    return Batch(
        src=pad(src, suffix=(EOS_ID,)),
        tgt_in=pad(tgt, prefix=(BOS_ID,)),
        tgt_out=pad(tgt, suffix=(EOS_ID,)),
        n_tokens=sum(len(t) + 1 for t in tgt),
    )


def collate_flat(
    src_ids: np.ndarray, src_offsets: np.ndarray, tgt_ids: np.ndarray, tgt_offsets: np.ndarray, indices: np.ndarray
) -> Batch:
    """``collate`` for pairs stored back to back in flat arrays (the token cache): one
    vectorised gather per side instead of a Python loop over sentences."""
    indices = np.asarray(indices, dtype=np.int64)
    src, _ = _gather_padded(src_ids, src_offsets, indices)
    tgt_out, tgt_lens = _gather_padded(tgt_ids, tgt_offsets, indices)
    tgt_in = np.empty_like(tgt_out)
    tgt_in[:, 0] = BOS_ID
    tgt_in[:, 1:] = tgt_out[:, :-1]
    shorter = np.flatnonzero(tgt_lens < tgt_out.shape[1] - 1)
    tgt_in[shorter, tgt_lens[shorter] + 1] = PAD_ID  # the eos shifted in from tgt_out is padding here
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out),
                 int(tgt_lens.sum() + len(indices)))


def _gather_padded(ids: np.ndarray, offsets: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ids[off[i]:off[i+1]] + eos, right-padded, as one (n, longest + 1) int64 array."""
    starts = np.asarray(offsets[indices], dtype=np.int64)
    lens = np.asarray(offsets[indices + 1], dtype=np.int64) - starts
    longest = int(lens.max()) if len(lens) else 0
    cols = np.arange(longest)
    mask = cols[None, :] < lens[:, None]
    out = np.full((len(indices), longest + 1), PAD_ID, dtype=np.int64)
    out[:, :longest][mask] = ids[(starts[:, None] + cols[None, :])[mask]]
    out[np.arange(len(indices)), lens] = EOS_ID
    return out, lens


def encode_source_batch(src: Sequence[Sequence[int]]) -> Tensor:
    return pad(src, suffix=(EOS_ID,))
