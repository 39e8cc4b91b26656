"""Scaled dot-product attention (3.2.1) for training on a CPU when the keys are few.

``F.scaled_dot_product_attention`` runs a tiled (flash) kernel on a CPU. For the sentences of
a captions corpus (a dozen to a few dozen keys) its tiles are mostly empty, and the plain
products, softmax and products again take half to four fifths of its time forward and backward
(BENCHMARKS.md); past ~64 keys the tiled kernel wins. The backward pass is written out, as
the loss's is: it keeps the attention weights and writes the scores' gradient with the
softmax's own backward kernel, so the mask and the scaling add no passes of their own.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

SHORT_KEYS = 64  # up to this many keys the plain products beat the CPU's tiled kernel (measured)


def allowed(mask: Optional[Tensor], causal: bool, queries: int, keys: int, device: torch.device) -> Optional[Tensor]:
    """The boolean "may attend" mask with the causal one folded in (None when neither)."""
    if not causal:
        return mask
    lower = torch.ones(queries, keys, dtype=torch.bool, device=device).tril()  # top-left, as SDPA's is_causal
    return lower if mask is None else mask & lower


class _ShortAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], scale: float) -> Tensor:
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
        if mask is not None:
            scores.masked_fill_(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        ctx.scale = scale
        ctx.save_for_backward(q, k, v, weights)
        return torch.matmul(weights, v)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, weights = ctx.saved_tensors
        grad_v = torch.matmul(weights.transpose(-1, -2), grad_out)
        grad_weights = torch.matmul(grad_out, v.transpose(-1, -2))
        # Masked keys have weight 0, so their scores' gradient is 0 without a pass of its own.
        grad_scores = torch._softmax_backward_data(grad_weights, weights, -1, weights.dtype).mul_(ctx.scale)
        grad_q = torch.matmul(grad_scores, k)
        grad_k = torch.matmul(grad_scores.transpose(-1, -2), q)
        return grad_q, grad_k, grad_v, None, None


def short_attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, causal: bool = False) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V per head, in the inputs' dtype, no dropout; ``mask`` True where
    attending is allowed (broadcast over heads and queries as SDPA's). Every query must see a key."""
    keys_mask = allowed(mask, causal, q.size(-2), k.size(-2), q.device)
    return _ShortAttention.apply(q, k, v, keys_mask, q.size(-1) ** -0.5)
