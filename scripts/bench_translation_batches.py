"""Beam-4 translation speed by batch size and precision on xformer's engine: what the pipeline's
translation stages get from `batch_size` / `max_tokens` (configs/multi30k-pipeline-gpu.yaml sets them
for a GPU). Each setting translates the last LINES lines of INPUT after a 200-line warm-up; the last
line says how many outputs fp32's smallest and largest batches share.

    python scripts/bench_translation_batches.py runs/multi30k-gpu/best.pt ../shared/data/multi30k/mono.en 20000
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

# (precision, batch_size, max_tokens): the decode config's batches, then larger ones
SETTINGS = (("bf16", 256, 16000), ("fp32", 256, 16000), ("fp32", 1000, 60000), ("fp32", 4000, 240000),
            ("bf16", 4000, 240000))


def main() -> None:
    from xformer_cli.decode.factory import load_engine

    if len(sys.argv) != 4:
        sys.exit(__doc__)
    model, source, count = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    lines = source.read_text(encoding="utf-8").splitlines()[-count:]
    outputs = {}
    for precision, batch, tokens in SETTINGS:
        engine = load_engine([model], engine="xformer", precision=precision, threads=8, log=lambda _: None)
        engine.translate(lines[:200], beam_size=4, batch_size=batch, max_tokens=tokens)  # warm-up
        start = time.perf_counter()
        outputs[(precision, batch)] = engine.translate(lines, beam_size=4, batch_size=batch, max_tokens=tokens)
        took = time.perf_counter() - start
        print(f"beam 4, {precision}, batch {batch}, max_tokens {tokens}: {len(lines) / took:.1f} sentences/s "
              f"({took:.1f} s)", flush=True)
    same = sum(a == b for a, b in zip(outputs[("fp32", 256)], outputs[("fp32", 4000)]))
    print(f"fp32 256 vs 4000 lines identical: {same} of {len(lines)}")


if __name__ == "__main__":
    main()
