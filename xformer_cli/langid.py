"""Language identification with py3langid (its model ships in its wheel: nothing is downloaded),
for what needs to know a text's language: a multilingual model's source when it is not given
(``xformer translate``, ``serve``'s ``source: auto``) and the off-target rate of ``eval-bleu``.

py3langid comes with the ``langid`` extra (and ``serve``); without it these functions say so in one line.
The identifier is loaded on first use (under a second), once per process.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Optional, Sequence

from xformer_cli.errors import XformerError
from xformer_cli.languages import same_language

if TYPE_CHECKING:  # py3langid is an extra, loaded on first use
    from py3langid.langid import LanguageIdentifier

MISSING = "language identification needs py3langid: pip install 'xformer[langid]'"
_lock = threading.Lock()
_identifier: Optional[LanguageIdentifier] = None


def identifier() -> LanguageIdentifier:
    """The py3langid identifier (normalised probabilities), loaded once."""
    global _identifier
    with _lock:
        if _identifier is None:
            try:
                from py3langid.langid import MODEL_FILE, LanguageIdentifier
            except ImportError:
                raise XformerError(MISSING) from None
            _identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    return _identifier


def rank(text: str) -> list[tuple[str, float]]:
    """Every language py3langid knows (ISO 639-1 codes) with its probability, best first."""
    return [(code, float(p)) for code, p in identifier().rank(text)]


def best_among(text: str, codes: Sequence[str]) -> Optional[str]:
    """Which of ``codes`` (a model's, ISO 639-1 or 639-3) ``text`` is most likely in; None
    when py3langid knows none of them."""
    for found, _ in rank(text):
        match = next((code for code in codes if same_language(found, code)), None)
        if match is not None:
            return match
    return None


def detected_among(texts: Sequence[str], codes: Sequence[str]) -> list[str]:
    """Each text's most likely language of ``codes`` ("" for a blank text, or when py3langid
    knows none of them). Restricted to a model's languages because the full set mistakes
    close ones: it calls some of Multi30k's Czech references Slovak, where the choice among
    en, de, fr and cs misnames none of its valid and test2016 references
    (docs/benchmarks/multilingual.md, "py3langid on references")."""
    return [best_among(text, codes) or "" if text.strip() else "" for text in texts]
