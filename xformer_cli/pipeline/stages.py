"""The pipeline's stages, each a call of what xformer already has (``train``'s loop, the engine
factory, the CTranslate2 exporter, sacreBLEU), importable one by one:

    reverse -> backtranslate -> teacher -> distill -> student -> export -> evaluate

A stage has a fingerprint of its inputs (``fingerprint_*``: settings, files, the upstream
stages' finished records) and a body (``run_*``) that writes into <run_dir>/<stage>/ and
returns what its record keeps (the model it made, line counts)."""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from xformer_cli.config import Config
from xformer_cli.errors import XformerError
from xformer_cli.file_stamps import file_stamp
from xformer_cli.pipeline import models
from xformer_cli.pipeline.corpus_translation import CorpusJob, TextLines, numbers_kept, translate_corpus
from xformer_cli.pipeline.record import StageRecord, at_home, fingerprint, from_home, held_fingerprint
from xformer_cli.pipeline.settings import PipelineConfig, TranslateStage

STAGES = ("reverse", "backtranslate", "teacher", "distill", "student", "export", "evaluate")
NEEDS = {"reverse": (), "backtranslate": ("reverse",), "teacher": ("backtranslate",), "distill": ("teacher",),
         "student": ("distill",), "export": ("student",), "evaluate": ("teacher", "student", "export")}


@dataclass
class Pipeline:
    """A pipeline config with its run directory's records, and where its lines go."""

    config: PipelineConfig
    log: Callable[[str], None] = print
    progress: bool = True
    _base: Optional[Config] = field(default=None, repr=False)
    old_stamps: str = ""  # one of earlier_forms.OLD_STAMPS: fingerprints as an earlier version's records hold them
    upstream_form: Optional[str] = None  # the form of the upstream stages' fingerprints, when not old_stamps'
    # Stages whose finished record is read where a redo set it aside: the status, seeing what a run would put back.
    read_aside: frozenset[str] = frozenset()

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run_dir)

    @property
    def base(self) -> Config:
        if self._base is None:
            self._base = models.base_config(self.config)
        return self._base

    @property
    def langs(self) -> tuple[str, str]:
        return self.base.data.src_lang, self.base.data.tgt_lang

    def stamp(self, *parts: Any) -> str:
        """The fingerprint of a stage's inputs, the run folder's own paths hashed as <run_dir>/...:
        a run folder moved or copied elsewhere keeps its finished stages."""
        return fingerprint(*parts, home=None if self.old_stamps == "absolute" else self.run_dir)

    @property
    def every_file(self) -> bool:
        """Whether fingerprints stamp every file a stage reads (valid sets, data files, saved
        datasets), as now, or the training corpora's text files alone, as the earlier forms did."""
        return not self.old_stamps

    def config_stamp(self, config: Config) -> dict:
        """A training stage's config and the files it reads, in this pipeline's form."""
        return models.config_stamp(config, self.run_dir, self.every_file)

    def kept(self, path: Path | str) -> str:
        """A path as the records keep it (<run_dir>/... for the run's own files)."""
        return at_home(path, self.run_dir)

    def path(self, kept: str) -> Path:
        return from_home(kept, self.run_dir)

    def record(self, stage: str) -> StageRecord:
        return StageRecord(stage, self.run_dir / stage)

    def finished(self, stage: str) -> dict:
        """A needed stage's finished record, or one line saying to run it first."""
        record = self.record(stage)
        record = (StageRecord(stage, record.replaced) if stage in self.read_aside else record).read()
        if not record or not record.get("done"):
            raise XformerError(f"pipeline stage {stage} has not finished in {self.run_dir}: run it first "
                               f"(xformer pipeline -c CONFIG --only {stage}, or without --only)")
        return record

    def upstream(self, stage: str) -> dict[str, str]:
        """The needed stages' identities: fingerprint and when it finished (a stage done over
        with the same inputs still makes the stages after it stale)."""
        form = self.old_stamps if self.upstream_form is None else self.upstream_form
        return {need: f"{held_fingerprint(rec, form)}@{rec.get('finished', '')}"
                for need in NEEDS[stage] for rec in [self.finished(need)]}

    def model(self, stage: str) -> Path:
        return self.path(self.finished(stage)["model"])


# -- reverse -------------------------------------------------------------------------------

def reverse_config(pipe: Pipeline) -> Config:
    return models.stage_config(pipe.config, "reverse", pipe.config.reverse.set, models.swapped(pipe.base))


