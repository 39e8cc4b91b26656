"""Glossaries and do-not-translate terms, by placeholders.

Each listed source term (and, automatically with a glossary, every URL, e-mail address and
number; numbers alone with ``keep_numbers``) is replaced in the source by a placeholder
before translation and the placeholder by its target term afterwards. A model that copies
the placeholder puts the term where the model wanted it; where the placeholder is lost (a
small model never saw one) the term goes where the aligner (``align.py``) maps the
placeholder's source position. Either way every listed target term appears once per source
occurrence, and the rest of the sentence is decoded as usual. Numbers left in the source are
kept by value (``keep_numbers.py``): one the model spelled out stays as it is. Without a glossary
and ``keep_numbers`` nothing is masked: the translation is the engine's. Placeholders were
chosen over lexically constrained beam search because they work on every engine
(CTranslate2's included) at the search's usual speed.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from xformer_cli.errors import XformerError
from xformer_cli.text.masked import Masked
from xformer_cli.text.keep_numbers import NUMBER, NumberCheck
from xformer_cli.text.offsets import Edits

# Do-not-translate by pattern: URLs, e-mail addresses, numbers (digits with inner . , : /).
AUTOMATIC = re.compile(
    r"(?:https?://|www\.)[^\s<>\"]*[^\s<>\".,;:!?)\]']"
    r"|[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
    r"|" + NUMBER.pattern
)
PLACEHOLDER = "X{}"  # what the term is masked with: X1, X2, ... within one unit
PLACEHOLDER_FOUND = re.compile(r"X(\d+)")


@dataclass(frozen=True)
class Glossary:
    """Source term -> target term; a target equal to its source means do-not-translate."""

    terms: Mapping[str, str] = field(default_factory=dict)
    automatic: bool = True  # URLs, e-mail addresses and numbers come out unchanged

    @classmethod
    def from_dict(cls, terms: Mapping[str, str], automatic: bool = True) -> "Glossary":
        """From ``{"source": "target"}``; refuses empty terms (``ValueError``)."""
        for source, target in terms.items():
            if not isinstance(source, str) or not isinstance(target, str) or not source.strip() or not target.strip():
                raise ValueError("glossary terms and their targets must be non-empty strings")
        return cls({s.strip(): t.strip() for s, t in terms.items()}, automatic)

    def merged(self, other: Optional["Glossary"]) -> "Glossary":
        """This glossary with ``other``'s terms over it (a request's over the server's)."""
        if other is None or not other.terms:
            return self
        return Glossary({**self.terms, **other.terms}, self.automatic and other.automatic)

    def key(self) -> tuple:
        """Hashable: what the batcher groups requests by."""
        return (tuple(sorted(self.terms.items())), self.automatic)


