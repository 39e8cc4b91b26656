"""The length penalty, chosen on the validation set after training.

GNMT's penalty ``((5 + |Y|) / 6) ** alpha`` decides how long beam search's outputs are. The
paper's alpha = 0.6 was tuned for WMT14 and a big model; a small model trained for minutes
writes shorter sentences, and on Multi30k the valid set favours a larger alpha (figures:
BENCHMARKS.md, "The length penalty, chosen on valid"). Decoding the valid set once per
candidate alpha with the final weights is cheap next to training, so
``train.tune_length_penalty`` does it and stores the winner in best.pt, where `translate`
and `eval-bleu` read their default from.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..evaluate import bleu


def pick_length_penalty(translate: Callable[[float], list[str]], refs: Sequence[str],
                        alphas: Sequence[float]) -> tuple[float, dict[float, float]]:
    """(the alpha with the highest BLEU of ``translate(alpha)`` against ``refs``, every alpha's
    BLEU). Ties go to the alpha listed first, so list the default first."""
    scores = {alpha: bleu(translate(alpha), refs).score for alpha in alphas}
    return max(alphas, key=scores.__getitem__), scores  # max keeps the first of equals
