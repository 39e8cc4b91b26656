"""Two parts of a CPU training step against the forms they replaced, timed in turn in one
process (this shared host's pace drifts 10-20% between minutes, more than either saving):

- dropout, forward and backward, on a decoder activation (the config's d_model, ~2000 tokens):
  the mask multiplied in as bools (before) and as 0/1 of the activation's dtype (now);
- the blocked loss's last pass over a (256 x vocabulary) block: the gradient stored, then its
  padding rows zeroed by a masked pass (before), or a scale and offset per row (now);
- and the whole loss, forward and backward over (rows x vocabulary) logits, at each block size the
  blocked walk could take (train/loss.py's ``_ROWS``) and in one pass (the GPU's path), fp32 and bf16.

    python scripts/bench_cpu_step_parts.py [--rows 1980] [--width 256] [--vocab 8000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xformer_cli.device import keep_freed_memory  # noqa: E402
from xformer_cli.train import loss as loss_module  # noqa: E402
from xformer_cli.model.dropout import dropout, keep_mask  # noqa: E402


def _microseconds(fn, repeat: int = 100) -> float:
    for _ in range(5):
        fn()
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat * 1e6


class _BoolProduct(torch.autograd.Function):
    """Dropout's product before: the bool mask saved and multiplied in as it is."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.mul(x, keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return torch.mul(grad, keep).mul_(ctx.scale), None, None


def _bool_product_dropout(x: torch.Tensor, upstream: torch.Tensor) -> None:
    scale = 1.0 / (1.0 - round(0.1 * 65536) / 65536)
    _BoolProduct.apply(x, keep_mask(x.shape, 0.1, x.device), scale).backward(upstream)


def dropout_pair(rows: int, width: int, dtype: torch.dtype) -> tuple[float, float]:
    x = torch.randn(rows, width).to(dtype).requires_grad_()
    upstream = torch.randn(rows, width).to(dtype)
    before = _microseconds(lambda: _bool_product_dropout(x, upstream))
    now = _microseconds(lambda: dropout(x, 0.1, True).backward(upstream))
    return before, now


def loss_pass_pair(vocab: int) -> tuple[float, float]:
    probs, out = torch.rand(256, vocab), torch.empty(256, vocab, dtype=torch.bfloat16)
    pad = torch.zeros(256, 1, dtype=torch.bool)
    pad[-20:] = True  # ~8% padding, as 2000-token Multi30k batches have
    scale, offset = 1 / 1800, torch.full((), -0.1 / vocab / 1800)

    def masked() -> None:
        torch.add(offset, probs, alpha=scale, out=out).masked_fill_(pad, 0.0)

    def per_row() -> None:
        row_scale = torch.full((256, 1), scale).masked_fill_(pad, 0.0)
        row_offset = torch.full((256, 1), offset.item()).masked_fill_(pad, 0.0)
        torch.addcmul(row_offset, probs, row_scale, out=out)

    return _microseconds(masked), _microseconds(per_row)


BLOCK_ROWS = (64, 128, 256, 512, 1024)


def loss_block_sweep(rows: int, vocab: int, dtype: torch.dtype) -> dict[str, float]:
    """Microseconds of the loss's forward and backward at each block size, and in one pass."""
    logits = torch.randn(rows, vocab).to(dtype).requires_grad_()
    gold = torch.randint(4, vocab, (rows,))
    gold[-rows // 12:] = 0  # ~8% padding (id 0 here), as 2000-token Multi30k batches have
    scale = torch.tensor(1.0 / rows)

    def step() -> None:
        loss, _ = loss_module.label_smoothed_nll(logits, gold, 0.1, 0, grad_scale=scale)
        (loss * scale).backward()
        logits.grad = None

    times, default = {}, loss_module._ROWS
    try:
        with loss_module.forced_path("blocked"):
            for block in BLOCK_ROWS:
                loss_module._ROWS = block
                times[f"blocks of {block}"] = _microseconds(step, repeat=20)
    finally:
        loss_module._ROWS = default
    with loss_module.forced_path("one_pass"):
        times["one pass"] = _microseconds(step, repeat=20)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1980, help="tokens of the activation (a 2000-token batch)")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    keep_freed_memory()  # as the trainer runs
    results: dict[str, list[tuple[float, float]]] = {"dropout bf16": [], "dropout fp32": [], "loss pass": []}
    for _ in range(args.rounds):
        results["dropout bf16"].append(dropout_pair(args.rows, args.width, torch.bfloat16))
        results["dropout fp32"].append(dropout_pair(args.rows, args.width, torch.float32))
        results["loss pass"].append(loss_pass_pair(args.vocab))
    sweeps: dict[str, list[dict[str, float]]] = {"fp32": [], "bf16": []}
    for _ in range(args.rounds):
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            sweeps[name].append(loss_block_sweep(args.rows, args.vocab, dtype))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of {args.rounds} rounds")
    for name, pairs in results.items():
        before, now = (statistics.median(p[i] for p in pairs) for i in (0, 1))
        print(f"{name:<14} before {before:8.0f} us   now {now:8.0f} us   ({now / before:.2f}x)")
    print(f"the loss, forward and backward, {args.rows} x {args.vocab} logits (train/loss.py's block: "
          f"{loss_module._ROWS} rows):")
    for name, rounds in sweeps.items():
        medians = {way: statistics.median(r[way] for r in rounds) for way in rounds[0]}
        print(f"  {name}: " + "   ".join(f"{way} {us:6.0f} us" for way, us in medians.items()))


if __name__ == "__main__":
    main()
