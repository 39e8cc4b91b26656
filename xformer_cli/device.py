"""Choosing the torch device, its precision and its fast-math settings.

Precision is decided from what the hardware offers, never assumed: a CPU gets bf16 only
when it computes bf16 natively (AVX512-BF16 or AMX; Arm's BF16 extension), because
elsewhere bf16 matmuls are emulated and slower than fp32. The machines this project runs
on change from day to day, so the choice is made at start-up and reported with its reason.
"""

from __future__ import annotations

import functools
from typing import Iterable, Optional

import torch

from xformer_cli.errors import XformerError

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
# CPU flags (as /proc/cpuinfo spells them) that mean bf16 arithmetic in hardware:
# AMX tiles, AVX-512 BF16 dot products, Arm's BF16 extension.
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")
NATIVE_FP16_FLAGS = ("amx_fp16", "avx512_fp16")
INT8_DOT_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni", "asimddp")


def pick_device(name: str = "auto") -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` | ``cuda:N`` -> the device; a CUDA one is configured
    for this project's kernels first (``configure_cuda``)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise XformerError(f"device '{name}' was asked for but CUDA is not available")
        configure_cuda()
    return device


def configure_cuda() -> None:
    """TF32 tensor cores for fp32 matmuls, and no cuDNN attention backend.

    Measured on an H100 (torch 2.11, BENCHMARKS.md "GPU"): with a padding mask in bf16,
    ``scaled_dot_product_attention`` picked cuDNN, which builds a graph for every new batch
    shape (the first epoch of WMT-news ran at 7k target tokens/s instead of 94k, bf16
    decoding at half the fp32 speed) and produced non-finite losses after ~700 steps where
    fp32 trained on; the memory-efficient kernel has neither problem."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.enable_cudnn_sdp(False)


def configure_threads(threads: int) -> None:
    if threads > 0:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 ``flags``, Arm ``Features``); empty
    where the file is missing (then no native bf16 is assumed)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def first_flag(wanted: Iterable[str], flags: Optional[Iterable[str]] = None) -> Optional[str]:
    """The first of ``wanted`` that the CPU reports, or None."""
    have = cpu_flags() if flags is None else frozenset(flags)
    return next((flag for flag in wanted if flag in have), None)


def resolve_precision(requested: str, device: torch.device, flags: Optional[Iterable[str]] = None) -> tuple[str, str]:
    """``requested`` (auto | bf16 | fp16 | fp32) on ``device`` -> (precision to use, why).

    auto: bf16 on CUDA and on a CPU with native bf16 (``flags`` overrides the CPU's own, for
    tests), fp32 otherwise. An explicit choice is kept; the reason then says when it will be
    slow (bf16 or fp16 emulated on a CPU without the instructions)."""
    if requested not in PRECISIONS:
        raise XformerError(f"precision must be one of {', '.join(PRECISIONS)}, not {requested!r}")
    if device.type == "cuda":
        return ("bf16", "CUDA") if requested == "auto" else (requested, "asked for")
    if device.type != "cpu":  # mps and others: autocast support varies, stay exact
        return ("fp32", f"{device.type} device") if requested == "auto" else (requested, "asked for")
    bf16_flag = first_flag(NATIVE_BF16_FLAGS, flags)
    if requested == "auto":
        if bf16_flag:
            return "bf16", f"the CPU computes bf16 natively ({bf16_flag})"
        return "fp32", "the CPU has no native bf16 (no amx_bf16 / avx512_bf16 flag)"
    if requested == "bf16" and not bf16_flag:
        return "bf16", "asked for, but this CPU has no native bf16: expect it to be slower than fp32"
    if requested == "fp16" and not first_flag(NATIVE_FP16_FLAGS, flags):
        return "fp16", "asked for, but this CPU has no native fp16: expect it to be slower than fp32"
    return requested, "asked for"


def autocast_dtype(precision: str) -> Optional[torch.dtype]:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def autocast(device: torch.device, precision: str = "fp32"):
    """Mixed precision for a resolved ``precision`` (bf16 | fp16 | fp32): autocast on CUDA
    and CPU alike (weights stay fp32, matmuls run in the half type); fp32 = off."""
    dtype = autocast_dtype(precision)
    enabled = dtype is not None and device.type in ("cuda", "cpu")
    return torch.autocast(device_type=device.type if device.type in ("cuda", "cpu") else "cpu",
                          dtype=dtype or torch.bfloat16, enabled=enabled)


DECODE_PRECISIONS = ("auto", "fp32", "bf16", "int8")


def torch_cpu_precision(flags: Optional[Iterable[str]] = None) -> tuple[str, str]:
    """The PyTorch engine's precision for translating on a CPU with ``flags``: (bf16 | fp32, why).
    bf16 where the CPU computes it natively (faster than fp32 there, BLEU within 0.2), else fp32."""
    bf16_flag = first_flag(NATIVE_BF16_FLAGS, flags)
    if bf16_flag:
        return "bf16", f"the CPU computes bf16 natively ({bf16_flag})"
    return "fp32", "the CPU has no native bf16"


def resolve_decode_precision(requested: str, device: torch.device, flags: Optional[Iterable[str]] = None) -> tuple[str, str]:
    """Translation precision: ``requested`` (auto | fp32 | bf16 | int8) -> (precision, why).

    auto: bf16 weights on CUDA and on a CPU with native bf16 (``torch_cpu_precision``), fp32
    otherwise; which engine auto picks is ``decode.factory``'s business. int8 runs through
    the CTranslate2 engine, whose int8 kernels want VNNI or AMX."""
    if requested not in DECODE_PRECISIONS:
        raise XformerError(f"--precision must be one of {', '.join(DECODE_PRECISIONS)}, not {requested!r}")
    if requested == "int8":
        if device.type == "cpu" and not first_flag(INT8_DOT_FLAGS, flags):
            return "int8", "asked for, but this CPU has no int8 dot-product instructions (VNNI/AMX): expect it to be slow"
        return "int8", "asked for (CTranslate2 int8 weights)"
    if requested == "fp32" or device.type not in ("cpu", "cuda"):
        return "fp32", "asked for" if requested == "fp32" else f"{device.type} device"
    if device.type == "cuda":
        return "bf16", "CUDA" if requested == "auto" else "asked for"
    if requested == "auto":
        return torch_cpu_precision(flags)
    if not first_flag(NATIVE_BF16_FLAGS, flags):
        return "bf16", "asked for, but this CPU has no native bf16: expect it to be slower than fp32"
    return "bf16", "asked for"