def fingerprint_reverse(pipe: Pipeline) -> str:
    given = pipe.config.reverse.checkpoint
    if given:  # checked here, before the stage says it starts
        check_direction(Path(given), (pipe.langs[1], pipe.langs[0]), "reverse.checkpoint")
        return pipe.stamp("reverse", model_stamp(given), pipe.langs)
    return pipe.stamp("reverse", pipe.config_stamp(reverse_config(pipe)))


def run_reverse(pipe: Pipeline) -> dict:
    given = pipe.config.reverse.checkpoint
    if given:
        return {"model": pipe.kept(given)}
    return _train(pipe, reverse_config(pipe))


def model_stamp(path: "str | Path") -> "str | list[str]":
    """A given model's stamp: a checkpoint file's, or every file's of an export directory."""
    if Path(path).is_dir():
        return [file_stamp(f) for f in sorted(Path(path).rglob("*")) if f.is_file()]
    return file_stamp(path)


def check_direction(path: Path, wanted: tuple[str, str], key: str) -> None:
    from xformer_cli.decode.direction import model_languages

    languages = model_languages(path)
    if languages is not None and not languages.trained(*wanted):
        raise XformerError(f"config key '{key}': {path} translates {languages.describe()}, "
                           f"not {wanted[0]}->{wanted[1]}")


def _train(pipe: Pipeline, config: Config) -> dict:
    from xformer_cli.train.trainer import train

    models.follow_a_moved_run(Path(config.run_dir), pipe.run_dir, pipe.log)
    result = train(config, overwrite=False, log=pipe.log, progress=pipe.progress)
    if result.stopped_because == "interrupted":
        raise KeyboardInterrupt
    return {"model": pipe.kept(models.trained_model(Path(config.run_dir))), "steps": result.steps,
            "best_valid_bleu": result.best_bleu}


# -- backtranslate ---------------------------------------------------------------------------

def _mono(pipe: Pipeline, side: str) -> TextLines:
    mono = pipe.config.mono
    path = getattr(mono, side)
    if not path:
        raise XformerError(f"config key 'mono.{side}': the {side}-language text this stage translates")
    return TextLines(Path(path), mono.skip_invalid_utf8, mono.max_lines)


# Settings a translating stage gained after runs had recorded it, with their defaults: left out of
# its fingerprint at the default, so that a finished stage stays finished when xformer is upgraded.
ADDED_LATER = {"batch_size": 0, "max_tokens": 0, "real_targets": False}


def stage_settings(stage: TranslateStage) -> dict:
    """A translating stage's settings as its fingerprint hashes them."""
    return {key: value for key, value in asdict(stage).items() if ADDED_LATER.get(key, object()) != value}


def fingerprint_backtranslate(pipe: Pipeline) -> str:
    mono = _mono(pipe, "target")
    real = ([models.corpora_stamp(pipe.base, pipe.run_dir, pipe.every_file)]
            if pipe.config.backtranslate.real_targets else [])
    return pipe.stamp("backtranslate", stage_settings(pipe.config.backtranslate), file_stamp(mono.path), mono.max_lines,
                      mono.skip_invalid, pipe.upstream("backtranslate"), *real)


REAL_TARGETS = "real-targets"  # <run_dir>/backtranslate/real-targets.{src,tgt}: the real targets back-translated


def run_backtranslate(pipe: Pipeline) -> dict:
    src, tgt = pipe.langs
    s = pipe.config.backtranslate
    lines = _mono(pipe, "target")
    read = file_stamp(lines.path)  # as it was before the reading: unusable_named_file trusts this one
    folder = pipe.record("backtranslate").directory
    job = CorpusJob(lines, *translation_files(pipe, "backtranslate"), _total(lines), s.chunk_lines,
                    pipe.base.train.seed)
    translate = _translator(pipe, [pipe.model("reverse")], s)
    written = translate(job)
    record = {"lines": written, "dropped": dict(lines.dropped), "prefix": pipe.kept(folder / "synthetic"),
              "numbers": _numbers(pipe, job, tgt, src), "mono_read": read}
    if s.real_targets:
        targets, total = _training_side(pipe, 1)
        job = CorpusJob(targets, *real_target_files(pipe), total, s.chunk_lines, pipe.base.train.seed)
        pipe.log("backtranslate: the real pairs' target side")
        record["real_targets"] = {"lines": translate(job), "prefix": pipe.kept(folder / REAL_TARGETS)}
    return record


