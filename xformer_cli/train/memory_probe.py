"""Does a training step of a given token batch fit in GPU memory? (``train.max_tokens: auto``)

A throwaway copy of the run's model takes one real ``TrainStep`` (``step.py``: the same
optimizer, loss scaler, half-weight cache and, with several ranks, the same gradient
buckets as the run) on the widest batch the data can produce: for packed runs a real packed
batch with its attention masks, otherwise random ids of the widest shape. An out-of-memory
error means no. A compiled run's size is then checked once more with the compiled step
(CUDA-graph pools included), and lowered by the headroom share until it fits.

The copy is made under a forked random state and freed before the run builds its own
model, so probing changes neither the run's initial weights nor its dropout draws.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from xformer_cli.checkpoint_file import build_model
from xformer_cli.config import Config
from xformer_cli.data.batching import Batch, bucket_shape
from xformer_cli.train.epoch_batches import PackedPlan
from xformer_cli.train.batch_size import free_memory, largest_fitting, with_headroom
from xformer_cli.train.distributed import Distributed
from xformer_cli.train.step import TrainStep

if TYPE_CHECKING:
    from xformer_cli.data.cache import TokenCache
    from xformer_cli.tokenizer import Tokenizer

COMPILED_TRIES = 3  # a compiled step's size is lowered by the headroom share at most this many times


def probe_shape(tokens: int, width: int, length_bucket: int) -> tuple[int, int]:
    """(rows, width) of the widest batch of ``tokens`` slots: the declared bucket shape with
    buckets on, else as many rows of ``width`` as fit."""
    if length_bucket > 0:
        return bucket_shape(width, tokens, length_bucket)
    return max(1, tokens // width), width


def widest_batch(config: Config, data: TokenCache, tokens: int, width: int, vocab: int, bos_id: int) -> Batch:
    """The batch of ``tokens`` slots that needs the most memory: a real packed batch (one
    shape per run, masks included) with train.batching packed, else random ids of the
    widest (rows, width) shape."""
    tc = config.train
    if tc.batching == "packed":
        plan = PackedPlan(data, tokens, tc.seed)
        first = plan.batches(1, data.src_lens, data.tgt_lens)[0]
        return plan.load(first).with_start_token(bos_id)
    rows, padded = probe_shape(tokens, width, tc.length_bucket)
    ids = torch.randint(4, vocab, (rows, padded))
    return Batch(ids, ids, ids, rows * padded)


def step_fits(config: Config, tokenizer: Tokenizer, data: TokenCache, device: torch.device, precision: str,
              dist: Distributed, width: int, compiled: bool) -> Callable[[int], bool]:
    """fits(tokens): does one ``TrainStep`` on the widest batch of ``tokens`` slots fit on ``device``?"""
    tc = config.train
    model = build_model(config, tokenizer).to(device).train()
    step = TrainStep(model, tc, device, precision, dist, static_shapes=tc.batching == "packed" or tc.length_bucket > 0,
                     communicate=False, compile=compiled)
    vocab = min(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)

    def fits(tokens: int) -> bool:
        try:
            batch = widest_batch(config, data, tokens, width, vocab, config.model.bos_id).to(device)
            step([batch], batch.n_tokens)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # an allocation failure surfaces here at the latest
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            step.zero_grad()
            free_memory()

    fits.step = step  # type: ignore[attr-defined]  # for tests: what the probe built
    return fits


def largest_batch_on_gpu(config: Config, tokenizer: Tokenizer, data: TokenCache, device: torch.device, precision: str,
                         dist: Distributed, width: int) -> int:
    """The largest token batch (multiple of 256) whose training step fits on ``device`` at ``width``."""
    with torch.random.fork_rng(devices=[device]):
        fits = step_fits(config, tokenizer, data, device, precision, dist, width, compiled=False)
        try:
            size = largest_fitting(fits)
        finally:
            del fits
            free_memory()
        if config.train.compile and size:
            size = _fitting_compiled(config, tokenizer, data, device, precision, dist, width, size)
    return size


def _fitting_compiled(config: Config, tokenizer: Tokenizer, data: TokenCache, device: torch.device, precision: str,
                      dist: Distributed, width: int, size: int) -> int:
    """``size`` (found eagerly) checked with the compiled step at the batch the run will take
    (``with_headroom``), and lowered by the headroom share until that fits."""
    fits = step_fits(config, tokenizer, data, device, precision, dist, width, compiled=True)
    try:
        for _ in range(COMPILED_TRIES):
            if fits(with_headroom(size)):
                return size
            size = with_headroom(size)
        return size
    finally:
        del fits
        free_memory()


def gpu_probe(config: Config, tokenizer: Tokenizer, data: TokenCache, device: torch.device, precision: str,
              dist: Distributed, width: int) -> Callable[[], int] | None:
    """The probe ``batch_size.resolved`` calls on CUDA; None elsewhere (nothing to probe)."""
    if device.type != "cuda":
        return None
    return lambda: largest_batch_on_gpu(config, tokenizer, data, device, precision, dist, width)
