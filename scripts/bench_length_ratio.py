"""Output length against the references' length, per split and per length penalty (issue 28).

The length-penalty pass (train.tune_length_penalty) picks alpha on valid. Whether that alpha
suits another test set depends on how long that set's references are for their sources. This
prints, in sacreBLEU's 13a tokens (what BLEU's brevity penalty counts):

- each split's target/source length ratio (train, valid, test2016);
- for each checkpoint: beam-4 valid BLEU, output/reference and output/source ratio at each alpha,
  and the alpha the pass picks (the highest BLEU).

    python scripts/bench_length_ratio.py runs/multi30k/best.pt [more checkpoints]
    python scripts/bench_length_ratio.py --splits-only

Valid only for the checkpoints: test2016 enters as its references' length, never as BLEU.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

ALPHAS = (0.6, 1.0, 1.3, 1.6, 2.0)  # configs/multi30k.yaml's train.tune_length_penalty


def tokens(lines: list[str]) -> int:
    tokenize = Tokenizer13a()
    return sum(len(tokenize(line).split()) for line in lines)


def read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def split_ratios(data: Path, src: str, tgt: str) -> None:
    for split in ("train", "valid", "test2016"):
        source, target = read(data / f"{split}.{src}"), read(data / f"{split}.{tgt}")
        print(f"{split:9s} {len(source):6d} lines  {tgt}/{src} length ratio {tokens(target) / tokens(source):.4f}")


def checkpoint_ratios(checkpoint: str, data: Path, src: str, tgt: str, threads: int) -> None:
    import torch

    from xformer_cli import Translator
    from xformer_cli.evaluate import bleu

    torch.set_num_threads(threads)
    source, refs = read(data / f"valid.{src}"), read(data / f"valid.{tgt}")
    translator = Translator.from_checkpoint(checkpoint, device="cpu", precision="auto")
    started, rows, source_tokens = time.time(), [], tokens(source)
    for alpha in ALPHAS:
        hyps = translator.translate(source, beam_size=4, length_penalty=alpha)
        score = bleu(hyps, refs)
        rows.append((alpha, score.score, score.length_ratio, tokens(hyps) / source_tokens))
    picked = max(rows, key=lambda row: row[1])[0]
    print(f"{checkpoint} ({translator.precision}, {time.time() - started:.0f} s): valid, beam 4")
    for alpha, valid_bleu, to_ref, to_src in rows:
        print(f"  alpha {alpha:<4g} BLEU {valid_bleu:6.2f}  output/ref {to_ref:.3f}  output/source {to_src:.4f}"
              + ("  <- picked" if alpha == picked else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="*")
    parser.add_argument("--splits-only", action="store_true")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    data = Path(os.environ.get("XFORMER_DATA", "../shared/data")) / "multi30k"
    split_ratios(data, args.src, args.tgt)
    if not args.splits_only:
        for checkpoint in args.checkpoints:
            checkpoint_ratios(checkpoint, data, args.src, args.tgt, args.threads)


if __name__ == "__main__":
    main()
