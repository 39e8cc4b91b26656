"""Data pipeline at WMT14 scale: tokenizer training, cache build, loader speed, padding.

Builds a 4.5M-pair corpus (WMT14 en-de's size) by repeating real text, Multi30k and
wmt-news from $XFORMER_DATA, each repetition in a fresh shuffled order, then runs the
same pipeline `xformer prepare` runs (reservoir sample -> sentencepiece -> tokenized
memory-mapped cache) with the wmt14-en-de-base tokenizer settings, then the loader.
Prints each figure; the peak RSS is this whole process's, i.e. the whole pipeline's.

    python scripts/bench_data.py --pairs 4500000 --workdir /tmp/xformer-bench-data
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import time
from pathlib import Path


from xformer_cli.config import load_config
from xformer_cli.data.batching import make_batches, padding_efficiency
from xformer_cli.data.prepare import prepare_data


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024  # Linux reports KiB


def read(path: Path) -> list[str]:
    # Split on "\n" only: str.splitlines also splits on \x0b, \x1c, U+2028..., which occur
    # inside real WMT lines and would misalign the two sides.
    return path.read_text(encoding="utf-8").rstrip("\n").split("\n")


def write_scaled_corpus(data: Path, out: Path, pairs: int, seed: int = 1) -> None:
    src = read(data / "multi30k/train.en") + read(data / "wmt-news/train.en")
    tgt = read(data / "multi30k/train.de") + read(data / "wmt-news/train.de")
    rng = random.Random(seed)
    order = list(range(len(src)))
    written = 0
    with open(out / "train.en", "w", encoding="utf-8") as fs, open(out / "train.de", "w", encoding="utf-8") as ft:
        while written < pairs:
            rng.shuffle(order)
            take = order[: pairs - written]
            fs.write("".join(src[i] + "\n" for i in take))
            ft.write("".join(tgt[i] + "\n" for i in take))
            written += len(take)


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument("--workdir", default="/tmp/xformer-bench-data")
    parser.add_argument("--config", default="configs/wmt14-en-de-base.yaml", help="tokenizer and filter settings")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--loader-seconds", type=float, default=20.0)
    parser.add_argument("--trainer-batches-per-s", type=float, default=70.0,
                        help="what a GPU trainer consumes: 70 batches of ~3.6k target tokens = ~250k tokens/s, "
                             "3x NVIDIA's 82k tokens/s per A100 (see BENCHMARKS.md)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()

    data = Path(os.environ.get("XFORMER_DATA", "../shared/data"))
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    (work / "corpus").mkdir(parents=True)
    started = time.time()
    write_scaled_corpus(data, work / "corpus", args.pairs)
    corpus_bytes = du(work / "corpus")
    print(f"corpus: {args.pairs} pairs, {corpus_bytes / 2**20:.0f} MiB of text, written in {time.time() - started:.1f}s")

    cfg = load_config(args.config, [
        f"run_dir={work / 'run'}", f"data.train={{prefix: {work / 'corpus' / 'train'}}}", "data.valid=null", "data.test=null",
    ])
    print(f"settings: {args.config}: vocab {cfg.tokenizer.vocab_size} {cfg.tokenizer.model_type}, "
          f"tokenizer sample {cfg.tokenizer.input_sentence_size} sentences, max_len {cfg.data.max_len}, "
          f"ratio {cfg.data.max_len_ratio}, threads {os.cpu_count()}")
    lines: list[str] = []

    def log(message: str) -> None:
        lines.append(message)
        print(f"  [{time.time() - started:7.1f}s, peak RSS {peak_rss_gib():.2f} GiB] {message}", flush=True)

    started = time.time()
    prepared = prepare_data(cfg, log)
    pipeline_seconds = time.time() - started
    cache = prepared.train
    after_prepare = peak_rss_gib()
    print(f"prepare: {pipeline_seconds:.1f}s in all; cache build {cache.meta['seconds']:.1f}s for "
          f"{cache.meta['src_tokens'] + cache.meta['tgt_tokens']:,} tokens; peak RSS so far {after_prepare:.2f} GiB")
    print(f"cache on disk: {du(cache.directory) / 2**20:.0f} MiB ({cache.meta['dtype']} ids + int64 offsets)")

    started = time.time()
    batches = make_batches(cache.src_lens, cache.tgt_lens, args.max_tokens, seed=1, epoch=1)
    plan_seconds = time.time() - started
    efficiency = padding_efficiency(batches, cache.src_lens, cache.tgt_lens)
    print(f"batching: {len(batches):,} batches of max_tokens {args.max_tokens} planned in {plan_seconds:.1f}s; "
          f"padding efficiency {efficiency:.4f}")

    started = time.time()
    done = tokens = 0
    while time.time() - started < args.loader_seconds and done < len(batches):
        batch = cache.batch(batches[done])
        tokens += batch.n_tokens
        done += 1
    rate = done / (time.time() - started)
    print(f"loader: {rate:.0f} batches/s ({tokens / (time.time() - started):,.0f} target tokens/s) on one core, "
          f"{rate / args.trainer_batches_per_s:.0f}x the {args.trainer_batches_per_s:g} batches/s a GPU trainer consumes")
    print(f"peak RSS, whole pipeline: {peak_rss_gib():.2f} GiB")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
