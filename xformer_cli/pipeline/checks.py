"""What the runner checks before a stage runs: whether a finished stage's output is still
there (``gone_output``), and why a stage could not run at all (``stage_problem``: a file its
config names, the training config it builds, the engine it asks for), found before the first
stage starts rather than hours into the pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from xformer_cli.errors import XformerError
from xformer_cli.file_stamps import file_stamp
from xformer_cli.pipeline.corpus_translation import TextLines
from xformer_cli.pipeline.earlier_forms import current_stamp
from xformer_cli.pipeline.record import CHANGED
from xformer_cli.pipeline.stages import (FINGERPRINTS, Pipeline, check_direction, engine_needs, reverse_config,
                                         student_config, teacher_configs)


def gone_output(pipe: Pipeline, stage: str) -> Optional[Path]:
    """A file the stage's finished record names that is no longer there (a deleted best.pt, a
    synthetic corpus moved away): the stage is done again rather than skipped for the stages after
    it to fail on. None: all there (or no record)."""
    record = pipe.record(stage).read() or {}
    named = [record.get("model"), *record.get("models", []), record.get("summary")]
    files = [pipe.path(kept) for kept in named if isinstance(kept, str)]
    prefixes = [record.get("prefix"), (record.get("real_targets") or {}).get("prefix")]
    files += [Path(f"{pipe.path(prefix)}.{lang}") for prefix in prefixes if isinstance(prefix, str)
              for lang in pipe.langs]
    from xformer_cli.export.format import EXPORT_INFO

    files += [folder / name for folder in files if folder.is_dir() for name in ("model.bin", EXPORT_INFO)]  # an export
    return next((path for path in files if not path.exists()), None)


def unusable_named_file(pipe: Pipeline, stage: str) -> Optional[str]:
    """A file the config names for ``stage`` that is not there or cannot serve, said in one line
    (None: all can). The run checks every stage it will visit before the first starts: a
    misspelt baseline must not wait hours for the evaluate stage to be found, nor a monolingual
    file that is a folder, empty or not UTF-8 for the reverse model's training to end. A monolingual
    file the stage's finished record says it read, unchanged since, is not read again."""
    c = pipe.config
    named = {"reverse": [("reverse.checkpoint", c.reverse.checkpoint)],
             "backtranslate": [("mono.target", c.mono.target)],
             "distill": [("mono.source", c.mono.source if c.distill.mono_source else None)]
             + [("distill.teachers", name) for name in c.distill.teachers if name != "teacher"],
             "evaluate": [("evaluate.baseline", c.evaluate.baseline)]}.get(stage, [])
    needed = {"backtranslate": "mono.target", "distill": "mono.source" if c.distill.mono_source else None}.get(stage)
    for key, given in named:
        if not given and key == needed:  # an empty or left-out path found when the stage came, after training
            side = "target" if key == "mono.target" else "source"
            return (f"config key '{key}': the {side}-language text the {stage} stage translates is not given "
                    "(checked before the first stage runs)")
        if given and not Path(given).exists():
            fetch = "; scripts/fetch_multi30k.py makes it" if _multi30k_mono(Path(given)) else ""
            return f"config key '{key}': {given} not found (checked before the first stage runs{fetch})"
        if given and key.startswith("mono.") and not _read_by_finished_stage(pipe, stage, Path(given)):
            problem = _unusable_text(TextLines(Path(given), c.mono.skip_invalid_utf8, c.mono.max_lines))
            if problem:
                return f"config key '{key}': {problem} (checked before the first stage runs)"
        problem = _unusable_model(pipe, key, Path(given)) if given and key in MODEL_KEYS else None
        if problem:
            return f"{problem} (checked before the first stage runs)"
    return None


MODEL_KEYS = ("reverse.checkpoint", "distill.teachers", "evaluate.baseline")  # a checkpoint or an export folder


def _unusable_model(pipe: Pipeline, key: str, given: Path) -> Optional[str]:
    """Why a model the config names by path cannot serve (None: it can): a folder that is no
    export (a run folder: the run trained on and failed at the stage that loads it), the
    reverse model inside the reverse stage's own folder (set aside and deleted when the stage
    is redone), or a model of the wrong direction (a teacher of the other one distilled garbage)."""
    from xformer_cli.export.format import EXPORT_INFO

    if given.is_dir() and not (given / EXPORT_INFO).is_file():
        inside = next((given / name for name in ("best.pt", "last.pt") if (given / name).is_file()), None)
        hint = f": give its checkpoint, e.g. {inside}" if inside else ""
        return f"config key '{key}': {given} is a folder, not a checkpoint or an export folder{hint}"
    own = (pipe.run_dir / "reverse").resolve()
    if key == "reverse.checkpoint" and (given.resolve() == own or own in given.resolve().parents):
        return (f"config key '{key}': {given} lies in the reverse stage's own folder, which the stage sets aside "
                "and replaces: copy it out of the run folder first")
    wanted = pipe.langs[::-1] if key == "reverse.checkpoint" else pipe.langs
    try:
        check_direction(given, (wanted[0], wanted[1]), key)
    except XformerError as exc:
        return str(exc)
    return None


