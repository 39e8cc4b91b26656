#!/usr/bin/env python
"""Load test of ``xformer serve`` on loopback, beside ``xformer translate`` on the same sentences.

    python scripts/bench_serve.py --checkpoint /tmp/runs/draw1/best.pt

Starts the server (a real uvicorn process), sends a fixed number of single-sentence
requests (Multi30k test2016's English side, repeated to --requests) from 1, 8 and 32
concurrent clients (threads, each with one keep-alive connection), and prints requests/s
and p50/p95 latency per concurrency, plus the mean batch the server formed. Then it runs
``xformer translate`` on the same sentences in one go and reports its sentences/s (its
run on one line, start-up and model load, is subtracted). Both sides use the
checkpoint's decode settings (beam, length penalty) and the same --precision and threads.
With --engine ctranslate2, --checkpoint is an export directory (both sides load it).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("XFORMER_DATA", ROOT.parent / "shared" / "data")) / "multi30k" / "test2016.en"


def env(args) -> dict:
    """The environment of both sides: OMP_NUM_THREADS=--threads when given (torch reads it)."""
    out = dict(os.environ)
    if args.threads:
        out["OMP_NUM_THREADS"] = str(args.threads)
    return out


def start_server(args) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "xformer_cli", "serve", "-m", str(args.checkpoint), "--port", "0",
               "--precision", args.precision, "--engine", args.engine, *args.serve_args]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(args))
    for line in proc.stdout:
        print("  server:", line.rstrip(), file=sys.stderr)
        found = re.search(r"serving on (http://\S+)", line)
        if found:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # keep the pipe drained
            return proc, found.group(1)
    raise SystemExit("the server did not start")


class Client:
    """One keep-alive connection."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)

    def call(self, method: str, path: str, body=None):
        data = json.dumps(body).encode() if body is not None else None
        self.conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        res = self.conn.getresponse()
        return res.status, json.loads(res.read())


def load(url: str, sentences: list[str], clients: int) -> dict:
    """Send every sentence once, ``clients`` at a time; latencies in seconds."""
    latencies: list[float] = []
    failures = []
    next_index = iter(range(len(sentences)))
    lock = threading.Lock()

    def worker():
        client = Client(url)
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            started = time.perf_counter()
            status, body = client.call("POST", "/translate", {"q": sentences[i], "source": "en", "target": "de"})
            took = time.perf_counter() - started
            with lock:
                latencies.append(took)
                if status != 200:
                    failures.append((status, body))

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    latencies.sort()
    return {
        "clients": clients, "requests": len(sentences), "seconds": wall, "rps": len(sentences) / wall,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))],
        "failures": len(failures),
    }


def batch_translate(args, sentences: list[str]) -> dict:
    """``xformer translate`` on the sentences, minus its run on one line (start-up, model load)."""
    with tempfile.TemporaryDirectory() as tmp:
        one, many = Path(tmp) / "one.en", Path(tmp) / "many.en"
        one.write_text(sentences[0] + "\n", encoding="utf-8")
        many.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
        times = {}
        for name, path in (("one", one), ("many", many)):
            command = [sys.executable, "-m", "xformer_cli", "translate", "-m", str(args.checkpoint), "-i", str(path),
                       "-o", str(Path(tmp) / f"{name}.de"), "--precision", args.precision, *args.translate_args]
            started = time.perf_counter()
            subprocess.run(command, cwd=ROOT, check=True, env=env(args))
            times[name] = time.perf_counter() - started
    net = times["many"] - times["one"]
    return {"sentences": len(sentences), "seconds_total": times["many"], "seconds_start": times["one"],
            "seconds": net, "sentences_per_s": len(sentences) / net}


def vanishing(url: str, lines: list[str], clients: int) -> dict:
    """``clients`` clients each send a ~100-word text and close their connection at once; then
    one honest client asks for one sentence. Its latency, beside the same request's on the
    idle server, shows whether the server worked for the vanished ones."""
    import socket

    parts = urlsplit(url)
    honest = lines[0]
    Client(url).call("POST", "/translate", {"q": honest, "source": "auto", "target": "de"})  # loads the detector
    started = time.perf_counter()
    Client(url).call("POST", "/translate", {"q": honest, "source": "auto", "target": "de"})
    idle_ms = (time.perf_counter() - started) * 1000
    before = Client(url).call("GET", "/health")[1]
    for i in range(clients):
        words: list[str] = []
        for line in lines[i:]:
            words += line.split()
            if len(words) >= 100:
                break
        body = json.dumps({"q": " ".join(words), "source": "en", "target": "de"}).encode()
        sock = socket.create_connection((parts.hostname, parts.port))
        sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        sock.close()
    started = time.perf_counter()
    Client(url).call("POST", "/translate", {"q": honest, "source": "auto", "target": "de"})
    after_ms = (time.perf_counter() - started) * 1000
    time.sleep(1.0)
    after = Client(url).call("GET", "/health")[1]
    return {"clients": clients, "idle_ms": idle_ms, "after_ms": after_ms,
            "dropped": after["dropped"] - before["dropped"], "abandoned": after.get("abandoned", 0) - before.get("abandoned", 0),
            "texts_in_engine_calls": after["texts"] - before["texts"] - 1}  # servers before "abandoned": 0


