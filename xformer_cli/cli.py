"""The ``xformer`` command line: parse options, call the library, map errors to exit codes.

A user error (``XformerError``) prints one line, ``error: ...``, on stderr and exits 1;
Ctrl-C exits 130. Heavy imports (torch) happen inside the commands so ``--help`` is quick.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from xformer_cli.version import __version__
from xformer_cli.errors import XformerError

app = typer.Typer(
    name="xformer",
    help="Train a Transformer translation model, translate with it, and score it with sacreBLEU.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help text is plain: "pip install 'xformer[ctranslate2]'" keeps its brackets
)


def _fail(message: str, code: int = 1) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def user_errors(fn):
    """Turn library errors into one line on stderr and a non-zero exit, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except XformerError as exc:
            _fail(str(exc))
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except BrokenPipeError:
            raise typer.Exit(0)
        except MemoryError:
            _fail("out of memory; lower train.max_tokens or decode.batch_size")
        except (OSError, RuntimeError) as exc:
            from xformer_cli.fileio import disk_full

            if not disk_full(exc):
                raise
            # a write the library did not name itself (config.yaml, the tokenizer, an export)
            target = getattr(exc, "filename", None) or "a file"
            _fail(f"could not write {target}: no space left on device; files written before it are intact")

    return wrapper


def _log(message: str) -> None:
    typer.echo(message, err=True)  # stderr: stdout is for data


def _version(value: bool) -> None:
    if value:
        typer.echo(f"xformer {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Show the version and exit."),
) -> None:
    """xformer: from parallel text to a trained Transformer, translations and BLEU."""


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
    result = run_training(cfg, overwrite=overwrite, log=_log, progress=not quiet)
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

    log = lambda message: typer.echo(message, err=True)  # noqa: E731
    cfg, tokenizer = for_prepare(load_config(config, overrides), log)
    prepared = prepare_data(cfg, log, tokenizer=tokenizer)
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
) -> None:
    """Back-translate, train a teacher, distill, train a student, export and evaluate it.

    Stages: reverse, backtranslate, teacher, distill, student, export, evaluate. A stage whose
    inputs have not changed since it finished is skipped; a killed one resumes (docs/pipeline.md)."""
    from xformer_cli.pipeline import load_pipeline_config, run_pipeline

    # No _before_torch(): the pipeline is a training job and keeps OpenMP's default waits, as
    # train does; sleeping waits cost its training a fifth of its steps (docs/pipeline.md, "Threads").
    run_pipeline(load_pipeline_config(config, overrides), from_stage, only, log=_log, progress=not quiet)


