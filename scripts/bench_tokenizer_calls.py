"""What a sentencepiece call costs by how it is made: a list call (a pool of threads started each
time) against one call a line, for n lines; and a translation's detokenizing, one hypothesis at a
time, through the list call (as before ONE_CALL_FROM) and through Tokenizer.decode_tgt.

    python scripts/bench_tokenizer_calls.py runs/multi30k/best.pt ../shared/data/multi30k/valid
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable


def best_of(fn: Callable[[], object], repeats: int = 20) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    from xformer_cli.checkpoint_file import load_checkpoint
    from xformer_cli.tokenizer import Tokenizer

    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tok = Tokenizer.from_state(load_checkpoint(sys.argv[1])["tokenizer"])
    prefix = sys.argv[2]
    src = Path(f"{prefix}.en").read_text(encoding="utf-8").splitlines()
    print(f"{len(src)} lines of {prefix}.en; ms a call, the best of 20")
    for n in (1, 8, 32, 64, 128, 256, 512, len(src)):
        lines = src[:n]
        listed = best_of(lambda: tok.src.encode(lines))
        each = best_of(lambda: [tok.src.encode(line) for line in lines])
        print(f"encode {len(lines):5d} lines: one list call {listed * 1e3:7.3f}, a call a line {each * 1e3:7.3f}")
    ids = tok.encode_tgt(Path(f"{prefix}.de").read_text(encoding="utf-8").splitlines())
    listed = best_of(lambda: [tok.tgt.decode([list(x)])[0] for x in ids], 3)
    now = best_of(lambda: [tok.decode_tgt([x])[0] for x in ids], 3)
    print(f"detokenize {len(ids)} hypotheses one at a time: through the list call {listed * 1e3:.1f} ms, "
          f"through decode_tgt {now * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
