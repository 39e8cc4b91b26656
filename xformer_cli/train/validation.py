"""Validation during training: loss, perplexity and BLEU on the valid set, then the save
that goes with it (best.pt when BLEU improved) and the early-stopping count.

A multilingual run validates each direction on its own valid set (translated into its
target, the loss with its tag): per-direction loss and BLEU under ``directions`` in
metrics.jsonl, and the mean of the directions' BLEU as ``valid_bleu``, the figure best.pt,
early stopping and checkpoint averaging compare (each direction counts the same, whatever
the size of its valid set). A bilingual run logs what it always has.

With several ranks, every rank scores its own share of each direction's set (every
world_size-th sentence) and the figures and translations are gathered: no rank waits while
another decodes the whole set, and validation takes 1/world_size of the time.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from xformer_cli.data.batching import make_batches, shard
from xformer_cli.data.encoded import EncodedCorpus
from xformer_cli.device import autocast
from xformer_cli.evaluate import bleu
from xformer_cli.model.transformer import Transformer
from xformer_cli.tokenizer import PAD_ID
from xformer_cli.train import run_checkpoints
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
            loss, nll = label_smoothed_nll(logits, model.scored_targets(batch.tgt_out), eps, PAD_ID)
            sums += torch.stack([loss.float(), nll.float(), torch.full((), float(batch.n_tokens), device=device)])
    model.train()
    return sums


COLLAPSED_SPREAD = 0.01  # a working encoder's positions differ by about 0.5 a feature (after its LayerNorm)


def encoder_spread(model: Transformer, data: EncodedCorpus, device: torch.device, sentences: int = 16) -> float:
    """How much the encoder's outputs differ between the positions of a sentence: the standard
    deviation across its positions, averaged over features and over the first ``sentences``
    valid sentences of two pieces or more. Near 0 when every position gets the same vector: a
    collapsed encoder (a deep post-norm stack can do that at a short warm-up), whose source the
    decoder cannot read, while the training loss still falls like a language model's."""
    picked = [i for i in range(len(data.src)) if len(data.src[i]) > 1][:sentences]
    if not picked:
        return math.nan
    src = data.batch(picked).src.to(device)
    model.eval()
    with torch.no_grad():
        memory = model.encode(src).float()
    model.train()
    real = (src != PAD_ID).unsqueeze(-1).float()
    count = real.sum(dim=1, keepdim=True)
    mean = (memory * real).sum(dim=1, keepdim=True) / count
    variance = ((memory - mean) ** 2 * real).sum(dim=1, keepdim=True) / (count - 1)
    return variance.sqrt().mean().item()


@dataclass
class DirectionScore:
    loss: float  # label-smoothed, per target token
    ppl: float
    bleu: float


@dataclass
class ValidScores:
    """A validation's figures: over every direction, and each direction's own."""

    loss: float  # label-smoothed, per target token of every direction together
    ppl: float
    bleu: float  # the mean of the directions' BLEU: what best.pt, early stopping and averaging compare
    directions: dict[str, DirectionScore] = field(default_factory=dict)  # "en-de" -> its figures

    def figures(self) -> dict:
        """The metrics.jsonl figures: valid_loss, valid_ppl, valid_bleu as a bilingual run has
        always logged them, and with several directions each one's under ``directions``."""
        out: dict = {"valid_loss": round(self.loss, 4), "valid_ppl": round(self.ppl, 3),
                     "valid_bleu": round(self.bleu, 2)}
        if len(self.directions) > 1:
            out["directions"] = {name: {"valid_loss": round(d.loss, 4), "valid_ppl": round(d.ppl, 3),
                                        "valid_bleu": round(d.bleu, 2)} for name, d in self.directions.items()}
        return out

    def describe(self) -> str:
        """"valid loss 3.120 ppl 22.65 BLEU 21.30", with each direction's BLEU when there are several."""
        line = f"valid loss {self.loss:.3f} ppl {self.ppl:.2f} BLEU {self.bleu:.2f}"
        if len(self.directions) > 1:
            line += " (mean of " + ", ".join(f"{name} {d.bleu:.2f}" for name, d in self.directions.items()) + ")"
        return line


