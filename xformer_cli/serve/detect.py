"""Language identification for ``POST /detect`` and ``source: "auto"``: py3langid, whose
model ships inside its wheel (nothing is downloaded at run time).

    detect("Zwei Hunde spielen im Schnee.")       # [("de", 0.969), ("lb", 0.017), ...], best first
    plainly_other("Zwei Hunde spielen im Schnee.", "en")   # ("de", 0.969): refuse it
    plainly_other("Hallo Welt", "en")             # None: too short to tell

The identifier (``xformer_cli/langid.py``) is loaded on first use (under a second), once per process.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from xformer_cli.errors import XformerError
from xformer_cli.langid import rank
from xformer_cli.languages import same_language
from xformer_cli.serve.protocol import ApiError, language_name

# A text is refused as "plainly another language" only when it has at least MIN_LETTERS
# letters (short texts, names and numbers are too easily mistaken) and the identifier
# gives another language at least MIN_CONFIDENCE while the model's own gets under
# MAX_SOURCE_CONFIDENCE. One German sentence of four words passes all three; "Hallo
# Welt", "Angela Merkel visits the Bundestag." and "iPhone 15 Pro Max" do not.
MIN_LETTERS = 20
MIN_CONFIDENCE = 0.9
MAX_SOURCE_CONFIDENCE = 0.05

_TAG = re.compile(r"<[^>]*>")


def detect(text: str, strip_tags: bool = False) -> list[tuple[str, float]]:
    """Every language the identifier knows with its probability, best first."""
    if strip_tags:
        text = _TAG.sub(" ", text)
    try:
        return rank(text)
    except XformerError as exc:  # py3langid is not installed
        raise ApiError(500, str(exc)) from None


def candidates(text: str, most: int = 3, floor: float = 0.05) -> list[dict[str, object]]:
    """``POST /detect``'s answer, LibreTranslate's shape: ``[{"confidence": percent,
    "language": code}]``, the best first, then up to ``most`` - 1 runners-up over ``floor``."""
    ranked = detect(text)
    kept = ranked[:1] + [(code, p) for code, p in ranked[1:most] if p >= floor]
    return [{"confidence": round(p * 100, 1), "language": code} for code, p in kept]


def plainly_other(text: str, source: "str | Sequence[str]", strip_tags: bool = False) -> Optional[tuple[str, float]]:
    """(language, probability) when ``text`` is plainly in a language other than ``source``
    (or than every one of several); None when it is in one of them, or too short or too mixed
    to tell."""
    if sum(ch.isalpha() for ch in (_TAG.sub(" ", text) if strip_tags else text)) < MIN_LETTERS:
        return None
    sources = [source] if isinstance(source, str) else list(source)
    ranked = detect(text, strip_tags)
    ours = lambda code: any(same_language(code, s.split("-")[0]) for s in sources)  # noqa: E731
    best, confidence = ranked[0]
    own = max((p for code, p in ranked if ours(code)), default=0.0)
    if not ours(best) and confidence >= MIN_CONFIDENCE and own < MAX_SOURCE_CONFIDENCE:
        return best, confidence
    return None


class OtherLanguage(ApiError):
    """A 400 for ``q[at]`` (or ``q``), plainly not in the model's source language: ``naming``
    says it of the place the caller knows the text by (a file's line)."""

    def __init__(self, at: int, where: str, rest: str):
        super().__init__(400, f"Invalid request: {where} {rest}")
        self.at, self.rest = at, rest

    def naming(self, where: str) -> ApiError:
        return ApiError(400, f"Invalid request: {where} {self.rest}")


def refuse_other_language(texts: list[str], source: "str | Sequence[str]", batch: bool, html: bool = False) -> None:
    """400 naming the language when a text of a ``source: "auto"`` request is plainly not in
    the model's ``source`` language(s) (a translation of it would be garbage)."""
    sources = [source] if isinstance(source, str) else list(source)
    for at, text in enumerate(texts):
        found = plainly_other(text, sources, strip_tags=html)
        if found:
            code, confidence = found
            names = " or ".join(language_name(s) for s in sources)
            raise OtherLanguage(at, f"q[{at}]" if batch else "q",
                                f"is in {language_name(code)} ({code}, {confidence:.0%} sure), not {names}: "
                                f"this model translates from {', '.join(sources)} only")


def auto_sources(texts: list[str], candidates: Sequence[str], batch: bool, html: bool = False) -> list[dict]:
    """``source: "auto"``: each text's language among ``candidates`` (the model's sources for
    the target asked for) as LibreTranslate's {"language", "confidence"}; one candidate is
    taken as it is (confidence 100). A text plainly in none of them is a 400."""
    refuse_other_language(texts, list(candidates), batch, html)
    if len(candidates) == 1:
        return [{"language": candidates[0], "confidence": 100.0}] * len(texts)
    found = []
    for text in texts:
        ranked = detect(text, html) if text.strip() else []
        best = next(((c, p) for code, p in ranked for c in candidates if same_language(code, c)), (candidates[0], 0.0))
        found.append({"language": best[0], "confidence": round(best[1] * 100, 1)})
    return found
