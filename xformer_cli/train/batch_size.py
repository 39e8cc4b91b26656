"""``train.max_tokens: auto`` and ``train.tokens_per_update``: the batch size a run trains with.

``auto`` on CUDA probes, once at the start of a fresh run, the largest token batch whose
training step (forward, backward, optimizer step) fits in GPU memory, at the widest batch
shape the data can produce, and keeps a share of it as headroom (allocator fragmentation,
CUDA-graph pools, a peak the probe did not see). The resolved value is what config.yaml and
the checkpoints record, and a resumed run takes it from the checkpoint: it never probes again.
On a CPU there is no memory limit to find: ``auto`` takes ``CPU_MAX_TOKENS`` and says so.

``tokens_per_update`` (0 = off) fixes the tokens an optimizer step sees: update_freq is
the fewest batches of at most max_tokens that reach it, and max_tokens is then that share
(``split_update``), so the paper's ~25k tokens per update hold whatever the probe found.
"""

from __future__ import annotations

import dataclasses
import gc
from typing import Callable, Optional

import torch

from xformer_cli.config import TrainConfig

CPU_MAX_TOKENS = 4096  # auto on a device without a probe: TrainConfig's default budget
HEADROOM = 0.15  # share of the largest fitting batch left free
GRANULE = 256  # probed sizes are multiples of this
PROBE_START = 4096
PROBE_LIMIT = 1 << 20  # no batch above a million tokens is tried


def largest_fitting(fits: Callable[[int], bool], start: int = PROBE_START, limit: int = PROBE_LIMIT,
                    granule: int = GRANULE) -> int:
    """A multiple of ``granule`` up to ``limit`` for which ``fits`` holds, within 1/32 (or one
    granule) of the largest, assuming that whatever fits, smaller fits too: doubling from
    ``start`` until a size fails, then halving the gap between the last size that fit and
    the first that failed (the headroom dwarfs the 3% left). 0 if even ``granule`` fails."""
    size = max(granule, start // granule * granule)
    good, bad = 0, limit + granule
    while size <= limit:  # grow (or, if the start fails, shrink) to bracket the answer
        if fits(size):
            good = size
            if size == limit:
                return size
            size = min(size * 2, limit)
        else:
            bad = size
            break
    if good == 0:  # the start failed: search below it
        good, bad = 0, size
    while bad - good > max(granule, good // 32):
        middle = (good + bad) // 2 // granule * granule
        if middle <= good:
            break
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good


def with_headroom(fitting: int, headroom: float = HEADROOM, granule: int = GRANULE) -> int:
    """``fitting`` less the headroom share, down to a multiple of ``granule`` (at least one granule)."""
    return max(granule, int(fitting * (1 - headroom)) // granule * granule)


def split_update(tokens_per_update: int, max_tokens: int) -> tuple[int, int]:
    """(max_tokens, update_freq) with update_freq batches of at most ``max_tokens`` making up
    ``tokens_per_update``: the fewest batches, then equal shares of the update."""
    update_freq = max(1, -(-tokens_per_update // max_tokens))
    return -(-tokens_per_update // update_freq), update_freq


def resolved(tc: TrainConfig, probe: Optional[Callable[[], int]], log: Callable[[str], None]) -> TrainConfig:
    """``tc`` with max_tokens and update_freq as the run trains with them. ``probe``: the
    largest fitting batch on this device (None where it cannot be probed: a CPU)."""
    max_tokens, update_freq = tc.max_tokens, tc.update_freq
    if max_tokens == "auto":
        if probe is None:
            max_tokens = CPU_MAX_TOKENS
            log(f"train.max_tokens: auto probes GPU memory, which needs CUDA; using {max_tokens} on this device")
        else:
            fitting = probe()
            if fitting == 0:
                from xformer_cli.errors import XformerError

                raise XformerError(f"train.max_tokens: auto found no batch of even {GRANULE} tokens that fits "
                                   "in GPU memory; set train.max_tokens to a number")
            max_tokens = with_headroom(fitting)
            log(f"train.max_tokens: auto -> {max_tokens} (largest fitting batch {fitting} tokens, "
                f"{HEADROOM:.0%} left as headroom)")
    if tc.tokens_per_update:
        max_tokens, update_freq = split_update(tc.tokens_per_update, max_tokens)
        log(f"train.tokens_per_update {tc.tokens_per_update}: update_freq {update_freq} x max_tokens {max_tokens}")
    return dataclasses.replace(tc, max_tokens=max_tokens, update_freq=update_freq)


def from_checkpoint(tc: TrainConfig, saved: dict) -> TrainConfig:
    """``tc`` with the max_tokens and update_freq a resumed run was saved with, where ``tc``
    derives them (auto, tokens_per_update, max_tokens_by_planned_epochs): a resume never probes
    or plans again."""
    changes = {}
    if tc.max_tokens == "auto" or tc.tokens_per_update or tc.max_tokens_by_planned_epochs:
        changes["max_tokens"] = saved["max_tokens"]
    if tc.tokens_per_update:
        changes["update_freq"] = saved["update_freq"]
    return dataclasses.replace(tc, **changes)


def free_memory() -> None:
    """Hand the memory of a probe (or a failed size) back to the device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
