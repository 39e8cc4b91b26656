"""Scores people can trust: sacreBLEU's BLEU, chrF and TER, always with their signatures.

Everything numeric is sacrebleu's own computation; this module picks the metrics, scores
lines it is given (``cli/scoring.py`` reads the files), checks that the hypotheses look like
detokenized text, and runs sacrebleu's bootstrap confidence intervals and paired significance tests.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric
from sacrebleu.significance import PairedTest

from xformer_cli.errors import XformerError

METRIC_NAMES = ("bleu", "chrf", "ter")
DEFAULT_METRICS = ("bleu", "chrf")


@dataclass
class Score:
    name: str  # sacrebleu's name: BLEU, chrF2, TER
    score: float
    signature: str
    text: str  # sacrebleu's own one-line rendering
    mean: Optional[float] = None  # bootstrap mean (with confidence intervals)
    ci: Optional[float] = None  # half-width of the 95% interval
    p_value: Optional[float] = None  # paired test against the baseline
    length_ratio: Optional[float] = None  # BLEU: the hypotheses' length over the references' (its brevity penalty's)

    def to_dict(self) -> dict:
        out = {"score": round(self.score, 4), "signature": self.signature}
        for key in ("mean", "ci", "p_value"):
            value = getattr(self, key)
            if value is not None:
                out[key] = round(float(value), 4)
        return out


def make_metrics(names: Sequence[str] = DEFAULT_METRICS, lowercase: bool = False,
                 tokenize: Optional[str] = None) -> dict[str, Metric]:
    """``--lowercase`` applies to BLEU and chrF, ``--tokenize`` to BLEU; TER keeps sacrebleu's defaults."""
    metrics: dict[str, Metric] = {}
    for name in names:
        key = name.strip().lower()
        if key == "bleu":
            if tokenize is not None and tokenize not in BLEU.TOKENIZERS:
                raise XformerError(f"unknown BLEU tokenizer '{tokenize}' (choose from {', '.join(BLEU.TOKENIZERS)})")
            try:
                metrics["BLEU"] = BLEU(lowercase=lowercase, tokenize=tokenize)
            except (ImportError, RuntimeError, OSError) as exc:  # an extra not installed, a model not downloadable
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise XformerError(f"--tokenize {tokenize}: sacreBLEU cannot set it up here ({reason})") from None
        elif key == "chrf":
            metrics["chrF2"] = CHRF(lowercase=lowercase)
        elif key == "ter":
            metrics["TER"] = TER()
        else:
            raise XformerError(f"unknown metric '{name}' (choose from {', '.join(METRIC_NAMES)})")
    if not metrics:
        raise XformerError("no metric chosen")
    return metrics


def check_line_counts(hyps: Sequence[str], refs: Sequence[Sequence[str]], hyp_name: str, ref_names: Sequence[str],
                      allow_empty: bool = False) -> None:
    """Each reference as long as ``hyps`` (and ``hyps`` not empty unless ``allow_empty``), else one
    line naming both: before scoring, and before eval-bleu translates a source."""
    if not allow_empty and (not hyps or all(not h.strip() for h in hyps)):
        raise XformerError(f"{hyp_name} is empty")
    for ref, name in zip(refs, ref_names):
        if len(ref) != len(hyps):
            raise XformerError(f"line counts differ: {hyp_name} has {len(hyps)} lines, {name} has {len(ref)}")


def score_lines(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str] = DEFAULT_METRICS,
    lowercase: bool = False,
    tokenize: Optional[str] = None,
    bootstrap: int = 0,
    hyp_name: str = "hypotheses",
    ref_names: Optional[Sequence[str]] = None,
    allow_empty: bool = False,
) -> list[Score]:
    """Score one system against one or more reference streams (each as long as ``hyps``).
    An all-empty hypothesis file is an error unless ``allow_empty`` (a model early in training)."""
    ref_names = ref_names or [f"references {i + 1}" for i in range(len(refs))]
    check_line_counts(hyps, refs, hyp_name, ref_names, allow_empty)
    scores = []
    for name, metric in make_metrics(metrics, lowercase, tokenize).items():
        result = metric.corpus_score(list(hyps), [list(r) for r in refs], n_bootstrap=max(bootstrap, 1))
        mean = getattr(result, "_mean", None) if bootstrap > 1 else None
        ci = getattr(result, "_ci", None) if bootstrap > 1 else None
        signature = str(metric.get_signature())
        ratio = result.sys_len / result.ref_len if getattr(result, "ref_len", 0) else None
        scores.append(Score(result.name, float(result.score), signature, str(result), mean, ci, length_ratio=ratio))
    return scores


def bleu(hyps: Sequence[str], refs: Sequence[str]) -> Score:
    """Default sacreBLEU on detokenized text: what validation logs and eval-bleu print."""
    return score_lines(hyps, [refs], ("bleu",), allow_empty=True)[0]


