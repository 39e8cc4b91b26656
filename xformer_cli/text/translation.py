"""Texts -> engine-sized units -> one engine call -> texts, with whitespace, tags and terms
carried over. Every unit of every text of a call goes to the engine together, so a paragraph
costs what its sentences one per line cost."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Iterator, Optional, Sequence

from xformer_cli.decode.engine import Engine
from xformer_cli.decode.inputs import DEFAULT_MAX_INPUT_LEN, checked_lines, chunked
from xformer_cli.decode.options import SearchOptions
from xformer_cli.decode.search import Hypothesis, Wanted
from xformer_cli.errors import XformerError
from xformer_cli.text.align import Aligner, AttentionAligner, relative_aligner
from xformer_cli.text.glossary import Glossary, Masked, mask_terms, missing_placeholders, restore_terms
from xformer_cli.text.long import cut_sentence
from xformer_cli.text.keep_numbers import check_numbers, numbers_language
from xformer_cli.text.offsets import normalize_with_map
from xformer_cli.text.segments import Rendered, Segment
from xformer_cli.text.sentences import Span, split_spans

TEXT_FORMATS = ("text", "html")  # what translate --format reads
ALIGNERS = ("auto", "attention", "relative")
MAX_UNITS_PER_TEXT = 256  # past it the rest of a text is one unit, cut by the engine with its warning


@dataclass
class TextOptions:
    """How texts are read and rebuilt around the engine: ``source_lang`` picks the sentence
    splitter's rules; the others say what is kept from the source (numbers, glossary terms, HTML
    tags, placeholders) and what is written (``alternatives``: the n-best)."""

    source_lang: str = "en"
    split_sentences: bool = True
    format: str = "text"  # text | html
    glossary: Optional[Glossary] = None  # also turns on do-not-translate for URLs, e-mails, numbers
    keep_numbers: bool = False  # every source number's value kept (text/keep_numbers.py), without a glossary too
    alternatives: int = 0  # extra translations per text, from the n-best lists
    aligner: str = "auto"  # auto (attention where the engine has it) | attention | relative
    placeholders: bool = False  # glossary terms: masked (True) or left in and their aligned words replaced
    target_lang: Optional[str] = None  # a multilingual model's target language (else the search options'); also
    # which number words count for keep_numbers (None = the model's only target, else digits only)

    def __post_init__(self) -> None:
        if self.format not in TEXT_FORMATS:
            raise XformerError(f"format must be one of {', '.join(TEXT_FORMATS)}, not {self.format!r}")
        if self.aligner not in ALIGNERS:
            raise XformerError(f"aligner must be one of {', '.join(ALIGNERS)}, not {self.aligner!r}")
        if not isinstance(self.alternatives, int) or self.alternatives < 0:
            raise XformerError(f"alternatives must be a whole number 0 or more, not {self.alternatives!r}")


@dataclass
class TextResult:
    text: str
    alternatives: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # best, then each alternative: sum over units
    # (alternatives and scores stop early where the search found fewer translations than asked for)
    sentences: list[tuple[int, int, int, int]] = field(default_factory=list)  # plain text: each source
    # sentence's span -> its translation's span in ``text`` (the best translation)


@dataclass
class _Sentence:
    start: int  # in the segment's text
    end: int
    norm_map: list[int]  # sentence offset -> offset in the normalized sentence
    parts: list[tuple[int, int, int]]  # (unit index, start, end) in the normalized sentence


def pick_aligner(engine: Engine, choice: str = "auto", target_lang: Optional[str] = None) -> Aligner:
    """Attention alignment where the engine gives it (the xformer engine on one model), else
    relative positions; ``target_lang``: the tag a multilingual model read."""
    model = getattr(engine, "model", None)
    can_attend = hasattr(engine, "alignment_weights") and hasattr(model, "cross_attention")
    if choice == "relative" or not can_attend:
        return relative_aligner
    tokenizer = engine.tokenizer
    weights = engine.alignment_weights if target_lang is None else (
        lambda line, tokens: engine.alignment_weights(line, tokens, target_lang=target_lang))
    return AttentionAligner(weights, tokenizer.src_pieces, tokenizer.tgt_pieces)


class Planner:
    """Cuts segments into units (sentences, parts of long ones, terms masked)."""

    def __init__(self, engine: Engine, opts: TextOptions, max_input_len: int):
        self.engine = engine
        self.opts = opts
        self.limit = max_input_len or DEFAULT_MAX_INPUT_LEN
        self.units: list[Masked] = []
        languages = getattr(engine, "languages", None)
        # the model's code for the target (fra, >>fra<< -> fr): the number words are looked up by it
        asked = languages.target(opts.target_lang) if languages is not None and opts.target_lang else opts.target_lang
        self.numbers_lang = numbers_language(asked, languages)

    def count(self, text: str) -> int:
        return len(self.engine.tokenizer.encode_src([text])[0])

    def plan(self, segment: Segment) -> list["Span | _Sentence"]:
        """The segment as gaps (kept as they are) and sentences (made of units)."""
        plan: list[Span | _Sentence] = []
        first_unit = len(self.units)
        spans = split_spans(segment.text, self.opts.source_lang, self.opts.split_sentences)
        for index, span in enumerate(spans):
            if span.is_gap:
                plan.append(span)
            elif len(self.units) - first_unit >= MAX_UNITS_PER_TEXT:  # the garbage bound: one unit for the rest
                last = max(s.end for s in spans if not s.is_gap)
                plan.append(self._sentence(segment.text, span.start, last, whole=True))
                plan.extend(s for s in spans[index:] if s.is_gap and s.start >= last)
                break
            else:
                plan.append(self._sentence(segment.text, span.start, span.end))
        return plan

    def _sentence(self, text: str, start: int, end: int, whole: bool = False) -> _Sentence:
        normalized, norm_map = normalize_with_map(text[start:end])
        parts = [normalized] if whole else cut_sentence(normalized, self.count, self.limit)
        located, at = [], 0
        for part in parts:
            begin = normalized.find(part, at)
            begin = at if begin < 0 else begin
            located.append((len(self.units), begin, begin + len(part)))
            self.units.append(mask_terms(part, self.opts.glossary, self.opts.placeholders, self.opts.keep_numbers,
                                         (self.opts.source_lang, self.numbers_lang)))
            at = begin + len(part)
        return _Sentence(start, end, norm_map, located)



def render(plan: list, segment: Segment, units: list[Masked], found: list[list[Hypothesis]], rank: int,
           engine: Engine, aligner: Aligner) -> Rendered:
    """The segment's translation from each unit's ``rank``-th hypothesis (the best where a
    unit has fewer), and where its positions land in it."""
    wanted = _positions_by_unit(plan, segment, units)
    texts: dict[int, tuple[str, dict[int, int]]] = {}
    score = 0.0
    for item in plan:
        for unit, _, _ in getattr(item, "parts", ()):
            hyps = found[unit]
            hyp = hyps[rank] if rank < len(hyps) else (hyps[0] if hyps else None)
            score += hyp.score if hyp else 0.0
            texts[unit] = _unit_text(units[unit], hyp, engine, aligner, wanted.get(unit, []))
    return _join(plan, segment, texts, score)


def _positions_by_unit(plan: list, segment: Segment, units: list[Masked]) -> dict[int, list[tuple[int, int, str]]]:
    """For each unit: (position index, offset in its masked source, side); positions in the
    gaps between sentences stay there (``_join``)."""
    by_unit: dict[int, list[tuple[int, int, str]]] = {}
    for index, (offset, side) in enumerate(segment.positions):
        for item in plan:
            if isinstance(item, Span) or not item.start <= offset <= item.end:
                continue
            if (offset == item.end and side == "start") or (offset == item.start and side == "end"):
                continue  # on the sentence's edge, outside it
            local = item.norm_map[offset - item.start]
            unit, begin, end = next(((u, b, e) for u, b, e in item.parts if local <= e), item.parts[-1])
            inside = min(max(local - begin, 0), end - begin)
            by_unit.setdefault(unit, []).append((index, units[unit].edits.map(inside, side), side))
            break
    return by_unit


def _unit_text(masked: Masked, hyp: Optional[Hypothesis], engine: Engine, aligner: Aligner,
               wanted: list[tuple[int, int, str]]) -> tuple[str, dict[int, int]]:
    """One unit's translation with its terms restored, and its wanted positions in it."""
    if hyp is None:
        return "", {index: 0 for index, _, _ in wanted}
    target = engine.detokenize(hyp)
    numbers = check_numbers(target, masked)
    lost = missing_placeholders(target, masked, numbers)
    if masked.placeholders:  # a lost placeholder: its term goes where the placeholder aligns
        term_positions = [(masked.spans[i][0], "start") for i in lost]
    else:  # a term left in the source: its target replaces what the term's words align to
        term_positions = [(masked.spans[i][side == "end"], side) for i in lost for side in ("start", "end")]
    positions = term_positions + [(offset, side) for _, offset, side in wanted]
    aligned = aligner(masked.text, target, hyp.tokens, positions) if positions else []
    terms = aligned[:len(term_positions)]
    spots = (dict(zip(lost, terms)) if masked.placeholders
             else {i: (terms[2 * n], terms[2 * n + 1]) for n, i in enumerate(lost)})
    restored, edits = restore_terms(target, masked, spots, numbers)
    placed = {index: edits.map(at, side) for (index, _, side), at in zip(wanted, aligned[len(term_positions):])}
    return restored, placed


