"""Issue 28's GPU recipe search in one device call: several variants of
configs/multi30k-gpu.yaml train at once on the one GPU, each bounded by the same minutes; the
variant with the best valid BLEU (after the length-penalty pass, what best.pt gives) is scored
once on test2016 (beam 4). Tuned on valid only: no other variant is decoded on test.

    python scripts/gpu_recipe_search.py --out DIR [--minutes 6.5] [--only NAME ...] [--device cuda]
    python scripts/gpu_recipe_search.py --out /tmp/s --quick --device cpu --minutes 0.3   # a rehearsal

The variants share the GPU, so each gets fewer steps than it would alone (its log says how
many); a figure from here is what the variant reaches *within* its minutes while sharing.
Writes DIR/search.txt (the table), DIR/NAME.metrics.jsonl, DIR/NAME.log and the test output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "configs/multi30k-gpu.yaml"
COMMON = {"train.threads": 4}
# The config's first guess, before this search: fairseq's transformer_iwslt_de_en sizes.
FIRST_GUESS = {"model.d_model": 512, "model.encoder_layers": 6, "model.decoder_layers": 6, "train.lr_scale": 0.6,
               "train.warmup_steps": 1500}
VARIANTS: dict[str, dict] = {
    "w512-l6": FIRST_GUESS,
    "w256-l6": {**FIRST_GUESS, "model.d_model": 256},
    "w256-l3-cpu-lr": {},  # the config as it is now: the CPU recipe's shape and rate, dropout 0.3
    "w512-l6-tok12k": {**FIRST_GUESS, "train.max_tokens": 12000, "train.lr_scale": 0.85},  # twice the batch
    # The second search: the chosen shape's rate and depth, wider (Noam's d^-0.5 lowers the peak
    # with the width by itself), and depth with pre-norm (post-norm 6+6 does not train at this rate).
    "w512-l3": {"model.d_model": 512, "model.d_ff": 2048, "model.n_heads": 8},
    "w384-l3": {"model.d_model": 384, "model.d_ff": 1536, "model.n_heads": 6},
    "w256-l6-prenorm": {"model.encoder_layers": 6, "model.decoder_layers": 6, "model.pre_norm": True},
    # packed batches and CUDA graphs: 1.46x the steps at base size (docs/benchmarks/gpu.md, the third lease)
    "w512-l3-compiled": {"model.d_model": 512, "model.d_ff": 2048, "model.n_heads": 8, "train.batching": "packed",
                         "train.compile": True},
    # The third search: label smoothing 0.2, which the CPU recipe's long runs gained from
    # (docs/benchmarks/training-recipe.md, "label smoothing 0.2 for long runs"); the GPU config's ~11k steps are
    # longer still.
    "w256-l3-ls2": {"train.label_smoothing": 0.2},
    "w384-l3-ls2": {"model.d_model": 384, "model.d_ff": 1536, "model.n_heads": 6, "train.label_smoothing": 0.2},
}
QUICK = {"model.d_model": 64, "model.d_ff": 128, "model.n_heads": 4, "model.encoder_layers": 1, "model.decoder_layers": 1,
         "tokenizer.vocab_size": 1000, "data.valid_max_sentences": 40, "train.max_tokens": 1000,
         "train.tune_length_penalty": "[0.6,1.0]", "train.threads": 1}


def train_command(name: str, runs: Path, minutes: float, quick: bool, device: str) -> list[str]:
    sets = {**COMMON, **VARIANTS[name], "train.max_minutes": minutes, "run_dir": str(runs / name),
            "train.device": device}
    if quick:
        sets.update(QUICK)
    args = [sys.executable, "-m", "xformer_cli", "train", "-c", CONFIG, "--quiet", "--overwrite"]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return args


def summary(runs: Path, name: str) -> dict:
    path = runs / name / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    valid = [r for r in rows if "valid_bleu" in r and "averaged_steps" not in r]
    averaged = [r for r in rows if "averaged_steps" in r]
    lp = [r for r in rows if "length_penalty" in r]
    rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    return {
        "name": name, "steps": max((r["step"] for r in rows), default=0),
        "minutes": max((r.get("minutes", 0) for r in rows), default=0),
        "tok_s": sorted(rates)[len(rates) // 2] if rates else 0,
        "curve": " ".join(f"{r['step']}:{r['valid_bleu']}" for r in valid),
        "best_single": max((r["valid_bleu"] for r in valid), default=None),
        "averaged": averaged[-1]["valid_bleu"] if averaged else None,
        "lp": max(lp[-1]["length_penalty_valid_bleu"].values()) if lp else None,
        "alpha": lp[-1]["length_penalty"] if lp else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=Path, default=None, help="the variants' run directories (default: OUT/runs)")
    parser.add_argument("--minutes", type=float, default=6.5)
    parser.add_argument("--only", nargs="*", choices=list(VARIANTS), default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to rehearse the script on a CPU")
    args = parser.parse_args()
    args.out = args.out.resolve()  # the trainers and the scoring run in the repository's root
    args.out.mkdir(parents=True, exist_ok=True)
    args.runs = (args.runs or args.out / "runs").resolve()
    names = args.only or list(VARIANTS)
    started = time.time()
    procs = {}
    for name in names:
        log = (args.out / f"{name}.log").open("w")
        procs[name] = subprocess.Popen(train_command(name, args.runs, args.minutes, args.quick, args.device), cwd=ROOT,
                                       stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    for name, proc in procs.items():
        print(f"{name}: exit {proc.wait()} after {time.time() - started:.0f} s", flush=True)
    rows = [summary(args.runs, n) for n in names]
    lines = [f"{'variant':16} {'steps':>6} {'min':>5} {'tok/s':>7} {'best':>6} {'avg':>6} {'LP':>6} alpha  valid BLEU curve"]
    for r in rows:
        lines.append(f"{r['name']:16} {r['steps']:6} {r['minutes']:5.1f} {r['tok_s']:7.0f} {r['best_single'] or 0:6.2f} "
                     f"{r['averaged'] or 0:6.2f} {r['lp'] or 0:6.2f} {r['alpha'] or 0:<5g}  {r['curve']}")
        src = args.runs / r["name"] / "metrics.jsonl"
        if src.exists():
            (args.out / f"{r['name']}.metrics.jsonl").write_text(src.read_text())
    done = [r for r in rows if r["lp"] is not None]
    if done:
        best = max(done, key=lambda r: r["lp"])
        lines.append(f"chosen on valid: {best['name']} (valid {best['lp']:.2f}, alpha {best['alpha']:g})")
        # the checkpoint alone: eval-bleu scores the test set its training config names (test2016)
        score = subprocess.run([sys.executable, "-m", "xformer_cli", "eval-bleu", "-m",
                                str(args.runs / best["name"] / "best.pt"), "--beam-size", "4", "--device", args.device,
                                "--output", str(args.out / "test2016.hyp.de")],
                               cwd=ROOT, capture_output=True, text=True)
        lines += [line for line in score.stdout.splitlines() if line.startswith(("BLEU", "chrF", "number"))]
        lines.append(score.stderr.strip().splitlines()[-1] if score.returncode and score.stderr.strip() else "")
    lines.append(f"wall {time.time() - started:.0f} s")
    (args.out / "search.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
