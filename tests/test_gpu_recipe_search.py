"""scripts/gpu_recipe_search.py, the one device call of issue 28's GPU search, rehearsed on a
CPU at tiny sizes: a GPU lease is too short to find a broken script there."""

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT


def _valid_after_pass(metrics) -> float:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return max([r for r in rows if "length_penalty" in r][-1]["length_penalty_valid_bleu"].values())


@pytest.mark.slow
def test_the_search_trains_its_variants_at_once_and_scores_test_for_the_one_chosen_on_valid(small_corpus, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "multi30k").symlink_to(small_corpus)
    out, runs, names = tmp_path / "out", tmp_path / "runs", ["w256-l3-cpu-lr", "w256-l6"]
    proc = subprocess.run([sys.executable, "scripts/gpu_recipe_search.py", "--out", str(out), "--runs", str(runs),
                           "--quick", "--device", "cpu", "--minutes", "0.1", "--only", *names],
                          cwd=ROOT, env={**os.environ, "XFORMER_DATA": str(data)}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    table = (out / "search.txt").read_text()
    scores = {name: _valid_after_pass(out / f"{name}.metrics.jsonl") for name in names}
    chosen = max(names, key=lambda name: scores[name])
    assert f"chosen on valid: {chosen} (valid {scores[chosen]:.2f}" in table
    assert "BLEU = " in table and "chrF2 = " in table
    hypotheses = (out / "test2016.hyp.de").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == len((small_corpus / "test2016.en").read_text(encoding="utf-8").splitlines())
