"""Where a training step goes: the trainer's own step (TrainStep: forward, label-smoothed
loss, backward, fused Adam) on real batches, under torch's profiler, on a CPU or a GPU.

    python scripts/profile_train_step.py --precision fp32            # this CPU as it is
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python scripts/profile_train_step.py --precision fp32        # as a CPU with AVX2 only
    python scripts/profile_train_step.py --device cuda --precision fp32 bf16 --pairs 29000 \\
        --set model.d_model=512 model.d_ff=2048 model.n_heads=8 model.encoder_layers=6 \\
        model.decoder_layers=6 tokenizer.vocab_size=8000 train.max_tokens=25000   # paper base, 25k tokens

Prints the step time and its shares. On a CPU: matrix products (and the GFLOP/s they reach
against a 2048^3 fp32 product timed in the same process), attention, LayerNorm, the loss, the
optimizer, dtype copies, and dropout (measured by difference: the same steps with dropout 0).
On CUDA: the GPU's kernel time per step against the step's wall time (a GPU busy well under
100% of the step waits on the host: launch-bound), that kernel time by kind (matrix products,
attention, LayerNorm, softmax, dropout, casts, other element-wise work, reductions, the
optimizer), kernels per step, and the longest kernels; the dropout difference as on a CPU.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_train import (cpu_name, flop_counter, load_batches, peak_matmul_flops, peak_matmul_size,  # noqa: E402
                         run_steps, trainer_model, trainer_step)
from xformer_cli.config import load_config  # noqa: E402
from xformer_cli.device import cpu_flags, keep_freed_memory, pick_device  # noqa: E402
from xformer_cli.train import forward_loss  # noqa: E402
from xformer_cli.train.step import TrainStep  # noqa: E402

# Self-time categories by aten op name (the first that matches); the loss by its own range.
CATEGORIES = [
    ("matrix products", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm")),
    ("attention (SDPA kernels)", ("scaled_dot_product", "flash_attention")),
    ("LayerNorm", ("native_layer_norm",)),
    ("optimizer (fused Adam)", ("_fused_adam", "_fused_adamw")),
    ("dtype copies", ("aten::copy_", "aten::_to_copy")),
]
# CUDA kernels by a fragment of their (lower-cased) name, the first that matches.
KERNEL_CATEGORIES = [  # attention first: its kernels are CUTLASS ones too (fmha_cutlassF...)
    ("attention", ("fmha", "flash", "attention", "attn")),
    ("matrix products", ("gemm", "cutlass", "nvjet", "xmma", "wgmma", "cublas", "splitkreduce")),
    ("LayerNorm", ("layer_norm", "layernorm")),
    ("optimizer (fused Adam)", ("adam", "multi_tensor", "foreach")),
    ("softmax / log-softmax", ("softmax",)),
    ("dropout", ("dropout", "bernoulli", "philox")),
    ("copies and casts", ("copy", "memcpy", "cast", "convert")),
    ("memset", ("memset", "fill")),
    ("reductions", ("reduce",)),
    ("other element-wise", ("elementwise", "vectorized", "index", "where", "masked")),
]
LOSS_RANGE = "label_smoothed_nll"


def kernel_category(name: str) -> str:
    """The kind of work a CUDA kernel does, by its name (KERNEL_CATEGORIES); 'other' if none."""
    lower = name.lower()
    return next((category for category, fragments in KERNEL_CATEGORIES if any(f in lower for f in fragments)), "other")


def build_step(cfg, tokenizer, plan, device: torch.device, precision: str, dropout: bool) -> TrainStep:
    torch.manual_seed(1)
    if not dropout:
        cfg.model.dropout = 0.0
    model = trainer_model(cfg, tokenizer, plan).train().to(device)
    return trainer_step(model, cfg, device, precision)


def timed_loss():
    """The trainer's loss wrapped in a profiler range (forward; its backward is the Function's node)."""
    real = forward_loss.label_smoothed_nll

    def wrapped(*args):
        with record_function(LOSS_RANGE):
            return real(*args)

    forward_loss.label_smoothed_nll = wrapped


def shares(prof, steps: int) -> dict[str, float]:
    """Milliseconds per step of each category (self CPU time), the loss by its ranges (total)."""
    out: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        name = event.key
        if name == LOSS_RANGE or ("evaluate_function" in name and "SmoothedNLL" in name):
            out["label-smoothed loss (forward + backward)"] += event.cpu_time_total / 1e3 / steps
            continue
        for category, fragments in CATEGORIES:
            if any(f in name for f in fragments):
                out[category] += event.self_cpu_time_total / 1e3 / steps
                break
    return out


def kernel_times(prof) -> dict[str, tuple[float, int]]:
    """{kernel name: (microseconds in all, launches)} of every CUDA kernel and memory op profiled."""
    out: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            out[event.name][0] += event.device_time if hasattr(event, "device_time") else event.cuda_time
            out[event.name][1] += 1
    return {name: (us, n) for name, (us, n) in out.items()}


def report_kernels(kernels: dict[str, tuple[float, int]], steps: int, wall: float, top: int) -> None:
    """GPU busy share of the step, kernel time by kind, and the longest kernels, per step."""
    busy_ms = sum(us for us, _ in kernels.values()) / 1e3 / steps
    launches = sum(n for _, n in kernels.values()) / steps
    print(f"GPU kernel time {busy_ms:.1f} ms a step of {wall * 1e3:.1f} ms wall: busy {busy_ms / (wall * 1e3):.0%} "
          f"({launches:.0f} kernels a step; the rest of the step the GPU waits on the host)")
    by_kind: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for name, (us, n) in kernels.items():
        by_kind[kernel_category(name)][0] += us
        by_kind[kernel_category(name)][1] += n
    for kind, (us, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        ms = us / 1e3 / steps
        print(f"  {kind:<28} {ms:8.2f} ms  {ms / busy_ms:6.1%} of kernel time  {n / steps:6.0f} kernels")
    print(f"longest kernels (ms a step, launches a step):")
    for name, (us, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {us / 1e3 / steps:7.2f}  {n / steps:5.0f}  {name[:110]}")


def report_cpu(prof, step: TrainStep, timed, profiled: float, peak: float) -> None:
    flops = sum(matmul_flops(step, b) for b in timed) / len(timed)
    parts = shares(prof, len(timed))
    for name, ms in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<42} {ms:8.1f} ms  {ms / (profiled * 1e3):6.1%}")
    matmul_ms = parts.get("matrix products", 0.0)
    if matmul_ms:
        reached = flops / (matmul_ms / 1e3)
        print(f"matrix products: {flops / 1e9:.2f} GFLOP a step at {reached / 1e9:.1f} GFLOP/s = "
              f"{reached / peak:.0%} of the fp32 {peak_matmul_size(torch.device('cpu'))}^3 product")


def matmul_flops(step: TrainStep, batch) -> float:
    """FLOPs of the step's matrix products (attention's own excluded), by FlopCounterMode."""
    per_op = flop_counter(step.model, step.loss_of, [batch]).get_flop_counts().get("Global", {})
    return float(sum(v for k, v in per_op.items() if "scaled_dot_product" not in str(k)))


def profile_precision(args, tokenizer, plan, batches, device: torch.device, precision: str, peak: float) -> None:
    """One precision: the step with dropout 0 (the ablation), then with dropout, timed and profiled."""
    warm, timed = batches[:4], batches[4:]
    tokens = sum(b.n_tokens for b in timed) / len(timed)
    ablated = build_step(load_config(args.config, args.set), tokenizer, plan, device, precision, dropout=False)
    run_steps(ablated, warm, device)
    no_dropout = run_steps(ablated, timed, device)
    del ablated
    step = build_step(load_config(args.config, args.set), tokenizer, plan, device, precision, dropout=True)
    run_steps(step, warm, device)
    plain = run_steps(step, timed, device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        profiled = run_steps(step, timed, device)
    scored = step.model.cfg.output_pieces or tokenizer.tgt_vocab_size
    print(f"== precision {precision}, output layer {scored} pieces: step {plain * 1e3:.1f} ms ({profiled * 1e3:.1f} ms under the profiler); "
          f"{tokens / plain:.0f} target tokens/s; {len(timed)} steps of {tokens:.0f} target tokens")
    if device.type == "cuda":
        report_kernels(kernel_times(prof), len(timed), plain, args.top)
    else:
        report_cpu(prof, step, timed, profiled, peak)
    print(f"  {'dropout (step with dropout minus without)':<42} {(plain - no_dropout) * 1e3:8.1f} ms  "
          f"{(plain - no_dropout) / plain:6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/multi30k.yaml")
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (TF32 for fp32 there, as the trainer sets it)")
    parser.add_argument("--steps", type=int, default=8, help="profiled steps (after 4 warm-up steps)")
    parser.add_argument("--pairs", type=int, default=6000)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--top", type=int, default=12, help="longest kernels to list (CUDA)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides (model sizes, batch)")
    args = parser.parse_args()
    device = pick_device(args.device)  # on CUDA: TF32 matmuls, no cuDNN attention, as in training
    if device.type == "cpu":
        keep_freed_memory()  # as the trainer runs (train/run_plan.py)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.set)
    loader_args = argparse.Namespace(pairs=args.pairs, length_bucket=0, steps=args.steps + 4)
    tokenizer, plan, batches = load_batches(cfg, loader_args, device)
    timed_loss()
    peak = peak_matmul_flops(device, torch.float32)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    print(f"machine: {where}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"avx512f {'avx512f' in cpu_flags()}, avx512_bf16 {'avx512_bf16' in cpu_flags()}, "
          f"amx_bf16 {'amx_bf16' in cpu_flags()}")
    print(f"model {cfg.model.d_model} wide, {cfg.model.encoder_layers}+{cfg.model.decoder_layers} layers, "
          f"vocabulary {tokenizer.src_vocab_size}, max_tokens {cfg.train.max_tokens}; fp32 "
          f"{peak_matmul_size(device)}^3 product in this process: {peak / 1e9:.1f} GFLOP/s")
    for precision in args.precision:
        profile_precision(args, tokenizer, plan, batches, device, precision, peak)


if __name__ == "__main__":
    main()
