"""Label-smoothed cross-entropy (section 5.4, after Szegedy et al. 2016).

The target distribution puts 1 - eps on the gold token and spreads eps uniformly over
the vocabulary; padding positions contribute nothing. The loss comes back summed so the
caller can normalise by the real number of target tokens across accumulated batches.

The gradient is written by hand: d loss / d logits = softmax(logits) - q, with q the
smoothed target. Autograd would instead run separate backward passes for log_softmax,
gather and mean over the (tokens x vocabulary) matrix; on a CPU those memory-bound
passes are a large share of a small model's training step (docs/benchmarks/cpu-speed.md,
"Training throughput and FLOP utilisation"). The forward pass computes loss and gradient
together in fp32 whatever the logits' dtype; the gradient is stored in the logits' dtype
and scaled in the backward pass.

Two paths compute the same thing. ``blocked`` walks the rows a few hundred at a time so
each block stays in the CPU's cache, faster than whole-matrix passes on a CPU
(docs/benchmarks/cpu-speed.md, "Where the time went, and what changed"). ``one_pass``
treats the whole matrix at once: a fixed dozen kernels whatever the batch, which is what a
GPU wants (there the blocked walk costs a dozen launches per 256 rows, the one launch cost
that grows with the batch). The device picks the path (compiled code always takes one pass);
``forced_path`` overrides it, so a test or the op counter can run the GPU path on a CPU.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch
from torch import Tensor

from xformer_cli.errors import XformerError

_ROWS = 256  # rows per block: 256 x an 8k vocabulary in fp32 is 8 MB; 64 to 1024 time alike (cpu-speed.md)
LOSS_PATHS = ("blocked", "one_pass")
_forced: Optional[str] = None


def loss_path(device: torch.device) -> str:
    """The path the loss takes on ``device``: blocked on a CPU, one pass elsewhere (unless forced)."""
    if _forced is not None:
        return _forced
    if torch.compiler.is_compiling():  # compiled code fuses the passes; a loop over blocks would
        return "one_pass"  # specialise the graph on the batch's row count and recompile per batch
    return "blocked" if device.type == "cpu" else "one_pass"


@contextlib.contextmanager
def forced_path(path: str) -> Iterator[None]:
    """Run every loss inside the block on ``path`` (blocked | one_pass), whatever the device."""
    global _forced
    if path not in LOSS_PATHS:
        raise XformerError(f"loss path must be one of {', '.join(LOSS_PATHS)}, not {path!r}")
    before, _forced = _forced, path
    try:
        yield
    finally:
        _forced = before


def _smoothed_rows(rows: Tensor, gold: Tensor, epsilon: float, pad_id: int, compute: torch.dtype,
                   want_grad: bool, scale: float = 1.0,
                   out: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """(n, V) logits, (n, 1) gold -> (loss sum, NLL sum, gradient times ``scale`` or None), the
    gradient written into ``out`` when given (its dtype: the cast is the last pass's store)."""
    vocab = rows.size(-1)
    # Half-precision logits are upcast: the softmax over a large vocabulary needs fp32.
    lprobs = torch.log_softmax(rows.to(compute), dim=-1)
    pad = gold == pad_id
    nll = -lprobs.gather(-1, gold)
    uniform = -lprobs.mean(dim=-1, keepdim=True)  # cross-entropy against the uniform distribution
    loss = ((1.0 - epsilon) * nll + epsilon * uniform).masked_fill_(pad, 0.0).sum()
    nll_sum = nll.masked_fill_(pad, 0.0).sum()
    if not want_grad:
        return loss, nll_sum, None
    probs = lprobs.exp_()
    probs.scatter_add_(-1, gold, torch.full_like(nll, epsilon - 1.0))  # softmax - (1 - eps) on gold ...
    # ... - eps/V everywhere, times the scale, in one pass that stores in out's dtype
    if out is None:  # one pass (a GPU): the padding rows zeroed by a pass of their own
        offset = torch.full((), -epsilon / vocab * scale, dtype=compute, device=rows.device)
        return loss, nll_sum, torch.add(offset, probs, alpha=scale).masked_fill_(pad, 0.0)
    # The blocked walk (a CPU): a scale and offset per row, 0 on padding rows, so the padding's
    # zeros come with the same pass (a second masked pass cost as much as the rest of it).
    row_scale = torch.full_like(nll, scale).masked_fill_(pad, 0.0)
    row_offset = torch.full_like(nll, -epsilon / vocab * scale).masked_fill_(pad, 0.0)
    return loss, nll_sum, torch.addcmul(row_offset, probs, row_scale, out=out)


def _blocked(flat: Tensor, gold: Tensor, epsilon: float, pad_id: int, compute: torch.dtype,
             want_grad: bool, scale: float) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    grad = torch.empty_like(flat) if want_grad else None
    loss = torch.zeros((), dtype=compute, device=flat.device)
    nll_sum = torch.zeros((), dtype=compute, device=flat.device)
    for start in range(0, flat.size(0), _ROWS):
        rows = slice(start, start + _ROWS)
        block_loss, block_nll, _ = _smoothed_rows(flat[rows], gold[rows], epsilon, pad_id, compute, want_grad,
                                                  scale, None if grad is None else grad[rows])
        loss += block_loss
        nll_sum += block_nll
    return loss, nll_sum, grad


def _one_pass(flat: Tensor, gold: Tensor, epsilon: float, pad_id: int, compute: torch.dtype,
              want_grad: bool, scale: float) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    loss, nll_sum, grad = _smoothed_rows(flat, gold, epsilon, pad_id, compute, want_grad, scale)
    return loss, nll_sum, None if grad is None else grad.to(flat.dtype)  # no copy when already that dtype


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, epsilon: float, pad_id: int,
                grad_scale: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        vocab = logits.size(-1)
        flat, gold = logits.reshape(-1, vocab), target.reshape(-1, 1)
        want_grad = ctx.needs_input_grad[0]
        compute = torch.promote_types(logits.dtype, torch.float32)  # fp32, or fp64 when given fp64
        blocked = loss_path(logits.device) == "blocked"
        # The blocked walk scales the gradient while each block is in cache; one pass (a GPU)
        # leaves it to the backward's one kernel, which needs no host read to skip.
        ctx.prescaled = grad_scale if blocked and want_grad else None
        walk = _blocked if blocked else _one_pass
        scale = 1.0 if ctx.prescaled is None else ctx.prescaled.item()  # a CPU tensor: no device sync
        loss, nll_sum, grad = walk(flat, gold, epsilon, pad_id, compute, want_grad, scale)
        ctx.mark_non_differentiable(nll_sum)
        if want_grad:
            ctx.save_for_backward(grad.view(logits.shape))
        return loss, nll_sum

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor, None, None, None, None]:
        (grad,) = ctx.saved_tensors
        # The graph is never backpropagated twice, so the saved buffer can be scaled in place.
        if ctx.prescaled is None:
            return grad.mul_(grad_loss), None, None, None, None
        if grad_loss.device.type == "cpu" and torch.equal(grad_loss, ctx.prescaled.to(grad_loss)):
            return grad, None, None, None, None  # the gradient asked for is the one written: no pass
        return grad.mul_(grad_loss / ctx.prescaled), None, None, None, None


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float, pad_id: int,
                       grad_scale: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """(..., V) logits and (...) gold ids -> (smoothed loss sum, plain NLL sum) over non-pad tokens.

    ``grad_scale``: the gradient the caller will send back for the loss sum (the 1/tokens of
    ``(loss / tokens).backward()``), when known before the forward pass. The CPU path then
    writes the logits' gradient already scaled and the backward pass skips a whole pass over
    it; any other gradient still comes out right (scaled by the ratio)."""
    return _LabelSmoothedCrossEntropy.apply(logits, target, epsilon, pad_id, grad_scale)
