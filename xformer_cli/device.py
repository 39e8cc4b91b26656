"""Choosing the torch device, its precision and its fast-math settings.

Precision is decided from what the hardware offers, never assumed: a CPU gets bf16 only
when it computes bf16 natively (AVX512-BF16 or AMX; Arm's BF16 extension), because
elsewhere bf16 matmuls are emulated and slower than fp32. A CUDA device is read by its
compute capability: bf16 tensor cores from 8.0 (Ampere) on, fp16 ones only on 7.x (V100,
T4, RTX 20xx), none before. The machines this project runs on change from day to day, so
the choice is made at start-up and reported with its reason.

``$XFORMER_CPU_FLAGS_MASK`` (flags or shell patterns, space or comma separated) hides CPU
flags from every choice made here, so one machine can make the choices of another: with
``'avx512* amx* avx_vnni'`` a bf16 CPU decides as an AVX2-only one would (docs/training.md).
"""

from __future__ import annotations

import ctypes
import fnmatch
import functools
import os
import re
import sys
from typing import Iterable, Optional

import torch

from xformer_cli.errors import XformerError
from xformer_cli.precisions import DEVICE_DECODE_PRECISIONS, TRAINING_PRECISIONS

EMULATED_ON_CPU = "asked for, but this CPU has no native {}: expect it to be slower than fp32"
# CPU flags (as /proc/cpuinfo spells them) that mean bf16 arithmetic in hardware:
# AMX tiles, AVX-512 BF16 dot products, Arm's BF16 extension.
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")
NATIVE_FP16_FLAGS = ("amx_fp16", "avx512_fp16")
INT8_DOT_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni", "asimddp")
CPU_FLAGS_MASK_ENV = "XFORMER_CPU_FLAGS_MASK"
# CUDA compute capabilities (major) from which the tensor cores compute each half type.
BF16_TENSOR_CORES = 8  # A100, RTX 30xx, L4, H100 and later
FP16_TENSOR_CORES = 7  # V100, T4, RTX 20xx


