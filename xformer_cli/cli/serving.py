"""``xformer serve``: its options, handed to the server (``xformer_cli.serve``), which checks them first."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from xformer_cli.cli.common import app, before_torch, log, user_errors
from xformer_cli.cli.options import DEVICE, ENGINE, PRECISION


@app.command()
@user_errors
def serve(  # long: its signature is its options, one parameter each
    checkpoint: Path = typer.Option(..., "--checkpoint", "-m",
                                    help="A checkpoint written by xformer train, or "
                                         "a directory written by xformer export."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(5000, "--port", help="Port to listen on (0: any free one; the log line says which)."),
    engine: str = ENGINE,
    precision: str = PRECISION,
    device: str = DEVICE,
    source: Optional[str] = typer.Option(None, "--source",
                                         help="Source language code (default: the checkpoint's data.src_lang; "
                                              "another spelling of it, e.g. deu for de)."),
    target: Optional[str] = typer.Option(None, "--target",
                                         help="Target language code (default: the checkpoint's data.tgt_lang; "
                                              "another spelling of it, e.g. de-DE for de)."),
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
    before_torch()
    from xformer_cli.serve.protocol import Limits
    from xformer_cli.serve.server import serve as run_server

    run_server(str(checkpoint), engine=engine, device=device, precision=precision, source=source, target=target,
               name=name, host=host, port=port, api_key=api_key, threads=threads,
               limits=Limits(max_chars=max_chars, max_texts=max_texts),
               batcher=dict(max_wait=max_wait_ms / 1000, max_sentences=max_batch, max_tokens=max_batch_tokens,
                            max_queued=max_queue),
               access_log=access_log, graceful_timeout=graceful_timeout, log=log, glossary=glossary, cors=cors or (),
               max_file_bytes=max_file_bytes)
