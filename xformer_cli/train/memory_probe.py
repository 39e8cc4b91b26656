"""Does a training step of a given token batch fit in GPU memory? (``train.max_tokens: auto``)

A throwaway copy of the run's model and optimizer trains one step on a batch of random ids of
the widest shape the data can produce; an out-of-memory error means no. The copy is made under
a forked random state and freed before the run builds its own model, so probing changes
neither the run's initial weights nor its dropout draws.
"""

from __future__ import annotations

from typing import Callable

import torch

from xformer_cli.checkpoint import build_model
from xformer_cli.config import Config
from xformer_cli.data.batching import bucket_shape
from xformer_cli.train.batch_size import free_memory, largest_fitting
from xformer_cli.train.forward_loss import forward_loss


def probe_shape(tokens: int, width: int, length_bucket: int) -> tuple[int, int]:
    """(rows, width) of the widest batch of ``tokens`` slots: the declared bucket shape with
    buckets on, else as many rows of ``width`` as fit."""
    if length_bucket > 0:
        return bucket_shape(width, tokens, length_bucket)
    return max(1, tokens // width), width


def largest_batch_on_gpu(config: Config, tokenizer, device: torch.device, precision: str, width: int) -> int:
    """The largest token batch (multiple of 256) whose training step fits on ``device`` at ``width``."""
    tc = config.train
    with torch.random.fork_rng(devices=[device]):
        model = build_model(config, tokenizer).to(device).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-9, fused=True)
        loss_of = forward_loss(model, device, precision, tc.label_smoothing)
        vocab = min(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)

        def fits(tokens: int) -> bool:
            rows, padded = probe_shape(tokens, width, tc.length_bucket)
            try:
                ids = torch.randint(4, vocab, (rows, padded), device=device)
                loss_of(ids, ids, ids).backward()
                optimizer.step()
                torch.cuda.synchronize(device)
                return True
            except torch.cuda.OutOfMemoryError:
                return False
            finally:
                optimizer.zero_grad(set_to_none=True)
                free_memory()

        try:
            return largest_fitting(fits)
        finally:
            del model, optimizer, loss_of
            free_memory()


def gpu_probe(config: Config, tokenizer, device: torch.device, precision: str, width: int) -> Callable[[], int] | None:
    """The probe ``batch_size.resolved`` calls on CUDA; None elsewhere (nothing to probe)."""
    if device.type != "cuda":
        return None
    return lambda: largest_batch_on_gpu(config, tokenizer, device, precision, width)
