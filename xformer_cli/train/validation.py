"""Validation during training: loss, perplexity and BLEU on the valid set, then the save
that goes with it (best.pt when BLEU improved) and the early-stopping count.

With several ranks, every rank scores its own share of the valid set (every world_size-th
sentence) and the figures and translations are gathered: no rank waits while another
decodes the whole set, and validation takes 1/world_size of the time.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from xformer_cli.data.batching import make_batches, shard
from xformer_cli.data.encoded import EncodedCorpus
from xformer_cli.device import autocast
from xformer_cli.evaluate import bleu
from xformer_cli.model.transformer import Transformer
from xformer_cli.tokenizer import PAD_ID
from xformer_cli.train import checkpointing
from xformer_cli.train.distributed import unshard
from xformer_cli.train.loss import label_smoothed_nll
from xformer_cli.train.state import RunState


def validation_sums(model: Transformer, data: EncodedCorpus, max_tokens: int, device: torch.device, eps: float,
                    precision: str = "fp32", indices: Optional[list[int]] = None) -> torch.Tensor:
    """(label-smoothed loss, NLL, target tokens) summed over ``indices`` of ``data`` (all by
    default), as a float32 vector on ``device``: one value to sum over ranks, read once."""
    picked = list(range(len(data.src))) if indices is None else indices
    lens_src, lens_tgt = data.src_lens[picked], data.tgt_lens[picked]
    sums = torch.zeros(3, device=device)
    model.eval()
    with torch.no_grad():
        for idx in make_batches(lens_src, lens_tgt, max_tokens, shuffle=False):
            batch = data.batch([picked[i] for i in idx]).with_start_token(model.cfg.bos_id).to(device)
            with autocast(device, precision):
                logits = model(batch.src, batch.tgt_in)
            loss, nll = label_smoothed_nll(logits, batch.tgt_out, eps, PAD_ID)
            sums += torch.stack([loss.float(), nll.float(), torch.full((), float(batch.n_tokens), device=device)])
    model.train()
    return sums


def validation_loss(model: Transformer, data: EncodedCorpus, max_tokens: int, device: torch.device, eps: float,
                    precision: str = "fp32") -> tuple[float, float]:
    """(label-smoothed loss, plain NLL) per target token over the whole set."""
    loss, nll, tokens = validation_sums(model, data, max_tokens, device, eps, precision).tolist()
    return loss / tokens, nll / tokens


def score_valid(run: RunState) -> tuple[float, float, float]:
    """(label-smoothed loss, perplexity, BLEU) of the model's current weights on the valid set,
    on every rank (each scores its share); BLEU decodes the way `xformer translate
    --precision auto` does on this device."""
    tc, dist, valid = run.config.train, run.dist, run.valid
    assert valid is not None
    mine = shard(list(range(len(valid.encoded.src))), dist.rank, dist.world_size)
    sums = validation_sums(run.model, valid.encoded, tc.max_tokens, run.device, tc.label_smoothing, run.precision, mine)
    loss, nll, tokens = dist.all_reduce_sum(sums).tolist()
    src = shard(valid.corpus.src, dist.rank, dist.world_size)
    run.model.eval()
    hyps = run.valid_engine().translate(src, beam_size=tc.valid_beam_size) if src else []
    run.model.train()
    hyps = unshard(dist.gather(hyps, "validation (the ranks' translations)"))
    return loss / tokens, math.exp(min(nll / tokens, 50)), bleu(hyps, valid.corpus.tgt).score


def validate(run: RunState) -> bool:
    """Validate and save; returns, on every rank, whether patience ran out."""
    tc, c = run.config.train, run.counters
    entry = run.event(precision=run.precision)
    improved = run.valid is None  # without a valid set, best.pt is simply the latest
    if run.valid is not None:
        loss, ppl, score = score_valid(run)
        entry.update(valid_loss=round(loss, 4), valid_ppl=round(ppl, 3), valid_bleu=round(score, 2))
        run.log(f"step {c.step}: valid loss {loss:.3f} ppl {ppl:.2f} BLEU {score:.2f}")
        improved = c.best_bleu is None or score > c.best_bleu
        if improved:
            c.best_bleu = score
            c.bad_validations = 0
        else:
            c.bad_validations += 1
    if run.device.type == "cuda":
        entry["max_memory_gib"] = round(torch.cuda.max_memory_allocated(run.device) / 2**30, 3)
    checkpointing.save(run, best=improved)
    run.metrics.record(entry)
    return bool(tc.patience) and c.bad_validations >= tc.patience
