"""The training step with the output layer over the whole joint vocabulary against one over
the target side's pieces (``model.restrict_output``), interleaved in one process.

    python scripts/bench_output_pieces.py --precision bf16 fp32 --set train.max_tokens=2000

Both models are the config's, built from one seed, and take the trainer's own step
(TrainStep: forward, label-smoothed loss, backward, Adam) on the same batches of the first
--pairs Multi30k pairs; the rounds alternate between them, so the host's drift over minutes
(10-15% on a shared machine) falls on both alike. Prints each round's milliseconds a step, the
medians and their ratio, and how many pieces the target side uses.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_train import cpu_name, load_batches  # noqa: E402
from profile_train_step import run_steps  # noqa: E402

from xformer_cli.checkpoint_file import build_model  # noqa: E402
from xformer_cli.config import load_config  # noqa: E402
from xformer_cli.data.sources import load_corpus  # noqa: E402
from xformer_cli.device import cpu_flags, keep_freed_memory  # noqa: E402
from xformer_cli.train.distributed import Distributed  # noqa: E402
from xformer_cli.train.output_pieces import target_pieces  # noqa: E402
from xformer_cli.train.step import TrainStep  # noqa: E402


def steps_for(cfg, tokenizer, pieces: torch.Tensor, precision: str) -> dict[str, TrainStep]:
    out = {}
    for name, restrict in (("whole vocabulary", False), ("target side's pieces", True)):
        torch.manual_seed(1)
        model = build_model(cfg, tokenizer, pieces if restrict else None).train()
        out[name] = TrainStep(model, cfg.train, torch.device("cpu"), precision, Distributed(), compile=False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/multi30k.yaml")
    parser.add_argument("--precision", nargs="+", default=["bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--pairs", type=int, default=29000, help="pairs the tokenizer and the pieces are counted on")
    parser.add_argument("--steps", type=int, default=12, help="timed steps a round (after 4 warm-up steps)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    keep_freed_memory()  # as the trainer runs
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.set)
    tokenizer, _, batches = load_batches(cfg, argparse.Namespace(pairs=args.pairs, length_bucket=0, steps=args.steps + 4),
                                         torch.device("cpu"))
    corpus = load_corpus(cfg.data.train[0], cfg.data.src_lang, cfg.data.tgt_lang, "train")
    ids = np.concatenate([np.asarray(line, dtype=np.int64) for line in tokenizer.encode_tgt(corpus.tgt[: args.pairs])])
    pieces = target_pieces(ids, tokenizer.tgt_vocab_size)
    flags = cpu_flags()
    print(f"machine: {cpu_name()}; torch {torch.__version__}, {torch.get_num_threads()} threads; avx512_bf16 "
          f"{'avx512_bf16' in flags}, amx_bf16 {'amx_bf16' in flags}; max_tokens {cfg.train.max_tokens}; "
          f"target side: {pieces.numel()} of {tokenizer.tgt_vocab_size} pieces")
    for precision in args.precision:
        steps = steps_for(cfg, tokenizer, pieces, precision)
        for step in steps.values():
            run_steps(step, batches[:4], torch.device("cpu"))
        times: dict[str, list[float]] = {name: [] for name in steps}
        for r in range(args.rounds):
            for name, step in steps.items():
                times[name].append(run_steps(step, batches[4:], torch.device("cpu")) * 1e3)
            print(f"  {precision} round {r + 1}: " + ", ".join(f"{n} {t[-1]:.1f} ms" for n, t in times.items()), flush=True)
        whole, restricted = (statistics.median(t) for t in times.values())
        print(f"{precision}: median step {whole:.1f} ms (whole vocabulary), {restricted:.1f} ms (target side's "
              f"pieces): {whole / restricted:.3f}x")


if __name__ == "__main__":
    main()
