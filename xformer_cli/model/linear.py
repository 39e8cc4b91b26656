"""``nn.Linear`` that keeps oneDNN's compiled bf16 kernels in use on a CPU.

On a CPU, bf16 matmuls run on oneDNN (AMX / AVX512-BF16), which compiles a kernel for every
new matrix shape, and the compiling costs several times the product it serves (the timings are
in docs/benchmarks/cpu-speed.md, "Where the time went, and what changed"). Token-budget batches
and beam search give a new row count (batch x length, or live beams) almost every step, so
without care most bf16 steps pay that again and again.
Here the rows go into a zero-padded bf16 buffer whose height is a multiple of 64 (the cast
to bf16 and the padding are one copy), and the three products of forward and backward run
on the padded height: at most 63 wasted rows (about 2% of a 3000-token batch), a few dozen
distinct shapes in a whole run, each compiled once. fp32 (MKL: nothing compiled per shape)
and other devices take the plain ``F.linear``.

On CUDA, autocast would cast every weight to bf16 at every use, forward and backward: a
cast kernel per weight per micro-batch. ``HalfWeightCache`` instead keeps bf16 copies of
the Linear weights, refreshed once per optimizer step (one foreach copy), while the fp32
weights stay the masters that the optimizer updates; the products and gradients are those
autocast computes.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROW_MULTIPLE = 64
_plain_only = False  # set by plain_products(): every device takes F.linear, as CUDA does


@contextlib.contextmanager
def plain_products() -> Iterator[None]:
    """Inside the block, a CPU takes the plain ``F.linear`` as CUDA does (no padded bf16
    product), and attention keeps its inputs' dtype as on CUDA (``cuda_code_path``): how the
    op counter runs the GPU's code path on a CPU."""
    global _plain_only
    before, _plain_only = _plain_only, True
    try:
        yield
    finally:
        _plain_only = before


def cuda_code_path() -> bool:
    """True inside ``plain_products``: the CPU-only branches (padded bf16 products, fp32
    attention scores under autocast) stand aside for the ones CUDA takes."""
    return _plain_only


def _padded_rows(x: Tensor, rows: int, dtype: torch.dtype) -> Tensor:
    """(..., K) with ``rows`` rows of K -> (rows rounded up to ROW_MULTIPLE, K) in ``dtype``, zeros
    below; one pass however ``x`` is laid out (attention's heads come in transposed)."""
    height = -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE
    out = x.new_empty(height, x.numel() // rows, dtype=dtype)
    out[:rows].view(x.shape).copy_(x)
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
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        out, xp, w = _padded_product(x, weight, bias)
        ctx.save_for_backward(xp, w)
        ctx.rows, ctx.x_shape, ctx.x_dtype = x.numel() // x.size(-1), x.shape, x.dtype
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
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


class _PadRows(torch.autograd.Function):
    """(..., K) -> (rows rounded up to ROW_MULTIPLE, K) in bf16, zeros below, where a row is the
    last ``row_dims`` dims; the gradient of the real rows comes back in the input's dtype and shape."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, row_dims: int) -> Tensor:
        ctx.rows, ctx.x_shape, ctx.x_dtype = math.prod(x.shape[:-row_dims]), x.shape, x.dtype
        return _padded_rows(x, ctx.rows, torch.bfloat16)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad[: ctx.rows].view(ctx.x_shape).to(ctx.x_dtype), None


def cpu_bf16_training(x: Tensor, weight: Tensor) -> bool:
    """Training in bf16 on a CPU (autocast over fp32 weights, gradients on): where the padded
    products of this module apply."""
    return torch.is_grad_enabled() and weight.dtype != torch.bfloat16 and _cpu_bf16(x, weight)


def padded_bf16_block(x: Tensor, block: Callable[[Tensor], Tensor], row_dims: int = 1) -> Tensor:
    """``block`` (row-wise: linears and element-wise functions of them) on the rows of ``x``
    padded once to a multiple of ROW_MULTIPLE in bf16, its output cut back to ``x``'s rows (a
    row: the last ``row_dims`` dims of ``x``). Every product inside then takes the padded
    height as it is: one cast-and-pad copy for the block instead of one per product, forward
    and backward. The padding rows get no gradient (only the real rows' output is used), so
    whatever the block computes on them is dropped. For ``cpu_bf16_training``."""
    out = block(_PadRows.apply(x, row_dims))
    return out[: math.prod(x.shape[:-row_dims])].view(*x.shape[:-row_dims], out.size(-1))


def _cpu_bf16(x: Tensor, weight: Tensor) -> bool:
    """A bf16 product on a CPU: bf16 weights (decoding), or bf16 autocast (training)."""
    if x.device.type != "cpu" or _plain_only:
        return False
    if weight.dtype == torch.bfloat16:
        return True
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


class _CachedHalfLinear(torch.autograd.Function):
    """x W^T + b with W and b already in the half type; gradients as autocast's (half
    products, cast back to the fp32 masters' and the input's dtypes)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Optional[Tensor], half_w: Tensor,
                half_b: Optional[Tensor]) -> Tensor:
        xh = x.to(half_w.dtype)
        ctx.save_for_backward(xh, half_w)
        ctx.x_dtype, ctx.dtypes = x.dtype, (weight.dtype, None if bias is None else bias.dtype)
        return F.linear(xh, half_w, half_b)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor], None, None]:
        xh, w = ctx.saved_tensors
        g = grad.to(w.dtype).reshape(-1, grad.size(-1))
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (g @ w).view(*xh.shape[:-1], w.size(1)).to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            grad_w = (g.t() @ xh.reshape(-1, xh.size(-1))).to(ctx.dtypes[0])
        if ctx.needs_input_grad[2]:
            grad_b = g.sum(0).to(ctx.dtypes[1])
        return grad_x, grad_w, grad_b, None, None


