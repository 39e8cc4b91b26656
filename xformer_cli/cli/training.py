"""``xformer train``, ``prepare``, ``pipeline``, ``average`` and ``report``: runs and what they write."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from xformer_cli.cli.common import app, log, user_errors
from xformer_cli.errors import XformerError


@app.command()
@user_errors
def train(
    config: Path = typer.Option(..., "--config", "-c", help="YAML config (see configs/)."),
    overrides: List[str] = typer.Option([], "--set", "-s",
                                        help="Override a key: --set model.d_model=256 (repeatable)."),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help="Start afresh, deleting the checkpoints in "
                                        "run_dir (default: resume from last.pt)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    threads: Optional[int] = typer.Option(None, "--threads",
                                          help="CPU threads for torch (train.threads; 0 = torch's default)."),
) -> None:
    """Train a tokenizer and a Transformer as the config says; checkpoints go to run_dir.

    On a run_dir that holds last.pt, training resumes exactly where it stopped. Ctrl-C or
    SIGTERM finishes the current step, saves last.pt and exits (code 130)."""
    from xformer_cli.config import load_config
    from xformer_cli.train.trainer import train as run_training

    cfg = load_config(config, overrides + ([f"train.threads={threads}"] if threads is not None else []))
    result = run_training(cfg, overwrite=overwrite, log=log, progress=not quiet)
    if result.stopped_because == "interrupted":
        raise typer.Exit(130)


@app.command()
@user_errors
def prepare(
    config: Path = typer.Option(..., "--config", "-c", help="YAML config (see configs/)."),
    overrides: List[str] = typer.Option([], "--set", "-s", help="Override a key: --set data.dedup=true (repeatable)."),
) -> None:
    """Train the tokenizer and build the tokenized cache, without training (train reuses both)."""
    from xformer_cli.config import load_config
    from xformer_cli.data.prepare import prepare_data
    from xformer_cli.train.init_from import for_prepare
    from xformer_cli.train.run_checkpoints import trained_tokenizer_check

    cfg, tokenizer = for_prepare(load_config(config, overrides), log)
    prepared = prepare_data(cfg, log, tokenizer=tokenizer, keep=trained_tokenizer_check(cfg))
    meta = prepared.train.meta
    typer.echo(f"cache: {prepared.train.directory} ({meta['pairs']} pairs, {meta['src_tokens']} source and "
               f"{meta['tgt_tokens']} target tokens, {'reused' if prepared.cache_reused else 'built'})")


@app.command()
@user_errors
def pipeline(
    config: Path = typer.Option(..., "--config", "-c", help="Pipeline YAML (configs/*pipeline*.yaml)."),
    overrides: List[str] = typer.Option([], "--set", "-s", help="Override a key: --set run_dir=runs/p (repeatable)."),
    from_stage: Optional[str] = typer.Option(None, "--from", help="Redo this stage and every one after it."),
    only: Optional[str] = typer.Option(None, "--only", help="Run this stage alone (the stages it needs must be done)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
    status: bool = typer.Option(False, "--status",
                                help="Run nothing: say what a run would do with each stage, and how far it got."),
) -> None:
    """Back-translate, train a teacher, distill, train a student, export and evaluate it.

    Stages: reverse, backtranslate, teacher, distill, student, export, evaluate. A stage whose
    inputs have not changed since it finished is skipped; a killed one resumes (docs/pipeline.md)."""
    from xformer_cli.pipeline import Pipeline, load_pipeline_config, pipeline_status, run_pipeline
    from xformer_cli import run_lock
    from xformer_cli.pipeline.runner import whole_path

    if status:
        if from_stage or only:
            raise XformerError("--status looks at every stage: give it without --from and --only")
        settings = load_pipeline_config(config, overrides)
        statuses = pipeline_status(settings)
        holder = run_lock.holder(settings.run_dir)
        typer.echo(f"pipeline in {settings.run_dir} (what the next run does with each stage):" if holder is None
                   else f"pipeline in {settings.run_dir}, running now: {holder.describe()} "
                        "(a second run would stop at once):")
        for stage in statuses:
            typer.echo(stage.line())
        line = whole_path(Pipeline(settings, progress=False))
        if line is not None:
            typer.echo(line)
        return

    # No before_torch(): the pipeline is a training job and keeps OpenMP's default waits, as
    # train does; sleeping waits cost its training a fifth of its steps (docs/pipeline.md, "Threads").
    run_pipeline(load_pipeline_config(config, overrides), from_stage, only, log=log, progress=not quiet)


@app.command()
@user_errors
def average(
    checkpoints: List[Path] = typer.Argument(..., help="Checkpoints to average, or one run directory (with --last)."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the averaged checkpoint."),
    last: int = typer.Option(5, "--last", help="With a run directory: average its newest N step checkpoints."),
    force: bool = typer.Option(False, "--force", help="Replace the output file if it exists."),
) -> None:
    """Average the weights of several checkpoints (the paper averaged the last 5 for base, 20 for big)."""
    from xformer_cli.fileio import new_output_file
    from xformer_cli.train.average import average_checkpoints, last_checkpoints

    if force and output.is_file() and output.suffix != ".pt":  # a run's config.yaml, an export's model.bin
        raise XformerError(f"{output} is not a checkpoint (.pt): --force replaces a checkpoint only")
    new_output_file(output, force)
    paths = last_checkpoints(checkpoints[0], last) if len(checkpoints) == 1 and checkpoints[0].is_dir() else checkpoints
    average_checkpoints(paths, output)
    typer.echo(f"averaged {len(paths)} checkpoint{'s' if len(paths) != 1 else ''} into {output}: "
               f"{', '.join(p.name for p in paths)}")


@app.command()
@user_errors
def report(
    run_dir: Path = typer.Argument(..., help="A run directory written by xformer train."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="PNG path (default RUN_DIR/report.png)."),
) -> None:
    """Plot losses, validation BLEU and learning rate against steps and wall time; print a summary."""
    from xformer_cli.plots import plot_report

    target = output or run_dir / "report.png"
    typer.echo(plot_report(run_dir, target))
    typer.echo(f"report: {target}")