def _total(lines: TextLines) -> int:
    from xformer_cli.textio import count_lines

    total = count_lines(lines.path)
    return min(total, lines.max_lines) if lines.max_lines else total


def stage_threads(pipe: Pipeline, asked: int = 0) -> int:
    """Threads for a stage that translates: ``asked``, else the config's ``threads``, else what
    training uses (torch's, every core). The pipeline runs alone, as train does, with OpenMP's
    default waits, so decode.factory's one-core-fewer rule for spinning threads does not apply."""
    import torch

    return asked or pipe.config.threads or torch.get_num_threads()


def _translate(pipe: Pipeline, checkpoints: list[Path], s: TranslateStage, job: CorpusJob) -> int:
    return _translator(pipe, checkpoints, s)(job)


def engine_needs(s: TranslateStage) -> tuple[str, ...]:
    """What a translating stage asks of its engine (the engine factory's ``needs``)."""
    return ("sampling_topk", "seed") if s.sampling_topk else ()


def _translator(pipe: Pipeline, checkpoints: list[Path], s: TranslateStage) -> Callable[[CorpusJob], int]:
    """The stage's engine, loaded once, as a function that translates a job (resuming it) and
    returns its line count: a stage with two jobs (backtranslate.real_targets) loads one engine."""
    from xformer_cli.decode.factory import load_engine

    sampling = bool(s.sampling_topk)
    engine = load_engine(checkpoints, engine=s.engine, precision=s.precision, threads=stage_threads(pipe),
                         needs=engine_needs(s), log=pipe.log)
    opts = dict(beam_size=s.beam_size, sampling_topk=s.sampling_topk or None,
                temperature=s.temperature if sampling else None, batch_size=s.batch_size or None,
                max_tokens=s.max_tokens or None)
    engine.options(**opts)  # bad options refused before any line is read

    def run(job: CorpusJob) -> int:
        def translate(chunk: list[str], index: int) -> list[str]:  # lines cut to the input length: said below
            return engine.translate_lines(chunk, engine.options(seed=job.seed + index if sampling else None, **opts))

        cut_before = engine.truncated_lines
        lines = translate_corpus(job, translate, pipe.log, pipe.progress)
        cut = engine.truncated_lines - cut_before
        if cut:  # each line is one model input: a longer one is translated as far as the model reads
            limit = engine.input_limit()
            pipe.log(f"{job.outputs_path.name}: {cut} line(s) longer than the model's input length ({limit} pieces) "
                     "translated cut to it (data.max_len drops such pairs from training)")
        return lines

    return run


def _numbers(pipe: Pipeline, job: CorpusJob, src_lang: str, tgt_lang: str) -> dict:
    """The source numbers the translations kept, said in a line and kept in the record."""
    kept = numbers_kept(job, src_lang, tgt_lang)
    hint = " (data.drop_number_mismatch: true drops the pairs that lost one)" if kept.kept < kept.total else ""
    pipe.log(f"{job.outputs_path.name}: {kept.text}{hint}")
    return kept.to_dict()


# -- teacher ---------------------------------------------------------------------------------

def teacher_configs(pipe: Pipeline) -> list[Config]:
    """One training config per teacher (``teacher.seeds``): the first in <run_dir>/teacher as a
    single teacher always was, each other in <run_dir>/teacher/seed-<seed> on the first's
    tokenizer (an ensemble needs one vocabulary)."""
    t = pipe.config.teacher
    folder = pipe.record("teacher").directory
    made = pipe.record("backtranslate").directory
    synthetic = [{"prefix": made / "synthetic", "weight": t.synthetic_weight}]
    if pipe.config.backtranslate.real_targets:  # one new source for each real pair an epoch, as the pair itself
        synthetic.append({"prefix": made / REAL_TARGETS, "weight": 1.0})
    data = models.with_corpora(True, *({**corpus, "tag": t.tag, "until": t.synthetic_until} for corpus in synthetic))
    seeds = t.seeds or [None]
    first = models.stage_config(pipe.config, "teacher", _seeded(t.set, seeds[0]), data)
    shared = _tokenizer_of(first)
    return [first] + [models.stage_config(pipe.config, "teacher", {**_seeded(t.set, seed), **shared}, data,
                                          folder=folder / f"seed-{seed}") for seed in seeds[1:]]


def teacher_config(pipe: Pipeline) -> Config:
    """The (first) teacher's training config."""
    return teacher_configs(pipe)[0]


