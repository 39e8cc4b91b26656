"""``xformer translate``: input lines (a file or stdin, streamed in chunks), the text options
(sentences, HTML, glossary, n-best), the output, and attention plots."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import typer

from xformer_cli.cli.common import (
    app, before_torch, check_output, direction_for, interrupts_on_sigterm, load_engine_logged, user_errors,
    warn_cut_lines)
from xformer_cli.cli.options import (
    BATCH_SIZE, BEAM_SIZE, COMPUTE_TYPE, DEVICE, ENGINE, LENGTH_PENALTY, MAX_LEN_A, MAX_LEN_B, MIN_LEN, PRECISION,
    SOURCE_LANG, TARGET_LANG, THREADS)
from xformer_cli.errors import XformerError


@app.command()
@user_errors
@interrupts_on_sigterm
def translate(  # long: its signature is its options, one parameter each
    checkpoints: List[Path] = typer.Option(..., "--checkpoint", "-m",
                                           help="A checkpoint written by xformer train (repeat for an "
                                                "ensemble), or a directory written by xformer export."),
    input: Optional[Path] = typer.Option(None, "--input", "-i",
                                         help="Source text, one sentence per line (default stdin)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Where to write translations (default stdout)."),
    beam_size: Optional[int] = BEAM_SIZE,
    length_penalty: Optional[float] = LENGTH_PENALTY,
    max_len_a: Optional[float] = MAX_LEN_A,
    max_len_b: Optional[int] = MAX_LEN_B,
    min_len: Optional[int] = MIN_LEN,
    batch_size: Optional[int] = BATCH_SIZE,
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens",
                                             help="Padded source tokens x beam per batch at most."),
    max_input_len: Optional[int] = typer.Option(None, "--max-input-len",
                                                help="Source pieces the engine takes at once; a longer "
                                                     "sentence is cut into parts (default: the checkpoint's "
                                                     "decode.max_input_len, else data.max_len)."),
    nbest: Optional[int] = typer.Option(None, "--nbest",
                                        help="Write the N best per input line (1 too): "
                                             "LINE<TAB>RANK<TAB>SCORE<TAB>TRANSLATION."),
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
    engine: str = ENGINE,
    compute_type: Optional[str] = COMPUTE_TYPE,
    no_cache: bool = typer.Option(False, "--no-cache",
                                  help="Recompute every decoder position at each step (slow; for comparison)."),
    device: str = DEVICE,
    precision: str = PRECISION,
    threads: int = THREADS,
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
    target_lang: Optional[str] = TARGET_LANG,
    source_lang: Optional[str] = SOURCE_LANG,
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
    before_torch()
    from xformer_cli.decode.factory import searches_beam

    inputs = [(input, "--input"), (glossary, "--glossary"), *((c, "--checkpoint") for c in checkpoints)]
    check_output(output, inputs, attention)
    if attention is not None and len(checkpoints) > 1:  # an ensemble has no one cross-attention to draw
        raise XformerError("--attention plots one model's cross-attention: give one --checkpoint, not an ensemble")
    if attention_sentences < 1:
        raise XformerError(f"--attention-sentences must be at least 1, not {attention_sentences}")
    lines = _input_lines(input, chunk_lines, invalid_utf8)
    terms = _glossary(format, glossary)  # a bad --format or glossary file: said before the model loads
    # tags and terms follow attention
    aligning = attention is not None or format == "html" or glossary is not None or keep_numbers
    needs = _needs(aligning, sampling_topk != 0, temperature != 1.0, seed is not None, no_cache,
                   searches_beam(beam_size, checkpoints))
    translator = load_engine_logged(checkpoints, engine, precision, device, threads, needs, compute_type)
    if attention is not None and not hasattr(translator, "attention"):
        raise XformerError(f"--attention needs the xformer engine (fp32, bf16 or fp16), not {translator.name}")
    direction = direction_for(translator.languages, target_lang, source_lang, lines.text)  # the engine read them
    rows, nbest = nbest is not None, 1 if nbest is None else nbest  # --nbest 1 given: its one row, scored
    text_options = _text_options(direction, split_sentences, format, terms, nbest, keep_numbers)
    options = translator.options(beam_size=beam_size, length_penalty=length_penalty, max_len_a=max_len_a,
                                 max_len_b=max_len_b, min_len=min_len, batch_size=batch_size, max_tokens=max_tokens,
                                 max_input_len=max_input_len, nbest=nbest, sampling_topk=sampling_topk,
                                 temperature=temperature, seed=seed, use_cache=not no_cache,
                                 target_lang=direction.target)
    wanted = attention_sentences if attention is not None else 0
    plotted = _translate_stream(translator, options, text_options, lines, input, output, progress, chunk_lines, wanted,
                                rows)
    warn_cut_lines(translator, max_input_len)
    if attention is not None:
        _plot_attention(translator, plotted, attention, replace(options, nbest=1), attention_heads)


def _needs(*wanted: bool) -> tuple[str, ...]:
    """What a translate run asks of its engine (the engine factory's ``needs``), in this order:
    attention, sampling, temperature, a seed, no key/value cache, beam search. A need is named
    by the ``SearchOptions`` field it moves from its default (``use_cache``: turned off)."""
    names = ("attention", "sampling_topk", "temperature", "seed", "use_cache", "beam_search")
    return tuple(name for name, asked in zip(names, wanted) if asked)


def _input_lines(input: Optional[Path], chunk_lines: int, invalid_utf8: str = "error") -> "_Peek":
    """The input lines, of which the first chunk is read ahead only where the source language
    must be detected (``direction_for``); the options checked before anything loads."""
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


def _glossary(format: str, glossary: Optional[Path]):
    """--format checked and --glossary read (None without one)."""
    from xformer_cli.text import load_glossary
    from xformer_cli.text.translation import TEXT_FORMATS

    if format not in TEXT_FORMATS:
        raise XformerError(f"--format must be one of {', '.join(TEXT_FORMATS)}, not {format!r}")
    return load_glossary(glossary) if glossary is not None else None


def _text_options(direction, split_sentences: bool, format: str, terms, nbest: int, keep_numbers: bool = False):
    """How ``translate`` reads its lines: the sentence splitter's language is the direction's
    source; the number words --keep-numbers accepts are its target's; ``terms``: ``_glossary``'s."""
    from xformer_cli.text import TextOptions

    return TextOptions(source_lang=direction.source, split_sentences=split_sentences, format=format, glossary=terms,
                       alternatives=max(nbest, 1) - 1, keep_numbers=keep_numbers, target_lang=direction.target)


def _translate_stream(translator, options, text_options, lines, input: Optional[Path], output: Optional[Path],
                      progress: Optional[bool], chunk_lines: int, keep: int, rows: bool = False) -> list[str]:
    """Translate ``lines`` (read from ``input``: stdin when None or "-") to ``output`` (stdout
    when None), with a progress bar when asked or when a file is read on a terminal; returns
    the first ``keep`` non-empty input lines (for an attention plot), kept as they stream by."""
    from tqdm import tqdm

    from xformer_cli.text.translation import result_lines, translate_text_stream
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
        for text in result_lines(results, options.nbest, rows):
            out.write(text + "\n")
            bar.update(1 if options.nbest == 1 else 1 / options.nbest)
    return kept


def _plot_attention(translator, lines: list[str], target: Path, search, per_head: bool) -> None:
    """The model's translation of each line as one input, with the search the run used."""
    from xformer_cli.plots import plot_attention

    if not lines:
        raise XformerError("--attention needs a non-empty input line")
    plot_attention(translator.attention(lines, search=search), target, per_head=per_head)
    typer.echo(f"attention plot: {target}", err=True)
