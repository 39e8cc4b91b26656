"""Does NLLB's forced target BOS cut off-target output? (issue 27; figures in BENCHMARKS.md)

Two models of the same config trained on en<->de and en<->fr (step-bounded): one as xformer
trains today (the target tag leads the source, the decoder starts from bos), one that also
starts the decoder from the target tag (M2M-100 / NLLB's forced BOS). For the experiment
the second is made by patching ``Batch.with_start_token`` (a multilingual source's first
piece is its tag: the decoder's first input becomes that piece), not by a product option.

Both are decoded by the package's engine (greedy: beam size 1, with its length limits, minimum
length and banned tokens), the decoder started from bos or, for the second, from the tag (the
model's start token, ``model.bos_id``, set to it), on test2016 for two trained directions and
the zero-shot de->fr and fr->de, and scored (sacreBLEU, the off-target rate of xformer
eval-bleu among the model's languages).

    python scripts/bench_forced_bos.py --data ../shared/data/multi30k --work runs/bos --steps 1000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path
from typing import Iterator

import torch

from xformer_cli.config import load_config
from xformer_cli.data import batching
from xformer_cli.decode.direction_scores import off_target
from xformer_cli.decode.translator import Translator
from xformer_cli.evaluate import bleu
from xformer_cli.train.trainer import train

DIRECTIONS = [("en", "de"), ("de", "en"), ("de", "fr"), ("fr", "de")]  # two trained, two zero-shot


def config(data: Path, run_dir: Path, steps: int, threads: int):
    sets = {"run_dir": run_dir, "data.pairs": "[en-de, de-en, en-fr, fr-en]", "data.train.prefix": data / "train",
            "data.valid.prefix": data / "valid", "data.test.prefix": data / "test2016",
            "data.train.fallback_dataset": "null", "data.valid.fallback_dataset": "null",
            "data.test.fallback_dataset": "null", "data.valid_max_sentences": 100, "tokenizer.vocab_size": 5000,
            "model.d_model": 128, "model.d_ff": 512, "model.encoder_layers": 2, "model.decoder_layers": 2,
            "train.max_steps": steps, "train.max_minutes": 0, "train.max_tokens": 2000, "train.warmup_steps": 400,
            "train.valid_every": steps, "train.save_every": 0, "train.keep_checkpoints": 0, "train.average_last": 0,
            "train.tune_length_penalty": "[]", "train.precision": "fp32", "train.device": "cpu",
            "train.threads": threads, "train.log_every": 50}
    return load_config("configs/multi30k.yaml", [f"{k}={v}" for k, v in sets.items()])


def forced_start(self, bos_id: int):
    """The decoder starts from the source's first piece: the target tag."""
    self.tgt_in[:, 0] = self.src[:, 0]
    return self


@contextlib.contextmanager
def decoder_start(model: torch.nn.Module, token: int) -> Iterator[None]:
    """Inside the block the model's decoder starts from ``token``: the engine feeds
    ``model.bos_id`` first (and never lets it follow), so a forced start is that setting."""
    before, model.cfg.bos_id = model.cfg.bos_id, token
    try:
        yield
    finally:
        model.cfg.bos_id = before


def translate(translator: Translator, lines: list[str], target: str, forced: bool) -> list[str]:
    """Greedy translations by the engine, the decoder started from bos, or (``forced``) from the
    target's tag, as the model was trained."""
    model = translator.model
    start = translator.tokenizer.tag_id(translator.languages.tag(target)) if forced else model.cfg.bos_id
    with decoder_start(model, start):
        return translator.translate(lines, beam_size=1, target_lang=target)


def evaluate(checkpoint: Path, data: Path, forced: bool, lines: int) -> list[dict]:
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    languages = translator.languages
    rows = []
    for source, target in DIRECTIONS:
        src = (data / f"test2016.{source}").read_text(encoding="utf-8").splitlines()[:lines]
        ref = (data / f"test2016.{target}").read_text(encoding="utf-8").splitlines()[:lines]
        hyps = translate(translator, src, target, forced)
        wrong, scored = off_target(hyps, target, ["en", "de", "fr"])
        rows.append({"direction": f"{source}->{target}", "trained": languages.trained(source, target),
                     "bleu": round(bleu(hyps, ref).score, 2), "off_target": wrong, "of": scored})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="folder with train/valid/test2016 .en .de .fr")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lines", type=int, default=1000)
    args = parser.parse_args()
    results = {}
    original = batching.Batch.with_start_token
    for name, forced in (("source tag", False), ("source tag + forced BOS", True)):
        batching.Batch.with_start_token = forced_start if forced else original
        started = time.time()
        run = args.work / ("forced" if forced else "tag")
        train(config(args.data, run, args.steps, args.threads), overwrite=True, log=lambda _: None, progress=False)
        trained_s = time.time() - started
        results[name] = {"train_s": round(trained_s), "directions": evaluate(run / "best.pt", args.data, forced, args.lines)}
        print(json.dumps({name: results[name]}), flush=True)
    batching.Batch.with_start_token = original
    (args.work / "forced_bos.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
