"""Models side by side on one machine: the pipeline's evaluate table (BLEU, chrF2, number
accuracy, sentences/s, target tokens/s, size) for any checkpoints, ensembles or exports.

    python scripts/bench_models.py -c configs/multi30k.yaml \
        --model main=runs/multi30k/best.pt --model "two runs=runs/a/best.pt+runs/b/best.pt" \
        --beam 4 --splits valid test --passes 2 [--threads 2] [--json OUT.json]

A model is NAME=PATH, or NAME=PATH+PATH+... for the ensemble of those checkpoints (one vocabulary).
The valid and test sets are the config's (``data.valid``, ``data.test``). The timed passes are
taken in turns over every row, as ``xformer pipeline``'s evaluate takes them, so the speeds of
one run compare; speeds of two runs on a shared machine do not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xformer_cli.config import load_config  # noqa: E402
from xformer_cli.errors import XformerError  # noqa: E402
from xformer_cli.pipeline.evaluation import score_models, split_sets, table  # noqa: E402


def parse_model(text: str) -> tuple[str, list[Path]]:
    name, sep, paths = text.partition("=")
    if not sep or not name or not paths:
        raise SystemExit(f"--model {text!r}: give NAME=PATH or NAME=PATH+PATH")
    found = [Path(p) for p in paths.split("+")]
    for path in found:
        if not path.exists():
            raise SystemExit(f"--model {name}: {path} not found")
    return name, found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", required=True, help="the config whose valid/test sets are scored")
    parser.add_argument("--model", action="append", required=True, type=parse_model)
    parser.add_argument("--beam", type=int, nargs="+", default=[4])
    parser.add_argument("--splits", nargs="+", default=["valid", "test"], choices=["valid", "test"])
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0,
                        help="every row's threads; 0: torch's (every core), as the pipeline's evaluate takes")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    data = load_config(args.config).data
    try:
        sets = split_sets(data, args.splits, args.config, lambda _: None)
    except XformerError as exc:
        raise SystemExit(str(exc)) from None
    import torch

    # Every row on the same threads: decode.factory's rule would give a spinning torch one core
    # fewer than CTranslate2 here (this script leaves OpenMP its default waits, as the pipeline does).
    threads = args.threads or torch.get_num_threads()
    rows = score_models(args.model, sets, args.beam, threads, (data.src_lang, data.tgt_lang),
                        lambda line: print(line, file=sys.stderr, flush=True), args.passes)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([r.to_dict() for r in rows], indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
