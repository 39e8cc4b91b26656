"""Fine-tuning (train.init_from) against from-scratch training at OPUS-MT's size, same process.

A 58,101-piece joint word-level sentencepiece model (OPUS-MT en-de's vocabulary size) over
Multi30k + wmt-news; a random-weight 6+6, d_model 512 model saved as an xformer checkpoint
stands in for the pretrained model (no weights can be downloaded here). Rounds alternate
scratch and init_from runs of the same steps on Multi30k; tokens/s is read from each run's
metrics.jsonl (the first window, start-up, dropped); start-up is Trainer construction time.

    python scripts/bench_finetune.py --steps 16 --rounds 2 --max-tokens 512
"""

from __future__ import annotations

import argparse
import os
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from xformer_cli.checkpoint_file import build_model, save_checkpoint
from xformer_cli.config import Config, CorpusConfig, DataConfig, TokenizerConfig, load_config
from xformer_cli.data.prepare import prepare_data
from xformer_cli.model.transformer import ModelConfig
from xformer_cli.tokenizer import Tokenizer
from xformer_cli.train.trainer import Trainer

DATA = Path(os.environ.get("XFORMER_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
OPUS = dict(d_model=512, d_ff=2048, n_heads=8, encoder_layers=6, decoder_layers=6)


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def make_pretrained(work: Path) -> tuple[Path, Path]:
    src = lines(DATA / "multi30k/train.en") + lines(DATA / "wmt-news/train.en")
    tgt = lines(DATA / "multi30k/train.de") + lines(DATA / "wmt-news/train.de")
    tokenizer = Tokenizer.train(src, tgt, joint=True, vocab_size=58101, model_type="word")
    spm = work / "joint.model"
    spm.write_bytes(tokenizer.src_model_bytes)
    torch.manual_seed(0)
    config = Config(data=DataConfig(train=[CorpusConfig(prefix=str(DATA / "multi30k/train"))]),
                    tokenizer=TokenizerConfig(model=str(spm), vocab_size=58101, model_type="word"),
                    model=ModelConfig(**OPUS))
    model = build_model(config, tokenizer)
    print(f"vocabulary {tokenizer.src_vocab_size} pieces, {model.count_parameters():,} parameters")
    path = work / "pretrained.pt"
    save_checkpoint({"config": config.to_dict(), "tokenizer": {"src": tokenizer.src_model_bytes, "tgt": None},
                     "model": model.state_dict(), "step": 0}, path)
    return path, spm


def config_path(kind: str, work: Path, pretrained: Path, spm: Path, args) -> Path:
    run_dir = work / f"run-{kind}"
    tree = {"run_dir": str(run_dir), "data": {"train": {"prefix": str(DATA / "multi30k/train")}, "max_len": 128,
                                             "cache_dir": str(work / "cache")},
            "train": {"max_steps": args.steps, "valid_every": 10**6, "max_tokens": args.max_tokens, "log_every": 4,
                      "threads": args.threads, "device": "cpu", "precision": "fp32"}}
    if kind == "finetune":
        tree["train"].update(init_from=str(pretrained), schedule="inverse_sqrt", lr=5e-5, warmup_steps=200)
    else:
        tree["tokenizer"] = {"model": str(spm)}
        tree["model"] = OPUS
    path = work / f"{kind}.yaml"
    path.write_text(json.dumps(tree), encoding="utf-8")
    return path


def run(kind: str, work: Path, pretrained: Path, spm: Path, args) -> tuple[float, float]:
    run_dir = work / f"run-{kind}"
    shutil.rmtree(run_dir, ignore_errors=True)
    path = config_path(kind, work, pretrained, spm, args)
    started = time.time()
    trainer = Trainer(load_config(path), log=lambda _: None, progress=False)
    startup = time.time() - started
    trainer.run()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][1:]
    shutil.rmtree(run_dir, ignore_errors=True)  # ~900 MB of checkpoint per run
    return statistics.mean(rates), startup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ftbench-"))
    try:
        pretrained, spm = make_pretrained(work)
        print(f"pretrained checkpoint {pretrained.stat().st_size / 2**20:.0f} MiB")
        prepare_data(load_config(config_path("scratch", work, pretrained, spm, args)), log=lambda _: None)  # the shared cache
        results: dict[str, list[tuple[float, float]]] = {"scratch": [], "finetune": []}
        for round_ in range(args.rounds):
            for kind in (("scratch", "finetune") if round_ % 2 == 0 else ("finetune", "scratch")):
                rate, startup = run(kind, work, pretrained, spm, args)
                results[kind].append((rate, startup))
                print(f"round {round_ + 1} {kind}: {rate:.0f} target tokens/s, start-up {startup:.1f} s", flush=True)
        for kind, got in results.items():
            print(f"{kind}: mean {statistics.mean(r for r, _ in got):.0f} target tokens/s, "
                  f"start-up {statistics.mean(s for _, s in got):.1f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
