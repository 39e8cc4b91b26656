"""Counting the aten ops of a training step: the host's launch cost, measured on any machine.

On a GPU a small model's step is set by how many kernels the host launches, not by FLOPs.
Every aten op that reaches the backend is (at most) one kernel launch, so the number of ops
per step, counted below autograd and autocast with a ``TorchDispatchMode``, tracks the
kernels per step. ``gpu_code_path`` makes a CPU take the branches CUDA takes (the one-pass
loss, plain ``F.linear``), and fake tensors make the count cost no arithmetic, so the
count for the paper's sizes runs in seconds on a CPU. ``cuda_path_step_ops`` counts the
trainer's own step (``train/step.py``'s ``TrainStep``) that way, so a change to the step moves
the count (scripts/bench_opcount.py, scripts/bench_train.py).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Callable, Iterator, Optional

import torch
import torch.utils._foreach_utils as foreach_utils
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from xformer_cli.config import TrainConfig
from xformer_cli.data.batching import Batch
from xformer_cli.model.linear import plain_products
from xformer_cli.train.distributed import Distributed
from xformer_cli.train.forward_loss import forced_half_weights
from xformer_cli.train.loss import forced_path
from xformer_cli.train.step import TrainStep

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

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: tuple[type, ...], args: tuple = (),
                           kwargs: Optional[dict[str, Any]] = None) -> Any:
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


def cuda_path_step_ops(build: Callable[[], torch.nn.Module], batches: list[Batch], tc: TrainConfig, precision: str,
                       half_weights: bool, loss_path: str = "one_pass") -> OpCounter:
    """The aten ops of one update of the trainer's own ``TrainStep`` over ``batches`` on the
    code path CUDA takes, on fake tensors (no arithmetic): the model ``build`` returns, the
    step's fused Adam(W), clipping and loss scaler as ``tc`` and ``precision`` ask; the second
    update is counted (the first creates Adam's state). ``half_weights``: the bf16 weight
    copies the trainer attaches on CUDA bf16 (``forward_loss.wants_half_weights``), refreshed
    once per update; ``loss_path``: ``one_pass`` (CUDA's) or ``blocked`` (the CPU's, CUDA's before it)."""
    tokens = sum(b.n_tokens for b in batches)
    with FakeTensorMode(allow_non_fake_inputs=True), _StandInReads(), gpu_code_path(), forced_path(loss_path), \
            forced_half_weights(half_weights), _fake_tensors_take_foreach():
        # One rank, as on one GPU: with several, the gradient buckets' copies and collectives come on top.
        step = TrainStep(build().train(), tc, torch.device("cpu"), precision, Distributed(), compile=False)
        step(batches, tokens)
        return count_ops(lambda: step(batches, tokens))


class _StandInReads(TorchDispatchMode):
    """Fake tensors hold no values, so a read of one gets a stand-in: the blocked loss reads its
    gradient scale (a float: 1.0) and compares it with the gradient it is sent, which never
    matches on CUDA (the CPU's shortcut stands aside: the scaling pass runs, as there)."""

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: tuple[type, ...], args: tuple = (),
                           kwargs: Optional[dict[str, Any]] = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default and isinstance(args[0], FakeTensor):
            return 1.0 if args[0].dtype.is_floating_point else 1
        if func is torch.ops.aten.equal.default and any(isinstance(a, FakeTensor) for a in args):
            return False
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _fake_tensors_take_foreach() -> Iterator[None]:
    """torch takes its foreach kernels (gradient clipping's norms) only for plain tensors, by
    type: fake ones would fall back to a loop of per-tensor ops that real gradients never run."""
    supported = foreach_utils._foreach_supported_types
    supported.append(FakeTensor)
    try:
        yield
    finally:
        supported.remove(FakeTensor)
