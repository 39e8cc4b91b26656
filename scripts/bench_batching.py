"""Padding efficiency and batch shapes of the three batch plans on a config's real corpus.

Tokenizes the config's training data as `xformer prepare` does (into --workdir), then builds
one epoch of batches each way at each --max-tokens and prints, per plan: batches, distinct
shapes, and padding efficiency (real tokens, eos/bos included, over the slots of every
batch's shape, both sides, and each side for the dynamic plan; a packed epoch's last batch
counts its empty rows).

    python scripts/bench_batching.py -c configs/multi30k.yaml --max-tokens 3000 8000 25000
    python scripts/bench_batching.py -c configs/wmt-news.yaml --max-tokens 3000 8000 25000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from xformer_cli.config import load_config
from xformer_cli.data.batching import batch_bounds, bucket_shape, make_batches, make_bucketed_batches, padding_efficiency
from xformer_cli.data.packing import make_packed_batches, pack_shape, packing_efficiency
from xformer_cli.data.prepare import prepare_data


def bucket_efficiency(batches: list, src: np.ndarray, tgt: np.ndarray, max_tokens: int, step: int) -> tuple[float, int]:
    """Efficiency of bucketed batches padded to their declared (rows, width), and the shapes used."""
    real = slots = 0
    shapes = set()
    for b in batches:
        rows, width = bucket_shape(int(max(src[b].max(), tgt[b].max())) + 1, max_tokens, step)
        shapes.add((rows, width))
        real += int(src[b].sum() + tgt[b].sum()) + 2 * len(b)
        slots += 2 * rows * width
    return real / max(slots, 1), len(shapes)


def side_efficiency(batches: list, lens: np.ndarray) -> float:
    """One side's real tokens (eos/bos included) over its slots: the target's padding costs the
    decoder, the output layer and the loss; the source's only the encoder and cross-attention."""
    return float((lens + 1).sum() / sum(len(b) * (int(lens[b].max()) + 1) for b in batches))


def target_first_batches(src: np.ndarray, tgt: np.ndarray, max_tokens: int, seed: int, epoch: int) -> list:
    """``make_batches`` sorted by target length first (tried and reverted: less target padding,
    lower BLEU under beam search)."""
    tie = np.random.default_rng([seed, epoch]).permutation(len(src))
    order = np.lexsort((tie, src, tgt))
    bounds = batch_bounds(np.maximum(src, tgt)[order] + 1, max_tokens)
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[3000, 8000, 25000])
    parser.add_argument("--bucket-step", type=int, default=8)
    parser.add_argument("--workdir", default="/tmp/xformer-bench-batching")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    cfg = load_config(args.config, [f"run_dir={args.workdir}"])
    cache = prepare_data(cfg, lambda line: None).train
    src, tgt = np.asarray(cache.src_lens, dtype=np.int64), np.asarray(cache.tgt_lens, dtype=np.int64)
    print(f"{args.config}: {len(src)} pairs")
    for max_tokens in args.max_tokens:
        dynamic = make_batches(src, tgt, max_tokens, args.seed, 1)
        shapes = {(len(b), int(src[b].max()) + 1, int(tgt[b].max()) + 1) for b in dynamic}
        print(f"max_tokens {max_tokens}: dynamic  {len(dynamic):5d} batches {len(shapes):4d} shapes, "
              f"efficiency {padding_efficiency(dynamic, src, tgt):.3f} (source {side_efficiency(dynamic, src):.3f}, "
              f"target {side_efficiency(dynamic, tgt):.3f})")
        other = target_first_batches(src, tgt, max_tokens, args.seed, 1)
        print(f"max_tokens {max_tokens}: dynamic, sorted by target length first (not used)  "
              f"efficiency {padding_efficiency(other, src, tgt):.3f} (source {side_efficiency(other, src):.3f}, "
              f"target {side_efficiency(other, tgt):.3f})")
        buckets = make_bucketed_batches(src, tgt, max_tokens, args.bucket_step, args.seed, 1)
        eff, n_shapes = bucket_efficiency(buckets, src, tgt, max_tokens, args.bucket_step)
        print(f"max_tokens {max_tokens}: buckets  {len(buckets):5d} batches {n_shapes:4d} shapes, efficiency {eff:.3f} "
              f"(step {args.bucket_step})")
        shape = pack_shape(src, tgt, max_tokens)
        started = time.perf_counter()
        packed = make_packed_batches(src, tgt, shape, args.seed, 1)
        seconds = time.perf_counter() - started
        full = [b for b in packed if len(b) == shape.rows]
        print(f"max_tokens {max_tokens}: packed   {len(packed):5d} batches    1 shape ({shape.rows} x {shape.src_width}/"
              f"{shape.tgt_width}), efficiency {packing_efficiency(packed, src, tgt, shape):.3f} "
              f"(full batches {packing_efficiency(full, src, tgt, shape):.3f}; packing {seconds * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
