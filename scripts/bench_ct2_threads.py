#!/usr/bin/env python
"""CTranslate2's two ways of using CPU threads against speed: one batch over all threads
(intra_threads, OpenMP) or parallel batches, one thread each (inter_threads), at several job
sizes (max_batch_size), for exports written by ``xformer export``.

    python scripts/bench_ct2_threads.py --model runs/multi30k-pipeline/export/student-int8 \
        --src ../shared/data/multi30k/test2016.en [--threads 2] [--beams 1 4] [--jobs 16 32 64 256]

It calls CTranslate2 directly on the source pieces (sentencepiece outside the clock, all lines
in one call, sorted by length as the engine's batches are), so the figures are the runtime's,
not the engine's: the rule in decode/ct2_engine.py ("the note on CPU threads") comes from them.
Sentences/s, the fastest of --passes passes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ctranslate2


def source_pieces(model: Path, src: Path, lines: int) -> list[list[str]]:
    import sentencepiece as spm

    names = ("spm.model", "source.spm.model")
    sp = spm.SentencePieceProcessor(model_file=str(next(model / n for n in names if (model / n).is_file())))
    text = src.read_text(encoding="utf-8").splitlines()[:lines]
    return sorted((sp.encode(line, out_type=str) + ["</s>"] for line in text), key=len)


def rate(translator: "ctranslate2.Translator", pieces: list[list[str]], beam: int, job: int, shortlist: bool, passes: int) -> float:
    best = 0.0
    for _ in range(passes):
        started = time.perf_counter()
        translator.translate_batch(pieces, beam_size=beam, max_batch_size=job, use_vmap=shortlist,
                                   max_decoding_length=256)
        best = max(best, len(pieces) / (time.perf_counter() - started))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, action="append", required=True, help="an export directory")
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--jobs", type=int, nargs="+", default=[32, 64, 128, 256], help="max_batch_size values")
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    import ctranslate2

    layouts = [("one batch on all threads", 1, args.threads)]
    if args.threads > 1:
        layouts.append(("parallel batches", args.threads, 1))
    for model in args.model:
        info = json.loads((model / "xformer_export.json").read_text(encoding="utf-8"))
        shortlist = bool(info.get("shortlist"))
        pieces = source_pieces(model, args.src, args.lines)
        print(f"{model} ({info.get('quantization') or 'float32'}{', shortlist' if shortlist else ''}), "
              f"{len(pieces)} lines of {args.src}, sentences/s:", flush=True)
        for label, inter, intra in layouts:
            translator = ctranslate2.Translator(str(model), inter_threads=inter, intra_threads=intra)
            for beam in args.beams:
                figures = "  ".join(f"jobs of {job}: {rate(translator, pieces, beam, job, shortlist, args.passes):7.1f}"
                                    for job in args.jobs)
                print(f"  {label:<24} (inter {inter}, intra {intra})  beam {beam}  {figures}", flush=True)
            del translator
    return 0


if __name__ == "__main__":
    sys.exit(main())