def _join(plan: list, segment: Segment, texts: dict[int, tuple[str, dict[int, int]]], score: float) -> Rendered:
    """Gaps as in the source, sentences from their units' translations joined by spaces."""
    out: list[str] = []
    sentences: list[tuple[int, int, int, int]] = []
    offsets = [0] * len(segment.positions)
    at = 0
    for item in plan:
        if isinstance(item, Span):
            gap = segment.text[item.start:item.end]
            if not segment.keep_ends and (item is plan[0] or item is plan[-1]):
                gap = ""
            for index, (offset, _) in enumerate(segment.positions):
                if item.start <= offset <= item.end:
                    offsets[index] = at + min(offset - item.start, len(gap))
            out.append(gap)
            at += len(gap)
            continue
        begin = at
        for number, (unit, _, _) in enumerate(item.parts):
            if number:
                out.append(" ")
                at += 1
            text, placed = texts[unit]
            for index, where in placed.items():
                offsets[index] = at + where
            out.append(text)
            at += len(text)
        sentences.append((item.start, item.end, begin, at))
    return Rendered("".join(out), offsets, score, sentences)


def translate_segments(engine: Engine, segments: Sequence[Segment], opts: TextOptions, search: SearchOptions,
                       wanted: Optional[Wanted] = None) -> list[list[Rendered]]:
    """Every segment's translations (the best, then ``opts.alternatives`` more), from one
    engine call over all their units; the units of a segment no longer ``wanted`` are
    dropped by the engine as soon as it can."""
    ranks = max(search.nbest, opts.alternatives + 1)
    if ranks > max(search.beam_size, 1):  # widened here, the beam would change the best translation too
        raise XformerError(f"alternatives {opts.alternatives} need a beam of at least {ranks}: the search asked for "
                           f"has beam_size {search.beam_size}")
    if ranks > search.nbest or (opts.target_lang and opts.target_lang != search.target_lang):
        search = engine.options(**{**search.__dict__, "nbest": ranks,
                                   "target_lang": opts.target_lang or search.target_lang,
                                   # an alpha not asked for is the old target's: the new one's own applies
                                   "length_penalty": search.length_penalty if search.length_penalty_given else None})
    lead = getattr(engine, "source_tag", None)  # a multilingual model's tag takes one source position
    tagged = lead is not None and lead(search).tag is not None
    planner = Planner(engine, opts, (search.max_input_len or DEFAULT_MAX_INPUT_LEN) - tagged)
    plans, owners = [], []  # owners[unit]: its segment
    for index, segment in enumerate(segments):
        plans.append(planner.plan(segment))
        owners.extend([index] * (len(planner.units) - len(owners)))
    unit_wanted = None if wanted is None else lambda unit: wanted(owners[unit])
    found = engine.search([unit.text for unit in planner.units], search, unit_wanted) if planner.units else []
    aligner = pick_aligner(engine, opts.aligner, search.target_lang)
    return [[render(plan, segment, planner.units, found, rank, engine, aligner)
             for rank in range(_ranks_found(plan, found, ranks))] for plan, segment in zip(plans, segments)]


