"""Training pairs whose numbers disagree, dropped (data.drop_number_mismatch; OpusCleaner's
num_mismatch filter): a target that lost a number of its source, or holds digits its source
has no number for. A teacher's translations lose numbers far more often than human ones do,
and a student trained on them learns to lose them too (docs/pipeline.md#numbers-the-model-learns-to-copy).

The rules are eval-bleu's (``number_matching.py``): a source number is kept when a mention of the
target, digits or a number word of the target language, is worth its value; each number of the
target's digits, read as the target language writes numbers (German "3.000" is 3000, "3,5" is
3.5), needs a mention of the source of its own, digits or a number word, worth its value ("2 men"
/ "Zwei Männer" and "Two men" / "2 Männer" agree; a teacher's loop "2012 2012 2012" on one 2012,
or "3.000 Hunde" for "3 dogs", does not)."""

from __future__ import annotations

from collections import Counter
from typing import Optional

from xformer_cli.number_matching import match_numbers, mentions, source_numbers

FILTER_VERSION = 1  # in the token cache's key: a change of the rules builds the cache again

LOST = "with a source number lost in the target"
INVENTED = "with target digits not in the source, or repeated"


def number_mismatch(src: str, tgt: str, src_lang: str, tgt_lang: str) -> Optional[str]:
    """Why the pair's numbers disagree (``LOST`` or ``INVENTED``), None when they agree."""
    if not any(c.isdigit() for c in src + tgt):  # most pairs: nothing to read
        return None
    numbers = source_numbers(src, src_lang)
    if numbers and len(match_numbers(numbers, mentions(tgt, tgt_lang))) < len(numbers):
        return LOST
    digits = source_numbers(tgt, tgt_lang)  # read as the target language writes them: German "3.000" is 3000
    if digits and len(match_numbers(digits, mentions(src, src_lang))) < len(digits):
        return INVENTED  # digits no source number is worth, or one number written twice ("2012 2012")
    return None


def without_number_mismatch(pairs: list[tuple[str, str]], src_lang: str, tgt_lang: str,
                            dropped: Counter) -> list[tuple[str, str]]:
    """``pairs`` less those whose numbers disagree, each counted in ``dropped`` by its reason."""
    kept = []
    for src, tgt in pairs:
        reason = number_mismatch(src, tgt, src_lang, tgt_lang)
        if reason is None:
            kept.append((src, tgt))
        else:
            dropped[reason] += 1
    return kept
