"""Where a CPU training step goes: the trainer's own step (TrainStep: forward, label-smoothed
loss, backward, fused Adam) on the default config's batches, under torch's profiler.

    python scripts/profile_train_step.py --precision fp32            # this CPU as it is
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python scripts/profile_train_step.py --precision fp32        # as a CPU with AVX2 only

Prints the step time and its shares: matrix products (and the GFLOP/s they reach against a
2048^3 fp32 product timed in the same process), attention, LayerNorm, the loss, the
optimizer, dtype copies, and dropout (measured by difference: the same steps with dropout 0).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_train import cpu_name, load_batches, peak_matmul_flops  # noqa: E402
from xformer_cli.checkpoint import build_model  # noqa: E402
from xformer_cli.config import load_config  # noqa: E402
from xformer_cli.device import cpu_flags, keep_freed_memory  # noqa: E402
from xformer_cli.train import forward_loss  # noqa: E402
from xformer_cli.train.distributed import Distributed  # noqa: E402
from xformer_cli.train.step import TrainStep  # noqa: E402

# Self-time categories by aten op name (the first that matches); the loss by its own range.
CATEGORIES = [
    ("matrix products", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm")),
    ("attention (SDPA kernels)", ("scaled_dot_product", "flash_attention")),
    ("LayerNorm", ("native_layer_norm",)),
    ("optimizer (fused Adam)", ("_fused_adam", "_fused_adamw")),
    ("dtype copies", ("aten::copy_", "aten::_to_copy")),
]
LOSS_RANGE = "label_smoothed_nll"


def build_step(cfg, tokenizer, precision: str, dropout: bool) -> TrainStep:
    torch.manual_seed(1)
    if not dropout:
        cfg.model.dropout = 0.0
    model = build_model(cfg, tokenizer).train()
    return TrainStep(model, cfg.train, torch.device("cpu"), precision, Distributed(), compile=False)


def run_steps(step: TrainStep, batches) -> float:
    started = time.perf_counter()
    for batch in batches:
        step([batch], batch.n_tokens)
    return (time.perf_counter() - started) / len(batches)


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


def matmul_flops(step: TrainStep, batch) -> float:
    """FLOPs of the step's matrix products (attention's own excluded), by FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step.loss_of(batch.src, batch.tgt_in, batch.tgt_out).backward()
    step.zero_grad()
    per_op = counter.get_flop_counts().get("Global", {})
    return float(sum(v for k, v in per_op.items() if "scaled_dot_product" not in str(k)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/multi30k.yaml")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=8, help="profiled steps (after 4 warm-up steps)")
    parser.add_argument("--pairs", type=int, default=6000)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    keep_freed_memory()  # as the trainer runs (train/plan.py)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    args.length_bucket, args.steps_total = 0, args.steps + 4
    loader_args = argparse.Namespace(pairs=args.pairs, length_bucket=0, steps=args.steps + 4)
    tokenizer, _, batches = load_batches(cfg, loader_args, torch.device("cpu"))
    warm, timed = batches[:4], batches[4:]
    timed_loss()
    peak = peak_matmul_flops(torch.device("cpu"), torch.float32)
    print(f"machine: {cpu_name()}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"avx512f {'avx512f' in cpu_flags()}, avx512_bf16 {'avx512_bf16' in cpu_flags()}, "
          f"amx_bf16 {'amx_bf16' in cpu_flags()}")
    print(f"precision {args.precision}; {len(timed)} steps of {sum(b.n_tokens for b in timed) / len(timed):.0f} "
          f"target tokens; fp32 2048^3 product in this process: {peak / 1e9:.1f} GFLOP/s")
    ablated = build_step(load_config(args.config), tokenizer, args.precision, dropout=False)
    run_steps(ablated, warm)
    no_dropout = run_steps(ablated, timed)
    step = build_step(cfg, tokenizer, args.precision, dropout=True)
    run_steps(step, warm)
    plain = run_steps(step, timed)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        profiled = run_steps(step, timed)
    flops = sum(matmul_flops(step, b) for b in timed) / len(timed)
    parts = shares(prof, len(timed))
    print(f"step: {plain * 1e3:.1f} ms ({profiled * 1e3:.1f} ms under the profiler); "
          f"{sum(b.n_tokens for b in timed) / len(timed) / plain:.0f} target tokens/s")
    for name, ms in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<42} {ms:8.1f} ms  {ms / (profiled * 1e3):6.1%}")
    print(f"  {'dropout (step with p=0.1 minus p=0)':<42} {(plain - no_dropout) * 1e3:8.1f} ms  "
          f"{(plain - no_dropout) / plain:6.1%}")
    matmul_ms = parts.get("matrix products", 0.0)
    if matmul_ms:
        reached = flops / (matmul_ms / 1e3)
        print(f"matrix products: {flops / 1e9:.2f} GFLOP a step at {reached / 1e9:.1f} GFLOP/s = "
              f"{reached / peak:.0%} of the fp32 2048^3 product")


if __name__ == "__main__":
    main()