def _ranks_found(plan: list, found: list[list[Hypothesis]], ranks: int) -> int:
    """How many of the ``ranks`` asked for a segment has (at least 1): as many as its unit with
    the most hypotheses; at a rank the others lack, they give their best (``render``). A rank no
    unit has is no translation at all, not a copy of the best."""
    units = [unit for item in plan for unit, _, _ in getattr(item, "parts", ())]
    return max(1, min(ranks, max((len(found[unit]) for unit in units), default=0)))


def _document_ranks(document, outputs: list[list[Rendered]], wanted: int) -> tuple[list[str], list[float]]:
    """An HTML text's translations and their scores, best first: each rank some segment has (the
    others give their best there), ``wanted`` at most."""
    if not outputs:  # markup alone, nothing to translate: every rank is the page as it is, certain
        return [document.render([])] * wanted, [0.0] * wanted
    depth = min(wanted, max(len(out) for out in outputs))
    picks = [[out[rank] if rank < len(out) else out[0] for out in outputs] for rank in range(depth)]
    return [document.render(pick) for pick in picks], [sum(r.score for r in pick) for pick in picks]


def translate_texts(engine: Engine, texts: Sequence[str], opts: Optional[TextOptions] = None,
                    search: Optional[SearchOptions] = None, wanted: Optional[Wanted] = None) -> list[TextResult]:
    """Each text's translation (and ``opts.alternatives`` more) in one engine call. A blank
    plain text gives ""; HTML keeps everything but its text. Without ``search``, the model's
    own (its beam at least alternatives + 1); a ``search`` given keeps its beam: one narrower
    than the alternatives asked for is refused. A text that stops being
    ``wanted`` (text index -> bool; its client went away) costs no more decoding than the
    engine has begun, and its result is partial."""
    from xformer_cli.text.html import parse_html

    texts = checked_lines(texts, "texts")
    opts = opts or TextOptions()
    if search is None:  # the model's own search, its beam widened for the alternatives asked for (as serve's)
        search = engine.options()
        if opts.alternatives + 1 > search.beam_size:
            search = engine.options(beam_size=opts.alternatives + 1)
    if opts.format == "html":
        documents = [parse_html(text) for text in texts]
        segments = [segment for document in documents for segment in document.segments]
        owners = [index for index, document in enumerate(documents) for _ in document.segments]
    else:
        documents = []
        owners = [index for index, text in enumerate(texts) if text.strip()]
        segments = [Segment(texts[index], keep_ends=False) for index in owners]
    segment_wanted = None if wanted is None else lambda segment: wanted(owners[segment])
    rendered = iter(translate_segments(engine, segments, opts, search, segment_wanted))
    results = []
    for index, text in enumerate(texts):
        sentences: list[tuple[int, int, int, int]] = []
        if documents:
            outputs = [next(rendered) for _ in documents[index].segments]
            ranks, scores = _document_ranks(documents[index], outputs, opts.alternatives + 1)
        elif text.strip():
            out = next(rendered)[:opts.alternatives + 1]
            ranks, scores, sentences = [r.text for r in out], [r.score for r in out], out[0].sentences
        else:
            ranks, scores = [""] * (opts.alternatives + 1), [0.0] * (opts.alternatives + 1)
        results.append(TextResult(ranks[0], ranks[1:opts.alternatives + 1], scores, sentences))
    return results


