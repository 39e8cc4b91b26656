"""What every command shares: the Typer app, one-line errors (``user_errors``), the log on
stderr, the engine loading of the commands that translate, and their common options."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import List, Optional

import typer

from xformer_cli.errors import XformerError
from xformer_cli.version import __version__


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


def _before_torch() -> None:
    """For the commands that translate: OpenMP threads that sleep at barriers (decode.factory)."""
    from xformer_cli.decode.factory import prefer_passive_waits

    prefer_passive_waits()


def _load_engine(models: List[Path], engine: str = "auto", precision: str = "auto", device: str = "auto",
                 threads: int = 0, needs: tuple[str, ...] = (), compute_type: Optional[str] = None):
    """``decode.factory.load_engine``, logging what it chose; ``compute_type``: the deprecated
    --compute-type, now a spelling of --precision that selects the CTranslate2 engine."""
    from xformer_cli.decode.factory import load_engine

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


# The options the commands that translate share.
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


def _direction(languages, target_lang: Optional[str], source_lang: Optional[str], text=lambda: ""):
    """The direction to translate (decode/direction.py) among ``languages`` (the engine's): --target-lang
    needed on a model with several target languages, --source-lang given or detected in ``text()``;
    zero-shot with a warning."""
    from xformer_cli.decode.direction import Direction, choose_direction

    if languages is None:  # a model that records no languages: say nothing against the flags
        return Direction(source_lang or "en", target_lang)
    return choose_direction(languages, target_lang, source_lang, text, _log)