def stale_need(pipe: Pipeline, stage: str, upgradable: Callable[[str], bool]) -> bool:
    """Whether a stage that --only or --from leaves out finished with other inputs than the
    config gives it now (a stage after it would read the old output: the export of the student
    before the one just trained). An earlier version's record of these inputs is not stale."""
    try:
        standing = pipe.record(stage).standing(FINGERPRINTS[stage](pipe))
    except XformerError:  # its own needs are not there: the stage that reads it says so
        return False
    return standing == CHANGED and not upgradable(stage)


def unbuildable_config(pipe: Pipeline, stage: str) -> Optional[str]:
    """The training config a training stage builds from ``model_config`` and its own ``set``
    (every seed's teacher), checked before the first stage runs: a bad key in ``student.set``
    must not wait hours for the teacher to be found. One line, or None when it builds."""
    build = {"reverse": lambda: None if pipe.config.reverse.checkpoint else reverse_config(pipe),
             "teacher": lambda: teacher_configs(pipe), "student": lambda: student_config(pipe)}.get(stage)
    try:
        if build is not None:
            build()
    except XformerError as exc:
        return f"{exc} (checked before the first stage runs)"
    return None


def unusable_engine(pipe: Pipeline, stage: str) -> Optional[str]:
    """The engine a translating stage asks for (its engine, precision and sampling, with as many
    models as it will translate with) that the engine factory would refuse, or None: found before
    the first stage, not after the models it needs have trained. Nothing is loaded."""
    from xformer_cli.decode.factory import choose_engine

    settings = {"backtranslate": pipe.config.backtranslate, "distill": pipe.config.distill}.get(stage)
    if settings is None:
        return None
    models = 1 if stage == "backtranslate" else sum(len(pipe.config.teacher.seeds) if name == "teacher" else 1
                                                    for name in pipe.config.distill.teachers)
    placeholders = [Path(f"{stage}-model-{i}.pt") for i in range(max(models, 1))]  # only their number counts
    try:
        choose_engine(placeholders, settings.engine, settings.precision,
                      needs=engine_needs(settings))
    except XformerError as exc:
        return (f"{exc} ({stage}.engine {settings.engine}, {stage}.precision {settings.precision}"
                f"{', sampling' if settings.sampling_topk else ''}; checked before the first stage runs)")
    return None


def stage_problem(pipe: Pipeline, stage: str) -> Optional[str]:
    """Why ``stage`` cannot run, found before the first stage starts (a file it names, the
    training config it builds, the engine it asks for), or None."""
    return unusable_named_file(pipe, stage) or unbuildable_config(pipe, stage) or unusable_engine(pipe, stage)


def _multi30k_mono(path: Path) -> bool:
    """Whether ``path`` is where the configs read Multi30k's monolingual captions."""
    return path.parent.name == "multi30k" and path.name in ("mono.de", "mono.en")


def _read_by_finished_stage(pipe: Pipeline, stage: str, path: Path) -> bool:
    """Whether ``stage`` finished reading ``path`` as it is now (its path, size and bytes; in a
    record of an earlier version, size and time)."""
    record = pipe.record(stage).read() or {}
    read = record.get("mono_read")
    return bool(record.get("done")) and path.is_file() and isinstance(read, str) and \
        current_stamp(read) == file_stamp(path)


def _unusable_text(lines: TextLines) -> Optional[str]:
    """Why a monolingual text file cannot be translated (a folder, no usable line); a line that
    is not UTF-8 is named by the reading itself, as the stage would name it. Only the lines the
    stage will read are read (mono.max_lines)."""
    if not lines.path.is_file():
        return f"{lines.path} is a directory, not a text file"
    if sum(1 for _ in lines) == 0:  # every line read once, so a line that is not UTF-8 stops the run now
        dropped = ", ".join(f"{n} {why}" for why, n in lines.dropped.items()) or "no line at all"
        return f"{lines.path} has no line to translate ({dropped})"
    return None