def long_request(url: str, lines: list[str], texts: int) -> dict:
    """One client sends ``texts`` paragraphs of test sentences (each under the server's 5000
    characters); a second later another asks for one sentence, five times in a row. Their
    latencies, beside the same request's on the idle server, show whether the long request
    holds the engine until it is through or takes turns."""
    honest = {"q": lines[0], "source": "en", "target": "de"}
    Client(url).call("POST", "/translate", honest)
    started = time.perf_counter()
    Client(url).call("POST", "/translate", honest)
    idle_ms = (time.perf_counter() - started) * 1000
    paragraphs, at = [], 0
    while len(paragraphs) < texts:
        paragraph = ""
        while len(paragraph) + len(lines[at % len(lines)]) + 1 < 4900:
            paragraph += lines[at % len(lines)] + " "
            at += 1
        paragraphs.append(paragraph.strip())
    took: dict[str, float] = {}

    def send_long():
        begun = time.perf_counter()
        status, _ = Client(url).call("POST", "/translate", {"q": paragraphs, "source": "en", "target": "de"})
        took["long_s"], took["long_status"] = time.perf_counter() - begun, status

    thread = threading.Thread(target=send_long)
    thread.start()
    time.sleep(1.0)
    small_ms = []
    for _ in range(5):
        begun = time.perf_counter()
        Client(url).call("POST", "/translate", honest)
        small_ms.append((time.perf_counter() - begun) * 1000)
    thread.join()
    return {"texts": texts, "sentences": at, "idle_ms": idle_ms, "small_ms": small_ms, **took}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/runs/draw1/best.pt"))
    parser.add_argument("--data", type=Path, default=DATA, help="Source sentences, one a line (repeated as needed).")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--requests-c1", type=int, default=0, help="Requests at concurrency 1 (default: --requests).")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--engine", default="xformer")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads for both sides (OMP_NUM_THREADS); 0: torch's default (the cores).")
    parser.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[],
                        help="Passed on to xformer serve (last on the line), e.g. --max-wait-ms 10.")
    parser.add_argument("--no-batch", action="store_true", help="Skip the xformer translate side.")
    parser.add_argument("--vanishing", type=int, default=0,
                        help="Also: this many clients send a 100-word text and leave at once; an honest request's latency after them.")
    parser.add_argument("--long-request", type=int, default=0,
                        help="Then one request of N paragraphs of ~4900 characters, with a one-sentence client beside it.")
    parser.add_argument("--json", type=Path, help="Also write the figures here.")
    args = parser.parse_args()
    args.translate_args = ["--engine", "ctranslate2"] if args.engine == "ctranslate2" else []

    lines = [line.strip() for line in args.data.read_text(encoding="utf-8").splitlines() if line.strip()]
    sentences = [lines[i % len(lines)] for i in range(args.requests)]
    results: dict = {"checkpoint": str(args.checkpoint), "data": str(args.data), "engine": args.engine,
                     "precision": args.precision, "threads": args.threads, "serve_args": args.serve_args, "load": []}

    proc, url = start_server(args)
    try:
        client = Client(url)
        while True:
            try:
                if client.call("GET", "/health")[0] == 200:
                    break
            except OSError:
                client = Client(url)
                time.sleep(0.1)
        results["server"] = client.call("GET", "/health")[1]
        load(url, sentences[:32], 8)  # warm-up
        for clients in args.concurrency:
            count = args.requests_c1 if clients == 1 and args.requests_c1 else args.requests
            before = Client(url).call("GET", "/health")[1]  # fresh connections: an idle one times out
            row = load(url, sentences[:count], clients)
            after = Client(url).call("GET", "/health")[1]
            row["mean_batch"] = (after["texts"] - before["texts"]) / max(after["batches"] - before["batches"], 1)
            results["load"].append(row)
            print(f"c={clients:3d}: {row['requests']} requests in {row['seconds']:.1f} s, {row['rps']:.1f} req/s, "
                  f"p50 {row['p50_ms']:.0f} ms, p95 {row['p95_ms']:.0f} ms, mean batch {row['mean_batch']:.1f}, "
                  f"failures {row['failures']}", flush=True)
        if args.vanishing:
            gone = results["vanishing"] = vanishing(url, lines, args.vanishing)
            print(f"vanishing: {gone['clients']} clients sent ~100 words and left; the next honest request took "
                  f"{gone['after_ms']:.0f} ms (idle server: {gone['idle_ms']:.0f} ms); dropped from the queue "
                  f"{gone['dropped']}, abandoned mid-decoding {gone['abandoned']}, texts that reached the engine (abandoned ones included) "
                  f"{gone['texts_in_engine_calls']}", flush=True)
        if args.long_request:
            long = results["long_request"] = long_request(url, lines, args.long_request)
            print(f"long request: {long['texts']} paragraphs ({long['sentences']} sentences) answered {long['long_status']} "
                  f"in {long['long_s']:.1f} s; a one-sentence request beside it took "
                  f"{', '.join(f'{ms:.0f}' for ms in long['small_ms'])} ms (idle server: {long['idle_ms']:.0f} ms)", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)

    if not args.no_batch:
        batch = batch_translate(args, sentences)
        results["batch"] = batch
        print(f"xformer translate: {batch['sentences']} sentences in {batch['seconds']:.1f} s "
              f"({batch['seconds_total']:.1f} s with {batch['seconds_start']:.1f} s start-up and load), "
              f"{batch['sentences_per_s']:.1f} sentences/s", flush=True)
        for row in results["load"]:
            print(f"  c={row['clients']}: {row['rps'] / batch['sentences_per_s']:.0%} of the batch command")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