def _seeded(stage_set: dict[str, Any], seed: Optional[int]) -> dict[str, Any]:
    return stage_set if seed is None else {**stage_set, "train.seed": seed}


def _tokenizer_of(config: Config) -> dict[str, Any]:
    """The overrides that make another run read ``config``'s tokenizer (the one it trains or reuses)."""
    tc = config.tokenizer
    if config.train.init_from or tc.model:
        return {}  # every run reads the same given one (the pretrained model's, or tokenizer.model)
    saved = Path(config.run_dir) / "tokenizer"
    if tc.joint:
        return {"tokenizer.model": str(saved / "joint.model")}
    return {"tokenizer.model": str(saved / "src.model"), "tokenizer.tgt_model": str(saved / "tgt.model")}


def fingerprint_teacher(pipe: Pipeline) -> str:
    first, *others = [pipe.config_stamp(config) for config in teacher_configs(pipe)]
    # a single teacher's fingerprint as before teacher.seeds: its finished stage stays finished
    return pipe.stamp("teacher", first, pipe.upstream("teacher"), *([others] if others else []))


TEACHER_DONE = "teacher-done.json"  # in a teacher's run_dir: it finished (the stage folder goes whole on a redo)


def run_teacher(pipe: Pipeline) -> dict:
    """Each teacher in turn. One that finished before a kill is not trained again: a run
    stopped by its clock would take a step more and tune its length penalty again."""
    from xformer_cli.fileio import atomic_file

    configs = teacher_configs(pipe)
    trained = []
    for number, config in enumerate(configs, 1):
        done = Path(config.run_dir) / TEACHER_DONE
        if done.is_file():
            # Its model named where the run lies now (one written before run folders could move
            # names it by absolute path, perhaps in the folder this one was copied from).
            trained.append({**json.loads(done.read_text(encoding="utf-8")),
                            "model": pipe.kept(models.trained_model(Path(config.run_dir)))})
            pipe.log(f"teacher {number} of {len(configs)} (seed {config.train.seed}): finished before, kept")
            continue
        if len(configs) > 1:
            pipe.log(f"teacher {number} of {len(configs)} (seed {config.train.seed}) in {config.run_dir}")
        trained.append(_train(pipe, config))
        done.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(done, "w", encoding="utf-8") as f:
            json.dump(trained[-1], f)
    return {**trained[0], "models": [t["model"] for t in trained], "teachers": trained}


# -- distill ---------------------------------------------------------------------------------

def _teacher_models(pipe: Pipeline) -> list[Path]:
    """Every model the teacher stage trained, in the order of its seeds (a record from before
    teacher.seeds holds one)."""
    record = pipe.finished("teacher")
    return [pipe.path(m) for m in record.get("models", [record["model"]])]


def _teachers(pipe: Pipeline) -> list[Path]:
    """distill.teachers as checkpoints: "teacher" is every model of the teacher stage."""
    found: list[Path] = []
    for name in pipe.config.distill.teachers:
        if name == "teacher":
            found.extend(_teacher_models(pipe))
        else:
            found.append(Path(name))
    return found


def fingerprint_distill(pipe: Pipeline) -> str:
    d = pipe.config.distill
    given = [model_stamp(name) for name in d.teachers if name != "teacher"]
    mono = [file_stamp(_mono(pipe, "source").path), pipe.config.mono.max_lines] if d.mono_source else []
    return pipe.stamp("distill", stage_settings(d), given, mono, pipe.config_stamp(pipe.base),
                      pipe.upstream("distill"))


def _training_side(pipe: Pipeline, side: int) -> tuple[Iterator[str], Optional[int]]:
    """One side (0 source, 1 target) of the real training pairs, as training reads them; and
    about how many lines that is (for the progress bar's ETA; None when a source cannot tell)."""
    from xformer_cli.data.sources import open_sources

    src, tgt = pipe.langs
    sources = open_sources(pipe.base.data.train, src, tgt, "train", pipe.base.data.skip_invalid_utf8)
    counts = [source.line_estimate() for source in sources]
    return (line for source in sources for line in source.side(side)), None if None in counts else sum(counts)


def _distill_sources(pipe: Pipeline, mono: Optional[TextLines]) -> tuple[Iterator[str], Optional[int]]:
    """The real training pairs' source side, then the monolingual source text; and about how
    many lines that is (None when a source cannot tell)."""
    sources, count = _training_side(pipe, 0)
    if mono is None:
        return sources, count
    return itertools.chain(sources, mono), None if count is None else count + _total(mono)


