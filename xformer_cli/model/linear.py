"""``nn.Linear`` that keeps oneDNN's compiled bf16 kernels in use on a CPU.

On a CPU, bf16 matmuls run on oneDNN (AMX / AVX512-BF16), which compiles a kernel for every
new matrix shape: measured at ~11 ms for a (2900 x 256) x (256 x 1024) product that itself
takes 2.5 ms. Token-budget batches and beam search give a new row count (batch x length, or
live beams) almost every step, so without care most bf16 steps pay that again and again.
Here the rows go into a zero-padded bf16 buffer whose height is a multiple of 64 (the cast
to bf16 and the padding are one copy), and the three products of forward and backward run
on the padded height: at most 63 wasted rows (about 2% of a training batch), a few dozen
distinct shapes in a whole run, each compiled once. fp32 (MKL: nothing compiled per shape)
and other devices take the plain ``F.linear``.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROW_MULTIPLE = 64
_plain_only = False  # set by plain_products(): every device takes F.linear, as CUDA does


@contextlib.contextmanager
def plain_products() -> Iterator[None]:
    """Inside the block, a CPU takes the plain ``F.linear`` as CUDA does (no padded bf16
    product): how the op counter runs the GPU's code path on a CPU."""
    global _plain_only
    before, _plain_only = _plain_only, True
    try:
        yield
    finally:
        _plain_only = before


def _padded_rows(x: Tensor, rows: int, dtype: torch.dtype) -> Tensor:
    """(rows, K) -> (rows rounded up to ROW_MULTIPLE, K) in ``dtype``, zeros below."""
    height = -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE
    out = x.new_empty(height, x.size(-1), dtype=dtype)
    out[:rows].copy_(x.reshape(rows, x.size(-1)))
    out[rows:].zero_()
    return out


def _padded_product(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """x W^T + b in bf16 on the padded rows: (output cut back to x's rows, padded x, bf16 W)."""
    rows = x.numel() // x.size(-1)
    w = weight.to(torch.bfloat16)
    xp = _padded_rows(x, rows, torch.bfloat16)  # casts an fp32 input (an attention output) too
    out = F.linear(xp, w, None if bias is None else bias.to(torch.bfloat16))
    return out[:rows].view(*x.shape[:-1], weight.size(0)), xp, w


class _PaddedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        out, xp, w = _padded_product(x, weight, bias)
        ctx.save_for_backward(xp, w)
        ctx.rows, ctx.x_shape, ctx.x_dtype = x.numel() // x.size(-1), x.shape, x.dtype
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        xp, w = ctx.saved_tensors
        gp = _padded_rows(grad, ctx.rows, torch.bfloat16)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (gp @ w)[: ctx.rows].view(ctx.x_shape).to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            grad_w = (gp.t() @ xp).to(ctx.dtypes[0])
        if ctx.needs_input_grad[2]:
            grad_b = gp.sum(0, dtype=torch.float32).to(ctx.dtypes[1])
        return grad_x, grad_w, grad_b


def _cpu_bf16(x: Tensor, weight: Tensor) -> bool:
    """A bf16 product on a CPU: bf16 weights (decoding), or bf16 autocast (training)."""
    if x.device.type != "cpu" or _plain_only:
        return False
    if weight.dtype == torch.bfloat16:
        return True
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


class Linear(nn.Linear):
    def forward(self, x: Tensor) -> Tensor:
        if not _cpu_bf16(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        if not torch.is_grad_enabled():  # decoding (bf16 weights): no graph, just the padded product
            rows = x.numel() // x.size(-1)
            if rows % ROW_MULTIPLE == 0 and x.dtype == self.weight.dtype:
                return F.linear(x, self.weight, self.bias)
            return _padded_product(x, self.weight, self.bias)[0]
        if x.numel() % (x.size(-1) * ROW_MULTIPLE) == 0:
            return F.linear(x, self.weight, self.bias)
        return _PaddedLinear.apply(x, self.weight, self.bias)