def _ppl(nll: float, tokens: float) -> float:
    return math.exp(min(nll / max(tokens, 1.0), 50))


def translate_shares(run: RunState, beam_size: int, **search: Any) -> list[list[str]]:
    """Every direction's valid set translated into its target, each rank translating its share
    (every world_size-th line) and the shares gathered: the whole of each set on every rank."""
    dist = run.dist
    run.model.eval()
    engine = run.valid_engine()
    mine, cut_before = [], engine.truncated_lines
    for valid in run.valid:  # lines cut to the input length: said below, once, in a line of the run's log
        src = shard(valid.corpus.src, dist.rank, dist.world_size)
        opts = engine.options(beam_size=beam_size, target_lang=valid.direction[1], **search)
        mine.append(engine.translate_lines(src, opts) if src else [])
    cut = engine.truncated_lines - cut_before
    if cut and not run.valid_cut_said:
        run.valid_cut_said = True
        limit = engine.input_limit()
        run.log(f"valid: {cut} line(s) longer than the model's input length ({limit} pieces) cut to it for BLEU")
    run.model.train()
    shares = dist.gather(mine, "validation (the ranks' translations)")
    return [unshard([share[i] for share in shares]) for i in range(len(run.valid))]


def score_valid(run: RunState) -> ValidScores:
    """The model's current weights on every direction's valid set: loss and perplexity over
    all of them and per direction, BLEU per direction and its mean; on every rank (each scores
    its share). BLEU decodes the way `xformer translate --engine xformer --precision auto` does on this device."""
    tc, dist = run.config.train, run.dist
    assert run.valid
    shares = [shard(list(range(len(v.encoded.src))), dist.rank, dist.world_size) for v in run.valid]
    sums = torch.stack([validation_sums(run.model, v.encoded, tc.max_tokens, run.device, tc.label_smoothing,
                                        run.precision, share) for v, share in zip(run.valid, shares)])
    sums = dist.all_reduce_sum(sums).tolist()  # (directions, 3): one collective for them all
    hyps = translate_shares(run, tc.valid_beam_size)
    directions = {v.name: DirectionScore(loss / max(tokens, 1.0), _ppl(nll, tokens), bleu(h, v.corpus.tgt).score)
                  for v, (loss, nll, tokens), h in zip(run.valid, sums, hyps)}
    loss, nll, tokens = (sum(column) for column in zip(*sums))
    return ValidScores(loss / max(tokens, 1.0), _ppl(nll, tokens),
                       statistics.fmean(d.bleu for d in directions.values()), directions)


def validate(run: RunState) -> bool:
    """Validate and save; returns, on every rank, whether patience ran out."""
    tc, c = run.config.train, run.counters
    entry = run.event(precision=run.precision)
    improved = not run.valid  # without a valid set, best.pt is simply the latest
    if run.valid:
        scores = score_valid(run)
        entry.update(scores.figures())
        run.log(f"step {c.step}: {scores.describe()}")
        spread = encoder_spread(run.model, run.valid[0].encoded, run.device)
        if not math.isnan(spread):  # metrics.jsonl stays strict JSON (no NaN)
            entry["encoder_spread"] = round(spread, 4)
        if spread < COLLAPSED_SPREAD:
            run.log(f"step {c.step}: warning: the encoder gives every source position the same vector (it "
                    "collapsed; translations ignore the source): try model.pre_norm: true or a longer "
                    "train.warmup_steps")
        improved = c.best_bleu is None or scores.bleu > c.best_bleu
        if improved:
            c.best_bleu = scores.bleu
            c.bad_validations = 0
        else:
            c.bad_validations += 1
    if run.device.type == "cuda":
        entry["max_memory_gib"] = round(torch.cuda.max_memory_allocated(run.device) / 2**30, 3)
    run_checkpoints.save(run, best=improved)
    run.metrics.record(entry)
    return bool(tc.patience) and c.bad_validations >= tc.patience
