"""Paragraphs into sentences and back, with the whitespace between them kept exactly.

The splitter is ``sentencex`` (rules for some 240 languages, with fallbacks between related
ones; a compiled extension). On newstest2014 joined into 5-sentence paragraphs it finds about
as many of the joins as ``pysbd`` in a small fraction of its time (docs/benchmarks/text.md,
"The sentence splitter against pysbd"), which matters because splitting runs on every line
of ``translate``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """A piece of a text: ``text[start:end]``; ``is_gap`` for the whitespace between sentences."""

    start: int
    end: int
    is_gap: bool


def split_spans(text: str, lang: str, enabled: bool = True) -> list[Span]:
    """``text`` as alternating whitespace gaps and sentences that cover it exactly, in order
    (leading and trailing whitespace are gaps). ``enabled=False``: the stripped text is one
    sentence."""
    spans: list[Span] = []
    at = 0
    for piece in _sentences(text, lang) if enabled else [text]:
        core = piece.strip()
        if not core:
            continue
        start = text.find(core, at)
        if start < 0:  # the splitter changed the text: keep the rest as one sentence
            break
        if start > at:
            spans.append(Span(at, start, True))
        spans.append(Span(start, start + len(core), False))
        at = start + len(core)
    rest = text[at:]
    if rest.strip():
        lead = len(rest) - len(rest.lstrip())
        trail = len(rest.rstrip())
        if lead:
            spans.append(Span(at, at + lead, True))
        spans.append(Span(at + lead, at + trail, False))
        at += trail
    if at < len(text):
        spans.append(Span(at, len(text), True))
    return spans


def _sentences(text: str, lang: str) -> list[str]:
    from sentencex import segment

    try:
        return list(segment(lang or "en", text))
    except Exception:  # noqa: BLE001 - a splitter bug must not lose the text: one sentence
        return [text]