@app.command()
@user_errors
def average(
    checkpoints: List[Path] = typer.Argument(..., help="Checkpoints to average, or one run directory (with --last)."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the averaged checkpoint."),
    last: int = typer.Option(5, "--last", help="With a run directory: average its newest N step checkpoints."),
) -> None:
    """Average the weights of several checkpoints (the paper averaged the last 5 for base, 20 for big)."""
    from xformer_cli.train.average import average_checkpoints, last_checkpoints

    paths = last_checkpoints(checkpoints[0], last) if len(checkpoints) == 1 and checkpoints[0].is_dir() else checkpoints
    average_checkpoints(paths, output)
    typer.echo(f"averaged {len(paths)} checkpoints into {output}: {', '.join(p.name for p in paths)}")


def _before_torch() -> None:
    """For the commands that translate: OpenMP threads that sleep at barriers (decode.factory)."""
    from xformer_cli.decode.factory import prefer_passive_waits

    prefer_passive_waits()


def _load_engine(models: List[Path], engine: str = "auto", precision: str = "auto", device: str = "auto",
                 threads: int = 0, needs: tuple[str, ...] = (), compute_type: Optional[str] = None):
    """``decode.factory.load_engine``, logging what it chose; ``compute_type``: the deprecated
    --compute-type, now a spelling of --precision that selects the CTranslate2 engine."""
    from xformer_cli.decode.factory import load_engine

    if threads < 0:
        raise XformerError(f"--threads must be >= 0 (0 = every core), not {threads}")
    if compute_type is not None:
        if engine == "xformer":
            raise XformerError("--compute-type is for --engine ctranslate2 (and deprecated: use --precision)")
        if precision != "auto":
            raise XformerError("give --precision or the deprecated --compute-type, not both")
        _log("warning: --compute-type is deprecated; --precision takes CTranslate2's compute types")
        engine, precision = "ctranslate2", "auto" if compute_type == "default" else compute_type
    return load_engine(models, engine, precision=precision, device=device, threads=threads, needs=needs, log=_log)


def _warn_cut_lines(translator, max_input_len: Optional[int] = None) -> None:
    """One warning line for the input lines cut to the source length limit, if any."""
    if translator.truncated_lines:
        limit = max_input_len or translator.decode.max_input_len
        typer.echo(f"warning: {translator.truncated_lines} input line(s) longer than {limit} source pieces were cut "
                   f"to {limit} (--max-input-len / decode.max_input_len)", err=True)


_beam = typer.Option(None, "--beam-size", "-b", help="1 = greedy; default from the checkpoint's decode config.")
_alpha = typer.Option(None, "--length-penalty", help="GNMT length penalty alpha (paper: 0.6).")
_len_a = typer.Option(None, "--max-len-a", help="Max output length = a * source length + b.")
_len_b = typer.Option(None, "--max-len-b", help="Max output length = a * source length + b.")
_min_len = typer.Option(None, "--min-len", help="Output pieces before eos at least (default 1: no empty translations).")
_batch = typer.Option(None, "--batch-size", help="Sentences per decoding batch.")
_device = typer.Option("auto", "--device",
                       help="auto (CUDA when the engine sees a GPU, else the CPU), cpu, cuda or cuda:N.")
_engine = typer.Option("auto", "--engine",
                       help="auto (--precision decides), xformer (PyTorch), or ctranslate2 "
                            "(an export directory, or a checkpoint exported at start).")
_precision = typer.Option("auto", "--precision",
                          help="auto (the fastest whose BLEU stays within 0.2 of fp32; stderr says "
                               "which), fp32, bf16, fp16, int8 or another CTranslate2 compute type.")
_threads = typer.Option(0, "--threads",
                        help="CPU threads; 0 = $OMP_NUM_THREADS if set, else every core.")
_compute_type = typer.Option(None, "--compute-type", hidden=True,
                             help="Deprecated: --precision takes CTranslate2's compute types.")
_target_lang = typer.Option(None, "--target-lang", "-t",
                            help="Target language (fr, or fra): needed for a multilingual model with several.")
_source_lang = typer.Option(None, "--source-lang",
                            help="Source language (default: the one the model "
                                 "translates into the target from, else detected).")


@app.command()
@user_errors
def translate(  # long: its signature is its options, one parameter each
    checkpoints: List[Path] = typer.Option(..., "--checkpoint", "-m",
                                           help="A checkpoint written by xformer train (repeat for an "
                                                "ensemble), or a directory written by xformer export."),
    input: Optional[Path] = typer.Option(None, "--input", "-i",
                                         help="Source text, one sentence per line (default stdin)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Where to write translations (default stdout)."),
    beam_size: Optional[int] = _beam,
    length_penalty: Optional[float] = _alpha,
    max_len_a: Optional[float] = _len_a,
    max_len_b: Optional[int] = _len_b,
    min_len: Optional[int] = _min_len,
    batch_size: Optional[int] = _batch,
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens",
                                             help="Padded source tokens x beam per batch at most."),
    max_input_len: Optional[int] = typer.Option(None, "--max-input-len",
                                                help="Source pieces the engine takes at once; a longer "
                                                     "sentence is cut into parts (default: the checkpoint's "
                                                     "decode.max_input_len, else data.max_len)."),
    nbest: int = typer.Option(1, "--nbest",
                              help="Write the N best per input line: LINE<TAB>RANK<TAB>SCORE<TAB>TRANSLATION."),
    sampling_topk: int = typer.Option(0, "--sampling-topk",
                                      help="Sample instead of search: from the K most "
                                           "likely tokens (-1: all). Needs --beam-size 1."),
    temperature: float = typer.Option(1.0, "--temperature", help="Sampling temperature."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for sampling (reproducible draws)."),
    chunk_lines: int = typer.Option(2000, "--chunk-lines",
                                    help="Lines read, sorted and translated at a time (bounds memory)."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress",
                                            help="Progress bar on stderr (default: when "
                                                 "reading a file and stderr is a terminal)."),
    engine: str = _engine,
    compute_type: Optional[str] = _compute_type,
    no_cache: bool = typer.Option(False, "--no-cache",
                                  help="Recompute every decoder position at each step (slow; for comparison)."),
    device: str = _device,
    precision: str = _precision,
    threads: int = _threads,
    attention: Optional[Path] = typer.Option(None, "--attention",
                                             help="Also plot encoder-decoder attention to this PNG."),
    attention_sentences: int = typer.Option(1, "--attention-sentences", help="Plot the first N non-empty lines."),
    attention_heads: bool = typer.Option(False, "--attention-heads", help="One heatmap per head instead of the mean."),
    split_sentences: bool = typer.Option(True, "--split-sentences/--no-split-sentences",
                                         help="Split a line holding several sentences, "
                                              "translate them together, join them back."),
    format: str = typer.Option("text", "--format",
                               help="text, or html: translate the text of each line as HTML, keeping its tags."),
    glossary: Optional[Path] = typer.Option(None, "--glossary",
                                            help="TSV file of source term<TAB>target term: the "
                                                 "target term appears wherever the source term does."),
    target_lang: Optional[str] = _target_lang,
    source_lang: Optional[str] = _source_lang,
    invalid_utf8: str = typer.Option("error", "--invalid-utf8",
                                     help="A line that is not UTF-8: error (stop, naming the file "
                                          "and line) or replace (its bad bytes become U+FFFD)."),
    keep_numbers: bool = typer.Option(False, "--keep-numbers",
                                      help="Keep every source number's value in the translation, "
                                           "once, as digits or as the model's number word."),
) -> None:
    """Translate text: exactly one output line per input line (N with --nbest), blank lines stay blank.

    Input streams in chunks, so files of any size translate in bounded memory; a file
    given with --output appears only once it is complete. Every option in detail:
    docs/translation.md.
    """
    _before_torch()
    _check_output(output, [(input, "--input"), *((c, "--checkpoint") for c in checkpoints)], attention)
    lines = _input_lines(input, chunk_lines, invalid_utf8)
    terms = _glossary(format, glossary)  # a bad --format or glossary file: said before the model loads
    # tags and terms follow attention
    aligning = attention is not None or format == "html" or glossary is not None or keep_numbers
    needs = _needs(aligning, sampling_topk != 0, temperature != 1.0, seed is not None, no_cache, beam_size != 1)
    translator = _load_engine(checkpoints, engine, precision, device, threads, needs, compute_type)
    if attention is not None and not hasattr(translator, "attention"):
        raise XformerError(f"--attention needs the xformer engine (fp32, bf16 or fp16), not {translator.name}")
    direction = _direction(translator.languages, target_lang, source_lang, lines.text)  # the engine read them
    text_options = _text_options(direction, split_sentences, format, terms, nbest, keep_numbers)
    options = translator.options(beam_size=beam_size, length_penalty=length_penalty, max_len_a=max_len_a,
                                 max_len_b=max_len_b, min_len=min_len, batch_size=batch_size, max_tokens=max_tokens,
                                 max_input_len=max_input_len, nbest=nbest, sampling_topk=sampling_topk,
                                 temperature=temperature, seed=seed, use_cache=not no_cache,
                                 target_lang=direction.target)
    wanted = max(attention_sentences, 1) if attention is not None else 0
    plotted = _translate_stream(translator, options, text_options, lines, input, output, progress, chunk_lines, wanted)
    _warn_cut_lines(translator, max_input_len)
    if attention is not None:
        _plot_attention(translator, plotted, attention, beam_size, attention_heads, direction.target)


def _needs(*wanted: bool) -> tuple[str, ...]:
    """What a translate run asks of its engine (the engine factory's ``needs``), in this order:
    attention, sampling, temperature, a seed, no key/value cache, beam search."""
    names = ("attention", "sampling_topk", "temperature", "seed", "use_cache", "beam_search")
    return tuple(name for name, asked in zip(names, wanted) if asked)


def _check_output(output: Optional[Path], inputs: list, attention: Optional[Path] = None) -> None:
    """Before any work: an output that is one of the command's inputs (a checkpoint, the source)
    would destroy it; an attention plot path that cannot be written would fail the run after
    the translation was written."""
    if attention is not None:
        from xformer_cli.plots import check_png_path

        check_png_path(attention)
    from xformer_cli.fileio import same_file

    for path, option in inputs:
        if same_file(output, path):
            raise XformerError(f"--output {output} is the {option} file: write the translation elsewhere")


def _input_lines(input: Optional[Path], chunk_lines: int, invalid_utf8: str = "error") -> "_Peek":
    """The input lines, of which the first chunk is read ahead only where the source language
    must be detected (``_direction``); the options checked before anything loads."""
    from xformer_cli.textio import iter_lines

    if chunk_lines < 1:
        raise XformerError("--chunk-lines must be at least 1")
    if invalid_utf8 not in ("error", "replace"):
        raise XformerError(f"--invalid-utf8 must be error or replace, not {invalid_utf8!r}")
    remedy = "fix the input or pass --invalid-utf8 replace (its bytes read as U+FFFD)"
    return _Peek(iter_lines(input, invalid_utf8 == "replace", remedy), chunk_lines)


class _Peek:
    """Lines, of which ``text()`` reads the first ``n`` ahead (only when called); iterating
    gives every line, those included."""

    def __init__(self, lines, n: int):
        self.lines, self.n, self.first = lines, n, None

    def text(self) -> str:
        import itertools

        if self.first is None:
            self.first = list(itertools.islice(self.lines, self.n))
        return "\n".join(self.first)

    def __iter__(self):
        import itertools

        return itertools.chain(self.first or [], self.lines)


def _direction(languages, target_lang: Optional[str], source_lang: Optional[str], text=lambda: ""):
    """The direction to translate (decode/direction.py) among ``languages`` (the engine's): --target-lang
    needed on a model with several target languages, --source-lang given or detected in ``text()``;
    zero-shot with a warning."""
    from xformer_cli.decode.direction import Direction, choose_direction

    if languages is None:  # a model that records no languages: say nothing against the flags
        return Direction(source_lang or "en", target_lang)
    return choose_direction(languages, target_lang, source_lang, text, _log)


def _glossary(format: str, glossary: Optional[Path]):
    """--format checked and --glossary read (None without one)."""
    from xformer_cli.text import load_glossary
    from xformer_cli.text.pipeline import FORMATS

    if format not in FORMATS:
        raise XformerError(f"--format must be one of {', '.join(FORMATS)}, not {format!r}")
    return load_glossary(glossary) if glossary is not None else None


def _text_options(direction, split_sentences: bool, format: str, terms, nbest: int, keep_numbers: bool = False):
    """How ``translate`` reads its lines: the sentence splitter's language is the direction's
    source; the number words --keep-numbers accepts are its target's; ``terms``: ``_glossary``'s."""
    from xformer_cli.text import TextOptions

    return TextOptions(source_lang=direction.source, split_sentences=split_sentences, format=format, glossary=terms,
                       alternatives=max(nbest, 1) - 1, keep_numbers=keep_numbers, target_lang=direction.target)


def _translate_stream(translator, options, text_options, lines, input: Optional[Path], output: Optional[Path],
                      progress: Optional[bool], chunk_lines: int, keep: int) -> list[str]:
    """Translate ``lines`` (read from ``input``: stdin when None or "-") to ``output`` (stdout
    when None), with a progress bar when asked or when a file is read on a terminal; returns
    the first ``keep`` non-empty input lines (for an attention plot), kept as they stream by."""
    from tqdm import tqdm

    from xformer_cli.text.pipeline import result_lines, translate_text_stream
    from xformer_cli.textio import count_lines, open_output

    from_file = input is not None and str(input) != "-"
    show = progress if progress is not None else (from_file and sys.stderr.isatty())
    total = count_lines(input) if show and from_file else None
    kept: list[str] = []

    def remember(lines):
        for line in lines:
            if len(kept) < keep and line.strip():
                kept.append(line)
            yield line

    with open_output(output) as out, tqdm(total=total, unit="line", disable=not show, file=sys.stderr) as bar:
        results = translate_text_stream(translator, remember(lines), text_options, options, chunk_lines)
        for text in result_lines(results, options.nbest):
            out.write(text + "\n")
            bar.update(1 if options.nbest == 1 else 1 / options.nbest)
    return kept


def _plot_attention(translator, lines: list[str], target: Path, beam_size: Optional[int], per_head: bool,
                    target_lang: Optional[str] = None) -> None:
    from xformer_cli.plots import plot_attention

    if not lines:
        raise XformerError("--attention needs a non-empty input line")
    plot_attention(translator.attention(lines, beam_size=beam_size, target_lang=target_lang), target, per_head=per_head)
    typer.echo(f"attention plot: {target}", err=True)


@app.command()
@user_errors
def export(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-m", help="A checkpoint written by xformer train."),
    output: Path = typer.Option(..., "--output", "-o", help="Directory to write the exported model to."),
    format: str = typer.Option("ctranslate2", "--format",
                               help="ctranslate2 (for xformer translate --engine ctranslate2) "
                                    "or huggingface (a MarianMT model for transformers)."),
    quantization: Optional[str] = typer.Option(None, "--quantization",
                                               help="CTranslate2 weight type: int8, "
                                                    "int8_float16, float16, bfloat16 ..."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty output directory."),
    shortlist: bool = typer.Option(False, "--shortlist",
                                   help="CTranslate2: add a lexical shortlist counted on the checkpoint's training "
                                        "data (its config's data.train): each step then scores only the batch's "
                                        "candidate pieces, faster, with output that can differ."),
    shortlist_per_source: int = typer.Option(20, "--shortlist-per-source", help="Candidates per source piece."),
    shortlist_frequent: int = typer.Option(100, "--shortlist-frequent",
                                           help="The most frequent target pieces, candidates in every batch."),
) -> None:
    """Export a checkpoint for CTranslate2 (pip install 'xformer[ctranslate2]'): xformer translate
    --engine ctranslate2 uses it; or, with --format huggingface, for Hugging Face transformers
    (pip install 'xformer[hf]'): MarianMTModel (Pegasus for a pre-norm model: AutoModelForSeq2SeqLM)
    and MarianTokenizer load it."""
    if format == "ctranslate2":
        from xformer_cli.export.common import load_for_export, output_directory
        from xformer_cli.export.ctranslate2 import export_ctranslate2

        loaded = listed = None
        if shortlist:
            output_directory(output, force)  # a refused output directory before the count, not after it
            loaded = load_for_export(checkpoint, "CTranslate2")  # read once for the count and the export
            listed = _shortlist(loaded, shortlist_per_source, shortlist_frequent)
        written = export_ctranslate2(checkpoint, output, quantization=quantization, force=force, loaded=loaded,
                                     shortlist=listed)
    elif format == "huggingface":
        if quantization is not None or shortlist:
            raise XformerError(f"--{'quantization' if quantization is not None else 'shortlist'} is for "
                               "--format ctranslate2")
        from xformer_cli.export.huggingface import export_huggingface

        written = export_huggingface(checkpoint, output, force=force)
    else:
        raise XformerError(f"--format must be ctranslate2 or huggingface, not {format!r}")
    typer.echo(f"exported {checkpoint} -> {written}", err=True)


def _shortlist(loaded, per_source: int, frequent: int):
    """The shortlist counted on the loaded checkpoint's training data."""
    from xformer_cli.data.directions import training_pairs
    from xformer_cli.export.shortlist import ShortlistSettings, build_shortlist

    settings = ShortlistSettings(per_source=per_source, frequent=frequent)
    settings.check("--shortlist-per-source / --shortlist-frequent")
    say = lambda line: typer.echo(line, err=True)  # noqa: E731
    return build_shortlist(loaded[1], training_pairs(loaded[2].data, say), settings, say)


@app.command("import")
@user_errors
def import_(
    source: str = typer.Argument(...,
                                 help="A MarianMT model directory, or a Hub id such as "
                                      "Helsinki-NLP/opus-mt-en-de (needs internet)."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the xformer checkpoint."),
) -> None:
    """Import a Hugging Face MarianMT (OPUS-MT) model as an xformer checkpoint: translate, fine-tune
    (train.init_from) and export it like any other."""
    from xformer_cli.importers.marian import import_marian

    typer.echo(f"imported {source} -> {import_marian(source, output)}", err=True)


@app.command("eval-bleu")
@user_errors
def eval_bleu(  # long: its signature is its options, one parameter each
    refs: List[Path] = typer.Option([], "--ref", "-r",
                                    help="Reference file, repeatable (with "
                                         "--checkpoint alone: the config's data.test)."),
    hyps: List[Path] = typer.Option([], "--hyp",
                                    help="Hypotheses (detokenized). Several: the "
                                         "first is the baseline of a paired test."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", "-m",
                                              help="Translate --src with this checkpoint "
                                                   "(or export directory), then score."),
    src: Optional[Path] = typer.Option(None, "--src",
                                       help="Source text to translate (with --checkpoint); "
                                            "with --hyp, the source the number accuracy reads."),
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="With --checkpoint: also save the translations here."),
    metrics: str = typer.Option("bleu,chrf", "--metrics", help="Comma-separated: bleu, chrf, ter."),
    lowercase: bool = typer.Option(False, "--lowercase", help="Case-insensitive BLEU and chrF (sacrebleu -lc)."),
    tokenize: Optional[str] = typer.Option(None, "--tokenize",
                                           help="BLEU tokenizer (sacrebleu's: 13a, intl, zh, char, none, ...)."),
    confidence: int = typer.Option(0, "--confidence",
                                   help="Bootstrap resamples for 95% confidence intervals (e.g. 1000)."),
    paired_test: str = typer.Option("bs", "--paired-test",
                                    help="With several --hyp: bs (paired bootstrap) "
                                         "or ar (approximate randomisation)."),
    samples: int = typer.Option(0, "--samples", help="Resamples/trials of the paired test (0 = sacrebleu's default)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of text."),
    beam_size: Optional[int] = _beam,
    length_penalty: Optional[float] = _alpha,
    batch_size: Optional[int] = _batch,
    engine: str = _engine,
    device: str = _device,
    precision: str = _precision,
    threads: int = _threads,
    target_lang: Optional[str] = _target_lang,
    source_lang: Optional[str] = _source_lang,
) -> None:
    """Score with sacreBLEU (BLEU, chrF, TER, always with signatures): --hyp H --ref R, or --checkpoint C
    --src S --ref R, or --checkpoint C alone (the test set its training config names; a multilingual
    model's: one row per direction, with the share of outputs in another language than asked for).
    Where the source is known (--checkpoint with --src or alone on a one-direction model, or --src
    with --hyp), also the number accuracy: the share of source numbers whose value the output holds,
    in digits or as a word of the target language (docs/evaluation.md#number-accuracy)."""
    _before_torch()
    from xformer_cli.data.sources import read_lines
    from xformer_cli.evaluate import hypothesis_warnings, make_metrics

    if bool(hyps) == (checkpoint is not None):
        raise XformerError("give either --hyp, or --checkpoint with --src")
    if confidence < 0 or confidence == 1:
        raise XformerError("--confidence is a number of bootstrap resamples: 0 (off) or at least 2 (1000 is usual), "
                           f"not {confidence}")
    chosen = [m for m in metrics.split(",") if m.strip()]
    make_metrics(chosen, lowercase, tokenize)  # reject a bad metric or tokenizer before any translating
    search = dict(beam_size=beam_size, length_penalty=length_penalty, batch_size=batch_size)
    translator = _eval_engine(checkpoint, src, refs, (engine, precision, device, threads, search))
    if translator is not None and src is None and not refs and _multilingual(translator):
        _eval_directions(translator, checkpoint, chosen, (lowercase, tokenize), search, target_lang, source_lang,
                         output, as_json)
        return
    source_lines, ref_lines, ref_names, src = _references(translator, checkpoint, src, refs)
    if translator is not None:
        out = _translate_source(translator, checkpoint, src, source_lines, search, target_lang, source_lang, output)
        systems = [(f"translation of {src}", out)]
    else:
        systems = [(str(h), list(read_lines(h))) for h in hyps]
    for name, lines in systems:
        for warning in hypothesis_warnings(lines, name):
            typer.echo(f"warning: {warning}", err=True)
    scoring = dict(metrics=chosen, lowercase=lowercase, tokenize=tokenize, ref_names=ref_names,
                   numbers=_number_accuracy(systems, source_lines, src, translator, refs, target_lang))
    if len(systems) == 1:
        _print_scores(systems[0], ref_lines, confidence=confidence, as_json=as_json, **scoring)
    else:
        _print_comparison(systems, ref_lines, paired_test=paired_test, samples=samples, as_json=as_json, **scoring)


def _eval_engine(checkpoint: Optional[Path], src: Optional[Path], refs: List[Path], engine_args: tuple):
    """eval-bleu --checkpoint's engine (None with --hyp), after the checks that need no model:
    the one read of the checkpoint, whose languages and config the other steps ask."""
    if checkpoint is None:
        return None
    if src is None and refs:
        raise XformerError("--checkpoint needs --src (the source side to translate)")
    if src is not None and not refs:
        raise XformerError("give --ref (or --checkpoint alone, to score the test set its config names)")
    *args, search = engine_args
    needs = ("beam_search",) if search["beam_size"] != 1 else ()
    return _load_engine([checkpoint], *args, needs)


def _translate_source(translator, checkpoint: Path, src: Path, source_lines, search: dict, target_lang,
                      source_lang, output: Optional[Path]) -> list[str]:
    """eval-bleu --checkpoint: the source translated (into --target-lang on a multilingual model;
    its off-target rate said), and written to --output when given."""
    lines = source_lines if source_lines is not None else _read_source(src)
    direction = _direction(translator.languages, target_lang, source_lang, lambda: "\n".join(lines[:2000]))
    _check_output(output, [(src, "--src"), (checkpoint, "--checkpoint")])
    translated = translator.translate(lines, **search, target_lang=direction.target)
    _warn_cut_lines(translator)
    _say_off_target(translator, translated, direction)
    if output is not None:
        from xformer_cli.textio import write_lines

        write_lines(translated, output)
    return translated


def _multilingual(translator) -> bool:
    """Whether the engine's model translates more than one direction (eval-bleu then scores each)."""
    languages = translator.languages
    return languages is not None and len(languages.pairs) > 1


def _eval_directions(translator, checkpoint: Path, metrics, scoring, search, target_lang, source_lang,
                     output: Optional[Path], as_json: bool) -> None:
    """eval-bleu on a multilingual checkpoint alone: each direction's test set from its config
    (--target-lang / --source-lang keep only theirs), one row each (decode/direction_scores.py);
    --output PATH writes PATH.SRC-TGT per direction."""
    from xformer_cli.data.prepare import checkpoint_test_sets
    from xformer_cli.decode.direction_scores import direction_table, score_directions

    languages = translator.languages
    sets = checkpoint_test_sets(checkpoint, log=_log, config=translator.config)
    if target_lang:
        target = languages.target(target_lang)
        sets = {d: c for d, c in sets.items() if d[1] == target}
    if source_lang:
        source = languages.source(source_lang)
        sets = {d: c for d, c in sets.items() if d[0] == source}
    if not sets:
        raise XformerError(f"{checkpoint}: no test set of its config is in the directions asked for "
                           f"({languages.describe()})")
    results = score_directions(translator, sets, languages, metrics, search, *scoring, log=_log)
    _warn_cut_lines(translator)
    if output is not None:
        from xformer_cli.textio import write_lines

        for result in results:
            write_lines(result.hypotheses, output.with_name(f"{output.name}.{result.source}-{result.target}"))
    typer.echo(json.dumps({"directions": [r.to_dict() for r in results]}) if as_json else direction_table(results))


def _say_off_target(translator, translated: list[str], direction) -> None:
    """With a multilingual model: the share of outputs in another language than asked for (stderr)."""
    languages = translator.languages
    if languages is None or not languages.tagged or direction.target is None:
        return
    from xformer_cli.decode.direction_scores import off_target

    candidates = list(dict.fromkeys([*languages.sources, *languages.targets]))
    wrong, scored = off_target(translated, direction.target, candidates)
    if wrong is not None:
        _log(f"off-target: {wrong} of {scored} outputs ({100 * wrong / max(scored, 1):.1f}%) "
             f"are not in {direction.target} "
             f"({direction.describe()}{'' if direction.trained else ', zero-shot'}; py3langid)")


def _references(translator, checkpoint: Optional[Path], src: Optional[Path], refs: List[Path]):
    """(source lines or None, reference lines per reference, their names, the source's path):
    with --checkpoint alone, the test set of the checkpoint's own config (the engine's); else --ref."""
    from xformer_cli.data.sources import read_lines

    if checkpoint is not None and src is None and not refs:
        from xformer_cli.data.prepare import checkpoint_test_set

        test = checkpoint_test_set(checkpoint, log=_log, config=translator.config)
        return test.src, [test.tgt], [test.origin], Path(test.origin)
    if not refs:
        raise XformerError("give --ref (or --checkpoint alone, to score the test set its config names)")
    return None, [list(read_lines(r)) for r in refs], [str(r) for r in refs], src


def _number_accuracy(systems, source_lines: Optional[list[str]], src: Optional[Path], translator,
                     refs: List[Path], target_lang: Optional[str] = None):
    """Each system's number accuracy (docs/evaluation.md#number-accuracy), where the source is
    known (--checkpoint, or --src with --hyp); None otherwise. The languages: the engine's
    (``translator``'s; None with --hyp), else the suffixes of --src and --ref (test.en, test.de)."""
    from xformer_cli.number_matching import number_accuracy

    if source_lines is None and src is None:
        return None
    sources = source_lines if source_lines is not None else _read_source(src)
    recorded = translator.languages if translator is not None else None
    languages = _number_languages(recorded, src, refs, target_lang)
    for name, lines in systems:
        if len(lines) != len(sources):
            raise XformerError(f"{src} has {len(sources)} lines but {name} has {len(lines)}: no number accuracy")
    return [number_accuracy(sources, lines, *languages) for _, lines in systems]


def _number_languages(languages, src: Optional[Path], refs: List[Path], target_lang: Optional[str]) -> tuple[str, str]:
    """(source, target) language of the number words: a one-direction model's pair (``languages``:
    the engine's), else --target-lang and the suffixes of --src and --ref (test.en, test.de); "" =
    digits only."""
    from xformer_cli.number_matching import language_of

    if languages is not None and len(languages.pairs) == 1:
        return languages.pairs[0]
    source = (language_of(src) if src is not None else "") or "en"
    return source, target_lang or (language_of(refs[0]) if refs else "")


def _read_source(src: Path) -> list[str]:
    from xformer_cli.textio import iter_lines

    return list(iter_lines(src))


def _print_scores(system, ref_lines, *, metrics, lowercase, tokenize, ref_names, confidence, as_json,
                  numbers=None) -> None:
    """One system's scores: text with signatures, or one JSON object; its number accuracy
    beside them where the source is known."""
    from xformer_cli.evaluate import score_lines

    name, lines = system
    scores = score_lines(lines, ref_lines, metrics, lowercase, tokenize, confidence, name, ref_names)
    if as_json:
        typer.echo(json.dumps({**{sc.name: sc.to_dict() for sc in scores},
                               **({"numbers": numbers[0].to_dict()} if numbers else {})}))
        return
    for sc in scores:
        typer.echo(sc.text)
        typer.echo(f"  signature: {sc.signature}")
    if numbers:
        typer.echo(numbers[0].text)


def _print_comparison(systems, ref_lines, *, metrics, lowercase, tokenize, ref_names, paired_test, samples, as_json,
                      numbers=None) -> None:
    """Several systems against the first: a significance table with signatures, or one JSON
    object; each system's number accuracy where the source is known."""
    from xformer_cli.evaluate import compare_systems

    rows, signatures = compare_systems(systems, ref_lines, metrics, lowercase, tokenize, paired_test, samples,
                                       ref_names)
    if as_json:
        typer.echo(json.dumps({
            "test": paired_test, "baseline": systems[0][0], "signatures": signatures,
            "systems": [{"name": name, **{sc.name: sc.to_dict() for sc in row},
                         **({"numbers": numbers[i].to_dict()} if numbers else {})}
                        for i, ((name, _), row) in enumerate(zip(systems, rows))],
        }))
        return
    typer.echo(_significance_table([name for name, _ in systems], rows, paired_test))
    for metric_name, signature in signatures.items():
        typer.echo(f"{metric_name} signature: {signature}")
    for (name, _), accuracy in zip(systems, numbers or []):
        typer.echo(f"{name}: {accuracy.text}")


def _significance_table(names: list[str], rows, test: str) -> str:
    header = ["system"] + [sc.name for sc in rows[0]]
    body = []
    for i, (name, row) in enumerate(zip(names, rows)):
        cells = [name + (" (baseline)" if i == 0 else "")]
        for sc in row:
            cell = f"{sc.score:.2f}"
            if sc.mean is not None and sc.ci is not None:
                cell += f" ({sc.mean:.2f} +- {sc.ci:.2f})"
            if sc.p_value is not None:
                cell += f" p={sc.p_value:.4f}{' *' if sc.p_value < 0.05 else ''}"
            cells.append(cell)
        body.append(cells)
    widths = [max(len(r[c]) for r in [header] + body) for c in range(len(header))]
    fmt = lambda r: "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip()  # noqa: E731
    legend = {"bs": "paired bootstrap resampling", "ar": "paired approximate randomisation"}[test]
    return "\n".join([fmt(header)] + [fmt(r) for r in body] + [f"p: {legend} against the baseline; * p < 0.05"])


@app.command()
@user_errors
def serve(  # long: its signature is its options, one parameter each
    checkpoint: Path = typer.Option(..., "--checkpoint", "-m",
                                    help="A checkpoint written by xformer train, or "
                                         "a directory written by xformer export."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(5000, "--port", help="Port to listen on (0: any free one; the log line says which)."),
    engine: str = _engine,
    precision: str = _precision,
    device: str = _device,
    source: Optional[str] = typer.Option(None, "--source",
                                         help="Source language code (default: the checkpoint's data.src_lang)."),
    target: Optional[str] = typer.Option(None, "--target",
                                         help="Target language code (default: the checkpoint's data.tgt_lang)."),
    name: Optional[str] = typer.Option(None, "--name",
                                       help="Model name shown on the page and in /health (default: RUN/FILE)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="XFORMER_API_KEY",
                                          help="Require this key (api_key field, X-API-Key or "
                                               "Authorization: Bearer); also read from $XFORMER_API_KEY."),
    max_wait_ms: float = typer.Option(10.0, "--max-wait-ms",
                                      help="How long a request may wait for others to share "
                                           "its engine call (a lone client does not wait)."),
    max_batch: int = typer.Option(64, "--max-batch", help="Texts per engine call at most."),
    max_batch_tokens: int = typer.Option(4096, "--max-batch-tokens",
                                         help="Estimated source tokens (words + 1) per engine call at most."),
    max_queue: int = typer.Option(1024, "--max-queue",
                                  help="Texts waiting at most; past it requests get 503 with Retry-After."),
    max_chars: int = typer.Option(5000, "--max-chars", help="Characters per text at most (400 past it)."),
    max_texts: int = typer.Option(64, "--max-texts", help="Texts per request at most (400 past it)."),
    threads: int = typer.Option(0, "--threads",
                                help="CPU threads for the engine; 0 = $OMP_NUM_THREADS "
                                     "if set, else one fewer than the cores."),
    access_log: bool = typer.Option(False, "--access-log", help="Log every request."),
    graceful_timeout: float = typer.Option(30.0, "--graceful-timeout",
                                           help="On SIGTERM, seconds to let in-flight requests finish."),
    glossary: Optional[Path] = typer.Option(None, "--glossary",
                                            help="TSV file of source term<TAB>target term, forced "
                                                 "in every request (a request's own glossary wins)."),
    cors: Optional[list[str]] = typer.Option(None, "--cors", metavar="ORIGIN",
                                             help="Let web pages of this origin (repeatable; "
                                                  "* for any) call the API from a browser."),
    max_file_bytes: int = typer.Option(1 << 20, "--max-file-bytes", metavar="BYTES",
                                       help="Largest file POST /translate_file takes (413 past it)."),
) -> None:
    """Serve a model over HTTP: LibreTranslate's POST /translate, /detect, /translate_file and GET
    /languages, GET /health, and a web page at /.

    Requests from all clients are batched together (one engine call at a time). Needs
    pip install 'xformer[serve]'. SIGTERM or Ctrl-C finishes the requests in flight, then exits.
    Every option in detail: docs/serving.md."""
    _before_torch()
    from xformer_cli.serve.cors import check_origin
    from xformer_cli.serve.protocol import Limits
    from xformer_cli.serve.server import serve as run_server

    if min(max_batch, max_batch_tokens, max_queue, max_chars, max_texts) < 1 or max_wait_ms < 0:
        raise XformerError("--max-batch, --max-batch-tokens, --max-queue, --max-chars and --max-texts must be at "
                           "least 1; --max-wait-ms at least 0")
    if max_texts > max_queue:
        raise XformerError(f"--max-texts ({max_texts}) cannot exceed --max-queue ({max_queue})")
    if max_file_bytes < 1:
        raise XformerError("--max-file-bytes must be at least 1")
    try:
        origins = [check_origin(origin) for origin in cors or ()]
    except ValueError as exc:
        raise XformerError(str(exc)) from None
    run_server(str(checkpoint), engine=engine, device=device, precision=precision, source=source, target=target,
               name=name, host=host, port=port, api_key=api_key, threads=threads,
               limits=Limits(max_chars=max_chars, max_texts=max_texts),
               batcher=dict(max_wait=max_wait_ms / 1000, max_sentences=max_batch, max_tokens=max_batch_tokens,
                            max_queued=max_queue),
               access_log=access_log, graceful_timeout=graceful_timeout, log=_log, glossary=glossary, cors=origins,
               max_file_bytes=max_file_bytes)


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


if __name__ == "__main__":  # pragma: no cover
    app()
