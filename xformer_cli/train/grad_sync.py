"""The gradients of every rank summed, after the backward passes, in place of DDP.

``DistributedDataParallel`` starts its all-reduces during the backward pass. A rank that
runs out of memory in its forward or backward then never joins them, and every other rank
waits in a collective that will not complete: the job hangs (fairseq re-raises for that
reason). It also broadcasts every buffer at every forward (the sinusoid tables included,
which a rank may grow on its own).

Here each parameter's gradient is a view into a few flat buckets, and the buckets are
all-reduced once every rank has finished its backward passes, beside a small vector of
figures (the summed loss, how many ranks ran out of memory). A rank that failed takes
part all the same, with zeros, so every rank runs the same collectives in the same order
and then skips or applies the update alike. The price is no overlap of communication with
the last backward pass; nothing is broadcast after the start.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from xformer_cli.train.distributed import Distributed

BUCKET_BYTES = 32 * 2**20  # large enough for full-speed collectives, small enough to pipeline


class GradientSync:
    """Flat gradient buckets over ``params`` (their ``.grad`` become views into them) and their
    sum over ranks. With ``dist`` None the buckets are made but nothing is communicated (the
    memory probe: the same allocations as the real step)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], dist_: Optional[Distributed]):
        self.dist = dist_
        unique = list({id(p): p for p in params if p.requires_grad}.values())  # tied weights once
        self.params = unique
        self.buckets: list[Tensor] = []
        for group in _buckets(unique):
            flat = torch.zeros(sum(p.numel() for p in group), dtype=group[0].dtype, device=group[0].device)
            offset = 0
            for p in group:
                p.grad = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            self.buckets.append(flat)
        self._views = [(p, p.grad.data_ptr()) for p in unique]  # checked after the first backward
        if self.dist is not None:  # every rank starts from rank 0's weights (DDP's one broadcast)
            self.dist.broadcast_from_main(p.data for p in unique)

    def zero_grad(self) -> None:
        """Zero the buckets (the gradients stay views into them; autograd adds into them in place)."""
        for flat in self.buckets:
            flat.zero_()

    def poison(self) -> None:
        """NaN in every gradient: after the sum, every rank's loss scaler skips the update."""
        for flat in self.buckets:
            flat.fill_(float("nan"))

    def reduce(self, figures: Tensor) -> Tensor:
        """Sum the gradients and ``figures`` over ranks (in place); returns the summed figures."""
        if self.dist is None or not self.dist.enabled:
            return figures
        if self._views:  # once: autograd adds into the views in place, or a gradient would go unsummed
            moved = [tuple(p.shape) for p, ptr in self._views if p.grad is None or p.grad.data_ptr() != ptr]
            if moved:
                raise RuntimeError(f"gradients left their buckets (shapes {moved[:3]}): they would not be summed")
            self._views = []
        works = [dist.all_reduce(figures, async_op=True)] + [dist.all_reduce(b, async_op=True) for b in self.buckets]
        with self.dist.waiting("the gradient sum"):
            for work in works:
                work.wait()
        return figures


def _buckets(params: list[torch.nn.Parameter]) -> list[list[torch.nn.Parameter]]:
    """Parameters in groups of one dtype and device, each at most BUCKET_BYTES (or one tensor)."""
    groups: list[list[torch.nn.Parameter]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        last = groups[-1] if groups else None
        if last is None or last[0].dtype != p.dtype or last[0].device != p.device or size + nbytes > BUCKET_BYTES:
            groups.append([p])
            size = nbytes
        else:
            last.append(p)
            size += nbytes
    return groups
