"""Greedy and beam search over a batch of sentences, with incremental decoding.

Both use the model's key/value cache (``Transformer.decode_step``): each step feeds only
the newest token, and the encoder output is projected once per sentence. Sentences that
finish leave the batch, so long stragglers do not drag the finished ones along.
``use_cache=False`` recomputes the whole prefix at every step instead: the reference the
cache is tested and benchmarked against. Greedy search can also sample (top-k, temperature).
A ``wanted`` function (row of ``src`` -> still wanted?) lets a caller whose client went
away take sentences out mid-search: they leave the batch as finished ones do, and come
back with no hypothesis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from xformer_cli.model.transformer import Transformer, reorder_cache
from xformer_cli.tokenizer import EOS_ID

if TYPE_CHECKING:
    from xformer_cli.decode.options import SearchOptions


Wanted = Callable[[int], bool]  # a row of the batch (or line of a call) -> is it still wanted?


@dataclass
class Hypothesis:
    tokens: list[int]  # without bos/eos
    # logprob over GNMT's length penalty of len(tokens) + 1 (eos) at the search's alpha: what beams are
    # ranked by; greedy search and sampling store the same, so scores compare across beam sizes.
    score: float
    logprob: float  # plain sum of token log-probabilities, eos included


def max_lengths(src: Tensor, pad_id: int, a: float, b: int) -> Tensor:
    """Per sentence: a * source length + b target tokens at most (eos not counted)."""
    src_len = (src != pad_id).sum(dim=1)
    return (a * src_len.float() + b).long().clamp(min=1)


def length_penalty(length: "int | Tensor", alpha: float) -> "float | Tensor":
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ^ alpha (Wu et al. 2016); elementwise for a tensor."""
    return ((5.0 + length) / 6.0) ** alpha


def next_token_logprobs(logits: Tensor, pad: int, bos: int, eos: int, at_limit: Tensor,
                        ban_eos: bool = False) -> Tensor:
    """Log-probabilities from next-token logits, with the rules the model does not know:
    pad and bos never follow, eos not while ``ban_eos`` (below the minimum length), and at
    the length limit only eos may. Forbidden tokens get -inf without renormalising the
    rest, so a hypothesis cut off at the limit is scored like any other."""
    lprobs = F.log_softmax(logits, dim=-1)
    cut = at_limit.any()
    eos_lp = lprobs[at_limit, eos] if cut else None
    lprobs[:, pad] = lprobs[:, bos] = float("-inf")
    if ban_eos:
        lprobs[:, eos] = float("-inf")
    if cut:
        lprobs[at_limit] = float("-inf")
        lprobs[at_limit, eos] = eos_lp
    return lprobs


def pick_tokens(lprobs: Tensor, topk: int, temperature: float, generator: Optional[torch.Generator]) -> Tensor:
    """The most likely token per row, or, when sampling (topk != 0), one drawn from the
    ``topk`` most likely (-1: the whole vocabulary) at ``temperature``."""
    if topk == 0:
        return lprobs.argmax(dim=1)
    logits = lprobs / max(temperature, 1e-6)
    if 0 < topk < logits.size(1):
        kth = logits.topk(topk, dim=1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=1), 1, generator=generator).squeeze(1)


