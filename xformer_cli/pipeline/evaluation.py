"""One table of every model of the pipeline on valid and test: BLEU, chrF2, number accuracy,
sentences/s and target tokens/s on this machine with the same threads for each, model size.
Each model at each beam size is one row (a student is meant to be read greedy, its teacher
with a beam)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from xformer_cli.data.sources import ParallelCorpus


@dataclass
class Row:
    model: str
    split: str
    beam_size: int
    engine: str
    bleu: float
    chrf: float
    numbers: float  # % of the source's numbers kept (eval-bleu's number accuracy)
    sentences_per_s: float
    target_tokens_per_s: float
    size_mb: float
    path: str

    def to_dict(self) -> dict:
        return asdict(self)


def model_size_mb(path: Path) -> float:
    """What the model weighs as deployed: a CTranslate2 directory's model.bin, or a
    checkpoint's weights (without an optimizer state it may carry)."""
    if path.is_dir():
        return (path / "model.bin").stat().st_size / 2**20
    from xformer_cli.checkpoint_file import load_checkpoint

    state = load_checkpoint(path)
    return sum(t.numel() * t.element_size() for t in state["model"].values()) / 2**20


def score_model(name: str, path: Path, sets: dict[str, ParallelCorpus], beam_sizes: Sequence[int], threads: int,
                langs: tuple[str, str], log: Callable[[str], None], timed_passes: int = 1) -> list[Row]:
    """Every split at every beam size for one model, on the engine ``xformer translate`` picks for
    that search (a beam asks for xformer's beam search, as translate does); the speeds are the
    fastest of ``timed_passes`` passes."""
    from xformer_cli.decode.factory import load_engine

    engines: dict[bool, tuple] = {}
    size = round(model_size_mb(path), 2)
    rows = []
    for beam in beam_sizes:
        if (beam > 1) not in engines:
            said: list[str] = []
            engine = load_engine([path], threads=threads, needs=("beam_search",) if beam > 1 else (), log=said.append)
            engines[beam > 1] = engine, _engine_label(said, engine)
        engine, label = engines[beam > 1]
        for split, corpus in sets.items():
            row = _score(engine, corpus, beam, langs, timed_passes)
            rows.append(Row(name, split, beam, label, *row, size, str(path)))
            log(f"evaluate: {name} beam {beam} {split}: BLEU {row[0]:.2f}, chrF2 {row[1]:.2f}, numbers {row[2]:.1f}%, "
                f"{row[3]:.1f} sentences/s")
    return rows


def _engine_label(said: list[str], engine) -> str:
    """"ctranslate2 int8 on cpu" out of the factory's line ("precision: auto -> ... (why), N
    threads"), with the compute type an export's "default" turned out to be."""
    if not said:
        return engine.name
    label = said[0].split("->", 1)[-1].split("(")[0].split(",")[0].strip()
    return label.replace(" default ", f" {getattr(engine, 'precision', 'default')} ")


def _score(engine, corpus: ParallelCorpus, beam: int, langs: tuple[str, str], passes: int = 1) -> tuple[float, ...]:
    from xformer_cli.evaluate import score_lines
    from xformer_cli.number_matching import number_accuracy

    opts = engine.options(beam_size=beam)
    engine.search(corpus.src[:8], opts)  # warm the engine (first-call allocations) outside the clock
    seconds = float("inf")
    for _ in range(max(passes, 1)):  # the same output each pass; the fastest is the engine's speed
        started = time.perf_counter()
        found = engine.search(corpus.src, opts)
        seconds = min(seconds, max(time.perf_counter() - started, 1e-9))
    outputs = [engine.detokenize(hyps[0]) if hyps else "" for hyps in found]
    tokens = sum(len(hyps[0].tokens) + 1 for hyps in found if hyps)  # eos counted, as training counts it
    bleu, chrf = score_lines(outputs, [corpus.tgt], ("bleu", "chrf"), allow_empty=True)
    numbers = number_accuracy(corpus.src, outputs, langs[0], langs[1])
    return (round(bleu.score, 2), round(chrf.score, 2), round(100 * numbers.share, 2),
            round(len(corpus.src) / seconds, 1), round(tokens / seconds, 1))


def table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table (what `xformer pipeline` prints and docs/pipeline.md shows)."""
    head = "| model | split | beam | engine | BLEU | chrF2 | numbers % | sentences/s | target tokens/s | MB |"
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r.model} | {r.split} | {r.beam_size} | {r.engine} | {r.bleu:.2f} | {r.chrf:.2f} | "
                     f"{r.numbers:.1f} | {r.sentences_per_s:.1f} | {r.target_tokens_per_s:.0f} | {r.size_mb:.1f} |")
    return "\n".join(lines)


def cut(corpus: ParallelCorpus, max_lines: int) -> ParallelCorpus:
    if not max_lines:
        return corpus
    return ParallelCorpus(corpus.src[:max_lines], corpus.tgt[:max_lines], corpus.dropped, corpus.name, corpus.origin)

