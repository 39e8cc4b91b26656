"""Validation during training: loss, perplexity and BLEU on the valid set, then the save
that goes with it (best.pt when BLEU improved) and the early-stopping count."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from xformer_cli.data.batching import make_batches
from xformer_cli.data.encoded import EncodedCorpus
from xformer_cli.device import autocast
from xformer_cli.evaluate import bleu
from xformer_cli.model.transformer import Transformer
from xformer_cli.tokenizer import PAD_ID
from xformer_cli.train import checkpointing
from xformer_cli.train.loss import label_smoothed_nll

if TYPE_CHECKING:
    from xformer_cli.train.trainer import Trainer


def validation_loss(model: Transformer, data: EncodedCorpus, max_tokens: int, device: torch.device, eps: float,
                    precision: str = "fp32") -> tuple[float, float]:
    """(label-smoothed loss, plain NLL) per target token over the whole set."""
    model.eval()
    total = nll_total = 0.0
    tokens = 0
    with torch.no_grad():
        for idx in make_batches(data.src_lens, data.tgt_lens, max_tokens, shuffle=False):
            batch = data.batch(idx).with_start_token(model.cfg.bos_id).to(device)
            with autocast(device, precision):
                logits = model(batch.src, batch.tgt_in)
            loss, nll = label_smoothed_nll(logits, batch.tgt_out, eps, PAD_ID)
            total += float(loss)
            nll_total += float(nll)
            tokens += batch.n_tokens
    model.train()
    return total / tokens, nll_total / tokens


def score_valid(trainer: "Trainer") -> tuple[float, float, float]:
    """(label-smoothed loss, perplexity, BLEU) of the model's current weights on the valid set;
    BLEU decodes the way `xformer translate --precision auto` does on this device."""
    tc = trainer.config.train
    loss, nll = validation_loss(trainer.model, trainer.valid_data, tc.max_tokens, trainer.device, tc.label_smoothing,
                                trainer.precision)
    trainer.model.eval()
    hyps = trainer.valid_translator().translate(trainer.valid_corpus.src, beam_size=tc.valid_beam_size)
    trainer.model.train()
    return loss, math.exp(min(nll, 50)), bleu(hyps, trainer.valid_corpus.tgt).score


def validate(trainer: "Trainer") -> bool:
    """Validate and save (rank 0); returns, on every rank, whether patience ran out."""
    tc = trainer.config.train
    if not trainer.dist.is_main:
        checkpointing.save(trainer)  # only hands this rank's random state to rank 0
        return trainer.dist.any(False, trainer.device)
    entry: dict = {"step": trainer.step, "epoch": trainer.epoch, "minutes": round(trainer.minutes(), 3),
                   "precision": trainer.precision}
    improved = trainer.valid_data is None  # without a valid set, best.pt is simply the latest
    if trainer.valid_data is not None:
        loss, ppl, score = score_valid(trainer)
        entry.update(valid_loss=round(loss, 4), valid_ppl=round(ppl, 3), valid_bleu=round(score, 2))
        trainer.log(f"step {trainer.step}: valid loss {loss:.3f} ppl {ppl:.2f} BLEU {score:.2f}")
        improved = trainer.best_bleu is None or score > trainer.best_bleu
        if improved:
            trainer.best_bleu = score
            trainer.bad_validations = 0
        else:
            trainer.bad_validations += 1
    if trainer.device.type == "cuda":
        entry["max_memory_gib"] = round(torch.cuda.max_memory_allocated(trainer.device) / 2**30, 3)
    checkpointing.save(trainer, best=improved)
    trainer.metrics.record(entry)
    return trainer.dist.any(bool(tc.patience) and trainer.bad_validations >= tc.patience, trainer.device)
