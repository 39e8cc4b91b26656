"""How well the length-penalty pass's pick carries over to unseen sentences, on valid alone.

The pass (train.tune_length_penalty) decodes valid at each alpha of its grid and keeps the
alpha with the highest BLEU. Next to each other the grid's scores often lie within a few
hundredths of BLEU, so the highest can be noise. This splits valid at random into two halves
many times over; a rule picks alpha on one half and is scored on the other:

- ``argmax``: the highest BLEU on the picking half (what the pass does);
- ``quadratic``: a parabola fitted to the grid's BLEU, its top's nearest grid alpha (argmax
  when the fit does not bend down);

and prints each rule's mean BLEU on the held-out halves, with the oracle (the held-out half's
own best alpha) above both. Sentence statistics are summed per half, so every figure is
sacreBLEU's corpus BLEU.

    python scripts/bench_length_penalty_pick.py runs/multi30k/best.pt [more checkpoints] --splits 500

The hypotheses are decoded once per checkpoint and alpha (beam 4, the checkpoint's training
precision, as the pass decodes) and kept beside the script's output directory (--cache).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU

from bench_length_ratio import ALPHAS, read  # the pass's grid, as the length-ratio bench decodes it


def decoded(checkpoint: str, source: list[str], cache: Path, threads: int) -> dict[float, list[str]]:
    """alpha -> valid hypotheses of ``checkpoint`` (beam 4), from ``cache`` when there."""
    file = Path(checkpoint).resolve()
    key = hashlib.sha1(f"{file}:{file.stat().st_size}:{file.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    path = cache / f"{file.parent.name}-{key}.json"
    if path.exists():
        return {float(a): h for a, h in json.loads(path.read_text(encoding="utf-8")).items()}
    import torch

    from xformer_cli import Translator

    torch.set_num_threads(threads)
    translator = Translator.from_checkpoint(checkpoint, device="cpu", precision="auto")
    started = time.time()
    hyps = {alpha: translator.translate(source, beam_size=4, length_penalty=alpha) for alpha in ALPHAS}
    print(f"{checkpoint}: decoded valid at {len(ALPHAS)} alphas ({translator.precision}, {time.time() - started:.0f} s)")
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({str(a): h for a, h in hyps.items()}), encoding="utf-8")
    return hyps


def sentence_stats(hyps: list[str], refs: list[str]) -> np.ndarray:
    """(lines, 10) sacreBLEU's sufficient statistics of each line."""
    return np.array(BLEU()._extract_corpus_statistics(hyps, [refs]), dtype=np.int64)


def corpus_bleu(stats: np.ndarray) -> float:
    return BLEU()._compute_score_from_stats(stats.sum(axis=0).tolist()).score


def pick_argmax(scores: list[float]) -> int:
    return int(np.argmax(scores))  # the first of equals, as the pass keeps it


def pick_quadratic(scores: list[float]) -> int:
    a, b, _ = np.polyfit(ALPHAS, scores, 2)
    if a >= 0:
        return pick_argmax(scores)
    top = min(max(-b / (2 * a), ALPHAS[0]), ALPHAS[-1])
    return int(np.argmin([abs(alpha - top) for alpha in ALPHAS]))


RULES = {"argmax": pick_argmax, "quadratic": pick_quadratic}


def held_out(stats: list[np.ndarray], splits: int, seed: int) -> dict[str, list[float]]:
    """rule -> its held-out half's BLEU over ``splits`` random halvings (and the oracle's)."""
    rng = np.random.default_rng(seed)
    lines = stats[0].shape[0]
    out: dict[str, list[float]] = {name: [] for name in [*RULES, "oracle"]}
    for _ in range(splits):
        mask = np.zeros(lines, dtype=bool)
        mask[rng.permutation(lines)[: lines // 2]] = True
        picking = [corpus_bleu(s[mask]) for s in stats]
        scored = [corpus_bleu(s[~mask]) for s in stats]
        for name, rule in RULES.items():
            out[name].append(scored[rule(picking)])
        out["oracle"].append(max(scored))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--splits", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path("runs/length_penalty_pick"))
    args = parser.parse_args()
    data = Path(os.environ.get("XFORMER_DATA", "../shared/data")) / "multi30k"
    source, refs = read(data / "valid.en"), read(data / "valid.de")
    gains = {name: [] for name in RULES}
    for checkpoint in args.checkpoints:
        hyps = decoded(checkpoint, source, args.cache, args.threads)
        stats = [sentence_stats(hyps[alpha], refs) for alpha in ALPHAS]
        whole = [corpus_bleu(s) for s in stats]
        result = held_out(stats, args.splits, seed=0)
        means = {name: statistics.fmean(values) for name, values in result.items()}
        print(f"{checkpoint}: whole valid " + ", ".join(f"{a:g}: {s:.2f}" for a, s in zip(ALPHAS, whole))
              + f"; picks argmax {ALPHAS[pick_argmax(whole)]:g}, quadratic {ALPHAS[pick_quadratic(whole)]:g}")
        print("  held-out halves, mean BLEU: " + ", ".join(f"{n} {m:.3f}" for n, m in means.items()))
        for name in RULES:
            gains[name].append(means[name] - means["argmax"])
    print(f"over {len(args.checkpoints)} checkpoints, mean held-out gain over argmax: "
          + ", ".join(f"{n} {statistics.fmean(g):+.3f} (min {min(g):+.3f}, max {max(g):+.3f})" for n, g in gains.items()))


if __name__ == "__main__":
    main()
