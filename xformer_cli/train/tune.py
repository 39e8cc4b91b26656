"""The length penalty, chosen on the validation set after training.

GNMT's penalty ``((5 + |Y|) / 6) ** alpha`` decides how long beam search's outputs are. The
paper's alpha = 0.6 was tuned for WMT14 and a big model; a small model trained for minutes
writes shorter sentences, and on Multi30k the valid set favours a larger alpha (figures:
docs/benchmarks/training-recipe.md, "The length penalty, chosen on valid"). Decoding the valid set once per
candidate alpha with the final weights is cheap next to training, so
``train.tune_length_penalty`` does it and stores the winner in best.pt, where `translate`
and `eval-bleu` read their default from.

A multilingual model decodes every direction's valid set at each alpha. The shared alpha is
the one with the highest mean BLEU over the directions (decode.length_penalty); with
``train.length_penalty_by_target`` each target language also gets its own, the one with the
highest mean BLEU over the directions into it (decode.length_penalty_by_target).
"""

from __future__ import annotations

import statistics
from typing import Mapping, Sequence


def best_alpha(scores: Mapping[float, Mapping[tuple[str, str], float]], directions: Sequence[tuple[str, str]]) -> float:
    """The alpha (key of ``scores``: alpha -> direction -> BLEU) with the highest mean BLEU over
    ``directions``; a tie goes to the smallest alpha, whatever the order the alphas are listed
    in: a larger alpha favours longer outputs, which the tie does not pay for."""
    alphas = sorted(scores)
    mean = {alpha: statistics.fmean(scores[alpha][d] for d in directions) for alpha in alphas}
    return max(alphas, key=mean.__getitem__)  # max keeps the first (smallest) of equals


def alphas_by_target(scores: Mapping[float, Mapping[tuple[str, str], float]]) -> dict[str, float]:
    """Each target language's alpha: the highest mean BLEU over the directions into it."""
    directions = list(next(iter(scores.values())))
    targets = list(dict.fromkeys(target for _, target in directions))
    return {target: best_alpha(scores, [d for d in directions if d[1] == target]) for target in targets}
