"""A batch's forward pass and label-smoothed loss as one function: what ``train.compile`` compiles.

Compiling model and loss together lets inductor fuse the loss's passes over the logits with
the output projection's epilogue, and (on CUDA, with static shapes) lets the whole forward
and backward be one captured CUDA graph per batch shape ("reduce-overhead"): the host then
launches one graph instead of hundreds of kernels. With shapes that vary batch to batch, the
default mode with dynamic shapes compiles once for all of them instead.

``compilations()`` reads dynamo's count of graphs built in this process, which the trainer
logs: one per batch shape is the expectation with buckets, more means recompiling.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

import torch
from torch import Tensor

from xformer_cli.device import autocast, autocast_dtype
from xformer_cli.model.linear import HalfWeightCache
from xformer_cli.model.transformer import Packing
from xformer_cli.tokenizer import PAD_ID
from xformer_cli.train.loss import label_smoothed_nll

LossFn = Callable[[Tensor, Tensor, Tensor, Optional[Packing], Optional[Tensor]], Tensor]
_half_weights_forced: Optional[bool] = None


@contextlib.contextmanager
def forced_half_weights(on: bool) -> Iterator[None]:
    """Inside the block the trainer attaches (True) or leaves out (False) the half-weight cache
    whatever the device: how a test runs CUDA's bf16 path on a CPU."""
    global _half_weights_forced
    before, _half_weights_forced = _half_weights_forced, on
    try:
        yield
    finally:
        _half_weights_forced = before


def wants_half_weights(device: torch.device, precision: str, compiled: bool) -> bool:
    """Half-precision (bf16, or fp16 on cards without bf16) weight copies made once per
    optimizer step replace autocast's per-use casts on CUDA (a kernel per weight per
    micro-batch); a CPU's own bf16 products need none, and compiled code fuses the casts
    into its kernels itself."""
    if _half_weights_forced is not None:
        return _half_weights_forced
    return device.type == "cuda" and precision in ("bf16", "fp16") and not compiled


def attach_half_weights(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                        precision: str, compiled: bool) -> Optional[HalfWeightCache]:
    """The cache on ``model`` itself (not a compile wrapper) when it pays; else None."""
    if not wants_half_weights(device, precision, compiled):
        return None
    return HalfWeightCache(model, optimizer, autocast_dtype(precision) or torch.bfloat16)


def forward_loss(model: torch.nn.Module, device: torch.device, precision: str, epsilon: float) -> LossFn:
    """(src, tgt_in, tgt_out, packing, grad_scale) -> the summed label-smoothed loss of the batch,
    forward under autocast; ``packing``: None, or the segments and positions of packed rows;
    ``grad_scale``: the gradient the loss sum will be given (``label_smoothed_nll``'s), or None."""

    def loss_of(src: Tensor, tgt_in: Tensor, tgt_out: Tensor, packing: Optional[Packing] = None,
                grad_scale: Optional[Tensor] = None) -> Tensor:
        with autocast(device, precision):
            logits = model(src, tgt_in) if packing is None else model(src, tgt_in, packing=packing)
        return label_smoothed_nll(logits, model.scored_targets(tgt_out), epsilon, PAD_ID, grad_scale)[0]

    return loss_of


def compile_mode(device: torch.device, static_shapes: bool) -> tuple[Optional[str], bool]:
    """(torch.compile mode, dynamic) for this device and batch plan: CUDA graphs where shapes
    repeat on CUDA; dynamic shapes where every batch has its own."""
    if static_shapes:
        return ("reduce-overhead" if device.type == "cuda" else None), False
    return None, True


def compiled(fn: LossFn, device: torch.device, static_shapes: bool, shapes: int = 0) -> LossFn:
    """``fn`` under torch.compile as ``compile_mode`` says; ``shapes``: how many batch shapes the
    plan declares (dynamo's recompile limit is raised to hold them all, or it would fall back
    to eager after the eighth)."""
    mode, dynamic = compile_mode(device, static_shapes)
    if shapes:
        raise_recompile_limits(shapes)
    return torch.compile(fn, mode=mode, dynamic=dynamic)


# dynamo's names for (recompiles of one function, recompiles in all): torch 2.7 renamed the
# limits; before that (our floor, 2.4, included) they were the cache_size ones. Newest first.
RECOMPILE_LIMIT_NAMES = ("recompile_limit", "cache_size_limit")
TOTAL_RECOMPILE_LIMIT_NAMES = ("accumulated_recompile_limit", "accumulated_cache_size_limit")


def _first_present(config: object, names: tuple[str, ...]) -> Optional[str]:
    return next((name for name in names if hasattr(config, name)), None)


def raise_recompile_limits(shapes: int) -> None:
    """Let dynamo compile ``shapes`` graphs (and one spare) of a function before it gives up,
    under whichever names this torch gives the limits; a torch with neither name keeps its
    own limits (more shapes then run eagerly: slower, never wrong)."""
    config = torch._dynamo.config
    limit = shapes + 1
    name = _first_present(config, RECOMPILE_LIMIT_NAMES)
    if name:
        limit = max(getattr(config, name), limit)
        setattr(config, name, limit)
    total = _first_present(config, TOTAL_RECOMPILE_LIMIT_NAMES)
    if total:
        setattr(config, total, max(getattr(config, total), 4 * limit))


def compilations() -> int:
    """Graphs dynamo has compiled in this process so far (its ``unique_graphs`` counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
