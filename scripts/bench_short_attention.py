"""CPU training attention: SDPA's tiled kernel against ``short_attention`` (plain products,
softmax, written-out backward), timed in turn in one process (this shared host's pace drifts
10-20% between minutes, more than the difference).

- by key length: forward and backward of one attention at ~2000 tokens a batch (batch = tokens
  / length), with a padding mask and causal, fp32 (what CPU training computes scores in, bf16
  runs too): where the crossover lies (``SHORT_KEYS``);
- ``--step``: the trainer's whole step (TrainStep) on real Multi30k batches, attention by SDPA
  (``SHORT_KEYS`` 0) and as shipped, 9 steps each in turn.

    python scripts/bench_short_attention.py [--lengths 12 24 32 48 64 96 128] [--rounds 5]
    XFORMER_DATA=../shared/data python scripts/bench_short_attention.py --step --precision bf16 fp32 \\
        [--set train.max_tokens=2000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xformer_cli.device import keep_freed_memory  # noqa: E402
from xformer_cli.model import transformer  # noqa: E402
from xformer_cli.model.short_attention import SHORT_KEYS, short_attention  # noqa: E402


def _milliseconds(fn, repeat: int = 10) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat * 1e3


def attention_pair(length: int, tokens: int, heads: int, d_head: int, causal: bool) -> tuple[float, float]:
    """(SDPA, short) milliseconds of one attention's forward and backward."""
    batch = max(1, tokens // length)
    q, k, v = (torch.randn(batch, heads, length, d_head, requires_grad=True) for _ in range(3))
    upstream = torch.randn(batch, heads, length, d_head)
    mask = None
    if not causal:  # about one key in twenty is padding, as in length-sorted batches
        mask = (torch.rand(batch, 1, 1, length) > 0.05)
        mask[..., 0] = True

    def sdpa() -> None:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal).backward(upstream)

    def short() -> None:
        short_attention(q, k, v, mask, causal).backward(upstream)

    return _milliseconds(sdpa), _milliseconds(short)


def by_length(args) -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.tokens} tokens, {args.heads} heads "
          f"of {args.d_head}; medians of {args.rounds} rounds; forward + backward, fp32; SHORT_KEYS = {SHORT_KEYS}")
    for length in args.lengths:
        for causal in (False, True):
            pairs = [attention_pair(length, args.tokens, args.heads, args.d_head, causal) for _ in range(args.rounds)]
            sdpa, short = (statistics.median(p[i] for p in pairs) for i in (0, 1))
            kind = "causal" if causal else "padding mask"
            print(f"{length:>4} keys, {kind:<12}  SDPA {sdpa:7.2f} ms   short {short:7.2f} ms   ({short / sdpa:.2f}x)")


def whole_step(args) -> None:
    from bench_train import load_batches
    from profile_train_step import build_step
    from xformer_cli.config import load_config

    cfg = load_config(args.config, args.set)
    tokenizer, _, batches = load_batches(cfg, argparse.Namespace(pairs=6000, length_bucket=0, steps=12),
                                         torch.device("cpu"))
    for precision in args.precision:
        step = build_step(load_config(args.config, args.set), tokenizer, torch.device("cpu"), precision, True)
        for batch in batches[:3]:
            step([batch], batch.n_tokens)
        times: dict[str, list[float]] = {"SDPA": [], "short": []}
        for _ in range(args.rounds):
            for name, keys in (("SDPA", 0), ("short", SHORT_KEYS)):
                transformer.SHORT_KEYS = keys
                started = time.perf_counter()
                for batch in batches[3:12]:
                    step([batch], batch.n_tokens)
                times[name].append((time.perf_counter() - started) / 9 * 1e3)
        transformer.SHORT_KEYS = SHORT_KEYS
        sdpa, short = statistics.median(times["SDPA"]), statistics.median(times["short"])
        print(f"{precision}: step median SDPA {sdpa:.1f} ms, short {short:.1f} ms ({short / sdpa:.3f}x); rounds: "
              + "  ".join(f"{a:.0f}/{b:.0f}" for a, b in zip(times["SDPA"], times["short"])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[12, 24, 32, 48, 64, 96, 128])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--step", action="store_true", help="the trainer's whole step instead")
    parser.add_argument("--config", default="configs/multi30k.yaml")
    parser.add_argument("--precision", nargs="+", default=["bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--set", nargs="*", default=[], help="config overrides")
    args = parser.parse_args()
    keep_freed_memory()  # as the trainer runs
    whole_step(args) if args.step else by_length(args)


if __name__ == "__main__":
    main()