@torch.no_grad()
def greedy_search(
    model: Transformer,
    src: Tensor,
    bos: int,
    eos: int,
    *,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    use_cache: bool = True,
    sampling_topk: int = 0,
    temperature: float = 1.0,
    generator: Optional[torch.Generator] = None,
    min_len: int = 1,
    wanted: Optional[Wanted] = None,
    alpha: float = 0.6,
) -> list[Optional[Hypothesis]]:
    """Best (or sampled) next token until eos, which may come after ``min_len`` tokens at
    the earliest. ``logprob`` is the model's summed log-probability; ``score`` is it over the
    GNMT length penalty at ``alpha``, as beam search scores (alpha does not change the output).
    A row that stops being ``wanted`` leaves at the next step with None."""
    pad = model.pad_id
    src_mask = model.padding_mask(src)
    memory = model.encode(src, src_mask)
    limits = max_lengths(src, pad, max_len_a, max_len_b)  # of the rows still decoding
    cache = model.new_cache() if use_cache else None
    active = torch.arange(src.size(0), device=src.device)  # batch rows still decoding
    seqs = torch.full((src.size(0), 1), bos, dtype=torch.long, device=src.device)
    tokens: list[list[int]] = [[] for _ in range(src.size(0))]
    logprob = [0.0] * src.size(0)
    results: list[Hypothesis | None] = [None] * src.size(0)
    step = 0
    while active.numel():
        logits = model.decode_step(seqs[:, -1:] if use_cache else seqs, memory, src_mask, cache)
        lprobs = next_token_logprobs(logits, pad, bos, eos, limits <= step, step < min_len)
        best = pick_tokens(lprobs, sampling_topk, temperature, generator)
        best_lp = lprobs.gather(1, best.unsqueeze(1)).squeeze(1)
        done = (best == eos).tolist()
        for row, (sentence, token, lp) in enumerate(zip(active.tolist(), best.tolist(), best_lp.tolist())):
            logprob[sentence] += lp
            if done[row]:
                penalty = length_penalty(len(tokens[sentence]) + 1, alpha)  # + 1: eos, as beam search counts
                results[sentence] = Hypothesis(tokens[sentence], logprob[sentence] / penalty, logprob[sentence])
            else:
                tokens[sentence].append(token)
        seqs = torch.cat([seqs, best.unsqueeze(1)], dim=1)
        if wanted is not None:
            done = [finished or not wanted(sentence) for finished, sentence in zip(done, active.tolist())]
        keep = ~torch.tensor(done, device=src.device)
        if not keep.all():
            rows = keep.nonzero().squeeze(1)
            active, limits, seqs = active[rows], limits[rows], seqs[rows]
            memory, src_mask = memory[rows], src_mask[rows]
            reorder_cache(cache, rows, sentences=rows)
        step += 1
    return results


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: Tensor,
    bos: int,
    eos: int,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    nbest: int = 1,
    use_cache: bool = True,
    min_len: int = 1,
    wanted: Optional[Wanted] = None,
) -> list[list[Hypothesis]]:
    """Beam search for every sentence of ``src`` at once; returns the ``nbest`` best per
    sentence ([] for one that stopped being ``wanted``: it leaves at the next step).

    At each step the 2K best continuations of the K beams are looked at: those ending in
    eos among the first K become finished hypotheses (scored with the GNMT length
    penalty), the K best others go on. A sentence stops at its maximum length (where eos
    is forced) or once it has ``nbest`` finished hypotheses that no live beam can still
    beat: a live beam's log-probability can only fall, and its length penalty can grow at
    most to that of the maximum length (tensor2tensor's bound, the paper's own code). So
    the n-best list is exactly what searching to the maximum length would give. Stopping
    at the first K finished instead (fairseq's rule) favours short outputs (figures:
    docs/benchmarks/training-recipe.md, "Multi30k en->de, default config, 30 minutes on CPU").

    A hypothesis has at least ``min_len`` tokens before eos (fairseq's default of 1: the
    empty translation, which an exact search otherwise often finds, is never one). The
    encoder output stays one row per sentence: the K beams are K queries against it.
    """
    k = beam_size
    beams = _Beams.start(model, src, bos, k, alpha, max_len_a, max_len_b)
    cache = model.new_cache() if use_cache else None
    finished: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]
    step = 0
    while beams.active.numel():
        sentences = beams.active.tolist()
        at_limit = beams.limits <= step
        logits = model.decode_step(beams.seqs[:, -1:] if use_cache else beams.seqs, beams.memory, beams.src_mask, cache)
        lprobs = next_token_logprobs(logits, model.pad_id, bos, eos, at_limit.repeat_interleave(k), step < min_len)
        top = beams.continuations(lprobs)
        is_eos = top.tokens == eos
        _finish_hypotheses(finished, sentences, beams.seqs, top, is_eos, k, length_penalty(step + 1, alpha))
        reorder_cache(cache, beams.advance(top, is_eos))
        done = _settled(finished, sentences, beams, nbest) | at_limit
        if wanted is not None:
            for row in [row for row, sentence in enumerate(sentences) if not wanted(sentence)]:
                done[row], finished[sentences[row]] = True, []
        if done.any():
            keep = (~done).nonzero().squeeze(1)
            reorder_cache(cache, beams.keep_only(keep), sentences=keep)
        step += 1
    return [sorted(h, key=lambda x: -x.score)[:nbest] for h in finished]


@dataclass
class _Candidates:
    """The 2K best continuations of each sentence's beams, best first: (sentences, 2K) each."""

    scores: Tensor  # log-probability of the beam plus the token
    beams: Tensor  # which of the sentence's K beams it continues (0 .. K-1)
    tokens: Tensor


