"""Counting the aten ops of a training step: the host's launch cost, measured on any machine.

On a GPU a small model's step is set by how many kernels the host launches, not by FLOPs.
Every aten op that reaches the backend is (at most) one kernel launch, so the number of ops
per step, counted below autograd and autocast with a ``TorchDispatchMode``, tracks the
kernels per step. ``gpu_code_path`` makes a CPU take the branches CUDA takes (the one-pass
loss, plain ``F.linear``), and fake tensors make the count cost no arithmetic, so the
count for the paper's sizes runs in seconds on a CPU. ``cuda_path_step_ops`` counts a whole
training step that way (scripts/bench_opcount.py, scripts/bench_train.py).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from xformer_cli.data.batching import Batch
from xformer_cli.device import autocast
from xformer_cli.model.linear import HalfWeightCache, plain_products
from xformer_cli.train.loss import forced_path, label_smoothed_nll

# Metadata-only ops: views and shape queries launch no kernel.
_NO_KERNEL = frozenset({"view", "_unsafe_view", "reshape", "alias", "t", "transpose", "permute", "expand",
                        "unsqueeze", "squeeze", "slice", "select", "as_strided", "detach", "split",
                        "unbind", "split_with_sizes", "lift_fresh", "empty", "empty_like", "empty_strided",
                        "new_empty", "new_empty_strided", "sym_size", "sym_stride", "sym_numel", "is_same_size"})


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside the block, by name; ``kernels`` leaves out views."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "aten":  # not prim.device and other queries
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def kernels(self) -> int:
        return sum(n for name, n in self.ops.items() if name not in _NO_KERNEL)


@contextlib.contextmanager
def gpu_code_path() -> Iterator[None]:
    """A CPU takes the branches a CUDA device takes: the one-pass loss, plain linear products."""
    with forced_path("one_pass"), plain_products():
        yield


def count_ops(fn: Callable[[], object]) -> OpCounter:
    """Run ``fn`` once under an ``OpCounter`` and return the counter."""
    counter = OpCounter()
    with counter:
        fn()
    return counter


def training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list[Batch], epsilon: float,
                  pad_id: int, precision: str) -> Callable[[], None]:
    """One optimizer update over ``batches`` as the trainer runs it (forward under autocast,
    loss, backward per batch; the finite check; the fused optimizer step; zeroed grads)."""
    device = next(model.parameters()).device
    tokens = sum(b.n_tokens for b in batches)

    def step() -> None:
        total = torch.zeros((), device=device)
        for batch in batches:
            with autocast(device, precision):
                logits = model(batch.src, batch.tgt_in)
            loss, _ = label_smoothed_nll(logits, model.scored_targets(batch.tgt_out), epsilon, pad_id)
            (loss / tokens).backward()
            total += loss.detach()
        optimizer.found_inf = (~torch.isfinite(total)).float()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def cuda_path_step_ops(build: Callable[[], torch.nn.Module], batches: list[Batch], epsilon: float, pad_id: int,
                       precision: str, half_weights: bool, loss_path: str = "one_pass") -> OpCounter:
    """The aten ops of one optimizer update over ``batches`` on the code path CUDA takes, on
    fake tensors (no arithmetic): the model ``build`` returns, fused Adam, the second update
    (the first creates Adam's state). ``half_weights``: the bf16 weight copies the trainer
    attaches on CUDA bf16 (``forward_loss.wants_half_weights``), refreshed once per update;
    ``loss_path``: ``one_pass`` (CUDA's) or ``blocked`` (the CPU's, CUDA's before it)."""
    with FakeTensorMode(allow_non_fake_inputs=True), gpu_code_path(), forced_path(loss_path):
        model = build().train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-6, fused=True)
        if half_weights:
            HalfWeightCache(model, optimizer, torch.bfloat16)
        step = training_step(model, optimizer, batches, epsilon, pad_id, precision)
        step()
        return count_ops(step)
