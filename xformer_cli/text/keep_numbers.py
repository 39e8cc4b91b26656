"""Numbers kept by value, when protection is asked for (``translate --keep-numbers``, or a
glossary's automatic do-not-translate numbers): every source number's value ends up in the
translation once, in digits or as the word the model chose, never both.

A number term of a unit (the source's digits, left in the source) is kept when the
translation holds its value (``number_matching``: digits in either convention, or a number word of the
target language: "2" -> "zwei" is kept as it is). A lost one replaces a number of the
translation that no source number claims (the model's wrong copy: "1102" -> "12"), the one
where the source number aligns or else the nearest; with none, it is inserted where it aligns
(``glossary.restore_terms``). Articles ("ein", "une") and numbers the source spells out are
never replaced.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from xformer_cli.number_matching import Mention, match_numbers, mentions, source_numbers

if TYPE_CHECKING:
    from xformer_cli.languages import Languages
    from xformer_cli.text.masked import Masked

# A number term: what the glossary masks as one. Not digits inside a name (X2, MP3, 4x4: a letter
# before them, or letters and a digit after); a unit or an ending after them is no name (5km, 21st).
NUMBER = re.compile(r"(?<![^\W_])\d+(?:[.,:/]\d+)*(?![\d.,:/]*\d)(?![^\W\d_]+\d)")


@dataclass
class NumberCheck:
    """One unit's translation against its number terms."""

    terms: set[int]  # indices (into ``masked.targets``) of the number terms
    lost: list[int]  # those whose value the translation lacks
    free: list[Mention] = field(default_factory=list)  # the translation's numbers nothing claims

    def take(self, start: int, end: int) -> Optional[tuple[int, int]]:
        """The span of a free number to replace for a lost term aligned to ``start:end``: one
        inside it, else the nearest; each is taken once. None when there is none."""
        if not self.free:
            return None
        inside = [m for m in self.free if m.start < max(end, start + 1) and start < m.end]
        chosen = inside[0] if inside else min(self.free, key=lambda m: min(abs(m.start - start), abs(m.end - start)))
        self.free.remove(chosen)
        return chosen.start, chosen.end


def numbers_language(asked: Optional[str], languages: Optional["Languages"]) -> str:
    """The language a translation's number words are read in: the target asked for, else the
    model's only target; "" when neither is known, and then digits only, as no word of one
    language is safe to read in another ("set" is Czech 100: number_words.py)."""
    if asked:
        return asked
    targets = languages.targets if languages is not None else []
    return targets[0] if len(targets) == 1 else ""


def number_terms(masked: "Masked") -> set[int]:
    """The terms that are numbers kept as they are (the source's digits)."""
    found = set()
    for index, (start, end) in enumerate(masked.spans):
        source = masked.text[start:end]
        if masked.targets[index] == source and NUMBER.fullmatch(source):
            found.add(index)
    return found


def check_numbers(target: str, masked: "Masked") -> Optional[NumberCheck]:
    """Which number terms ``target`` lacks by value, and which of its numbers are free; None
    for a unit without number terms or with placeholders (the model never saw the digits)."""
    terms = number_terms(masked) if not masked.placeholders else set()
    if not terms:
        return None
    src_lang, tgt_lang = masked.languages
    numbers, owners = [], []
    for index in sorted(terms):
        start, end = masked.spans[index]
        for number in source_numbers(masked.text[start:end], src_lang):
            numbers.append(number)
            owners.append(index)
    found = mentions(target, tgt_lang)
    matched = match_numbers(numbers, found)
    lost = sorted({owners[k] for k in range(len(numbers)) if k not in matched})
    spelled = set()  # values the source spells out ("four people"): their translations are not wrong copies
    for mention in mentions(masked.text, src_lang):
        if not any(c.isdigit() for c in masked.text[mention.start:mention.end]):
            spelled |= mention.values
    used = set(matched.values())
    free = [m for i, m in enumerate(found) if i not in used and not m.article and not m.values & spelled]
    return NumberCheck(terms, lost, free)
