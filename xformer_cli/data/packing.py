"""Packed batches: one (rows, source width, target width) shape for the whole run.

Several sentence pairs sit back to back in each row, each with its own eos (source) and
bos/eos (target); the model keeps them apart with segment ids and per-pair positions
(``model.transformer.Packing``). Every batch of a run has the same shape, so compiled code
is built once and CUDA graphs can be captured, while padding stays low even where pair
lengths vary a lot (length buckets cannot do both on short-sentence corpora).

The shape (``pack_shape``): each side as wide as the corpus' longest sentence on that side
plus eos/bos, rounded up to a multiple of 8, the narrower side widened to the corpus'
source:target token ratio; as many rows as ``max_tokens`` allows, counted
per side as ``make_batches`` counts it (rows x the wider side <= max_tokens), so switching
between the two keeps the tokens per batch. A pair is never split across rows.

Rows are filled first-fit decreasing within windows of shuffled pairs (``pack_rows``), and
batch order is shuffled: (seed, epoch) fix the whole epoch, so a batch index is a
resumable position, as with ``make_batches``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from xformer_cli.model.transformer import Packing
from xformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID

WIDTH_MULTIPLE = 8  # tensor-core friendly widths
WINDOW = 16384  # pairs packed together: large enough for small pairs to fill the gaps, small enough to vary per epoch

Row = np.ndarray  # pair indices of one row, in order
PackedRows = list[Row]  # the rows of one batch (fewer than ``rows`` only in an epoch's last batch)


@dataclass(frozen=True)
class PackShape:
    rows: int
    src_width: int  # source slots per row (eos included)
    tgt_width: int  # target slots per row (bos or eos included)


@dataclass
class PackedBatch:
    src: Tensor  # (rows, src_width) source ids, each pair's eos after it
    tgt_in: Tensor  # (rows, tgt_width) bos + target ids, per pair
    tgt_out: Tensor  # (rows, tgt_width) target ids + eos, per pair
    n_tokens: int  # real target tokens (what the loss is normalised by)
    packing: Packing  # segment ids and positions the model masks attention with

    def pin(self) -> "PackedBatch":
        """Page-locked host memory, so the copy to the GPU can overlap compute."""
        p = self.packing
        pinned = Packing(*(t.pin_memory() for t in (p.src_segments, p.tgt_segments, p.src_positions, p.tgt_positions)))
        return PackedBatch(self.src.pin_memory(), self.tgt_in.pin_memory(), self.tgt_out.pin_memory(), self.n_tokens,
                           pinned)

    def with_start_token(self, bos_id: int) -> "PackedBatch":
        """Every pair's decoder input starts with ``bos_id`` (model.bos_id) instead of BOS_ID."""
        if bos_id != BOS_ID:
            starts = (self.packing.tgt_positions == 0) & (self.packing.tgt_segments > 0)
            self.tgt_in[starts] = bos_id
        return self

    def to(self, device: torch.device) -> "PackedBatch":
        nb = device.type == "cuda"
        return PackedBatch(self.src.to(device, non_blocking=nb), self.tgt_in.to(device, non_blocking=nb),
                           self.tgt_out.to(device, non_blocking=nb), self.n_tokens, self.packing.to(device, nb))


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pack_shape(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int) -> PackShape:
    """The one batch shape of a run over this (length-filtered) corpus. The narrower side is
    widened to the corpus' source:target token ratio: a row is full when either side is,
    so widths out of proportion leave the other side part empty."""
    src_slots, tgt_slots = np.asarray(src_lens, dtype=np.int64) + 1, np.asarray(tgt_lens, dtype=np.int64) + 1
    src_width = _round_up(int(src_slots.max(initial=1)), WIDTH_MULTIPLE)
    tgt_width = _round_up(int(tgt_slots.max(initial=1)), WIDTH_MULTIPLE)
    ratio = max(int(src_slots.sum()), 1) / max(int(tgt_slots.sum()), 1)
    if tgt_width * ratio > src_width:
        src_width = _round_up(round(tgt_width * ratio), WIDTH_MULTIPLE)
    else:
        tgt_width = _round_up(round(src_width / ratio), WIDTH_MULTIPLE)
    return PackShape(max(1, max_tokens // max(src_width, tgt_width)), src_width, tgt_width)


def pack_rows(src_slots: np.ndarray, tgt_slots: np.ndarray, src_width: int, tgt_width: int) -> list[Row]:
    """First-fit decreasing of pairs (``src_slots``/``tgt_slots`` wide, in the order given for
    ties) into rows of ``src_width`` x ``tgt_width`` slots. Pairs of one size are placed
    together: first-fit puts identical pairs into the earliest rows with room, in turn."""
    n = len(src_slots)
    size = src_slots.astype(np.int64) * tgt_width + tgt_slots.astype(np.int64) * src_width  # both sides, scaled alike
    order = np.lexsort((tgt_slots, src_slots, -size))  # stable: ties keep the given (shuffled) order
    free_src = np.empty(n, dtype=np.int64)
    free_tgt = np.empty(n, dtype=np.int64)
    row_of = np.empty(n, dtype=np.int64)
    opened = 0
    keys = np.stack([src_slots[order], tgt_slots[order]], axis=1)
    edges = np.flatnonzero(np.any(np.diff(keys, axis=0), axis=1)) + 1
    for group in np.split(order, edges) if n else []:
        s, t = int(src_slots[group[0]]), int(tgt_slots[group[0]])
        room = np.minimum(free_src[:opened] // s, free_tgt[:opened] // t)
        filled = np.cumsum(room)
        placed = min(len(group), int(filled[-1]) if opened else 0)
        rows = np.searchsorted(filled, np.arange(placed), side="right")
        row_of[group[:placed]] = rows
        taken = np.bincount(rows, minlength=opened)
        free_src[:opened] -= taken * s
        free_tgt[:opened] -= taken * t
        rest = len(group) - placed  # open new rows, each as full of this size as it goes
        if rest:
            per_row = max(1, min(src_width // s, tgt_width // t))
            new = opened + np.arange(rest) // per_row
            row_of[group[placed:]] = new
            count = np.bincount(new - opened)
            free_src[opened : opened + len(count)] = src_width - count * s
            free_tgt[opened : opened + len(count)] = tgt_width - count * t
            opened += len(count)
    by_row = np.argsort(row_of[order], kind="stable")
    members = order[by_row]
    return np.split(members, np.flatnonzero(np.diff(row_of[members])) + 1) if n else []


def make_packed_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, shape: PackShape, seed: int = 0, epoch: int = 0,
                        shuffle: bool = True, window: int = WINDOW) -> list[PackedRows]:
    """An epoch as batches of rows of pair indices. Pairs are shuffled with (seed, epoch),
    packed ``window`` at a time (``pack_rows``), cut into batches of ``shape.rows`` rows,
    and the batch order is shuffled with the same generator."""
    src_slots = np.asarray(src_lens, dtype=np.int64) + 1
    tgt_slots = np.asarray(tgt_lens, dtype=np.int64) + 1
    rng = np.random.default_rng([seed, epoch])
    pairs = rng.permutation(len(src_slots)) if shuffle else np.arange(len(src_slots))
    rows: list[Row] = []
    for start in range(0, len(pairs), window):
        part = pairs[start : start + window]
        rows.extend(part[r] for r in pack_rows(src_slots[part], tgt_slots[part], shape.src_width, shape.tgt_width))
    batches = [rows[i : i + shape.rows] for i in range(0, len(rows), shape.rows)]
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def _pack_side(ids: np.ndarray, offsets: np.ndarray, pairs: np.ndarray, row_of: np.ndarray, segment: np.ndarray,
               shape: tuple[int, int], first: int | None, last: int | None) -> tuple[np.ndarray, ...]:
    """One side of a packed batch: each pair's ids with ``first`` before or ``last`` after
    them, laid back to back in its row; with the segment id and the position of every slot."""
    rows, width = shape
    starts = np.asarray(offsets[pairs], dtype=np.int64)
    slots = np.asarray(offsets[pairs + 1], dtype=np.int64) - starts + 1
    before = np.cumsum(slots) - slots  # slots of the batch's earlier pairs
    row_first = np.flatnonzero(np.r_[True, row_of[1:] != row_of[:-1]]) if len(pairs) else np.zeros(0, np.int64)
    column = before - np.repeat(before[row_first], np.diff(np.r_[row_first, len(pairs)]))
    owner = np.repeat(np.arange(len(pairs)), slots)
    position = np.arange(int(slots.sum())) - np.repeat(before, slots)
    token = np.empty(len(owner), dtype=np.int64)
    if first is not None:  # first, then ids[start : start + slots - 1]
        head = position == 0
        token[head] = first
        token[~head] = ids[starts[owner[~head]] + position[~head] - 1]
    else:  # ids, then ``last``
        tail = position == slots[owner] - 1
        token[tail] = last
        token[~tail] = ids[starts[owner[~tail]] + position[~tail]]
    at = (row_of[owner], column[owner] + position)
    out = {"ids": np.full(shape, PAD_ID, np.int64), "seg": np.zeros(shape, np.int64), "pos": np.zeros(shape, np.int64)}
    out["ids"][at], out["seg"][at], out["pos"][at] = token, segment[owner], position
    return out["ids"], out["seg"], out["pos"]


def collate_packed(src_ids: np.ndarray, src_offsets: np.ndarray, tgt_ids: np.ndarray, tgt_offsets: np.ndarray,
                   rows: Sequence[Row], shape: PackShape) -> PackedBatch:
    """The packed batch of ``rows`` (pair indices) from pairs stored back to back in flat
    arrays (the token cache); rows past ``len(rows)`` stay empty (all padding, no loss)."""
    pairs = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows]) if rows else np.zeros(0, np.int64)
    counts = np.array([len(r) for r in rows], dtype=np.int64)
    row_of = np.repeat(np.arange(len(rows)), counts)
    segment = np.arange(len(pairs)) - np.repeat(np.cumsum(counts) - counts, counts) + 1  # 1, 2, ... per row
    src, src_seg, src_pos = _pack_side(src_ids, src_offsets, pairs, row_of, segment, (shape.rows, shape.src_width),
                                       None, EOS_ID)
    tgt_out, tgt_seg, tgt_pos = _pack_side(tgt_ids, tgt_offsets, pairs, row_of, segment,
                                           (shape.rows, shape.tgt_width), None, EOS_ID)
    tgt_in, _, _ = _pack_side(tgt_ids, tgt_offsets, pairs, row_of, segment, (shape.rows, shape.tgt_width), BOS_ID, None)
    n_tokens = int((tgt_seg > 0).sum())
    t = torch.from_numpy
    return PackedBatch(t(src), t(tgt_in), t(tgt_out), n_tokens, Packing(t(src_seg), t(tgt_seg), t(src_pos), t(tgt_pos)))


def packing_efficiency(batches: Sequence[PackedRows], src_lens: np.ndarray, tgt_lens: np.ndarray,
                       shape: PackShape) -> float:
    """Real tokens (eos/bos included) over the slots of every batch's full shape, both sides: a
    figure for scripts/bench_batching.py (training does not compute it)."""
    real = sum(int(src_lens[r].sum() + tgt_lens[r].sum()) + 2 * len(r) for rows in batches for r in rows)
    return real / max(len(batches) * shape.rows * (shape.src_width + shape.tgt_width), 1)
