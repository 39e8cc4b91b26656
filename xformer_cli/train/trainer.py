"""The training loop: data -> tokenizer -> batches -> model, loss, Adam + Noam -> checkpoints.

``train(config)`` is the whole of ``xformer train``. The run directory ends up holding
``config.yaml`` (the resolved config), ``tokenizer/``, ``metrics.jsonl``, ``last.pt``
and ``best.pt`` (highest validation BLEU).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import yaml
from tqdm import tqdm

from xformer_cli.config import Config
from xformer_cli.data.batching import Batch, collate, make_batches
from xformer_cli.data.prepare import prepare_data
from xformer_cli.data.sources import ParallelCorpus
from xformer_cli.decode.translator import Translator
from xformer_cli.device import autocast, configure_threads, pick_device
from xformer_cli.errors import XformerError
from xformer_cli.evaluate import bleu
from xformer_cli.model.build import build_model
from xformer_cli.model.transformer import Transformer
from xformer_cli.tokenizer import PAD_ID, Tokenizer
from xformer_cli.train.checkpoint import save_checkpoint
from xformer_cli.train.loss import label_smoothed_nll
from xformer_cli.train.schedule import NoamSchedule


@dataclass
class EncodedCorpus:
    src: list[list[int]]
    tgt: list[list[int]]
    raw_tgt: list[str]  # detokenized references, for BLEU

    @property
    def src_lens(self) -> np.ndarray:
        return np.fromiter((len(s) for s in self.src), dtype=np.int64, count=len(self.src))

    @property
    def tgt_lens(self) -> np.ndarray:
        return np.fromiter((len(t) for t in self.tgt), dtype=np.int64, count=len(self.tgt))

    def batch(self, indices) -> Batch:
        return collate([self.src[i] for i in indices], [self.tgt[i] for i in indices])


@dataclass
class TrainResult:
    steps: int
    epochs: int
    minutes: float
    best_bleu: Optional[float]
    run_dir: Path


def check_run_dir(config: Config, overwrite: bool) -> None:
    run_dir = Path(config.run_dir)
    if ((run_dir / "last.pt").exists() or (run_dir / "best.pt").exists()) and not overwrite:
        raise XformerError(f"{run_dir} already holds checkpoints; choose another run_dir or pass --overwrite")


def prepare_run_dir(config: Config, overwrite: bool) -> Path:
    run_dir = Path(config.run_dir)
    check_run_dir(config, overwrite)
    if overwrite:
        for name in ("last.pt", "best.pt", "metrics.jsonl"):
            (run_dir / name).unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")
    return run_dir


def encode_corpus(corpus: ParallelCorpus, tokenizer: Tokenizer, max_len: Optional[int] = None) -> EncodedCorpus:
    src, tgt = tokenizer.encode_src(corpus.src), tokenizer.encode_tgt(corpus.tgt)
    keep = [i for i in range(len(src)) if src[i] and tgt[i]]
    if max_len is not None:
        over = [i for i in keep if len(src[i]) > max_len or len(tgt[i]) > max_len]
        if over:
            corpus.dropped[f"longer than {max_len} pieces"] += len(over)
            drop = set(over)
            keep = [i for i in keep if i not in drop]
    return EncodedCorpus([src[i] for i in keep], [tgt[i] for i in keep], [corpus.tgt[i] for i in keep])


def validation_loss(model: Transformer, data: EncodedCorpus, max_tokens: int, device: torch.device, eps: float) -> tuple[float, float]:
    """(label-smoothed loss, plain NLL) per target token over the whole set."""
    model.eval()
    total = nll_total = 0.0
    tokens = 0
    with torch.no_grad():
        for idx in make_batches(data.src_lens, data.tgt_lens, max_tokens, shuffle=False):
            batch = data.batch(idx).to(device)
            with autocast(device):
                logits = model(batch.src, batch.tgt_in)
            loss, nll = label_smoothed_nll(logits, batch.tgt_out, eps, PAD_ID)
            total += float(loss)
            nll_total += float(nll)
            tokens += batch.n_tokens
    model.train()
    return total / tokens, nll_total / tokens


def train(config: Config, overwrite: bool = False, log: Callable[[str], None] = print, progress: bool = True) -> TrainResult:
    tc = config.train
    configure_threads(tc.threads)
    torch.manual_seed(tc.seed)
    device = pick_device(tc.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # Every input is read and checked before the run directory is touched:
    # bad data must not cost the checkpoints of an earlier run.
    check_run_dir(config, overwrite)
    prepared = prepare_data(config, log, before_write=lambda: prepare_run_dir(config, overwrite))
    run_dir = Path(config.run_dir)
    tokenizer, train_data, valid_corpus = prepared.tokenizer, prepared.train, prepared.valid
    valid_data = encode_corpus(valid_corpus, tokenizer) if valid_corpus is not None else None

    model = build_model(config, tokenizer).to(device)
    log(f"model: {model.count_parameters():,} parameters on {device}")
    optimizer = torch.optim.Adam(
        model.parameters(), lr=0.0, betas=(tc.adam_beta1, tc.adam_beta2), eps=tc.adam_eps,
        weight_decay=tc.weight_decay, **({"fused": True} if device.type == "cuda" else {}),
    )
    schedule = NoamSchedule(optimizer, config.model.d_model, tc.warmup_steps, tc.lr_scale)
    translator = Translator(model, tokenizer, config.decode, device)
    tokenizer_state = {"src": tokenizer.src_model_bytes, "tgt": tokenizer.tgt_model_bytes}

    metrics_path = run_dir / "metrics.jsonl"
    best_bleu: Optional[float] = None
    step = epoch = 0
    batches_done = 0  # within the epoch: (seed, epoch, batches_done) is the exact data position
    started = time.time()
    deadline = started + tc.max_minutes * 60 if tc.max_minutes else math.inf

    def checkpoint_state() -> dict:
        return {
            "config": config.to_dict(), "tokenizer": tokenizer_state, "model": model.state_dict(),
            "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
            "step": step, "epoch": epoch, "batches_done": batches_done, "seed": tc.seed, "best_bleu": best_bleu,
        }

    def record(entry: dict) -> None:
        with metrics_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")

    last_validated = -1

    def validate() -> None:
        nonlocal best_bleu, last_validated
        last_validated = step
        entry: dict = {"step": step, "epoch": epoch, "minutes": round((time.time() - started) / 60, 3)}
        if valid_data is not None:
            loss, nll = validation_loss(model, valid_data, tc.max_tokens, device, tc.label_smoothing)
            model.eval()
            hyps = translator.translate(valid_corpus.src, beam_size=tc.valid_beam_size)
            model.train()
            score = bleu(hyps, valid_corpus.tgt).score
            entry.update(valid_loss=round(loss, 4), valid_ppl=round(math.exp(min(nll, 50)), 3), valid_bleu=round(score, 2))
            log(f"step {step}: valid loss {loss:.3f} ppl {math.exp(min(nll, 50)):.2f} BLEU {score:.2f}")
            if best_bleu is None or score > best_bleu:
                best_bleu = score
                save_checkpoint(checkpoint_state(), run_dir / "best.pt")
        save_checkpoint(checkpoint_state(), run_dir / "last.pt")
        record(entry)

    model.train()
    window_loss = window_tokens = 0.0
    window_start = time.time()
    bar = tqdm(total=tc.max_steps, desc="train", unit="step", disable=not progress, dynamic_ncols=True)
    stop = False
    while not stop:
        epoch += 1
        batches = make_batches(train_data.src_lens, train_data.tgt_lens, tc.max_tokens, tc.seed, epoch)
        for first in range(0, len(batches), tc.update_freq):
            group = [train_data.batch(idx).to(device) for idx in batches[first : first + tc.update_freq]]
            batches_done = first + len(group)
            n_tokens = sum(b.n_tokens for b in group)
            lr = schedule.step()
            for batch in group:
                with autocast(device):
                    logits = model(batch.src, batch.tgt_in)
                loss, _ = label_smoothed_nll(logits, batch.tgt_out, tc.label_smoothing, PAD_ID)
                (loss / n_tokens).backward()
                window_loss += float(loss.detach())
            if tc.clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.clip_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            window_tokens += n_tokens
            bar.update(1)
            if step % tc.log_every == 0:
                rate = window_tokens / max(time.time() - window_start, 1e-9)
                avg = window_loss / max(window_tokens, 1)
                extra = {"left": f"{(deadline - time.time()) / 60:.1f}min"} if deadline != math.inf else {}
                bar.set_postfix(loss=f"{avg:.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:.0f}", epoch=epoch, **extra)
                record({"step": step, "epoch": epoch, "train_loss": round(avg, 4), "lr": lr, "tokens_per_s": round(rate, 1),
                        "minutes": round((time.time() - started) / 60, 3)})
                window_loss = window_tokens = 0.0
                window_start = time.time()
            out_of_time = time.time() >= deadline
            if step >= tc.max_steps or out_of_time:
                stop = True
                break
            if step % tc.valid_every == 0:
                validate()
        if tc.max_epochs and epoch >= tc.max_epochs:
            stop = True
    bar.close()
    if last_validated != step:
        validate()
    minutes = (time.time() - started) / 60
    log(f"done: {step} steps, {epoch} epochs, {minutes:.1f} min; best valid BLEU "
        f"{best_bleu if best_bleu is None else round(best_bleu, 2)}; checkpoints in {run_dir}")
    return TrainResult(step, epoch, minutes, best_bleu, run_dir)
