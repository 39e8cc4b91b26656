"""Data-parallel training on torch.distributed, launched by torchrun.

    torchrun --nproc_per_node 8 -m xformer_cli train -c configs/wmt14-en-de-base.yaml

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; without them everything here is a no-op
and training runs in one process. NCCL on CUDA, gloo on CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Distributed:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @classmethod
    def from_environment(cls) -> "Distributed":
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def start(self, device: torch.device) -> None:
        if self.enabled and not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    def stop(self) -> None:
        """Tear down once every rank is done communicating: a rank that leaves while another
        still talks to it can abort at exit (gloo)."""
        if self.enabled and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def sum(self, values: list[float], device: torch.device) -> list[float]:
        """Element-wise sum over ranks (one collective for several numbers)."""
        if not self.enabled:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def any(self, flag: bool, device: torch.device) -> bool:
        return self.sum([float(flag)], device)[0] > 0 if self.enabled else flag

    def gather(self, value: object) -> list:
        """Every rank's ``value`` (any picklable object), in rank order, on every rank."""
        if not self.enabled:
            return [value]
        values: list = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, staying on the device (no host sync)."""
        if self.enabled:
            tensor = tensor.clone()
            dist.all_reduce(tensor)
        return tensor
