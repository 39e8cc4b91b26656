"""Quoted text kept as written: Multi30k's captions quote what a sign or a shirt says, and the
German references keep most of it verbatim ('a shirt that says "Asian Pacific 2007"' / 'mit dem
Aufdruck "Asian Pacific 2007"'). For each quoted span of the valid and test2016 sources
(data/quote_augmentation.py finds them, a closing full stop left out), this counts the
outputs that hold it character for character, beside the references scored the same way.

    python scripts/bench_quotes.py runs/multi30k/best.pt [more checkpoints] [--beam 4]

Each line of the sources that quotes is printed with every model's output.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from xformer_cli import Translator
from xformer_cli.data.quote_augmentation import quoted_spans

DATA = Path(os.environ.get("XFORMER_DATA", "../shared/data")) / "multi30k"


def quoted_lines(splits: list[str]) -> tuple[list[str], list[str]]:
    """The source lines that quote a span, and their references."""
    sources, references = [], []
    for split in splits:
        src = (DATA / f"{split}.en").read_text(encoding="utf-8").splitlines()
        ref = (DATA / f"{split}.de").read_text(encoding="utf-8").splitlines()
        for s, r in zip(src, ref):
            if quoted_spans(s):
                sources.append(s)
                references.append(r)
    return sources, references


def kept(sources: list[str], outputs: list[str]) -> tuple[int, int]:
    """(spans the outputs write as the source does, spans in all)."""
    spans = [(s[a:b], out) for s, out in zip(sources, outputs) for a, b in quoted_spans(s)]
    return sum(quote in out for quote, out in spans), len(spans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--splits", nargs="+", default=["valid", "test2016"])
    args = parser.parse_args()
    sources, references = quoted_lines(args.splits)
    rows = [("the reference", references)]
    for path in args.checkpoints:
        rows.append((path, Translator.from_checkpoint(path).translate(sources, beam_size=args.beam)))
    for index, source in enumerate(sources):
        print(f"\n{source}")
        for name, outputs in rows:
            print(f"  {name}: {outputs[index]}")
    print(f"\nquoted spans written as the source has them ({', '.join(args.splits)}, beam {args.beam}):")
    for name, outputs in rows:
        n, total = kept(sources, outputs)
        print(f"  {name:<50} {n} of {total}")


if __name__ == "__main__":
    main()
