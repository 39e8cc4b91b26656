"""Where a translation's time goes: xformer's engine translating LINES lines of INPUT (beam search
in batches as the pipeline's translation stages make them) under torch's profiler, on a CPU or a GPU.

    python scripts/profile_decode.py --checkpoint runs/multi30k/best.pt --input ../shared/data/multi30k/mono.en
    python scripts/profile_decode.py --checkpoint runs/gc10/bt-teacher/teacher/best.pt --device cuda \\
        --input .d/multi30k/mono.en --lines 8000 --batch-size 4000 --max-tokens 240000

Prints sentences/s, the host's time by aten op (self time: what the search's tensor work costs on the
host, the rest of the wall is Python), and on CUDA the GPU's kernel time against the wall (a GPU busy
well under 100% waits on the host), by kind, with the longest kernels.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profile_train_step import kernel_times, report_kernels  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--input", required=True, type=Path, help="source-language lines")
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=0, help="0: the checkpoint's decode.batch_size")
    parser.add_argument("--max-tokens", type=int, default=0, help="0: the checkpoint's decode.max_tokens")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()

    from xformer_cli.decode.factory import load_engine

    lines = args.input.read_text(encoding="utf-8").splitlines()[-args.lines:]
    engine = load_engine([args.checkpoint], engine="xformer", precision=args.precision, device=args.device, log=print)
    opts = dict(beam_size=args.beam_size, batch_size=args.batch_size or None, max_tokens=args.max_tokens or None)
    engine.translate(lines[:100], **opts)  # warm-up: kernels chosen, caches allocated
    cuda = engine.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        engine.translate(lines, **opts)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    print(f"{len(lines)} lines, beam {args.beam_size}: {wall:.2f} s, {len(lines) / wall:.1f} sentences/s "
          f"(under the profiler)")
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    host_ops = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::")) / 1e6
    print(f"host: aten ops {host_ops:.2f} s of the {wall:.2f} s wall (the rest: Python, tokenizing, waiting)")
    for event in events[:args.top]:
        print(f"  {event.self_cpu_time_total / 1e6:7.3f} s  {event.count:7d} calls  {event.key[:90]}")
    if cuda:
        report_kernels(kernel_times(prof), 1, wall, args.top)


if __name__ == "__main__":
    main()
