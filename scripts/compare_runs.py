"""Do two training runs agree? Their last.pt weights and their logged per-step losses.

    python scripts/compare_runs.py RUN_A RUN_B [--atol 2e-5 --rtol 1e-4 --loss-rtol 1e-4]

What scripts/gpu_check.sh uses to compare two ranks sharing one GPU (gloo, CUDA tensors)
with one process accumulating the same two batches (the CPU test in tests/test_training.py
does the same with two CPU processes). Prints the largest differences; exits 1 when they
are outside the tolerances or the runs took different steps.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xformer_cli.checkpoint_file import load_checkpoint  # noqa: E402


def step_losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train_loss"] for r in rows if "train_loss" in r}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--atol", type=float, default=2e-5)
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--loss-rtol", type=float, default=1e-4)
    args = parser.parse_args()
    a, b = load_checkpoint(args.a / "last.pt"), load_checkpoint(args.b / "last.pt")
    ok = a["step"] == b["step"]
    print(f"steps: {a['step']} vs {b['step']}")
    worst, worst_key = 0.0, ""
    for key, value in a["model"].items():
        other = b["model"][key]
        excess = ((value.float() - other.float()).abs() - args.rtol * other.float().abs()).max().item()
        if excess > worst:
            worst, worst_key = excess, key
        ok &= bool(torch.allclose(other.float(), value.float(), atol=args.atol, rtol=args.rtol))
    print(f"weights: largest |a - b| - rtol*|b| = {worst:.3g} ({worst_key or 'none'}); atol {args.atol:g}")
    la, lb = step_losses(args.a), step_losses(args.b)
    common = sorted(set(la) & set(lb))
    rel = max((abs(la[s] - lb[s]) / max(abs(la[s]), 1e-12) for s in common), default=0.0)
    ok &= bool(common) and rel <= args.loss_rtol
    print(f"losses: {len(common)} common steps, largest relative difference {rel:.3g} (rtol {args.loss_rtol:g})")
    print("agree" if ok else "DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
