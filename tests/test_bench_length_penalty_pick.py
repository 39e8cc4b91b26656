"""scripts/bench_length_penalty_pick.py: the rules it compares and its held-out halves."""

import sys

import numpy as np

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import bench_length_penalty_pick as pick  # noqa: E402


def test_the_quadratic_rule_takes_the_grid_alpha_nearest_the_fitted_top():
    # a parabola peaking at 1.2 with the highest point (noise) at 1.6
    scores = [38.0, 38.9, 38.95, 39.0, 38.2]
    assert pick.ALPHAS[pick.pick_argmax(scores)] == 1.6
    assert pick.ALPHAS[pick.pick_quadratic(scores)] == 1.3
    assert pick.pick_quadratic([39.0, 38.0, 37.5, 38.0, 39.5]) == pick.pick_argmax([39.0, 38.0, 37.5, 38.0, 39.5])


def test_held_out_halves_score_the_alpha_picked_on_the_other_half():
    refs = [f"ein Hund läuft über die Wiese Nummer {i} ." for i in range(40)]
    good = pick.sentence_stats(refs, refs)
    worse = pick.sentence_stats([r.replace("Hund", "Mann") for r in refs], refs)
    stats = [worse, worse, good, worse, worse]  # 1.3 is best on every line
    result = pick.held_out(stats, splits=5, seed=0)
    assert result["argmax"] == result["oracle"] and np.allclose(result["argmax"], 100.0)
    assert pick.corpus_bleu(worse) < 100.0