def run_distill(pipe: Pipeline) -> dict:
    src, tgt = pipe.langs
    mono = _mono(pipe, "source") if pipe.config.distill.mono_source else None
    read = file_stamp(mono.path) if mono else None  # as it was before the reading (unusable_named_file)
    folder = pipe.record("distill").directory
    lines, total = _distill_sources(pipe, mono)
    job = CorpusJob(lines, *translation_files(pipe, "distill"),
                    total, pipe.config.distill.chunk_lines, pipe.base.train.seed)
    written = _translate(pipe, _teachers(pipe), pipe.config.distill, job)
    return {"lines": written, "dropped": dict(mono.dropped) if mono else {}, "prefix": pipe.kept(folder / "distilled"),
            "numbers": _numbers(pipe, job, src, tgt), "mono_read": read}


# -- student, export -------------------------------------------------------------------------

def student_config(pipe: Pipeline) -> Config:
    return _budgeted_student(pipe)[0]


def _budgeted_student(pipe: Pipeline) -> tuple[Config, bool]:
    """The student's config, and whether budget_minutes cut its train.max_minutes."""
    s = pipe.config.student
    data = models.with_corpus(pipe.record("distill").directory / "distilled", s.real_pairs)
    config = models.stage_config(pipe.config, "student", s.set, data)
    left = student_minutes_left(pipe)
    if left is None or (config.train.max_minutes and left >= config.train.max_minutes):
        return config, False
    return models.stage_config(pipe.config, "student", {**s.set, "train.max_minutes": left}, data), True


def student_minutes_left(pipe: Pipeline) -> Optional[float]:
    """With budget_minutes: what the finished stages before the student leave of it, less
    reserve_minutes (None without a budget, or before those stages have finished; the
    student's fingerprint then needs them anyway). Their recorded minutes are fixed once they
    finish, so the student's minutes, and its fingerprint, stay the same on every call."""
    budget = pipe.config.budget_minutes
    before = STAGES[:STAGES.index("student")]
    spent = [pipe.record(name).read() or {} for name in before]
    if not budget or not all(r.get("done") and isinstance(r.get("minutes"), (int, float)) for r in spent):
        return None
    left = round(budget - pipe.config.reserve_minutes - sum(r["minutes"] for r in spent), 1)
    if left < 1:
        raise XformerError(f"config key 'budget_minutes': the stages before the student took "
                           f"{sum(r['minutes'] for r in spent):.1f} of its {budget:g} minutes (reserve_minutes "
                           f"{pipe.config.reserve_minutes:g}): nothing is left for the student")
    return left


def fingerprint_student(pipe: Pipeline) -> str:
    return pipe.stamp("student", pipe.config_stamp(student_config(pipe)), pipe.upstream("student"))


def run_student(pipe: Pipeline) -> dict:
    config, cut = _budgeted_student(pipe)
    if cut:
        pipe.log(f"student: {config.train.max_minutes:g} minutes, what budget_minutes {pipe.config.budget_minutes:g} "
                 f"leaves after the stages before it and reserve_minutes {pipe.config.reserve_minutes:g}")
    return _train(pipe, config)


def fingerprint_export(pipe: Pipeline) -> str:
    return pipe.stamp("export", asdict(pipe.config.export), pipe.upstream("export"))


def run_export(pipe: Pipeline) -> dict:
    from xformer_cli.export.common import load_for_export
    from xformer_cli.export.ctranslate2 import export_ctranslate2

    e = pipe.config.export
    target = pipe.record("export").directory / f"student-{e.quantization}"
    loaded = load_for_export(pipe.model("student"), "CTranslate2")
    shortlist = _student_shortlist(pipe, loaded[1], loaded[2]) if e.shortlist else None
    export_ctranslate2(pipe.model("student"), target, quantization=e.quantization, force=True, loaded=loaded,
                       shortlist=shortlist)
    pipe.log(f"exported the student to {target} ({e.quantization}{', with its shortlist' if shortlist else ''})")
    return {"model": pipe.kept(target)}


def _student_shortlist(pipe: Pipeline, tokenizer, config):
    """The lexical shortlist counted on the pairs the student trained on."""
    from xformer_cli.data.directions import training_pairs
    from xformer_cli.export.shortlist import ShortlistSettings, build_shortlist

    e = pipe.config.export
    settings = ShortlistSettings(per_source=e.shortlist_per_source, frequent=e.shortlist_frequent)
    return build_shortlist(tokenizer, training_pairs(config.data, pipe.log), settings, pipe.log)


