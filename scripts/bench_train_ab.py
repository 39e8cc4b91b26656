#!/usr/bin/env python
"""Whole-trainer A/B: ``xformer train`` from two (or more) source trees and OpenNMT-py, interleaved.

    git worktree add --detach /tmp/old 7f39c2d
    python scripts/bench_train_ab.py --tree . /tmp/old --onmt-venv /tmp/onmt-venv --rounds 3

Each round runs, in turn, ``xformer train -c CONFIG`` for --steps steps from every tree (each
tree its own working directory and PYTHONPATH, so its own code) and, with --onmt-venv,
OpenNMT-py's ``onmt_train`` on the same sizes and max_tokens (``bench_train.py``'s peer run).
Rates are target tokens/s, the median of the reports every --report-every steps, the first
dropped. Interleaving is the point: on a shared machine speeds drift by 10-20% between
minutes, so only figures from the same round compare. It answers "did this change slow the
trainer down" (trees) and "how far ahead of the peer are we" (OpenNMT-py) in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_train import onmt_trainer_rate  # noqa: E402

from xformer_cli.config import load_config  # noqa: E402


def trainer_rate(tree: Path, config: str, steps: int, every: int, precision: str,
                 env: Optional[dict[str, str]] = None) -> tuple[float, list[float]]:
    """Steady-state target tokens/s of ``xformer train`` run from ``tree``'s own code, in ``env``
    (this process's environment when None)."""
    with tempfile.TemporaryDirectory() as run_dir:
        sets = [f"run_dir={run_dir}", f"train.max_steps={steps}", f"train.log_every={every}",
                f"train.valid_every={steps * 10}", "data.valid_max_sentences=8", "train.max_minutes=0",
                f"train.precision={precision}", "train.device=cpu"]
        done = subprocess.run([sys.executable, "-m", "xformer_cli", "train", "-c", config, "--overwrite", "--quiet",
                               *[x for kv in sets for x in ("--set", kv)]], cwd=tree,
                              env={**(os.environ if env is None else env), "PYTHONPATH": str(tree)},
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"xformer train in {tree} failed:\n{done.stderr[-3000:]}")
        rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    rates = [row["tokens_per_s"] for row in rows if "tokens_per_s" in row][1:]
    return statistics.median(rates), rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", nargs="+", type=Path, default=[Path(".")], help="source trees (the first is the reference)")
    parser.add_argument("--config", default="configs/multi30k.yaml", help="relative to each tree")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--report-every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--onmt-venv", help="OpenNMT-py 3.5.1 virtualenv (scripts/peers/setup_opennmt.sh)")
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.tree]
    cfg = load_config(trees[0] / args.config)
    rates: dict[str, list[float]] = {str(tree): [] for tree in trees}
    peer: list[float] = []
    for round_no in range(1, args.rounds + 1):
        cells = []
        for tree in trees:
            rate, reports = trainer_rate(tree, args.config, args.steps, args.report_every, args.precision)
            rates[str(tree)].append(rate)
            cells.append(f"{tree.name or tree} {rate:.0f} {[round(r) for r in reports]}")
        if args.onmt_venv:
            rate, reports, _ = onmt_trainer_rate(args.onmt_venv, cfg, args.steps, args.report_every)
            peer.append(rate)
            cells.append(f"OpenNMT-py {rate:.0f} {[round(r) for r in reports]}")
            cells += [f"{tree.name or tree}/OpenNMT-py {rates[str(tree)][-1] / rate:.2f}x" for tree in trees]
        print(f"round {round_no}: " + " | ".join(cells), flush=True)
    for tree in trees:
        line = f"mean {tree}: {statistics.mean(rates[str(tree)]):.0f} target tokens/s ({args.precision})"
        if peer:
            line += f", {statistics.mean(r / p for r, p in zip(rates[str(tree)], peer)):.2f}x OpenNMT-py (mean of rounds)"
        print(line)


if __name__ == "__main__":
    main()
