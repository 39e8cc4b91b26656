"""The sentence splitter `translate` runs on every line (sentencex) against a peer (pysbd), on
one machine in one run: a test set's lines joined into paragraphs of N, each splitter asked to
find the joins again. Prints, per splitter and language: the joins found (a split exactly where
two lines were joined), the other splits (inside a line: a line of two sentences, or a wrong
split), and the time per paragraph.

    pip install pysbd   # the peer; not a dependency of xformer
    python scripts/bench_sentence_split.py                       # newstest2014, en and de, 5 lines
    python scripts/bench_sentence_split.py --lines 3003 --per-paragraph 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from bench_train import cpu_name  # noqa: E402

Splitter = Callable[[str], list[str]]


def paragraphs(lines: list[str], size: int) -> list[tuple[str, set[int]]]:
    """Each paragraph (lines joined by a space) with the character offsets where its lines join."""
    out = []
    for start in range(0, len(lines) - size + 1, size):
        group = [line.strip() for line in lines[start:start + size]]
        joins, at = set(), 0
        for line in group[:-1]:
            at += len(line) + 1
            joins.add(at)
        out.append((" ".join(group), joins))
    return out


def split_offsets(text: str, pieces: list[str]) -> set[int]:
    """Where each piece after the first starts in ``text`` (the splitter's boundaries)."""
    found, at = set(), 0
    for index, piece in enumerate(pieces):
        core = piece.strip()
        if not core:
            continue
        start = text.find(core, at)
        if start < 0:
            break
        if index and start > 0:
            found.add(start)
        at = start + len(core)
    return found


def measure(split: Splitter, paras: list[tuple[str, set[int]]]) -> dict:
    split(paras[0][0])  # load its rules once, outside the timing
    joined = found = other = 0
    started = time.perf_counter()
    results = [split(text) for text, _ in paras]
    seconds = time.perf_counter() - started
    for (text, joins), pieces in zip(paras, results):
        offsets = split_offsets(text, pieces)
        joined += len(joins)
        found += len(offsets & joins)
        other += len(offsets - joins)
    return {"joins": joined, "found": found, "other": other, "ms_per_paragraph": 1000 * seconds / len(paras)}


def splitters(lang: str) -> dict[str, Splitter]:
    from sentencex import segment

    chosen: dict[str, Splitter] = {"sentencex": lambda text: list(segment(lang, text))}
    try:
        import pysbd
    except ImportError:
        print("pysbd is not installed (pip install pysbd): sentencex alone", file=sys.stderr)
        return chosen
    segmenter = pysbd.Segmenter(language=lang, clean=False)
    chosen["pysbd"] = segmenter.segment
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data = Path(os.environ.get("XFORMER_DATA", ROOT.parent / "shared" / "data"))
    parser.add_argument("--prefix", type=Path, default=data / "wmt14" / "newstest2014", help="PREFIX.LANG files")
    parser.add_argument("--langs", default="en,de")
    parser.add_argument("--lines", type=int, default=3003, help="lines read from each file")
    parser.add_argument("--per-paragraph", type=int, default=5)
    args = parser.parse_args()
    print(f"machine: {cpu_name()}; {args.prefix.name}, {args.lines} lines in paragraphs of {args.per_paragraph}")
    print(f"{'lang':5} {'splitter':10} {'joins found':>16} {'other splits':>13} {'ms/paragraph':>13}")
    for lang in args.langs.split(","):
        path = args.prefix.with_name(f"{args.prefix.name}.{lang}")
        lines = path.read_text(encoding="utf-8").splitlines()[: args.lines]
        paras = paragraphs(lines, args.per_paragraph)
        for name, split in splitters(lang).items():
            r = measure(split, paras)
            print(f"{lang:5} {name:10} {r['found']:>7}/{r['joins']:<8} {r['other']:>13} {r['ms_per_paragraph']:>13.3f}")


if __name__ == "__main__":
    main()