@dataclass
class _Beams:
    """Beam search's state for the sentences still decoding: row i of each tensor is one
    sentence, except ``seqs``, whose rows i*K .. i*K+K-1 are its K beams."""

    k: int
    active: Tensor  # the sentences' rows in the input batch
    limits: Tensor  # their maximum lengths
    best_possible_penalty: Tensor  # a live beam's score can rise no higher than its log-probability over this
    scores: Tensor  # (sentences, K): each beam's log-probability
    seqs: Tensor  # (sentences * K, tokens so far): each beam's tokens, bos first
    memory: Tensor  # encoder output, one row per sentence: the K beams are K queries against it
    src_mask: Tensor

    @classmethod
    def start(cls, model: Transformer, src: Tensor, bos: int, k: int, alpha: float,
              max_len_a: float, max_len_b: int) -> "_Beams":
        n, device = src.size(0), src.device
        src_mask = model.padding_mask(src)
        memory = model.encode(src, src_mask)
        limits = max_lengths(src, model.pad_id, max_len_a, max_len_b)
        best_possible_penalty = length_penalty(limits.float() + 1.0, alpha)  # + 1: eos
        scores = torch.full((n, k), float("-inf"), device=device)
        scores[:, 0] = 0.0  # all beams start identical: keep only one alive
        seqs = torch.full((n * k, 1), bos, dtype=torch.long, device=device)
        return cls(k, torch.arange(n, device=device), limits, best_possible_penalty, scores, seqs, memory, src_mask)

    def continuations(self, lprobs: Tensor) -> _Candidates:
        """The 2K best continuations per sentence. They are among the 2K best tokens of each
        of its beams: rank those few rather than all K x vocabulary sums."""
        k, m = self.k, self.scores.size(0)
        width = min(2 * k, lprobs.size(1))
        beam_top, beam_tokens = lprobs.topk(width, dim=1)
        candidates = (self.scores.view(-1, 1) + beam_top).view(m, k * width)
        top_scores, top_ids = candidates.topk(min(2 * k, k * width), dim=1)
        return _Candidates(top_scores, top_ids // width, beam_tokens.view(m, k * width).gather(1, top_ids))

    def advance(self, top: _Candidates, is_eos: Tensor) -> Tensor:
        """Carry on with the K best continuations that do not end here; returns the rows of
        ``seqs`` (and of the decoder cache) they continue."""
        m = self.scores.size(0)
        self.scores, pick = top.scores.masked_fill(is_eos, float("-inf")).topk(self.k, dim=1)
        parents = (top.beams.gather(1, pick) + torch.arange(m, device=pick.device).unsqueeze(1) * self.k).view(-1)
        self.seqs = torch.cat([self.seqs[parents], top.tokens.gather(1, pick).view(-1, 1)], dim=1)
        return parents

    def keep_only(self, keep: Tensor) -> Tensor:
        """Keep only the sentences ``keep``; returns the rows of their beams."""
        rows = (keep.unsqueeze(1) * self.k + torch.arange(self.k, device=keep.device)).view(-1)
        self.active, self.limits = self.active[keep], self.limits[keep]
        self.best_possible_penalty = self.best_possible_penalty[keep]
        self.scores, self.seqs = self.scores[keep], self.seqs[rows]
        self.memory, self.src_mask = self.memory[keep], self.src_mask[keep]
        return rows


def _finish_hypotheses(finished: list[list[Hypothesis]], sentences: list[int], seqs: Tensor, top: _Candidates,
                       is_eos: Tensor, k: int, penalty: float) -> None:
    """Candidates ending in eos among a sentence's first K become finished hypotheses,
    scored with the length penalty; each sentence keeps its K best."""
    eos_rows, eos_cols = (is_eos[:, :k] & torch.isfinite(top.scores[:, :k])).nonzero(as_tuple=True)
    if not eos_rows.numel():
        return
    parent = eos_rows * k + top.beams[eos_rows, eos_cols]
    prefixes = seqs[parent, 1:].tolist()
    raw = top.scores[eos_rows, eos_cols].tolist()
    for r, prefix, s in zip(eos_rows.tolist(), prefixes, raw):
        kept = finished[sentences[r]]
        kept.append(Hypothesis(prefix, s / penalty, s))
        if len(kept) > k:  # keep the K best
            kept.remove(min(kept, key=lambda h: h.score))


def _settled(finished: list[list[Hypothesis]], sentences: list[int], beams: _Beams, nbest: int) -> Tensor:
    """Per sentence: whether it has ``nbest`` finished hypotheses that its best live beam
    can no longer beat, even at its maximum length."""
    bounds = (beams.scores[:, 0] / beams.best_possible_penalty).tolist()
    return torch.tensor([
        len(finished[s]) >= nbest and sorted(h.score for h in finished[s])[-nbest] >= bound
        for s, bound in zip(sentences, bounds)
    ], device=beams.scores.device)


def search_batch(model: Transformer, src: Tensor, opts: "SearchOptions", generator: Optional[torch.Generator] = None,
                 wanted: Optional[Wanted] = None) -> list[list[Hypothesis]]:
    """The ``opts.nbest`` best hypotheses per sentence of ``src``: greedy search (or
    sampling) for beam size 1, beam search otherwise; [] for a row no longer ``wanted``."""
    if opts.beam_size == 1:
        found = greedy_search(model, src, model.cfg.bos_id, EOS_ID, max_len_a=opts.max_len_a, max_len_b=opts.max_len_b,
                              use_cache=opts.use_cache, sampling_topk=opts.sampling_topk, temperature=opts.temperature,
                              generator=generator, min_len=opts.min_len, wanted=wanted, alpha=opts.length_penalty)
        return [[hyp] if hyp is not None else [] for hyp in found]
    return beam_search(model, src, model.cfg.bos_id, EOS_ID, beam_size=opts.beam_size, alpha=opts.length_penalty,
                       max_len_a=opts.max_len_a, max_len_b=opts.max_len_b, nbest=opts.nbest,
                       use_cache=opts.use_cache, min_len=opts.min_len, wanted=wanted)