def load_glossary(path: "str | Path") -> Glossary:
    """A TSV file: ``source term<TAB>target term`` per line; blank lines and ``#`` comments
    are skipped; a bad line is a one-line error naming the file and the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is not part of the first term
    except FileNotFoundError:
        raise XformerError(f"glossary not found: {path}") from None
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise XformerError(f"{path}:{line}: the glossary is not UTF-8 ({exc.reason})") from None
    except OSError as exc:
        raise XformerError(f"{path}: cannot read the glossary ({type(exc).__name__})") from None
    terms: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        columns = line.split("\t")
        if len(columns) != 2 or not columns[0].strip() or not columns[1].strip():
            raise XformerError(f"{path}:{number}: a glossary line needs a source term, a tab and a target term")
        source, target = columns[0].strip(), columns[1].strip()
        if terms.get(source, target) != target:  # the same pair twice is harmless; two targets are a contradiction
            raise XformerError(f"{path}:{number}: {source!r} is given another target term than on line "
                               f"{first_line[source]} ({terms[source]!r} there, {target!r} here)")
        terms[source] = target
        first_line.setdefault(source, number)
    return Glossary(terms)


def mask_terms(text: str, glossary: Optional[Glossary], placeholders: bool = True, numbers: bool = False,
               languages: tuple[str, str] = ("en", "")) -> Masked:
    """Replace glossary terms (longest first, whole words) and automatic do-not-translate
    matches (with a glossary; numbers alone with ``numbers``) by placeholders X1, X2, ... (a
    placeholder-like word already in the text is masked too, so the output's placeholders are
    all ours). Nothing is masked without a glossary and ``numbers``."""
    found = _matches(text, glossary, numbers)
    if not placeholders:
        return Masked(text, [target for _, _, target in found], [(start, end) for start, end, _ in found], Edits(),
                      False, languages)
    out, targets, spans, at = [], [], [], 0
    edits = Edits()
    for start, end, target in found:
        out.append(text[at:start])
        placeholder = PLACEHOLDER.format(len(targets) + 1)
        begin = sum(map(len, out))
        out.append(placeholder)
        spans.append((begin, begin + len(placeholder)))
        targets.append(target)
        edits.add(start, end - start, placeholder)
        at = end
    out.append(text[at:])
    return Masked("".join(out), targets, spans, edits, True, languages)


def _matches(text: str, glossary: Optional[Glossary], numbers: bool = False) -> list[tuple[int, int, str]]:
    """Non-overlapping (start, end, target) matches, glossary terms before automatic ones."""
    if glossary is None and not numbers:
        return []
    candidates: list[tuple[int, int, str]] = []
    if glossary is not None:
        for source in _longest_first(tuple(glossary.terms)):
            if source in text:  # most terms are in no sentence: a substring test spares their regex
                target = glossary.terms[source]
                candidates += [(m.start(), m.end(), target) for m in _term_pattern(source).finditer(text)]
    automatic = AUTOMATIC if glossary is not None and glossary.automatic else NUMBER if numbers else None
    if automatic is not None:
        candidates += [(m.start(), m.end(), m.group()) for m in automatic.finditer(text)]
    placeholders = re.finditer(rf"(?<!\w){PLACEHOLDER_FOUND.pattern}(?!\w)", text)
    candidates += [(m.start(), m.end(), m.group()) for m in placeholders]
    taken: list[tuple[int, int, str]] = []
    for start, end, target in candidates:  # first come (longest glossary terms) first served
        if all(end <= s or start >= e for s, e, _ in taken):
            taken.append((start, end, target))
    return sorted(taken)


@functools.lru_cache(maxsize=1 << 16)
def _term_pattern(source: str) -> "re.Pattern[str]":
    """A term as whole words, compiled once: re's own cache holds 512 patterns, and a larger
    glossary recompiled every term for every sentence (a 1000-term glossary: 80 ms a sentence)."""
    return re.compile(rf"(?<!\w){re.escape(source)}(?!\w)")


@functools.lru_cache(maxsize=64)
def _longest_first(sources: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(sources, key=len, reverse=True))


def missing_placeholders(target: str, masked: Masked, numbers: Optional[NumberCheck] = None) -> list[int]:
    """Indices (0-based) of the placeholders the translation ``target`` lost (terms left in
    the source: those whose target term it lacks; number terms: those whose value it lacks)."""
    if not masked.placeholders:  # a term the output holds fewer times than the source: all its occurrences
        found = {term: len(_term_in(term, target)) for term in set(masked.targets)}
        lost = [i for i, term in enumerate(masked.targets) if found[term] < masked.targets.count(term)]
        return lost if numbers is None else sorted({i for i in lost if i not in numbers.terms} | set(numbers.lost))
    seen = {int(m.group(1)) for m in _placeholders_in(target)}
    return [i for i in range(len(masked.targets)) if i + 1 not in seen]


def restore_terms(target: str, masked: Masked, placed: dict[int, int],
                  numbers: Optional[NumberCheck] = None) -> tuple[str, Edits]:
    """``target`` with each placeholder replaced by its term, and each lost one's term inserted
    at ``placed[index]`` (a word boundary of ``target``); and the edits that made it. Lost
    number terms (``numbers``) replace a free number of ``target`` where there is one."""
    edits = Edits()
    if not masked.placeholders:
        return _replace_aligned(target, masked, placed, numbers)
    for match in _placeholders_in(target):
        number = int(match.group(1))
        if 1 <= number <= len(masked.targets):
            edits.add(match.start(), match.end() - match.start(), masked.targets[number - 1])
    body_end = len(target.rstrip(".!?;:,\"')»“” "))
    for index, at in sorted(placed.items(), key=lambda item: item[1]):
        term = masked.targets[index]
        if at >= body_end:  # at the end: before the closing punctuation
            edits.add(body_end, 0, f" {term}" if body_end else term)
        else:
            edits.add(at, 0, f"{term} ")
    return edits.apply(target), edits


def _placeholders_in(text: str):
    return re.finditer(rf"(?<!\w){PLACEHOLDER_FOUND.pattern}(?!\w)", text)


def _term_in(term: str, text: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(rf"(?<!\w){re.escape(term)}(?!\w)", text)]


def whole_words(text: str, start: int, end: int) -> tuple[int, int]:
    """``text[start:end]`` widened to the whole words (between spaces) it touches, less the
    punctuation at its outer edges; an empty span moves to the start of the word it is in."""
    empty = end <= start
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    if empty:
        return start, start
    while end < len(text) and not text[end].isspace():
        end += 1
    core_start, core_end = start, end
    while core_start < core_end and not text[core_start].isalnum():
        core_start += 1
    while core_end > core_start and not text[core_end - 1].isalnum():
        core_end -= 1
    return (core_start, core_end) if core_end > core_start else (start, end)


def _replace_aligned(target: str, masked: Masked, placed: dict[int, "tuple[int, int] | int"],
                     numbers: Optional[NumberCheck] = None) -> tuple[str, Edits]:
    """Terms left in the source: the whole target words aligned to a term (``placed``: their
    span) replaced by its target term; an empty or already used span gets the term inserted
    before a word; words that already hold the term are left as they are. A lost number term
    replaces a free number of ``target`` (``NumberCheck.take``) where there is one."""
    edits = Edits()
    taken: list[tuple[int, int]] = []
    body = len(target.rstrip(".!?;:,\"')»“” "))
    for index, span in sorted(placed.items(), key=lambda item: item[1] if isinstance(item[1], int) else item[1][0]):
        start, end = whole_words(target, *((span, span) if isinstance(span, int) else span))
        term = masked.targets[index]
        wrong = numbers.take(start, end) if numbers is not None and index in numbers.terms else None
        if wrong is not None and not any(wrong[0] < e and s < wrong[1] for s, e in taken):
            taken.append(wrong)
            edits.add(wrong[0], wrong[1] - wrong[0], term)
            continue
        source_words = len(masked.text[masked.spans[index][0]:masked.spans[index][1]].split())
        if len(target[start:end].split()) > 2 * source_words + 1:  # a wild alignment: insert instead
            end = start
        if end > start and not any(start < e and s < end for s, e in taken):
            taken.append((start, end))
            if not _term_in(term, target[start:end]):
                edits.add(start, end - start, term)
            continue
        at = min(start, body)
        for s, e in taken:
            if s <= at <= e:
                at = e
        if at >= body or (at and not target[at - 1].isspace()):
            edits.add(at, 0, f" {term}" if at else term)
        else:
            edits.add(at, 0, f"{term} ")
    return edits.apply(target), edits
