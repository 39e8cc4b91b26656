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

from xformer_cli import __version__
from xformer_cli.errors import XformerError

app = typer.Typer(
    name="xformer",
    help="Train a Transformer translation model, translate with it, and score it with sacreBLEU.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
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

    return wrapper


def _version(value: bool) -> None:
    if value:
        typer.echo(f"xformer {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> None:
    """xformer: from parallel text to a trained Transformer, translations and BLEU."""


@app.command()
@user_errors
def train(
    config: Path = typer.Option(..., "--config", "-c", help="YAML config (see configs/)."),
    overrides: List[str] = typer.Option([], "--set", "-s", help="Override a key: --set model.d_model=256 (repeatable)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace checkpoints already in run_dir."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Train a tokenizer and a Transformer as the config says; checkpoints go to run_dir."""
    from xformer_cli.config import load_config
    from xformer_cli.train.trainer import train as run_training

    cfg = load_config(config, overrides)
    log = lambda message: typer.echo(message, err=True)  # noqa: E731 - keeps stdout for data
    run_training(cfg, overwrite=overwrite, log=log, progress=not quiet)


def _read_input(path: Optional[Path]) -> list[str]:
    """Lines split on '\\n' only, undecodable bytes replaced: the line count never drifts."""
    if path is None or str(path) == "-":
        data = sys.stdin.buffer.read()
    else:
        if not path.is_file():
            raise XformerError(f"input file not found: {path}")
        data = path.read_bytes()
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def _write_output(lines: list[str], path: Optional[Path]) -> None:
    text = "".join(line + "\n" for line in lines)
    if path is None or str(path) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        path.write_text(text, encoding="utf-8")


def _translate(checkpoint: Path, lines: list[str], beam_size: Optional[int], length_penalty: Optional[float],
               max_len_a: Optional[float], max_len_b: Optional[int], batch_size: Optional[int], device: str) -> list[str]:
    from xformer_cli.decode.translator import Translator

    translator = Translator.from_checkpoint(checkpoint, device=device)
    return translator.translate(lines, beam_size, length_penalty, max_len_a, max_len_b, batch_size)


_beam = typer.Option(None, "--beam-size", "-b", help="1 = greedy; default from the checkpoint's decode config.")
_alpha = typer.Option(None, "--length-penalty", help="GNMT length penalty alpha (paper: 0.6).")
_len_a = typer.Option(None, "--max-len-a", help="Max output length = a * source length + b.")
_len_b = typer.Option(None, "--max-len-b", help="Max output length = a * source length + b.")
_batch = typer.Option(None, "--batch-size", help="Sentences per decoding batch.")
_device = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N.")


@app.command()
@user_errors
def translate(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-m", help="A checkpoint written by xformer train."),
    input: Optional[Path] = typer.Option(None, "--input", "-i", help="Source text, one sentence per line (default stdin)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Where to write translations (default stdout)."),
    beam_size: Optional[int] = _beam,
    length_penalty: Optional[float] = _alpha,
    max_len_a: Optional[float] = _len_a,
    max_len_b: Optional[int] = _len_b,
    batch_size: Optional[int] = _batch,
    device: str = _device,
) -> None:
    """Translate text: exactly one output line per input line, blank lines stay blank."""
    lines = _read_input(input)
    hyps = _translate(checkpoint, lines, beam_size, length_penalty, max_len_a, max_len_b, batch_size, device)
    _write_output(hyps, output)


@app.command("eval-bleu")
@user_errors
def eval_bleu(
    ref: Path = typer.Option(..., "--ref", "-r", help="Reference translations."),
    hyp: Optional[Path] = typer.Option(None, "--hyp", help="Hypotheses to score (detokenized text)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", "-m", help="Translate --src with this checkpoint, then score."),
    src: Optional[Path] = typer.Option(None, "--src", help="Source text to translate (with --checkpoint)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="With --checkpoint: also save the translations here."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of text."),
    beam_size: Optional[int] = _beam,
    length_penalty: Optional[float] = _alpha,
    batch_size: Optional[int] = _batch,
    device: str = _device,
) -> None:
    """Score with sacreBLEU (BLEU and chrF, with signatures): --hyp H --ref R, or --checkpoint C --src S --ref R."""
    from xformer_cli.data.sources import read_lines
    from xformer_cli.evaluate import score_lines

    if (hyp is None) == (checkpoint is None):
        raise XformerError("give either --hyp, or --checkpoint with --src")
    refs = list(read_lines(ref))
    if checkpoint is not None:
        if src is None:
            raise XformerError("--checkpoint needs --src (the source side to translate)")
        hyps = _translate(checkpoint, _read_input(src), beam_size, length_penalty, None, None, batch_size, device)
        if output is not None:
            _write_output(hyps, output)
        hyp_name = f"translation of {src}"
    else:
        hyps = list(read_lines(hyp))
        hyp_name = str(hyp)
    scores = score_lines(hyps, refs, hyp_name, str(ref))
    if as_json:
        typer.echo(json.dumps({s.name: {"score": round(s.score, 4), "signature": s.signature} for s in scores}))
    else:
        for s in scores:
            typer.echo(s.text)
            typer.echo(f"  signature: {s.signature}")


if __name__ == "__main__":  # pragma: no cover
    app()
