"""Aten ops of one training step on the code path a CUDA device takes, counted on a CPU.

Every aten op that reaches the backend is at most one kernel launch, and a small model's step
on a GPU is set by its launches (train/opcount.py). The step counted is the trainer's own
(``TrainStep``: fused Adam, the loss scaler at fp16, clipping with --clip-norm, the finite
check), on one rank. The count runs on fake tensors (no arithmetic), so the paper's base model
at a 25k-token batch counts in seconds, on any machine, with the branches CUDA takes (the
one-pass loss, plain ``F.linear``); the second update is counted (the first creates Adam's
state). Rows:

- blocked loss: the CPU's label-smoothed loss, which CUDA ran before the one-pass loss;
- one-pass loss: CUDA's loss, autocast casting each weight at every use;
- + half-weight cache: what the trainer runs on CUDA bf16 (``forward_loss.wants_half_weights``):
  bf16 weight copies made once per update instead of autocast's per-use casts, self-attention's
  q, k and v from one product on them, bias gradients summed straight into fp32.

Columns: all aten ops, and those that launch a kernel (views and allocations left out).
Random ids in rows of 25 tokens stand in for a batch (the count does not depend on them).

    python scripts/bench_opcount.py                                  # paper base, 25k tokens, bf16
    python scripts/bench_opcount.py --tokens 4000
    python scripts/bench_opcount.py --tokens 6250 --micro-batches 4   # 25k tokens as 4 x 6250
"""

from __future__ import annotations

import argparse

import torch

from xformer_cli.config import TrainConfig
from xformer_cli.data.batching import Batch
from xformer_cli.model.transformer import ModelConfig, Transformer
from xformer_cli.train.opcount import cuda_path_step_ops

ROW_LENGTH = 25
ROWS = (("blocked loss", "blocked", False), ("one-pass loss", "one_pass", False),
        ("+ half-weight cache (the trainer on CUDA bf16)", "one_pass", True))


def fake_batch(tokens: int, vocab: int) -> Batch:
    ids = torch.randint(4, vocab, (max(tokens // ROW_LENGTH, 1), ROW_LENGTH))
    return Batch(ids, ids, ids, ids.numel())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=25000, help="target tokens per micro-batch")
    parser.add_argument("--micro-batches", type=int, default=1, help="micro-batches per update (update_freq)")
    parser.add_argument("--vocab", type=int, default=37000, help="joint vocabulary, tied embeddings (the paper's)")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--d-ff", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers each")
    parser.add_argument("--clip-norm", type=float, default=TrainConfig.clip_norm,
                        help="train.clip_norm (0: no clipping)")
    args = parser.parse_args()
    cfg = ModelConfig(d_model=args.d_model, d_ff=args.d_ff, n_heads=args.heads, encoder_layers=args.layers,
                      decoder_layers=args.layers)
    tc = TrainConfig(clip_norm=args.clip_norm)  # the trainer's defaults: Adam, label smoothing 0.1
    batches = [fake_batch(args.tokens, args.vocab) for _ in range(args.micro_batches)]
    print(f"torch {torch.__version__}; d_model {args.d_model}, d_ff {args.d_ff}, {args.heads} heads, "
          f"{args.layers}+{args.layers} layers, vocab {args.vocab} tied; {args.micro_batches} x "
          f"{batches[0].n_tokens} target tokens, {args.precision}; the trainer's step: fused {tc.optimizer}, "
          f"clip_norm {tc.clip_norm:g}, one rank")
    print(f"{'step':<48} {'aten ops':>9} {'kernels':>8}")
    for label, loss_path, half in ROWS:
        if half and args.precision != "bf16":
            continue  # the cache exists for bf16 only
        counter = cuda_path_step_ops(lambda: Transformer(cfg, args.vocab, 0, 0), batches, tc, args.precision, half,
                                     loss_path)
        print(f"{label:<48} {counter.total:>9} {counter.kernels:>8}")


if __name__ == "__main__":
    main()