# -- evaluate --------------------------------------------------------------------------------

def _evaluated(pipe: Pipeline) -> list[tuple[str, list[Path]]]:
    """The baseline (when given), each teacher (the first as "teacher", each other by its seed),
    the distillation teacher where it is another model (checkpoints given by path, or an
    ensemble), the student and its export."""
    baseline = [Path(pipe.config.evaluate.baseline)] if pipe.config.evaluate.baseline else []
    teachers = _teacher_models(pipe)
    teacher, distilling = teachers[:1], _teachers(pipe)
    found = [("baseline", baseline)] if baseline else []
    found.append(("teacher", teacher))
    seeds = pipe.config.teacher.seeds
    found.extend((f"teacher (seed {seed})", [path]) for seed, path in zip(seeds[1:], teachers[1:]))
    if distilling not in (teacher, baseline):
        found.append(("distillation teacher", distilling))
    return found + [("student", [pipe.model("student")]),
                    (f"student-{pipe.config.export.quantization}", [pipe.model("export")])]


def fingerprint_evaluate(pipe: Pipeline) -> str:
    baseline = pipe.config.evaluate.baseline
    scored = models.scored_files_stamp(pipe.base, pipe.run_dir, pipe.every_file)
    return pipe.stamp("evaluate", asdict(pipe.config.evaluate), model_stamp(baseline) if baseline else None,
                      asdict(pipe.base.data), scored, pipe.config.threads, pipe.upstream("evaluate"))


def run_evaluate(pipe: Pipeline) -> dict:
    from xformer_cli.fileio import atomic_file
    from xformer_cli.pipeline import evaluation

    e = pipe.config.evaluate
    sets = evaluation.split_sets(pipe.base.data, e.splits, str(pipe.config.model_config_path), pipe.log, e.max_lines)
    rows = evaluation.score_models(_evaluated(pipe), sets, e.beam_sizes, stage_threads(pipe, e.threads),
                                   pipe.langs, pipe.log, e.timed_passes)
    summary = pipe.record("evaluate").directory / "summary.json"
    with atomic_file(summary, "w", encoding="utf-8") as f:
        json.dump([row.to_dict() for row in rows], f, indent=2)
        f.write("\n")
    pipe.log(evaluation.table(rows))
    return {"summary": pipe.kept(summary), "rows": len(rows)}


def translation_files(pipe: Pipeline, stage: str) -> Optional[tuple[Path, Path]]:
    """A translating stage's two sides: (the lines it translates, their translations); None for
    the other stages."""
    src, tgt = pipe.langs
    folder = pipe.record(stage).directory
    return {"backtranslate": (folder / f"synthetic.{tgt}", folder / f"synthetic.{src}"),
            "distill": (folder / f"distilled.{src}", folder / f"distilled.{tgt}")}.get(stage)


def real_target_files(pipe: Pipeline) -> tuple[Path, Path]:
    """backtranslate.real_targets's two sides: (the real targets, their back-translations)."""
    src, tgt = pipe.langs
    folder = pipe.record("backtranslate").directory
    return folder / f"{REAL_TARGETS}.{tgt}", folder / f"{REAL_TARGETS}.{src}"


def trained_run_dirs(pipe: Pipeline, stage: str) -> list[Path]:
    """The run folders a training stage trains in (one per teacher seed; none for the other
    stages, and for a reverse model given as a checkpoint)."""
    if stage == "reverse" and pipe.config.reverse.checkpoint:
        return []
    configs = {"reverse": lambda: [reverse_config(pipe)], "teacher": lambda: teacher_configs(pipe),
               "student": lambda: [student_config(pipe)]}.get(stage, list)()
    return [Path(config.run_dir) for config in configs]


# Each stage's two functions, in STAGES' order: what its output depends on, and the run that makes it.
FINGERPRINTS = {"reverse": fingerprint_reverse, "backtranslate": fingerprint_backtranslate,
                "teacher": fingerprint_teacher, "distill": fingerprint_distill, "student": fingerprint_student,
                "export": fingerprint_export, "evaluate": fingerprint_evaluate}
RUNS = {"reverse": run_reverse, "backtranslate": run_backtranslate, "teacher": run_teacher, "distill": run_distill,
        "student": run_student, "export": run_export, "evaluate": run_evaluate}
