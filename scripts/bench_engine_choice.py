"""What `--precision auto` should pick on this machine: each engine and precision on one checkpoint,
run as `xformer translate` runs it (decode.factory.load_engine with its own batching and threads),
each in a process of its own, greedy and beam search: sentences/s (the fastest of 3 passes after a
warm-up), BLEU, and the lines identical to PyTorch fp32's. The last line says what auto picks here.

    python scripts/bench_engine_choice.py --checkpoint runs/multi30k/best.pt [--beams 1 4] [--threads 2]
        [--systems xformer:fp32 ctranslate2:fp32 ctranslate2:int8]

By default PyTorch fp32 and bf16 and CTranslate2 float32; bf16 only where the CPU computes it
(elsewhere PyTorch emulates it, far slower: no candidate).

The rule it checks is decode.factory.auto_choice (docs/translation.md, "--precision"); run it on a
CPU kind the rule has no figure for (e.g. AVX512-BF16 without AMX) before changing the rule there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
DATA = Path(os.environ.get("XFORMER_DATA", ROOT.parent / "shared" / "data"))
SYSTEMS = ("xformer:fp32", "xformer:bf16", "ctranslate2:fp32")  # the first: the lines compared to


def default_systems() -> list[str]:
    """SYSTEMS, less PyTorch bf16 where the CPU does not compute bf16."""
    from xformer_cli.device import cpu_flags, torch_cpu_precision

    native_bf16 = torch_cpu_precision(cpu_flags())[0] == "bf16"
    return [system for system in SYSTEMS if native_bf16 or system != "xformer:bf16"]


def worker(args: argparse.Namespace) -> None:
    """One engine, one beam: prints a JSON line {"per_s", "lines"}."""
    from xformer_cli.decode.factory import load_engine

    src = Path(args.src).read_text(encoding="utf-8").splitlines()
    engine = load_engine(args.checkpoint, engine=args.engine, precision=args.precision, threads=args.threads)
    engine.translate(src[:100], beam_size=args.beam)  # warm-up
    best, out = float("inf"), []
    for _ in range(3):
        start = time.perf_counter()
        out = engine.translate(src, beam_size=args.beam)
        best = min(best, time.perf_counter() - start)
    print(json.dumps({"per_s": len(src) / best, "lines": out}))


def measure(args: argparse.Namespace, engine: str, precision: str, beam: int) -> dict:
    command = [sys.executable, __file__, "--worker", "--checkpoint", args.checkpoint, "--src", args.src,
               "--engine", engine, "--precision", precision, "--beam", str(beam), "--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--src", default=str(DATA / "multi30k" / "test2016.en"))
    parser.add_argument("--ref", default=str(DATA / "multi30k" / "test2016.de"))
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--systems", nargs="+", help="engine:precision, the first the lines are compared to "
                        "(default: xformer:fp32, xformer:bf16 where the CPU computes bf16, ctranslate2:fp32)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    parser.add_argument("--beam", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    import sacrebleu

    from bench_train import cpu_name
    from xformer_cli.decode.factory import choose_engine
    from xformer_cli.device import cpu_flags

    refs = Path(args.ref).read_text(encoding="utf-8").splitlines()
    print(f"machine: {cpu_name()}; cpu flags: {' '.join(sorted(f for f in cpu_flags() if 'bf16' in f or 'amx' in f)) or 'no bf16'}; "
          f"{args.threads} threads; {args.checkpoint}")
    systems = [tuple(system.split(":", 1)) for system in args.systems or default_systems()]
    print(f"beam  engine       precision  sent/s   BLEU  identical to {' '.join(systems[0])}")
    for beam in args.beams:
        first_lines: list[str] = []  # the first system's: the others are compared to them
        for engine, precision in systems:
            row = measure(args, engine, precision, beam)
            first_lines = first_lines or row["lines"]
            same = sum(a == b for a, b in zip(row["lines"], first_lines))
            bleu = sacrebleu.corpus_bleu(row["lines"], [refs]).score
            print(f"{beam:4d}  {engine:12s} {precision:9s} {row['per_s']:7.1f}  {bleu:5.2f}  {same}/{len(refs)}")
        needs = ["beam_search"] if beam > 1 else []
        chosen = choose_engine([Path(args.checkpoint)], device="cpu", needs=needs)
        print(f"      translate -b {beam}: auto picks {chosen.engine} {chosen.precision} ({chosen.why})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