DEFAULT_SAMPLES = {"bs": 1000, "ar": 10000}  # sacreBLEU's resamples (bootstrap) and trials (randomisation)


def compare_systems(
    systems: Sequence[tuple[str, Sequence[str]]],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str] = DEFAULT_METRICS,
    lowercase: bool = False,
    tokenize: Optional[str] = None,
    test: str = "bs",
    samples: int = 0,
    ref_names: Optional[Sequence[str]] = None,
) -> tuple[list[list[Score]], dict[str, str]]:
    """Paired significance of every system against the first (the baseline).

    ``test`` is sacrebleu's paired bootstrap ("bs", 1000 resamples by default, with 95%
    intervals) or approximate randomisation ("ar", 10000 trials). Returns, per system, a
    score per metric (p-values on all but the baseline) and the signatures by metric.
    """
    if test not in ("bs", "ar"):
        raise XformerError(f"unknown paired test '{test}' (bs = paired bootstrap, ar = approximate randomisation)")
    if len(systems) < 2:
        raise XformerError("a paired test needs at least two systems (the first is the baseline)")
    if samples < 0 or samples == 1:  # sacreBLEU takes a negative for its default, one trial for a p-value of 0.5
        raise XformerError(f"the paired test's resamples (--samples) are 0 (sacreBLEU's default: "
                           f"{DEFAULT_SAMPLES[test]}) or at least 2, not {samples}")
    ref_names = ref_names or [f"references {i + 1}" for i in range(len(refs))]
    for name, hyps in systems:
        check_line_counts(hyps, refs, name, ref_names)
    chosen = make_metrics(metrics, lowercase, tokenize)
    paired = PairedTest([(n, list(h)) for n, h in systems], chosen, [list(r) for r in refs], test_type=test,
                        n_samples=samples)
    with _p_values_counting_ties():
        signatures, table = paired()
    rows: list[list[Score]] = []
    baseline = list(systems[0][1])
    for i, (_, hyps) in enumerate(systems):
        # Output equal to the baseline's line for line differs in nothing: p = 1. sacreBLEU counts
        # only resamples that beat the observed difference, none when it is 0, and says p = 0.001.
        same = i > 0 and list(hyps) == baseline
        row = []
        for metric_name in chosen:
            result = table[metric_name][i]
            row.append(Score(metric_name, float(result.score), str(signatures[metric_name]), "",
                             result.mean, result.ci, 1.0 if same else result.p_value))
        rows.append(row)
    return rows, {k: str(v) for k, v in signatures.items()}


@contextlib.contextmanager
def _p_values_counting_ties() -> Iterator[None]:
    """sacreBLEU's p-value counts the resamples whose statistic is strictly above the observed
    one (multeval's rule). Two systems that differ in a few lines give every randomisation trial
    exactly the observed difference (or none): none counted, p = 1/(N+1), 'significant'. The
    test's own definition (Noreen 1989; Riezler and Maxwell 2005) counts those at least as large,
    as here; a statistic off by float rounding counts as equal."""
    from sacrebleu import significance

    strict = getattr(significance, "_compute_p_value", None)
    if strict is None:  # another sacreBLEU: its own rule stands
        yield
        return

    def at_least(stats, real_difference: float) -> float:
        import numpy as np

        count = int(np.sum(stats >= real_difference - 1e-9 * max(1.0, abs(real_difference))))
        return (count + 1) / (len(stats) + 1)

    significance._compute_p_value = at_least
    try:
        yield
    finally:
        significance._compute_p_value = strict


_SPACED_PUNCT = re.compile(r"\w \.$| , | ' | n't\b| 's\b|\( | \)")


def hypothesis_warnings(hyps: Sequence[str], name: str) -> list[str]:
    """Signs that a hypothesis file is not detokenized text, which sacreBLEU expects."""
    lines = [h for h in hyps if h.strip()]
    if not lines:
        return []
    warnings = []
    if sum("\u2581" in h for h in lines) > 0.1 * len(lines):
        warnings.append(f"{name} holds sentencepiece pieces ('\u2581'): decode it to plain text before scoring")
    if sum("@@ " in h or h.endswith("@@") for h in lines) > 0.05 * len(lines):
        warnings.append(f"{name} holds BPE joiners ('@@'): remove them before scoring")
    if sum(bool(_SPACED_PUNCT.search(h)) for h in lines) > 0.3 * len(lines):
        warnings.append(f"{name} looks tokenized (spaced punctuation): sacreBLEU expects detokenized text")
    unk = sum("<unk>" in h for h in lines)
    if unk:
        warnings.append(f"{name}: {unk} lines hold <unk>")
    return warnings
