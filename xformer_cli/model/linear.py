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
weights stay the masters that the optimizer updates. The products are those autocast computes,
the gradients too but for the weights' and biases', which reach fp32 in one kernel each (a
bias's without autocast's rounding to bf16 between); self-attention's q, k and v come from one
product (``stacked_half_product``). On CUDA a small model's step waits on the host's kernel
launches (docs/benchmarks/gpu.md, the fourth lease): each kernel left out counts.
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
    """x W^T + b with W and b already in the half type (``half_w``, ``half_b``): the rows of one
    or more Linears stacked (``masters``: their fp32 weight and bias, weight and bias, ...), one
    product for Linears that read the same input. The product and the input's gradient are
    autocast's; the weight and bias gradients reach the fp32 masters in one kernel each, the bias
    summed straight into fp32 (autocast sums in the half type, then casts: two kernels, and the
    rounding between)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, half_w: Tensor, half_b: Optional[Tensor], *masters: Optional[Tensor]) -> Tensor:
        xh = x.to(half_w.dtype)
        ctx.save_for_backward(xh, half_w)
        ctx.x_dtype, ctx.rows = x.dtype, [w.size(0) for w in masters[0::2]]
        ctx.dtypes = (masters[0].dtype, None if masters[1] is None else masters[1].dtype)
        return F.linear(xh, half_w, half_b)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
        xh, w = ctx.saved_tensors
        g = grad.to(w.dtype).reshape(-1, grad.size(-1))
        grad_x = None
        masters: list[Optional[Tensor]] = [None] * (2 * len(ctx.rows))
        if ctx.needs_input_grad[0]:
            grad_x = (g @ w).view(*xh.shape[:-1], w.size(1)).to(ctx.x_dtype)
        if any(ctx.needs_input_grad[3::2]):
            masters[0::2] = (g.t() @ xh.reshape(-1, xh.size(-1))).to(ctx.dtypes[0]).split(ctx.rows)
        if any(ctx.needs_input_grad[4::2]):
            masters[1::2] = g.sum(0, dtype=ctx.dtypes[1]).split(ctx.rows)
        return (grad_x, None, None, *masters)


def stacked_half_product(x: Tensor, linears: tuple["Linear", ...]) -> Optional[Tensor]:
    """``torch.cat([m(x) for m in linears], -1)`` in one product, where a ``HalfWeightCache``
    applies (CUDA training in half precision; it holds the Linears' half weights stacked, see
    ``shared_input_linears``); None elsewhere: the caller applies each Linear."""
    cache = linears[0].half_cache
    if cache is None or not cache.applies(x):
        return None
    stacked = cache.stacked_halves(linears)
    if stacked is None:
        return None
    return _CachedHalfLinear.apply(x, *stacked, *(p for m in linears for p in (m.weight, m.bias)))


class HalfWeightCache:
    """Half-precision copies of a model's ``Linear`` weights and biases for autocast training,
    made once per optimizer step: the optimizer's step hook and the model's state-dict load
    hook mark them stale, and the first training product after that refreshes them all with
    one foreach copy. Only products under autocast to ``dtype`` with gradients enabled use
    them (decoding and validation take the usual path). Attach it only where autocast's
    per-use casts cost launches, i.e. on CUDA.

    A module whose ``shared_input_linears()`` names Linears that often read one input (attention's
    q and kv projections, in self-attention) gets their copies stacked in one buffer, each
    Linear's copy a view of its rows, so ``stacked_half_product`` runs them as one product:
    fewer kernels forward and backward, and no concatenation."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, dtype: torch.dtype = torch.bfloat16):
        self.dtype = dtype
        self.linears = [m for m in model.modules() if isinstance(m, Linear)]
        masters = {id(p): p for m in self.linears for p in (m.weight, m.bias) if p is not None}
        self.masters = list(masters.values())  # a tied weight once
        self.half_of: dict[int, Tensor] = {}
        self.stacked: dict[tuple[int, ...], tuple[Tensor, Optional[Tensor]]] = {}
        for module in model.modules():
            if hasattr(module, "shared_input_linears"):
                self._stack(module.shared_input_linears())
        for p in self.masters:
            self.half_of.setdefault(id(p), torch.empty_like(p, dtype=dtype))
        self.halves = [self.half_of[id(p)] for p in self.masters]
        self.stale = True
        for m in self.linears:
            m.half_cache = self
        self._hooks = [optimizer.register_step_post_hook(lambda *_: self.mark_stale()),
                       model.register_load_state_dict_post_hook(lambda *_: self.mark_stale())]

    def _stack(self, linears: tuple["Linear", ...]) -> None:
        """One buffer for the weights of ``linears`` (and one for their biases), each Linear's
        copy a view of its rows; left alone where a parameter already has its copy (a tied or
        shared one) or only some of them have a bias."""
        weights, biases = [m.weight for m in linears], [m.bias for m in linears]
        has_bias = [b is not None for b in biases]
        if any(id(p) in self.half_of for p in weights + biases if p is not None) or len(set(has_bias)) > 1:
            return
        rows = [w.size(0) for w in weights]
        stacked_w = weights[0].new_empty((sum(rows), weights[0].size(1)), dtype=self.dtype)
        stacked_b = biases[0].new_empty(sum(rows), dtype=self.dtype) if has_bias[0] else None
        for params, stacked in ((weights, stacked_w), (biases, stacked_b)):
            if stacked is not None:
                self.half_of.update((id(p), view) for p, view in zip(params, stacked.split(rows)))
        self.stacked[tuple(map(id, linears))] = (stacked_w, stacked_b)

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

    def _refresh(self) -> None:
        if self.stale:
            with torch.no_grad():
                torch._foreach_copy_(self.halves, self.masters)
            self.stale = False

    def halves_for(self, m: "Linear") -> tuple[Tensor, Optional[Tensor]]:
        self._refresh()
        return self.half_of[id(m.weight)], None if m.bias is None else self.half_of[id(m.bias)]

    def stacked_halves(self, linears: tuple["Linear", ...]) -> Optional[tuple[Tensor, Optional[Tensor]]]:
        """The stacked copies of ``linears`` (weight, bias), or None where they were not stacked."""
        stacked = self.stacked.get(tuple(map(id, linears)))
        if stacked is not None:
            self._refresh()
        return stacked


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
            return _CachedHalfLinear.apply(x, half_w, half_b, weight, bias)
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
