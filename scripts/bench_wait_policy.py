#!/usr/bin/env python
"""OpenMP's wait policy against speed: xformer's decoding and training under OpenMP's default
waits (spin a while, then sleep), sleeping waits (OMP_WAIT_POLICY=PASSIVE, what translate,
eval-bleu and serve set) and bounded spins (GOMP_SPINCOUNT=N, libgomp's), on a quiet machine
and beside busy-loop processes.

    python scripts/bench_wait_policy.py --checkpoint runs/multi30k/best.pt \\
        --src ../shared/data/multi30k/mono.en --beams 1 4 --threads 2 1 [--burners 1] \\
        [--train-config configs/multi30k.yaml --train-steps 150]

Each figure runs in a fresh process (OpenMP reads the policy once, as it loads). Decoding:
sentences/s of the xformer engine over --lines lines, the fastest of two passes after a
warm-up. Training: ``xformer train``'s median target tokens/s over --train-steps steps
(bench_train_ab.trainer_rate). It answers which policy a command should run under on this
machine, quiet and shared (docs/benchmarks/decoding.md, "Threads").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
POLICY_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def policy_env(policy: str) -> dict[str, str]:
    """``default``, ``passive`` or ``spin=N`` as an environment."""
    env = {k: v for k, v in os.environ.items() if k not in POLICY_KEYS}
    if policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif policy.startswith("spin="):
        env["GOMP_SPINCOUNT"] = policy.partition("=")[2]
    elif policy != "default":
        raise SystemExit(f"--policies: default, passive or spin=N, not {policy!r}")
    return env


WARM_UP = 200  # lines decoded before the timed ones


def child_decode(checkpoint: str, src: str, lines: int, beam: int, threads: int) -> None:
    from xformer_cli.decode.factory import load_engine

    engine = load_engine([Path(checkpoint)], engine="xformer", threads=threads, log=lambda _: None)
    text = Path(src).read_text(encoding="utf-8").splitlines()[: lines + WARM_UP]
    if len(text) <= WARM_UP:
        raise SystemExit(f"{src}: {len(text)} lines, the warm-up takes {WARM_UP}: give a longer file")
    engine.translate(text[:WARM_UP], beam_size=beam)
    best = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        engine.translate(text[WARM_UP:], beam_size=beam)
        best = min(best, time.perf_counter() - started)
    print(f"{(len(text) - WARM_UP) / best:.1f}")


def decode_rate(policy: str, args: argparse.Namespace, beam: int, threads: int) -> float:
    done = subprocess.run([sys.executable, __file__, "--child", args.checkpoint, args.src, str(args.lines), str(beam),
                           str(threads)], env={**policy_env(policy), "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"decoding under {policy} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


@contextmanager
def burners(count: int) -> Iterator[None]:
    """``count`` busy-loop processes: another job on the same cores."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def train_rate(policy: str, config: str, steps: int) -> float:
    from bench_train_ab import trainer_rate

    return trainer_rate(ROOT, config, steps, 25, "auto", env=policy_env(policy))[0]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        checkpoint, src, lines, beam, threads = sys.argv[2:7]
        return child_decode(checkpoint, src, int(lines), int(beam), int(threads))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--src", required=True, help="source lines to translate")
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--threads", type=int, nargs="+", default=[os.cpu_count() or 1])
    parser.add_argument("--policies", nargs="+", default=["default", "passive", "spin=10000"])
    parser.add_argument("--burners", type=int, default=0, help="busy-loop processes beside every figure")
    parser.add_argument("--train-config", help="also time xformer train on this config")
    parser.add_argument("--train-steps", type=int, default=150)
    args = parser.parse_args()
    with open(args.src, encoding="utf-8") as handle:  # what child_decode times: the lines after its warm-up
        timed = max(0, min(args.lines, sum(1 for _ in handle) - WARM_UP))
    print(f"burners: {args.burners}; decoding {timed} lines of {args.src} with {args.checkpoint} (sentences/s)")
    with burners(args.burners):
        for policy in args.policies:
            for threads in args.threads:
                cells = [f"beam {b}: {decode_rate(policy, args, b, threads):.1f}" for b in args.beams]
                print(f"{policy:>12}  {threads} threads  " + "  ".join(cells), flush=True)
            if args.train_config:
                rate = train_rate(policy, args.train_config, args.train_steps)
                print(f"{policy:>12}  train  {rate:.0f} target tokens/s", flush=True)


if __name__ == "__main__":
    main()
