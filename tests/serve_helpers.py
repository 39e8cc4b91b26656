"""Start ``xformer serve`` in a process of its own, or an app under uvicorn in a thread, and talk to it with the standard library."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class ServerProcess:
    def __init__(self, *args, timeout: float = 120):
        command = [sys.executable, "-m", "xformer_cli", "serve", "--port", "0", *map(str, args)]
        self.proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log: list[str] = []
        self.url = self._wait_for_url(timeout)
        self.wait_healthy(timeout)

    def _wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        for line in self.proc.stdout:
            self.log.append(line)
            found = re.search(r"serving on (http://\S+)", line)
            if found:
                return found.group(1)
            if time.monotonic() > deadline:
                break
        self.proc.kill()
        raise AssertionError("the server did not start:\n" + "".join(self.log) + self.proc.stdout.read())

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if get(self.url + "/health")[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("the server never became healthy")
            time.sleep(0.05)

    def output(self) -> str:
        """What the process printed (call once it has exited)."""
        return "".join(self.log) + self.proc.stdout.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc.stdout.close()


def request(url: str, body=None, headers=None, method=None, timeout: float = 60):
    """(status, parsed JSON or text, headers) of one request; errors are answers too."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            status, raw, got = res.status, res.read(), res.headers
    except urllib.error.HTTPError as exc:
        status, raw, got = exc.code, exc.read(), exc.headers
    text = raw.decode("utf-8")
    try:
        return status, json.loads(text), got
    except ValueError:
        return status, text, got


def get(url: str, timeout: float = 10):
    return request(url, timeout=timeout)


@contextmanager
def real_server(app):
    """``app`` under uvicorn in a thread, on a free port: its base URL."""
    import uvicorn

    from xformer_cli.serve.server import uvicorn_config

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn_config(app, log_level="warning"))  # the config xformer serve runs
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