def pick_device(name: str = "auto") -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` | ``cuda:N`` -> the device; a CUDA one is configured
    for this project's kernels first (``configure_cuda``)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", name):
        raise XformerError(f"device must be auto, cpu, cuda, cuda:N or mps, not {name!r}")
    device = torch.device(name)
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise XformerError("device 'mps' was asked for but this torch has no usable MPS (Apple GPU) here")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise XformerError(f"device '{name}' was asked for but CUDA is not available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise XformerError(f"device '{name}' was asked for but torch sees {torch.cuda.device_count()} GPU(s)")
        configure_cuda()
    return device


def configure_cuda() -> None:
    """TF32 tensor cores for fp32 matmuls, and no cuDNN attention backend.

    Measured on an H100 (torch 2.11; docs/benchmarks/gpu.md, "GPU: the first lease"): with a padding
    mask in bf16, ``scaled_dot_product_attention`` picked cuDNN, which builds a graph for every new
    batch shape (the first epoch of WMT-news ran at a fraction of its speed, and bf16 decoding
    slower than fp32) and produced non-finite losses early in the run where fp32 trained on; the
    memory-efficient kernel has neither problem."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.enable_cudnn_sdp(False)


def configure_threads(threads: int) -> None:
    if threads > 0:
        torch.set_num_threads(threads)


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt's parameter numbers (glibc's malloc.h)


def keep_freed_memory(libc: Optional[object] = None) -> bool:
    """Ask glibc's malloc to keep the memory a CPU training step frees for the next step.

    By default it maps every block over 32 MB afresh and returns it on free (and trims the
    heap's top): a step's logits and their gradient then come back as new pages, each zeroed
    by a page fault, step after step (docs/benchmarks/cpu-speed.md, "A faster CPU training
    step"). A training loop asks for the same sizes every step, so the process keeps its peak
    instead, as PyTorch's CUDA allocator does. True when applied; elsewhere than Linux with
    glibc, nothing changes. ``libc``: what provides ``mallopt`` (tests pass a fake)."""
    if libc is None:
        if not sys.platform.startswith("linux"):
            return False
        try:
            libc = ctypes.CDLL(None)  # the C library this process already runs on
        except OSError:
            return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:  # musl and others without glibc's knobs
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 ``flags``, Arm ``Features``), less
    those ``$XFORMER_CPU_FLAGS_MASK`` hides (read at every call, so a test may set it); empty
    where the file is missing (then no native bf16 is assumed)."""
    return mask_flags(proc_cpu_flags(), os.environ.get(CPU_FLAGS_MASK_ENV, ""))


def mask_flags(flags: Iterable[str], mask: str) -> frozenset[str]:
    """``flags`` without those matching any of ``mask``'s names or shell patterns
    (``avx512*``), given space or comma separated."""
    patterns = mask.replace(",", " ").split()
    return frozenset(flag for flag in flags if not any(fnmatch.fnmatchcase(flag, p) for p in patterns))


@functools.lru_cache(maxsize=1)
def proc_cpu_flags() -> frozenset[str]:
    """The flags /proc/cpuinfo reports, unmasked."""
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


def cuda_card(device: torch.device) -> tuple[str, int, int]:
    """(name, major, minor) of a CUDA device's compute capability."""
    if not torch.cuda.is_available():
        raise XformerError(f"device '{device}' was asked for but CUDA is not available")
    major, minor = torch.cuda.get_device_capability(device)
    return torch.cuda.get_device_name(device), int(major), int(minor)


def cuda_precision(requested: str, device: torch.device, training: bool = True) -> tuple[str, str]:
    """Precision on a CUDA device, from its compute capability. auto: bf16 from 8.0 (native
    bf16 tensor cores); fp16 on 7.x (fp16 tensor cores, no bf16 ones): training with the
    trainer's loss scaler, as fairseq and OpenNMT-py train there, translation with fp16
    weights; fp32 before 7.0. fp32 on 8.0 and above runs its matmuls on TF32 tensor cores
    (``configure_cuda``). An explicit choice is kept, with a warning where it is emulated."""
    name, major, minor = cuda_card(device)
    card = f"{name}, compute capability {major}.{minor}"
    if requested == "auto":
        if major >= BF16_TENSOR_CORES:
            return "bf16", f"{card}: computes bf16 natively"
        if major >= FP16_TENSOR_CORES:
            return "fp16", f"{card}: fp16 tensor cores but no bf16 ones; " + (
                "fp16 with loss scaling" if training else "fp16 weights")
        return "fp32", f"{card}: no half-precision tensor cores"
    if requested == "bf16" and major < BF16_TENSOR_CORES:
        return "bf16", f"asked for, but the {card} has no bf16 tensor cores: expect it to be slow"
    if requested == "fp16" and major < FP16_TENSOR_CORES:
        return "fp16", f"asked for, but the {card} has no fp16 tensor cores: expect no gain over fp32"
    if requested == "fp32" and major >= BF16_TENSOR_CORES:
        return "fp32", f"asked for (TF32 tensor cores for the matmuls on the {card})"
    return requested, "asked for"


def computes_natively(precision: str, device: torch.device, flags: Optional[Iterable[str]] = None) -> Optional[bool]:
    """Whether ``device`` computes ``precision``'s (fp32 | bf16 | fp16) products in hardware:
    on a CPU from its flags (``flags`` overrides them), on CUDA from the compute capability
    (bf16 tensor cores from 8.0, fp16 from 7.0). None where neither tells (no flags to read,
    other devices): then only a measurement can (a native half type outruns fp32). Its user is
    scripts/bench_train.py (which precisions to time); training and translation decide with
    ``resolve_precision`` and ``resolve_decode_precision``."""
    if precision == "fp32":
        return True
    if device.type == "cuda":
        major = cuda_card(device)[1]
        return major >= (BF16_TENSOR_CORES if precision == "bf16" else FP16_TENSOR_CORES)
    have = cpu_flags() if flags is None else frozenset(flags)
    if device.type != "cpu" or not have:
        return None
    return first_flag(NATIVE_BF16_FLAGS if precision == "bf16" else NATIVE_FP16_FLAGS, have) is not None


def resolve_precision(requested: str, device: torch.device, flags: Optional[Iterable[str]] = None) -> tuple[str, str]:
    """``requested`` (auto | bf16 | fp16 | fp32) on ``device`` -> (precision to use, why).

    auto: on CUDA, by compute capability (``cuda_precision``); on a CPU, bf16 where it computes
    bf16 natively (``flags`` overrides the CPU's own, for tests), fp32 otherwise. An explicit
    choice is kept; the reason then says when it will be slow (a half type the hardware
    emulates)."""
    if requested not in TRAINING_PRECISIONS:
        raise XformerError(f"precision must be one of {', '.join(TRAINING_PRECISIONS)}, not {requested!r}")
    if device.type == "cuda":
        return cuda_precision(requested, device)
    if device.type != "cpu":  # mps and others: autocast support varies, stay exact
        return ("fp32", f"{device.type} device") if requested == "auto" else (requested, "asked for")
    bf16_flag = first_flag(NATIVE_BF16_FLAGS, flags)
    if requested == "auto":
        if bf16_flag:
            return "bf16", f"the CPU computes bf16 natively ({bf16_flag})"
        return "fp32", "the CPU has no native bf16 (no amx_bf16 / avx512_bf16 flag)"
    if (requested == "bf16" and not bf16_flag) or (requested == "fp16" and not first_flag(NATIVE_FP16_FLAGS, flags)):
        return requested, EMULATED_ON_CPU.format(requested)
    return requested, "asked for"


def autocast_dtype(precision: str) -> Optional[torch.dtype]:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def autocast(device: torch.device, precision: str = "fp32") -> torch.autocast:
    """Mixed precision for a resolved ``precision`` (bf16 | fp16 | fp32): autocast on CUDA
    and CPU alike (weights stay fp32, matmuls run in the half type); fp32 = off."""
    dtype = autocast_dtype(precision)
    enabled = dtype is not None and device.type in ("cuda", "cpu")
    return torch.autocast(device_type=device.type if device.type in ("cuda", "cpu") else "cpu",
                          dtype=dtype or torch.bfloat16, enabled=enabled)


def torch_cpu_precision(flags: Optional[Iterable[str]] = None) -> tuple[str, str]:
    """The PyTorch engine's precision for translating on a CPU with ``flags``: (bf16 | fp32, why).
    bf16 where the CPU computes it natively (faster than fp32 there, at fp32's BLEU:
    docs/benchmarks/decoding.md, "Choosing the engine"), else fp32."""
    bf16_flag = first_flag(NATIVE_BF16_FLAGS, flags)
    if bf16_flag:
        return "bf16", f"the CPU computes bf16 natively ({bf16_flag})"
    return "fp32", "the CPU has no native bf16"


def resolve_decode_precision(requested: str, device: torch.device,
                             flags: Optional[Iterable[str]] = None) -> tuple[str, str]:
    """Translation precision: ``requested`` (auto | fp32 | bf16 | fp16 | int8) -> (precision, why).

    auto: on CUDA the training rule's precision as weights (``cuda_precision``: bf16 from
    compute capability 8.0, fp16 on 7.x, fp32 before); on a CPU bf16 weights where it computes
    bf16 natively (``torch_cpu_precision``), fp32 otherwise; which engine auto picks is
    ``decode.factory``'s business. int8 runs through the CTranslate2 engine, whose int8
    kernels want VNNI or AMX."""
    if requested not in DEVICE_DECODE_PRECISIONS:
        raise XformerError(f"--precision must be one of {', '.join(DEVICE_DECODE_PRECISIONS)}, not {requested!r}")
    if requested == "int8":
        if device.type == "cpu" and not first_flag(INT8_DOT_FLAGS, flags):
            return "int8", ("asked for, but this CPU has no int8 dot-product instructions (VNNI/AMX): "
                            "expect it to be slow")
        return "int8", "asked for (CTranslate2 int8 weights)"
    if requested == "fp32" or device.type not in ("cpu", "cuda"):
        return "fp32", "asked for" if requested == "fp32" else f"{device.type} device"
    if device.type == "cuda":
        return cuda_precision(requested, device, training=False)
    if requested == "auto":
        return torch_cpu_precision(flags)
    native = NATIVE_BF16_FLAGS if requested == "bf16" else NATIVE_FP16_FLAGS
    if not first_flag(native, flags):
        return requested, EMULATED_ON_CPU.format(requested)
    return requested, "asked for"
