"""Choosing the torch device and its fast-math settings."""

from __future__ import annotations

import torch

from xformer_cli.errors import XformerError


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise XformerError(f"device '{name}' was asked for but CUDA is not available")
    return device


def configure_threads(threads: int) -> None:
    if threads > 0:
        torch.set_num_threads(threads)


def autocast(device: torch.device, precision: str = "bf16"):
    """Mixed precision on CUDA (bf16 by default: the tensor cores' fast path, no loss
    scaling needed); plain fp32 elsewhere or with precision fp32."""
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=device.type == "cuda" and precision != "fp32")
