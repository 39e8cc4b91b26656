"""One table of every model of the pipeline on valid and test: BLEU, chrF2, number accuracy,
sentences/s and target tokens/s on this machine with the same threads for each, model size.
Each model at each beam size is one row (a student is meant to be read greedy, its teacher
with a beam)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, Union

from xformer_cli.data.sources import ParallelCorpus

if TYPE_CHECKING:
    from xformer_cli.config import DataConfig


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


@dataclass
class _Measured:
    """One row in the making: a model's engine for one search on one split, its output and its
    fastest timed pass so far."""

    name: str
    path: str  # the model's files (an ensemble's, comma-separated)
    engine: Any
    label: str
    beam: int
    split: str
    corpus: ParallelCorpus
    size_mb: float
    found: list = field(default_factory=list)
    seconds: float = float("inf")

    def warm(self) -> None:
        """First-call allocations outside the clock."""
        self.engine.search(self.corpus.src[:8], self.engine.options(beam_size=self.beam))

    def timed_pass(self) -> None:
        opts = self.engine.options(beam_size=self.beam)
        started = time.perf_counter()
        self.found = self.engine.search(self.corpus.src, opts)  # the same output each pass
        self.seconds = min(self.seconds, max(time.perf_counter() - started, 1e-9))

    def row(self, langs: tuple[str, str]) -> Row:
        from xformer_cli.evaluate import score_lines
        from xformer_cli.number_matching import number_accuracy

        outputs = [self.engine.detokenize(hyps[0]) if hyps else "" for hyps in self.found]
        tokens = sum(len(hyps[0].tokens) + 1 for hyps in self.found if hyps)  # eos counted, as training counts it
        bleu, chrf = score_lines(outputs, [self.corpus.tgt], ("bleu", "chrf"), allow_empty=True)
        numbers = number_accuracy(self.corpus.src, outputs, langs[0], langs[1])
        return Row(self.name, self.split, self.beam, self.label, round(bleu.score, 2), round(chrf.score, 2),
                   round(100 * numbers.share, 2), round(len(self.corpus.src) / self.seconds, 1),
                   round(tokens / self.seconds, 1), self.size_mb, self.path)


ModelPaths = Union[Path, Sequence[Path]]  # a checkpoint or an export directory, or several checkpoints: an ensemble


def score_models(models: Sequence[tuple[str, ModelPaths]], sets: dict[str, ParallelCorpus], beam_sizes: Sequence[int],
                 threads: int, langs: tuple[str, str], log: Callable[[str], None],
                 timed_passes: int = 1) -> list[Row]:
    """Every model at every beam size on every split, on the engine ``xformer translate`` picks
    for that search (a beam asks for xformer's beam search, as translate does). A row's speed is
    the fastest of ``timed_passes`` passes, taken in turns (every row's first pass, then every
    row's second): a slow spell of a shared machine then falls on every model alike, not on
    whichever was running in it, so the speeds compare. Every row's engine is held until the
    last pass: the memory of all the models' engines at once. A model given as several
    checkpoints is their ensemble (its size: all of them)."""
    measured = [m for name, path in models for m in _measured(name, path, sets, beam_sizes, threads)]
    for m in measured:
        m.warm()
    passes = max(timed_passes, 1)
    for done in range(passes):
        log(f"evaluate: timed pass {done + 1} of {passes} over {len(measured)} rows")
        for m in measured:
            m.timed_pass()
    rows = [m.row(langs) for m in measured]
    for row in rows:
        log(f"evaluate: {row.model} beam {row.beam_size} {row.split}: BLEU {row.bleu:.2f}, chrF2 {row.chrf:.2f}, "
            f"numbers {row.numbers:.1f}%, {row.sentences_per_s:.1f} sentences/s")
    return rows


def _measured(name: str, model: ModelPaths, sets: dict[str, ParallelCorpus], beam_sizes: Sequence[int],
              threads: int) -> list[_Measured]:
    """One model's rows, with one engine per kind of search (greedy or beam), loaded once."""
    from xformer_cli.decode.factory import load_engine

    paths = [Path(model)] if isinstance(model, (str, Path)) else [Path(p) for p in model]
    shown = ", ".join(map(str, paths))
    engines: dict[bool, tuple] = {}
    size = round(sum(model_size_mb(path) for path in paths), 2)
    found = []
    for beam in beam_sizes:
        if (beam > 1) not in engines:
            said: list[str] = []
            engine = load_engine(paths, threads=threads, needs=("beam_search",) if beam > 1 else (), log=said.append)
            engines[beam > 1] = engine, _engine_label(said, engine, len(paths))
        engine, label = engines[beam > 1]
        found.extend(_Measured(name, shown, engine, label, beam, split, corpus, size) for split, corpus in sets.items())
    return found


def _engine_label(said: list[str], engine, models: int = 1) -> str:
    """"ctranslate2 int8 on cpu" out of the factory's line ("precision: auto -> ... (why), N
    threads"), with the compute type an export's "default" turned out to be (and ", shortlist"
    where the export's shortlist restricts the search, ", ensemble of N" for several models)."""
    label = engine.name
    if said:
        label = said[0].split("->", 1)[-1].split("(")[0].split(",")[0].strip()
        label = label.replace(" default ", f" {getattr(engine, 'precision', 'default')} ")
        device = getattr(engine, "device", None)
        if engine.name == "ctranslate2" and device:  # where it runs (the CPU where the GPU it was given failed)
            label = f"{label.rsplit(' on ', 1)[0]} on {device}"
    label += ", shortlist" if getattr(engine, "shortlist", False) else ""
    return label + (f", ensemble of {models}" if models > 1 else "")


def table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table (what `xformer pipeline` prints and docs/pipeline.md shows)."""
    head = "| model | split | beam | engine | BLEU | chrF2 | numbers % | sentences/s | target tokens/s | MB |"
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r.model} | {r.split} | {r.beam_size} | {r.engine} | {r.bleu:.2f} | {r.chrf:.2f} | "
                     f"{r.numbers:.1f} | {r.sentences_per_s:.1f} | {r.target_tokens_per_s:.0f} | {r.size_mb:.1f} |")
    return "\n".join(lines)


def split_sets(data: DataConfig, splits: Sequence[str], config_path: str, log: Callable[[str], None],
               max_lines: int = 0) -> dict[str, ParallelCorpus]:
    """The config's valid and/or test set (``data``: its DataConfig), each cut to ``max_lines``;
    a split the config has no set for is one line naming its key."""
    from xformer_cli.data.directions import eval_sets
    from xformer_cli.errors import XformerError

    sets = {}
    for split in splits:
        found = eval_sets(data, split, log)
        if not found:
            raise XformerError(f"config key 'data.{split}' of {config_path}: no {split} set to evaluate on")
        sets[split] = cut(next(iter(found.values())), max_lines)
    return sets


def cut(corpus: ParallelCorpus, max_lines: int) -> ParallelCorpus:
    if not max_lines:
        return corpus
    return dataclasses.replace(corpus, src=corpus.src[:max_lines], tgt=corpus.tgt[:max_lines])