def one_line(text: str) -> str:
    """Line breaks of every kind inside a translated line as spaces (one line in, one out)."""
    return text if len(text.splitlines()) <= 1 and not text.endswith(("\n", "\r")) else " ".join(text.splitlines())


def translate_text_stream(engine: Engine, lines: Iterable[str], opts: TextOptions, search: SearchOptions,
                          chunk_lines: int = 2000) -> Iterator[TextResult]:
    """``translate_texts`` over any number of lines in bounded memory, in order. Sampling with a
    seed draws chunk k with seed + k, as the pipeline's corpus translation does: a line repeated
    in every chunk is not sampled alike in each."""
    for index, chunk in enumerate(chunked(lines, chunk_lines)):
        seeded = search if search.seed is None else replace(search, seed=search.seed + index)
        for result in translate_texts(engine, chunk, opts, seeded):
            yield TextResult(one_line(result.text), [one_line(text) for text in result.alternatives], result.scores)


def result_lines(results: Iterable[TextResult], nbest: int = 1, rows: Optional[bool] = None) -> Iterator[str]:
    """``xformer translate``'s output: one line per text, or ``nbest_rows`` per text (``rows``:
    asked for with --nbest, 1 included; by default when ``nbest`` is over 1)."""
    for line_no, result in enumerate(results, start=1):
        if not (nbest > 1 if rows is None else rows):
            yield result.text
        else:
            yield from nbest_rows(line_no, [result.text, *result.alternatives], result.scores, nbest)


def nbest_rows(line_no: int, texts: Sequence[str], scores: Sequence[float], k: int) -> list[str]:
    """``--nbest k``'s rows for one input line, best first: exactly k of
    ``LINE<TAB>RANK<TAB>SCORE<TAB>TRANSLATION`` (1-based), SCORE the length-normalised
    log-probability summed over the line's sentences. A blank line's translations are empty
    and score 0 (certain). A rank the search found no translation for (fewer than k, on tiny
    vocabularies or short length limits) is an empty translation scored -inf: it sorts last,
    where 0 would outrank every real translation (log-probabilities are at most 0)."""
    rows = []
    for rank in range(1, k + 1):
        found = rank <= min(len(texts), len(scores))
        text, score = (texts[rank - 1], scores[rank - 1]) if found else ("", float("-inf"))
        # a tab the source had between sentences would be a fifth column: a space in a row
        rows.append(f"{line_no}\t{rank}\t{score:.4f}\t{text.replace(chr(9), ' ')}")
    return rows
