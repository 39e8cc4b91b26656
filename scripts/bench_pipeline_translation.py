"""How long the pipeline's translation stages take on this machine: the engine, precision and
threads a pipeline stage picks (pipeline/stages.py's _translate: load_engine with the stage's
settings, every core, OpenMP's default waits), lines/s over the first LINES of a file in chunks
of the stage's chunk_lines, and the minutes that makes for the config's whole monolingual files.

    python scripts/bench_pipeline_translation.py --checkpoint runs/multi30k/best.pt \
        --input ../shared/data/multi30k/mono.en --lines 10000

A checkpoint of the pipeline's model size stands for both directions (the reverse model is the
same shape): backtranslate is greedy over mono.de (141,615 lines), distill beam 4 over the
training sources and mono.en (144,548 lines), as configs/multi30k-pipeline.yaml sets them.
"""

from __future__ import annotations

import argparse
import platform
import re
import time
from pathlib import Path

STAGES = {"backtranslate": (1, 141_615), "distill": (4, 144_548)}  # (beam size, lines) in the CPU config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--input", required=True, type=Path, help="source-language lines to translate")
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--chunk-lines", type=int, default=2000, help="the stages' chunk_lines")
    parser.add_argument("--threads", type=int, default=0, help="0: torch's (every core), as the pipeline")
    args = parser.parse_args()

    import torch

    from xformer_cli.decode.factory import load_engine

    threads = args.threads or torch.get_num_threads()
    lines = args.input.read_text(encoding="utf-8").splitlines()[: args.lines]
    # needs=(): as the pipeline asks (stages.engine_needs: beam search may run on CTranslate2)
    engine = load_engine([args.checkpoint], engine="auto", precision="auto", threads=threads, needs=(), log=print)
    print(f"{_cpu_name()}; {engine.name} {engine.precision}, {threads} threads, "
          f"{len(lines)} lines of {args.input.name} in chunks of {args.chunk_lines}")
    engine.translate(lines[:64], beam_size=1)  # warm-up
    for stage, (beam, total) in STAGES.items():
        started = time.perf_counter()
        for start in range(0, len(lines), args.chunk_lines):
            engine.translate(lines[start:start + args.chunk_lines], beam_size=beam)
        seconds = time.perf_counter() - started
        rate = len(lines) / seconds
        print(f"{stage}: beam {beam}, {rate:.1f} lines/s -> {total:,} lines in {total / rate / 60:.1f} min")


def _cpu_name() -> str:
    """lscpu's "Model name" (from /proc/cpuinfo), for the figure's record."""
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
    except OSError:
        found = None
    return found.group(1).strip() if found else platform.machine()


if __name__ == "__main__":
    main()
