"""Data-parallel training on torch.distributed, launched by torchrun.

    torchrun --nproc_per_node 8 -m xformer_cli train -c configs/wmt14-en-de-base.yaml

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; without them everything here is a no-op
and training runs in one process. NCCL on CUDA, gloo on CPU (``train.dist_backend`` picks
gloo on CUDA too: two ranks can then share one GPU, which NCCL refuses).

Every collective a rank waits in is bounded by ``train.dist_timeout_minutes``: a wait past
it ends the run with one line naming the setting (``CollectiveTimeout``), never a hang.
Tensors on the device stay float32 (MPS has no float64).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import time
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
import torch.distributed as dist

from xformer_cli.errors import XformerError

BACKENDS = ("auto", "nccl", "gloo")


def is_timeout(exc: BaseException) -> bool:
    """Whether a collective's error is its timeout (gloo: 'Timed out', NCCL's watchdog: 'Timeout')."""
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text


def _gloo_thread_count() -> int:
    """Live gloo threads in this process (Linux names them; 0 where /proc is absent)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    count = 0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                count += comm.read().startswith("gloo")
        except OSError:  # the thread ended while we looked
            continue
    return count


def _wait_for_gloo_threads_to_end(seconds: float = 5.0) -> None:
    """After destroy_process_group the last references to gloo's context can be dropped a moment
    later (a reference cycle, or a worker still releasing its finished work); its threads must be
    gone before the interpreter's shutdown, where tearing one down can abort the rank."""
    gc.collect()  # once: a cycle holding the group goes now; a worker's late release needs only time
    deadline = time.monotonic() + seconds
    while _gloo_thread_count() and time.monotonic() < deadline:
        time.sleep(0.02)


@dataclass
class Distributed:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    timeout_minutes: float = 30.0

    @classmethod
    def from_environment(cls) -> "Distributed":
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
                   int(os.environ.get("WORLD_SIZE", 1)))

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device_for(self, device: torch.device) -> torch.device:
        """This rank's device: its own GPU (LOCAL_RANK, shared round-robin when there are
        fewer GPUs than ranks, as with gloo), or ``device`` itself."""
        if not self.enabled or device.type != "cuda":
            return device
        return torch.device("cuda", self.local_rank % max(torch.cuda.device_count(), 1))

    def start(self, device: torch.device, backend: str = "auto", timeout_minutes: float = 30.0) -> str:
        """Join the process group; returns the backend ("" when not distributed)."""
        self.timeout_minutes = timeout_minutes
        if not self.enabled:
            return ""
        if backend == "auto":
            backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl" and device.type != "cuda":
            raise XformerError("config key 'train.dist_backend': nccl needs CUDA devices; "
                               "use gloo (or auto) on this device")
        if not dist.is_initialized():
            # torch._dynamo (imported on first use: making a torch.optim optimizer imports it)
            # takes references to the default process group when it is imported after the group
            # exists, and never drops them: the group then outlives destroy_process_group, and
            # gloo's threads are torn down at interpreter exit, where a rank could abort
            # ("terminate called without an active exception"). Imported first, it holds none.
            import torch._dynamo  # noqa: F401

            dist.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_minutes))
        return backend

    def stop(self) -> None:
        """Tear down once every rank is done communicating: a rank that leaves while another
        still talks to it can abort at exit (gloo)."""
        if self.enabled and dist.is_initialized():
            with self.waiting("the end of training"):
                dist.barrier()
            dist.destroy_process_group()
            _wait_for_gloo_threads_to_end()

    @contextlib.contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Turns a collective's timeout into one line that names the wait and the setting."""
        try:
            yield
        except RuntimeError as exc:
            if not is_timeout(exc):
                raise
            raise XformerError(
                f"rank {self.rank}: waited more than train.dist_timeout_minutes ({self.timeout_minutes:g}) for "
                f"the other processes at {what}; one of them is stuck or far slower (raise the setting if "
                "that is expected)") from None

    def barrier(self, what: str = "a barrier") -> None:
        if self.enabled:
            with self.waiting(what):
                dist.barrier()

    def sum(self, values: list[float], device: torch.device) -> list[float]:
        """Element-wise sum over ranks (one collective for several numbers)."""
        if not self.enabled:
            return values
        tensor = torch.tensor(values, dtype=torch.float32, device=device)
        with self.waiting("a sum of figures"):
            dist.all_reduce(tensor)
        return tensor.tolist()

    def any(self, flag: bool, device: torch.device) -> bool:
        return self.sum([float(flag)], device)[0] > 0 if self.enabled else flag

    def gather(self, value: object, what: str = "a gather") -> list:
        """Every rank's ``value`` (any picklable object), in rank order, on every rank."""
        if not self.enabled:
            return [value]
        values: list = [None] * self.world_size
        with self.waiting(what):
            dist.all_gather_object(values, value)
        return values

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, staying on the device (no host sync)."""
        if self.enabled:
            tensor = tensor.clone()
            dist.all_reduce(tensor)
        return tensor

    def broadcast_from_main(self, tensors: Iterable[torch.Tensor]) -> None:
        """Rank 0's values into every rank's ``tensors`` (in place; one flat message per dtype)."""
        if not self.enabled:
            return
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        with self.waiting("the start (rank 0's initial weights)"):
            for group in by_dtype.values():
                flat = torch.cat([t.detach().reshape(-1) for t in group])
                dist.broadcast(flat, 0)
                with torch.no_grad():
                    for t, part in zip(group, flat.split([t.numel() for t in group])):
                        t.copy_(part.view_as(t))


def unshard(shares: list[list]) -> list:
    """The items in their original order from the ranks' shares (``data.batching.shard``:
    every world_size-th item from the rank's own), as ``Distributed.gather`` returns them."""
    total = sum(len(s) for s in shares)
    out: list = [None] * total
    for rank, share in enumerate(shares):
        out[rank :: len(shares)] = share
    return out
