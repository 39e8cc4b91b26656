"""Corpus-level scores through sacrebleu, always with their signatures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from sacrebleu.metrics import BLEU, CHRF

from xformer_cli.data.sources import read_lines
from xformer_cli.errors import XformerError


@dataclass
class Score:
    name: str
    score: float
    signature: str
    text: str  # sacrebleu's own one-line rendering

    def to_dict(self) -> dict:
        return {"name": self.name, "score": self.score, "signature": self.signature, "text": self.text}


def _score(metric, hyps: Sequence[str], refs: Sequence[str]) -> Score:
    result = metric.corpus_score(list(hyps), [list(refs)])
    return Score(result.name, float(result.score), str(metric.get_signature()), str(result))


def bleu(hyps: Sequence[str], refs: Sequence[str]) -> Score:
    return _score(BLEU(), hyps, refs)


def chrf(hyps: Sequence[str], refs: Sequence[str]) -> Score:
    return _score(CHRF(), hyps, refs)


def score_files(hyp_path: str | Path, ref_path: str | Path) -> list[Score]:
    hyps = list(read_lines(Path(hyp_path)))
    refs = list(read_lines(Path(ref_path)))
    return score_lines(hyps, refs, str(hyp_path), str(ref_path))


def score_lines(hyps: Sequence[str], refs: Sequence[str], hyp_name: str = "hypotheses", ref_name: str = "references") -> list[Score]:
    if len(hyps) != len(refs):
        raise XformerError(f"line counts differ: {hyp_name} has {len(hyps)} lines, {ref_name} has {len(refs)}")
    if not refs:
        raise XformerError(f"{ref_name} is empty")
    return [bleu(hyps, refs), chrf(hyps, refs)]
