"""What every command shares: the Typer app, one-line errors (``user_errors``), the log on
stderr, the engine loading of the commands that translate, and ``--version`` (the options several
commands share are ``cli/options.py``'s)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Optional, TypeVar

import typer

from xformer_cli.errors import XformerError
from xformer_cli.version import __version__

if TYPE_CHECKING:
    from xformer_cli.decode.direction import Direction
    from xformer_cli.decode.engine import Engine
    from xformer_cli.languages import Languages

Command = TypeVar("Command", bound=Callable[..., Any])


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


def user_errors(fn: Command) -> Command:
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

            if isinstance(exc, RuntimeError) and _out_of_memory(exc):  # torch's allocators raise RuntimeErrors
                _fail("out of memory; lower train.max_tokens or decode.batch_size, or the model's size")
            if not disk_full(exc):
                if isinstance(exc, OSError) and exc.filename is not None:  # a path the system refused
                    _fail(f"{exc.filename}: {exc.strerror or exc}")
                raise
            # a write the library did not name itself (config.yaml, the tokenizer, an export)
            target = getattr(exc, "filename", None) or "a file"
            _fail(f"could not write {target}: no space left on device; files written before it are intact")

    return wrapper  # type: ignore[return-value]


def _out_of_memory(exc: RuntimeError) -> bool:
    """torch's CPU allocator ("can't allocate memory") or a GPU's ("out of memory")."""
    return any(words in str(exc) for words in ("can't allocate memory", "out of memory"))


def log(message: str) -> None:
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


def before_torch() -> None:
    """For the commands that translate: OpenMP threads that sleep at barriers (decode.factory)."""
    from xformer_cli.decode.factory import prefer_passive_waits

    prefer_passive_waits()


def load_engine_logged(models: List[Path], engine: str = "auto", precision: str = "auto", device: str = "auto",
                       threads: int = 0, needs: tuple[str, ...] = (), compute_type: Optional[str] = None) -> Engine:
    """``decode.factory.load_engine``, logging what it chose; ``compute_type``: the deprecated
    --compute-type, now a spelling of --precision that selects the CTranslate2 engine."""
    from xformer_cli.decode.factory import load_engine

    if compute_type is not None:
        if engine == "xformer":
            raise XformerError("--compute-type is for --engine ctranslate2 (and deprecated: use --precision)")
        if precision != "auto":
            raise XformerError("give --precision or the deprecated --compute-type, not both")
        log("warning: --compute-type is deprecated; --precision takes CTranslate2's compute types")
        engine, precision = "ctranslate2", "auto" if compute_type == "default" else compute_type
    return load_engine(models, engine, precision=precision, device=device, threads=threads, needs=needs, log=log)


def warn_cut_lines(translator: Engine, max_input_len: Optional[int] = None) -> None:
    """One warning line for the input lines cut to the source length limit, if any."""
    if translator.truncated_lines:
        limit = translator.input_limit(max_input_len)
        typer.echo(f"warning: {translator.truncated_lines} input line(s) longer than {limit} source pieces were cut "
                   f"to {limit} (--max-input-len / decode.max_input_len)", err=True)


def interrupts_on_sigterm(command: Command) -> Command:
    """A command that SIGTERM (a scheduler, `timeout`) stops as Ctrl-C does, with a
    KeyboardInterrupt: the output being written is removed, not left as a temporary file beside
    the old one. The handler before it is back when the command returns (it may run in-process)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():  # only the main thread sets handlers
            return command(*args, **kwargs)
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            return command(*args, **kwargs)
        finally:
            signal.signal(signal.SIGTERM, previous)

    return wrapper  # type: ignore[return-value]


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def check_output(output: Optional[Path], inputs: list[tuple[Path, str]], attention: Optional[Path] = None) -> None:
    """Before any work: an output that is one of the command's inputs (a checkpoint, the source),
    lies inside an export directory given, or is a checkpoint file would destroy it; an attention
    plot path that cannot be written would fail the run after the translation was written."""
    from xformer_cli.fileio import is_inside, same_file

    if attention is not None:
        from xformer_cli.plots import check_png_path

        check_png_path(attention)
        for path, option in [*inputs, (output, "--output")]:
            if path is not None and (same_file(attention, path) or Path(attention).resolve() == Path(path).resolve()):
                raise XformerError(f"--attention {attention} is the {option} file: write the plot elsewhere")

    if output is None:
        return
    for path, option in inputs:
        if same_file(output, path):
            raise XformerError(f"--output {output} is the {option} file: write the translation elsewhere")
        if path is not None and Path(path).is_dir() and is_inside(output, path):  # an export's model files
            raise XformerError(f"--output {output} is inside the {option} directory {path}: write the translation "
                               "elsewhere")
    if Path(output).suffix == ".pt" and Path(output).is_file():  # a run's last.pt beside the best.pt given
        raise XformerError(f"--output {output} is a checkpoint file: write the translation elsewhere")
    from xformer_cli.fileio import unwritable_folder

    output, folder = Path(output), Path(output).parent
    replaced = output.is_file() or not output.exists()  # a device or a pipe (/dev/null) is written into as it is
    why = unwritable_folder(folder) if replaced and folder.is_dir() else None
    if why is not None:  # said now, not after the translation
        raise XformerError(f"cannot write --output {output}: {why}")


def direction_for(languages: Optional[Languages], target_lang: Optional[str], source_lang: Optional[str],
                  text: Callable[[], str] = lambda: "") -> Direction:
    """The direction to translate (decode/direction.py) among ``languages`` (the engine's): --target-lang
    needed on a model with several target languages, --source-lang given or detected in ``text()``;
    zero-shot with a warning."""
    from xformer_cli.decode.direction import Direction, choose_direction

    if languages is None:  # a model that records no languages: say nothing against the flags
        return Direction(source_lang or "en", target_lang)
    return choose_direction(languages, target_lang, source_lang, text, log)
