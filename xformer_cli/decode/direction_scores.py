"""``xformer eval-bleu`` on a multilingual model: every direction translated with its target
language and scored on its own (BLEU, chrF, their signatures), with the off-target rate.

The off-target rate is the share of non-empty outputs whose language py3langid finds to be
another than the one asked for, chosen among the model's languages (its sources and
targets: ``langid.detected_among`` says why not among all 97). Without py3langid the rate is
not given (None) and the table says how to get it.

    results = score_directions(engine, checkpoint_test_sets("best.pt"), languages)
    print(direction_table(results))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from xformer_cli.data.sources import ParallelCorpus
from xformer_cli.decode.engine import Engine
from xformer_cli.errors import XformerError
from xformer_cli.evaluate import Score, score_lines
from xformer_cli.languages import Languages


@dataclass
class DirectionResult:
    source: str
    target: str
    lines: int
    scores: list[Score]
    off_target: Optional[int]  # outputs in another language; None without py3langid
    scored: int = 0  # non-empty outputs the rate is over
    hypotheses: list[str] = field(default_factory=list, repr=False)

    @property
    def name(self) -> str:
        return f"{self.source}->{self.target}"

    @property
    def off_target_rate(self) -> Optional[float]:
        return None if self.off_target is None else self.off_target / max(self.scored, 1)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"direction": self.name, "lines": self.lines,
                               **{s.name: s.to_dict() for s in self.scores}}
        if self.off_target is not None:
            out["off_target"] = {"rate": round(self.off_target_rate or 0.0, 4), "lines": self.off_target,
                                 "of": self.scored}
        return out


def off_target(hypotheses: Sequence[str], target: str, languages: Sequence[str]) -> tuple[Optional[int], int]:
    """(outputs not in ``target``, non-empty outputs); (None, n) without py3langid."""
    from xformer_cli.langid import detected_among

    scored = sum(bool(h.strip()) for h in hypotheses)
    try:
        found = detected_among(hypotheses, languages)
    except XformerError:  # py3langid is not installed
        return None, scored
    return sum(bool(h.strip()) and code != target for h, code in zip(hypotheses, found)), scored


def score_direction(engine: Engine, source: str, target: str, corpus: ParallelCorpus, languages: Languages,
                    metrics: Sequence[str], search: dict[str, Any], lowercase: bool = False,
                    tokenize: Optional[str] = None) -> DirectionResult:
    """One direction: ``corpus`` translated into ``target`` (``search``: translate's options),
    scored against its references, its off-target rate measured."""
    hyps = engine.translate(corpus.src, target_lang=target, **search)
    scores = score_lines(hyps, [corpus.tgt], metrics, lowercase, tokenize, 0, f"{source}->{target}", [corpus.origin])
    wrong, scored = off_target(hyps, target, languages.codes)
    return DirectionResult(source, target, len(hyps), scores, wrong, scored, hyps)


def sets_asked_for(sets: dict[tuple[str, str], ParallelCorpus], languages: Languages, target_lang: Optional[str],
                   source_lang: Optional[str], origin: str) -> dict[tuple[str, str], ParallelCorpus]:
    """The test sets of the directions into ``target_lang`` and from ``source_lang`` (each: any
    when None); ``origin`` (the checkpoint) names them when none is left."""
    if target_lang:
        target = languages.target(target_lang)
        sets = {d: c for d, c in sets.items() if d[1] == target}
    if source_lang:
        source = languages.source(source_lang)
        sets = {d: c for d, c in sets.items() if d[0] == source}
    if not sets:
        raise XformerError(f"{origin}: no test set of its config is in the directions asked for "
                           f"({languages.describe()})")
    return sets


def score_directions(engine: Engine, sets: dict[tuple[str, str], ParallelCorpus], languages: Languages,
                     metrics: Sequence[str] = ("bleu", "chrf"), search: Optional[dict[str, Any]] = None,
                     lowercase: bool = False, tokenize: Optional[str] = None,
                     log: Callable[[str], None] = lambda message: None) -> list[DirectionResult]:
    """Every direction of ``sets`` (checkpoint_test_sets), in order."""
    results = []
    for (source, target), corpus in sets.items():
        log(f"{source}->{target}: translating {len(corpus)} lines of {corpus.origin}")
        results.append(score_direction(engine, source, target, corpus, languages, metrics, search or {},
                                       lowercase, tokenize))
    return results


def direction_table(results: Sequence[DirectionResult]) -> str:
    """One row per direction (BLEU, chrF, off-target rate), then each metric's signature."""
    names = [s.name for s in results[0].scores]
    header = ["direction", "lines", *names, "off-target"]
    rows = []
    for r in results:
        rate = "n/a" if r.off_target is None else f"{100 * (r.off_target_rate or 0):.1f}% ({r.off_target}/{r.scored})"
        rows.append([r.name, str(r.lines), *[f"{s.score:.2f}" for s in r.scores], rate])
    widths = [max(len(row[c]) for row in [header, *rows]) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    for index, name in enumerate(names):
        lines.append(f"{name} signature: {results[0].scores[index].signature}")
    if any(r.off_target is None for r in results):
        lines.append("off-target: needs py3langid (pip install 'xformer[langid]')")
    else:
        lines.append("off-target: outputs py3langid finds in another of the model's languages than the one asked for")
    return "\n".join(lines)
