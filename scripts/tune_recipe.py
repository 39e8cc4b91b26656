"""The recipe search of issue 28: step-bounded runs of configs/multi30k.yaml with a named list
of overrides, run two at a time and resumably (a finished run is skipped), and the table of
their valid figures read back from each run's metrics.jsonl.

Every run is bounded by steps (train.max_minutes 0), never by minutes, so its BLEU does not
depend on how busy the machine is; each run uses one thread under ``nice``.

    python scripts/tune_recipe.py list
    python scripts/tune_recipe.py run s2000-noam s2000-cd30 [--jobs 2]
    python scripts/tune_recipe.py table [NAMES...] [--markdown]

Columns: valid BLEU (greedy) at the last step, of the averaged checkpoint (train.average_last),
and the best beam-4 valid BLEU of the length-penalty pass (what best.pt gives), the alpha it
chose, the steps, the peak and the last learning rate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs" / "tune"
CONFIG = "configs/multi30k.yaml"
COMMON = {"train.max_minutes": 0, "train.threads": 1, "data.cache_dir": "runs/tune/cache"}

# Peak of the Noam schedule: lr_scale * d_model^-0.5 * warmup^-0.5. Today's recipe (scale 0.7,
# warm-up 400, d_model 256) peaks at 2.19e-3. A 10% warm-up of 2000 steps (200) with scale 0.5
# peaks at 2.21e-3; scale 0.75 is 1.5x that.
NOAM = {}
CD30 = {"train.cooldown": 0.3}
WF10 = {"train.cooldown": 0.3, "train.warmup_fraction": 0.1, "train.lr_scale": 0.5}
WF10_HI = {"train.cooldown": 0.3, "train.warmup_fraction": 0.1, "train.lr_scale": 0.75}


def _runs(steps: int, prefix: str) -> dict[str, tuple[int, dict]]:
    return {
        f"{prefix}-noam": (steps, NOAM),
        f"{prefix}-cd30": (steps, CD30),
        f"{prefix}-cd50": (steps, {"train.cooldown": 0.5}),
        f"{prefix}-wf10": (steps, WF10),
        f"{prefix}-wf10-hi": (steps, WF10_HI),
        f"{prefix}-wf10-cd50": (steps, {**WF10, "train.cooldown": 0.5}),
        f"{prefix}-wf10-hi-cd50": (steps, {**WF10_HI, "train.cooldown": 0.5}),
        f"{prefix}-cd30-drop2": (steps, {**CD30, "model.dropout": 0.2}),
        f"{prefix}-cd50-drop2": (steps, {"train.cooldown": 0.5, "model.dropout": 0.2}),
        f"{prefix}-cd30-save50": (steps, {**CD30, "train.save_every": 50}),
    }


CONFIGS: dict[str, tuple[int, dict]] = {
    **_runs(2000, "s2000"),
    **_runs(1300, "s1300"),
    # the same tokens as 2000 steps of 3000, in fewer, larger steps (what a fixed wall clock gives)
    "s1333-cd30-tok4500": (1333, {**CD30, "train.max_tokens": 4500}),
}


def finished(name: str) -> bool:
    return any("length_penalty" in row for row in read_metrics(RUNS / name / "metrics.jsonl"))


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def command(name: str) -> list[str]:
    steps, overrides = CONFIGS[name]
    sets = {**COMMON, "run_dir": f"runs/tune/{name}", "train.max_steps": steps, **overrides}
    args = ["nice", "-n", "5", sys.executable, "-m", "xformer_cli", "train", "-c", CONFIG, "--quiet", "--overwrite"]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return args


def run_all(names: list[str], jobs: int) -> None:
    """Runs the unfinished ``names``, ``jobs`` at a time; each logs to runs/tune/logs/NAME.log."""
    todo = [n for n in names if not finished(n)]
    for n in names:
        if n not in todo:
            print(f"{n}: finished, skipped")
    (RUNS / "logs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "XFORMER_DATA": os.environ.get("XFORMER_DATA", str(ROOT.parent / "shared" / "data"))}
    running: dict[str, subprocess.Popen] = {}
    while todo or running:
        while todo and len(running) < jobs:
            name = todo.pop(0)
            log = (RUNS / "logs" / f"{name}.log").open("w", encoding="utf-8")
            print(f"{time.strftime('%H:%M:%S')} start {name}: {' '.join(command(name)[4:])}", flush=True)
            running[name] = subprocess.Popen(command(name), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(10)
        for name, proc in list(running.items()):
            if proc.poll() is not None:
                print(f"{time.strftime('%H:%M:%S')} {name}: exit {proc.returncode}", flush=True)
                del running[name]


def summary(name: str) -> Optional[dict]:
    rows = read_metrics(RUNS / name / "metrics.jsonl")
    if not rows:
        return None
    valid = [r for r in rows if "valid_bleu" in r and "averaged_steps" not in r]
    averaged = [r for r in rows if "averaged_steps" in r]
    lp = [r for r in rows if "length_penalty" in r]
    lrs = [r["lr"] for r in rows if "lr" in r]
    steps = max(r["step"] for r in rows)
    return {
        "name": name, "steps": steps, "planned": CONFIGS.get(name, (None,))[0],
        "last": valid[-1]["valid_bleu"] if valid and valid[-1]["step"] == steps else None,
        "averaged": averaged[-1]["valid_bleu"] if averaged else None,
        "lp": max(lp[-1]["length_penalty_valid_bleu"].values()) if lp else None,
        "alpha": lp[-1]["length_penalty"] if lp else None,
        "peak_lr": max(lrs) if lrs else None, "last_lr": lrs[-1] if lrs else None,
        "curve": " ".join(f"{r['step']}:{r['valid_bleu']}" for r in valid),
    }


def overrides_text(name: str) -> str:
    steps, overrides = CONFIGS.get(name, (0, {}))
    return " ".join(f"{k.split('.')[-1]}={v}" for k, v in overrides.items()) or "(today's recipe)"


def _fmt(value, spec: str = ".2f") -> str:
    return "" if value is None else format(value, spec)


def table(names: list[str], markdown: bool) -> None:
    head = ["run", "overrides", "steps", "valid last", "averaged", "LP pass (beam 4)", "alpha", "peak lr", "last lr",
            "greedy curve"]
    rows = []
    for name in names:
        s = summary(name)
        if s is None:
            continue
        rows.append([name, overrides_text(name), f"{s['steps']}/{s['planned']}", _fmt(s["last"]), _fmt(s["averaged"]),
                     _fmt(s["lp"]), _fmt(s["alpha"], "g"), _fmt(s["peak_lr"], ".2e"), _fmt(s["last_lr"], ".2e"),
                     s["curve"]])
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    for row in [head, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("list")
    run = sub.add_parser("run")
    run.add_argument("names", nargs="+", choices=sorted(CONFIGS))
    run.add_argument("--jobs", type=int, default=2)
    show = sub.add_parser("table")
    show.add_argument("names", nargs="*")
    show.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.what == "list":
        for name in CONFIGS:
            print(f"{name:24} {CONFIGS[name][0]:5} {overrides_text(name)}{'  (finished)' if finished(name) else ''}")
    elif args.what == "run":
        run_all(args.names, args.jobs)
    else:
        table(args.names or [n for n in CONFIGS if (RUNS / n).exists()], args.markdown)


if __name__ == "__main__":
    main()
