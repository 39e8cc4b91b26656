"""Dropout (Srivastava et al. 2014; the paper's P_drop, section 5.4) with a faster CPU mask.

``nn.Dropout`` draws its mask on a CPU with ``bernoulli_``, one Mersenne-Twister draw per
element: a large share of a small model's bf16 training step (docs/benchmarks/cpu-speed.md,
"Where the time went, and what changed"). Here one 64-bit draw
gives the bits of four elements (16 bits each), so the keep probability is exact to 1/65536.
The mask is multiplied in as 0/1 of the activations' own dtype: a product of bf16 (or fp32)
with bools takes ATen's mixed-dtype path, several times slower than the same-dtype one, and
a bool -> uint8 -> dtype conversion is one cheap pass. The values are those of the bool
product (x * 1 and x * 0 are exact), so training is bit-identical either way. The generator
is torch's default one, so seeding and checkpointed random state work as before. On other devices (CUDA's fused
Philox kernel is already fast) it is ``F.dropout``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from xformer_cli.model.linear import cuda_code_path


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> Tensor:
    """Bools, each True with probability 1 - p (to 1/65536)."""
    n = 1
    for size in shape:
        n *= size
    words = torch.randint(-2**63, 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=device)
    threshold = round(p * 65536) - 32768  # int16 draws are uniform on [-32768, 32767]
    return (words.view(torch.int16)[:n] >= threshold).view(shape)


def _as_dtype(keep: Tensor, dtype: torch.dtype) -> Tensor:
    """Bools as 0/1 of ``dtype``, by way of uint8 (bool -> bf16 directly is a slow cast)."""
    return keep.view(torch.uint8).to(dtype)


class _MaskedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        mask = _as_dtype(keep, x.dtype)
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return torch.mul(x, mask).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (mask,) = ctx.saved_tensors  # autograd hands the gradient over in the output's dtype: the mask's
        return torch.mul(grad, mask).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    if cuda_code_path():  # the op counter: F.dropout's one fused kernel on CUDA (the CPU's takes three)
        return torch.native_dropout(x, p, True)[0]
    keep = keep_mask(x.shape, p, x.device)
    return _MaskedScale.apply(x, keep, 1.0 / (1.0 - round(p * 65536) / 65536))


class Dropout(nn.Module):
    """``nn.Dropout``'s interface, ``dropout`` above inside."""

    def __init__(self, p: float = 0.1):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
