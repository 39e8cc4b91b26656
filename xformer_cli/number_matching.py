"""Numbers in text: which numbers a source sentence holds, and what the numbers of a
translation may be worth, written in digits or spelled out in the target language.

Used by ``eval-bleu``'s number accuracy (``number_accuracy``) and by ``translate
--keep-numbers`` (``text/keep_numbers.py``). The rules, exactly (docs/evaluation.md#number-accuracy):

- A source number is a run of digits, with the grouping and decimal separators of the source
  language between digit groups: English "1,102" is 1102 and "3.5" is 3.5; German "1.102" is
  1102 and "3,5" is 3.5. A separator that fits neither rule splits ("1,5" in English: 1 and 5;
  "10:30": 10 and 30; "9/11": 9 and 11). Letters around the digits do not matter ("A380": 380,
  "1970s": 1970, "50ft": 50); an English ordinal counts as its number ("3rd": 3, "1,250th": 1250).
  Numbers spelled out in the source ("two dogs") are not source numbers.
- A translation's number mentions: every run of digits, the first run of a token also worth
  the token read with either convention ("1.102" is 1102 or 1.102, or 1 and 102), and
  every number word of the target language (German, English, French, Czech: cardinals and
  ordinals, "zwei", "einundzwanzig", "dritten", "vingt-et-un", "dvacet"), a run of number
  words being one mention ("deux cents": 200). German "ein" (all its forms) and French
  "un"/"une" count as 1: those languages use one word for the article and the number. With
  no target language known ("") no word counts, digits only (number_words.py says why).
- A source number is kept when a mention of the translation is worth its value; each mention
  keeps at most one source number (a maximum matching).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from decimal import Decimal, InvalidOperation
from typing import Optional, Sequence

from xformer_cli.number_words import combine, connector, has_number_words, word_value

DIGITS = re.compile(r"\d+(?:(?:[.,\u00a0\u202f]|\s(?=\d{3}(?!\d)))\d+)*")
ENGLISH_ORDINAL = re.compile(r"(?:st|nd|rd|th)(?![^\W\d_])", re.IGNORECASE)
WORD = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*")
DECIMAL_POINT = frozenset({"en", "zh", "ja", "ko", "hi", "he", "th", "ms"})  # 1,102.5; the rest 1.102,5
SPACES = "\u00a0\u202f \t"


@dataclass(frozen=True)
class Mention:
    """A number in a text: its span, what it may be worth, and whether it is also an article
    (German "ein", French "une": kept as a match, never replaced)."""

    start: int
    end: int
    values: frozenset
    article: bool = False

    @property
    def value(self) -> Decimal:
        """The value of a source number (it has exactly one)."""
        return next(iter(self.values))


def _decimal(text: str) -> Optional[Decimal]:
    try:
        return Decimal(text).normalize()
    except InvalidOperation:
        return None


def read_digits(token: str, grouping: str, decimal: str) -> Optional[Decimal]:
    """``token`` read with one convention ("," groups and "." marks decimals, or the other way
    round; spaces group where the convention groups with "."), None if it does not fit."""
    groups = re.split(r"[.,\u00a0\u202f \t]", token)
    separators = [c for c in token if not c.isdigit()]
    whole, fraction = groups, []
    if separators and separators[-1] == decimal:
        whole, fraction = groups[:-1], groups[-1:]
        separators = separators[:-1]
    allowed = {grouping} | (set(SPACES) if grouping == "." else set())
    if any(s not in allowed for s in separators) or len(set(separators)) > 1:
        return None
    if len(whole) > 1 and (not 1 <= len(whole[0]) <= 3 or any(len(g) != 3 for g in whole[1:])):
        return None
    return _decimal("".join(whole) + ("." + fraction[0] if fraction else ""))


def separators(lang: str) -> tuple[str, str]:
    """``lang``'s (grouping, decimal) separators: "," and "." for English ("1,102.5"), "." and ","
    for the rest ("1.102,5")."""
    return (",", ".") if lang.lower() in DECIMAL_POINT else (".", ",")


def source_numbers(text: str, lang: str = "en") -> list[Mention]:
    """The numbers a source sentence holds in digits, each with its one value (see the module
    docstring for the rules)."""
    point = lang.lower() in DECIMAL_POINT
    grouping, decimal = separators(lang)
    found = []
    for match in DIGITS.finditer(text):
        token, start = match.group(), match.start()
        value = read_digits(token, grouping, decimal)
        end = match.end()
        if point and lang.lower() == "en":
            ordinal = ENGLISH_ORDINAL.match(text, end)
            end = ordinal.end() if ordinal else end
        if value is not None:
            found.append(Mention(start, end, frozenset({value})))
            continue
        for run in re.finditer(r"\d+", token):  # a separator neither rule reads: each run alone
            found.append(Mention(start + run.start(), start + run.end(), frozenset({Decimal(run.group())})))
    return found


def digit_mentions(token: str, start: int) -> list[Mention]:
    """A digit token of a translation as numbers: one per run of digits, the first also worth
    the whole token read with either convention ("1.102": 1102 or 1.102, or 1 and 102;
    "31.10.2013": 31, 10 and 2013), and then spanning the token (what a replacement replaces)."""
    runs = list(re.finditer(r"\d+", token))
    whole = {read_digits(token, grouping, decimal) for grouping, decimal in ((",", "."), (".", ","))} - {None}
    first_values = frozenset({Decimal(runs[0].group())} | whole)
    first = Mention(start, start + (len(token) if whole else runs[0].end()), first_values)
    return [first] + [Mention(start + run.start(), start + run.end(), frozenset({Decimal(run.group())}))
                      for run in runs[1:]]


def mentions(text: str, lang: str) -> list[Mention]:
    """Every number of a translation in ``lang``: digit tokens and runs of number words."""
    found = [mention for m in DIGITS.finditer(text) for mention in digit_mentions(m.group(), m.start())]
    run: list[tuple[int, int, int, bool]] = []  # (start, end, value, article) of the words so far

    def close() -> None:
        if run:
            combined = combine(v for _, _, v, _ in run)
            values = {Decimal(v) for _, _, v, _ in run} | (set() if combined is None else {Decimal(combined)})
            found.append(Mention(run[0][0], run[-1][1], frozenset(values), all(a for *_, a in run)))
            run.clear()

    last_end, pending_connector = 0, False
    for match in WORD.finditer(text):
        word = match.group()
        known = word_value(word, lang)
        joined = not text[last_end:match.start()].strip()
        if known is not None:
            if not joined:
                close()
            run.append((match.start(), match.end(), known[0], known[1]))
        elif run and joined and connector(word, lang) and not pending_connector:
            pending_connector = True
            last_end = match.end()
            continue
        else:
            close()
        pending_connector = False
        last_end = match.end()
    close()
    return sorted(found, key=lambda m: m.start)


def match_numbers(numbers: Sequence[Mention], found: Sequence[Mention]) -> dict[int, int]:
    """A maximum matching of source numbers to mentions worth their value (Kuhn's augmenting
    paths; sentences hold a handful of numbers): source index -> mention index."""
    owner: dict[int, int] = {}  # mention index -> source index

    def assign(index: int, seen: set[int]) -> bool:
        for m, mention in enumerate(found):
            if m in seen or numbers[index].value not in mention.values:
                continue
            seen.add(m)
            if m not in owner or assign(owner[m], seen):
                owner[m] = index
                return True
        return False

    for index in range(len(numbers)):
        assign(index, set())
    return {source: m for m, source in owner.items()}


@dataclass
class NumberAccuracy:
    """Source numbers kept in the translations: ``kept`` of ``total``, in ``lines`` lines with numbers."""

    kept: int = 0
    total: int = 0
    lines: int = 0
    target_lang: str = ""

    @property
    def share(self) -> float:
        return self.kept / self.total if self.total else 1.0

    def to_dict(self) -> dict:
        return {"accuracy": round(100 * self.share, 2), "kept": self.kept, "total": self.total,
                "lines": self.lines, "target_lang": self.target_lang}

    @property
    def text(self) -> str:
        words = f"digits or {self.target_lang} words" if has_number_words(self.target_lang) else "digits"
        return (f"numbers = {100 * self.share:.2f}% ({self.kept} of {self.total} source numbers kept, as {words}; "
                f"{self.lines} lines with numbers)")


def number_accuracy(sources: Sequence[str], outputs: Sequence[str], src_lang: str = "en",
                    tgt_lang: str = "") -> NumberAccuracy:
    """The share of the sources' numbers whose value the outputs hold (line by line)."""
    result = NumberAccuracy(target_lang=tgt_lang)
    for source, output in zip(sources, outputs):
        numbers = source_numbers(source, src_lang)
        if not numbers:
            continue
        result.lines += 1
        result.total += len(numbers)
        result.kept += len(match_numbers(numbers, mentions(output, tgt_lang)))
    return result


def language_of(path: "str | Path") -> str:
    """A file's language from a two-letter suffix ("test2016.de", "test2016.de.gz": "de"); "" otherwise."""
    path = Path(path)
    suffix = (path.with_suffix("") if path.suffix == ".gz" else path).suffix.lstrip(".")
    return suffix.lower() if re.fullmatch(r"[A-Za-z]{2}", suffix) else ""
