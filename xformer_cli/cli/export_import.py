"""``xformer export`` (CTranslate2 with its shortlist, Hugging Face) and ``xformer import`` (MarianMT)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from xformer_cli.cli.common import app, log, user_errors
from xformer_cli.errors import XformerError

SHORTLIST_PER_SOURCE, SHORTLIST_FREQUENT = 20, 100  # export/shortlist.ShortlistSettings' defaults


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
    force: bool = typer.Option(False, "--force", help="Replace an earlier export in the output directory."),
    shortlist: bool = typer.Option(False, "--shortlist",
                                   help="CTranslate2: add a lexical shortlist counted on the checkpoint's training "
                                        "data (its config's data.train): each step then scores only the batch's "
                                        "candidate pieces, faster, with output that can differ."),
    shortlist_per_source: int = typer.Option(SHORTLIST_PER_SOURCE, "--shortlist-per-source",
                                             help="Candidates per source piece."),
    shortlist_frequent: int = typer.Option(SHORTLIST_FREQUENT, "--shortlist-frequent",
                                           help="The most frequent target pieces, candidates in every batch."),
) -> None:
    """Export a checkpoint for CTranslate2 (pip install 'xformer[ctranslate2]'): xformer translate
    --engine ctranslate2 uses it; or, with --format huggingface, for Hugging Face transformers
    (pip install 'xformer[hf]'): MarianMTModel (Pegasus for a pre-norm model: AutoModelForSeq2SeqLM)
    and MarianTokenizer load it."""
    if not shortlist and (shortlist_per_source, shortlist_frequent) != (SHORTLIST_PER_SOURCE, SHORTLIST_FREQUENT):
        raise XformerError("--shortlist-per-source and --shortlist-frequent size the shortlist: give --shortlist too")
    if format == "ctranslate2":
        from xformer_cli.export.common import load_for_export, output_directory
        from xformer_cli.export.ctranslate2 import export_ctranslate2

        loaded = listed = None
        if shortlist:
            output_directory(output, force, checkpoint)  # a refused output directory before the count, not after it
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
        from xformer_cli.export import FORMATS

        raise XformerError(f"--format must be {' or '.join(FORMATS)}, not {format!r}")
    typer.echo(f"exported {checkpoint} -> {written}", err=True)


def _shortlist(loaded, per_source: int, frequent: int):
    """The shortlist counted on the loaded checkpoint's training data."""
    from xformer_cli.data.directions import training_pairs
    from xformer_cli.export.shortlist import ShortlistSettings, build_shortlist

    from xformer_cli.importers.marian import IMPORTED_FROM

    settings = ShortlistSettings(per_source=per_source, frequent=frequent)
    settings.check("--shortlist-per-source / --shortlist-frequent")
    if any(str(corpus.prefix or "").startswith(IMPORTED_FROM) for corpus in loaded[2].data.train):
        raise XformerError("--shortlist counts the training pairs a checkpoint records; this one was imported "
                           "(xformer import) and records none")
    return build_shortlist(loaded[1], training_pairs(loaded[2].data, log), settings, log)


@app.command("import")
@user_errors
def import_(
    source: str = typer.Argument(...,
                                 help="A MarianMT model directory, or a Hub id such as "
                                      "Helsinki-NLP/opus-mt-en-de (needs internet)."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the xformer checkpoint."),
    force: bool = typer.Option(False, "--force", help="Replace the output file if it exists."),
) -> None:
    """Import a Hugging Face MarianMT (OPUS-MT) model as an xformer checkpoint: translate, fine-tune
    (train.init_from) and export it like any other."""
    from xformer_cli.fileio import new_output_file
    from xformer_cli.importers.marian import import_marian

    new_output_file(output, force)
    typer.echo(f"imported {source} -> {import_marian(source, output)}", err=True)
