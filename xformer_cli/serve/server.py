"""Run the app under uvicorn until SIGTERM or Ctrl-C, then drain and exit cleanly.

On SIGTERM (or SIGINT) uvicorn stops accepting connections, lets in-flight requests
finish (at most ``graceful_timeout`` seconds), then runs the app's shutdown, which
drains the batcher's queue and stops its worker. The process then exits 0.
"""

from __future__ import annotations

import signal
import socket
from typing import Any, Callable, Optional, Sequence

from xformer_cli.errors import XformerError

MISSING = "xformer serve needs FastAPI and uvicorn: pip install 'xformer[serve]'"


def require_server_packages() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise XformerError(MISSING) from None


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free one); one-line errors."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, IndexError) as exc:
        raise XformerError(f"cannot listen on {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise XformerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run(app: Any, host: str = "127.0.0.1", port: int = 5000, *, access_log: bool = False,
        graceful_timeout: Optional[float] = 30.0, log: Callable[[str], None] = print, banner: str = "") -> None:
    import uvicorn

    sock = listen(host, port)
    config = uvicorn.Config(app, log_level="info", access_log=access_log, lifespan="on",
                            timeout_graceful_shutdown=graceful_timeout, server_header=False)
    server = uvicorn.Server(config)
    log(f"{banner}serving on {url_of(sock)} (SIGTERM or Ctrl-C: finish the requests in flight, then exit)")
    # uvicorn re-raises the signal that stopped it once it has shut down; a server that
    # drained cleanly should exit 0, so that re-raised signal lands here and is dropped.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    if not server.started:
        raise XformerError("the server did not start (see the log above)")


def serve(model: str, *, engine: str = "auto", device: str = "auto", precision: str = "auto",
          source: Optional[str] = None, target: Optional[str] = None, name: Optional[str] = None,
          host: str = "127.0.0.1", port: int = 5000, api_key: Optional[str] = None, threads: int = 0,
          limits: Any = None, batcher: Optional[dict[str, Any]] = None, access_log: bool = False,
          graceful_timeout: Optional[float] = 30.0, log: Callable[[str], None] = print,
          glossary: Any = None, cors: Sequence[str] = (), max_file_bytes: int = 1 << 20) -> None:
    """``xformer serve``: load the model, build the app, serve until told to stop."""
    require_server_packages()
    from xformer_cli.serve.app import create_app
    from xformer_cli.serve.engine import load_served_model

    loaded = load_served_model(model, engine, device=device, precision=precision, source=source, target=target,
                         name=name, threads=threads, serving=True, log=log, glossary=glossary)
    app = create_app(loaded, limits=limits, api_key=api_key, batcher=batcher, log=log, cors=cors,
                     max_file_bytes=max_file_bytes)
    directions = loaded.languages.describe() if loaded.languages else f"{loaded.source}->{loaded.target}"
    banner = (f"{loaded.name} ({loaded.engine}, {loaded.precision}, {directions}, "
              f"{loaded.threads} thread{'s' if loaded.threads > 1 else ''}): ")
    run(app, host, port, access_log=access_log, graceful_timeout=graceful_timeout, log=log, banner=banner)