class HalfWeightCache:
    """Half-precision copies of a model's ``Linear`` weights and biases for autocast training,
    made once per optimizer step: the optimizer's step hook and the model's state-dict load
    hook mark them stale, and the first training product after that refreshes them all with
    one foreach copy. Only products under autocast to ``dtype`` with gradients enabled use
    them (decoding and validation take the usual path). Attach it only where autocast's
    per-use casts cost launches, i.e. on CUDA."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, dtype: torch.dtype = torch.bfloat16):
        self.dtype = dtype
        self.linears = [m for m in model.modules() if isinstance(m, Linear)]
        masters = {id(p): p for m in self.linears for p in (m.weight, m.bias) if p is not None}
        self.masters = list(masters.values())  # a tied weight once
        self.halves = [torch.empty_like(p, dtype=dtype) for p in self.masters]
        self.half_of = {id(p): h for p, h in zip(self.masters, self.halves)}
        self.stale = True
        for m in self.linears:
            m.half_cache = self
        self._hooks = [optimizer.register_step_post_hook(lambda *_: self.mark_stale()),
                       model.register_load_state_dict_post_hook(lambda *_: self.mark_stale())]

    def mark_stale(self) -> None:
        self.stale = True

    def detach(self) -> None:
        """Back to autocast's casts (the hooks removed, the copies dropped)."""
        for m in self.linears:
            m.half_cache = None
        for hook in self._hooks:
            hook.remove()

    def applies(self, x: Tensor) -> bool:
        kind = x.device.type
        return (torch.is_grad_enabled() and torch.is_autocast_enabled(kind)
                and torch.get_autocast_dtype(kind) == self.dtype)

    def halves_for(self, m: "Linear") -> tuple[Tensor, Optional[Tensor]]:
        if self.stale:
            with torch.no_grad():
                torch._foreach_copy_(self.halves, self.masters)
            self.stale = False
        return self.half_of[id(m.weight)], None if m.bias is None else self.half_of[id(m.bias)]


class Linear(nn.Linear):
    half_cache: Optional[HalfWeightCache] = None

    def forward(self, x: Tensor, rows: Optional[Tensor] = None) -> Tensor:
        """x W^T + b, or with ``rows`` (ids of output features) only those features."""
        weight, bias = self.weight, self.bias
        if rows is not None:
            weight, bias = _rows_of(weight, rows), None if bias is None else _rows_of(bias, rows)
        if self.half_cache is not None and self.half_cache.applies(x):
            half_w, half_b = self.half_cache.halves_for(self)
            if rows is not None:
                half_w, half_b = _rows_of(half_w, rows), None if half_b is None else _rows_of(half_b, rows)
            return _CachedHalfLinear.apply(x, weight, bias, half_w, half_b)
        if not _cpu_bf16(x, weight):
            return F.linear(x, weight, bias)
        if not torch.is_grad_enabled():  # decoding (bf16 weights): no graph, just the padded product
            if x.numel() % (x.size(-1) * ROW_MULTIPLE) == 0 and x.dtype == weight.dtype:
                return F.linear(x, weight, bias)
            return _padded_product(x, weight, bias)[0]
        if x.numel() % (x.size(-1) * ROW_MULTIPLE) == 0:
            return F.linear(x, weight, bias)
        return _PaddedLinear.apply(x, weight, bias)


def _rows_of(t: Tensor, rows: Tensor) -> Tensor:
    return t.index_select(0, rows)  # its backward adds the rows' gradients into t's
