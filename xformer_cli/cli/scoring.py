"""``xformer eval-bleu``: a checkpoint's translations or given hypotheses scored with sacreBLEU,
per direction for a multilingual model, with the number accuracy where the source is known,
and several systems compared by a paired test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from xformer_cli.cli.common import (
    app, before_torch, check_output, direction_for, load_engine_logged, log, user_errors, warn_cut_lines)
from xformer_cli.cli.options import (
    BATCH_SIZE, BEAM_SIZE, DEVICE, ENGINE, LENGTH_PENALTY, PRECISION, SOURCE_LANG, TARGET_LANG, THREADS)
from xformer_cli.errors import XformerError


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
    beam_size: Optional[int] = BEAM_SIZE,
    length_penalty: Optional[float] = LENGTH_PENALTY,
    batch_size: Optional[int] = BATCH_SIZE,
    engine: str = ENGINE,
    device: str = DEVICE,
    precision: str = PRECISION,
    threads: int = THREADS,
    target_lang: Optional[str] = TARGET_LANG,
    source_lang: Optional[str] = SOURCE_LANG,
) -> None:
    """Score with sacreBLEU (BLEU, chrF, TER, always with signatures): --hyp H --ref R, or --checkpoint C
    --src S --ref R, or --checkpoint C alone (the test set its training config names; a multilingual
    model's: one row per direction, with the share of outputs in another language than asked for).
    Where the source is known (--checkpoint with --src or alone on a one-direction model, or --src
    with --hyp), also the number accuracy: the share of source numbers whose value the output holds,
    in digits or as a word of the target language (docs/evaluation.md#number-accuracy)."""
    before_torch()
    from xformer_cli.data.sources import read_lines
    from xformer_cli.evaluate import hypothesis_warnings, make_metrics

    if bool(hyps) == (checkpoint is not None):
        raise XformerError("give --hyp, or --checkpoint (alone: its test set; or with --src)")
    translating = {"--output": output is not None, "--beam-size": beam_size is not None,
                   "--length-penalty": length_penalty is not None, "--batch-size": batch_size is not None,
                   "--engine": engine != "auto", "--device": device != "auto",
                   "--precision": precision != "auto", "--threads": threads != 0}
    _check_scoring_options(hyps, samples, paired_test, translating)
    if confidence < 0 or confidence == 1:
        raise XformerError("--confidence is a number of bootstrap resamples: 0 (off) or at least 2 (1000 is usual), "
                           f"not {confidence}")
    if confidence and len(hyps) > 1:  # it was ignored: the paired test gives the intervals
        raise XformerError("--confidence is for one system: with several --hyp the paired bootstrap (--paired-test bs) "
                           "gives each its interval, from --samples resamples")
    chosen = [m for m in metrics.split(",") if m.strip()]
    make_metrics(chosen, lowercase, tokenize)  # reject a bad metric or tokenizer before any translating
    search = dict(beam_size=beam_size, length_penalty=length_penalty, batch_size=batch_size)
    given = _given_texts(checkpoint, src, refs, output)  # read and checked before a model loads
    translator = _eval_engine(checkpoint, (engine, precision, device, threads, search))
    if translator is not None and given is None and _multilingual(translator):
        if confidence:  # it was ignored
            raise XformerError("--confidence: the table of a multilingual model's directions has no intervals; score "
                               "one direction with --src and --ref to get one")
        _eval_directions(translator, checkpoint, chosen, (lowercase, tokenize), search, target_lang, source_lang,
                         output, as_json)
        return
    source_lines, ref_lines, ref_names, src = given or _test_set(translator, checkpoint, output)
    if translator is not None:
        out = _translate_source(translator, source_lines, search, target_lang, source_lang, output)
        systems = [(f"translation of {src}", out)]
    else:
        systems = [(str(h), list(read_lines(h))) for h in hyps]
    for name, lines in systems:
        for warning in hypothesis_warnings(lines, name):
            typer.echo(f"warning: {warning}", err=True)
    scoring = dict(metrics=chosen, lowercase=lowercase, tokenize=tokenize, ref_names=ref_names,
                   numbers=_number_accuracy(systems, source_lines, src, translator, refs, target_lang, source_lang))
    if len(systems) == 1:
        _print_scores(systems[0], ref_lines, confidence=confidence, as_json=as_json, **scoring)
    else:
        _print_comparison(systems, ref_lines, paired_test=paired_test, samples=samples, as_json=as_json, **scoring)


def _check_scoring_options(hyps: List[Path], samples: int, paired_test: str, translating: dict[str, bool]) -> None:
    """An option this scoring would not use is refused, not ignored: the translation's options
    (``translating``: option -> whether given, away from its default) with --hyp, as nothing is translated;
    --samples or another --paired-test without several systems to compare; and one system given twice."""
    if paired_test not in ("bs", "ar"):
        raise XformerError("--paired-test: bs (paired bootstrap) or ar (approximate randomisation), "
                           f"not {paired_test!r}")
    if paired_test != "bs" and len(hyps) < 2:
        raise XformerError(f"--paired-test {paired_test} compares systems: give several --hyp")
    if hyps:
        given = [name for name, on in translating.items() if on]
        if given:
            raise XformerError(f"{', '.join(given)}: for --checkpoint, which translates; --hyp scores given "
                               "translations")
    from xformer_cli.fileio import same_file

    twice = next((b for i, a in enumerate(hyps) for b in hyps[i + 1:] if same_file(a, b)), None)
    if twice is not None:  # a slip: one system compared with itself
        raise XformerError(f"--hyp {twice} is given twice: give each system once")
    if samples and len(hyps) < 2:
        raise XformerError("--samples sets the paired test's resamples: give several --hyp to compare")


def _given_texts(checkpoint: Optional[Path], src: Optional[Path], refs: List[Path], output: Optional[Path]):
    """(source lines, reference lines per reference, their names, the source's path) from --src and
    --ref, with their line counts checked and --output on none of the inputs, before a model loads;
    None for --checkpoint alone (its config's test set, read with the model). With --hyp the source
    lines are None: the number accuracy reads --src when given."""
    from xformer_cli.data.sources import read_lines
    from xformer_cli.evaluate import check_line_counts

    if checkpoint is not None and src is None and not refs:
        check_output(output, [(checkpoint, "--checkpoint")])
        return None
    if checkpoint is not None and src is None:
        raise XformerError("--checkpoint needs --src (the source side to translate)")
    if not refs:
        raise XformerError("give --ref (or --checkpoint alone, to score the test set its config names)")
    ref_lines = [list(read_lines(path)) for path in refs]
    source_lines = None
    if checkpoint is not None:
        check_output(output, [(src, "--src"), (checkpoint, "--checkpoint"), *((path, "--ref") for path in refs)])
        source_lines = _read_source(src)
        check_line_counts(source_lines, ref_lines, str(src), [str(path) for path in refs], allow_empty=True)
    return source_lines, ref_lines, [str(path) for path in refs], src


def _eval_engine(checkpoint: Optional[Path], engine_args: tuple):
    """eval-bleu --checkpoint's engine (None with --hyp): the one read of the checkpoint, whose
    languages and config the other steps ask."""
    if checkpoint is None:
        return None
    *args, search = engine_args
    from xformer_cli.decode.factory import searches_beam

    needs = ("beam_search",) if searches_beam(search["beam_size"], [checkpoint]) else ()
    return load_engine_logged([checkpoint], *args, needs)


def _test_set(translator, checkpoint: Path, output: Optional[Path]):
    """--checkpoint alone: the test set of its own config (the engine's), as ``_given_texts``
    returns --src and --ref; --output refused on its files."""
    from xformer_cli.data.directions import checkpoint_test_set

    test = checkpoint_test_set(checkpoint, log=log, config=translator.config)
    check_output(output, [(path, "data.test") for path in test.files])
    return test.src, [test.tgt], [test.origin], Path(test.origin)


def _translate_source(translator, lines: list[str], search: dict, target_lang, source_lang,
                      output: Optional[Path]) -> list[str]:
    """eval-bleu --checkpoint: the source translated (into --target-lang on a multilingual model;
    its off-target rate said), and written to --output when given."""
    direction = direction_for(translator.languages, target_lang, source_lang, lambda: "\n".join(lines[:2000]))
    translated = translator.translate(lines, **search, target_lang=direction.target)
    warn_cut_lines(translator)
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
    from xformer_cli.data.directions import checkpoint_test_sets
    from xformer_cli.decode.direction_scores import direction_table, score_directions, sets_asked_for

    languages = translator.languages
    sets = checkpoint_test_sets(checkpoint, log=log, config=translator.config)
    sets = sets_asked_for(sets, languages, target_lang, source_lang, str(checkpoint))
    results = score_directions(translator, sets, languages, metrics, search, *scoring, log=log)
    warn_cut_lines(translator)
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

    wrong, scored = off_target(translated, direction.target, languages.codes)
    if wrong is not None:
        log(f"off-target: {wrong} of {scored} outputs ({100 * wrong / max(scored, 1):.1f}%) "
             f"are not in {direction.target} "
             f"({direction.describe()}{'' if direction.trained else ', zero-shot'}; py3langid)")


def _number_accuracy(systems, source_lines: Optional[list[str]], src: Optional[Path], translator,
                     refs: List[Path], target_lang: Optional[str] = None, source_lang: Optional[str] = None):
    """Each system's number accuracy (docs/evaluation.md#number-accuracy), where the source is
    known (--checkpoint, or --src with --hyp); None otherwise. The languages: the engine's
    (``translator``'s; None with --hyp), else the suffixes of --src and --ref (test.en, test.de)."""
    from xformer_cli.number_matching import number_accuracy

    if source_lines is None and src is None:
        return None
    sources = source_lines if source_lines is not None else _read_source(src)
    recorded = translator.languages if translator is not None else None
    languages = _number_languages(recorded, src, refs, target_lang, source_lang)
    for name, lines in systems:
        if len(lines) != len(sources):
            raise XformerError(f"{src} has {len(sources)} lines but {name} has {len(lines)}: no number accuracy")
    return [number_accuracy(sources, lines, *languages) for _, lines in systems]


def _number_languages(languages, src: Optional[Path], refs: List[Path], target_lang: Optional[str],
                      source_lang: Optional[str] = None) -> tuple[str, str]:
    """(source, target) language of the number words: a one-direction model's pair (``languages``:
    the engine's), else --source-lang / --target-lang (any spelling: fra, >>fra<< are fr) and the
    suffixes of --src and --ref (test.en, test.de); "" = digits only."""
    from xformer_cli.languages import plain_code
    from xformer_cli.number_matching import language_of

    if languages is not None and len(languages.pairs) == 1:
        return languages.pairs[0]
    source = plain_code(source_lang) if source_lang else (language_of(src) if src is not None else "") or "en"
    return source, plain_code(target_lang) if target_lang else (language_of(refs[0]) if refs else "")


def _read_source(src: Path) -> list[str]:
    """--src's lines: a file as --ref and --hyp are read (.gz too), or stdin for "-"."""
    from xformer_cli.data.sources import read_lines
    from xformer_cli.textio import iter_lines

    return list(iter_lines(None) if str(src) == "-" else read_lines(src))


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
