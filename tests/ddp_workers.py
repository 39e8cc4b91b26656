"""Two (or more) training processes over gloo, started by a test with a fault injected in one
of them, and each bounded by a deadline that fails the test instead of hanging it.

torchrun cannot inject a fault into a child; ``multiprocessing``'s spawn can: each child sets
the variables torchrun would (RANK, WORLD_SIZE, MASTER_ADDR/PORT), applies its fault, runs
``train`` and writes what happened to a JSON file the test reads.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Optional

import pytest
import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weights_digest(state_dict: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(state_dict):
        h.update(key.encode())
        h.update(state_dict[key].detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def _oom_on_call(n: int) -> None:
    """The n-th forward-and-loss of this process raises CUDA's out-of-memory error."""
    from xformer_cli.train import forward_loss

    real, calls = forward_loss.label_smoothed_nll, {"n": 0}

    def failing(*args):
        calls["n"] += 1
        if calls["n"] == n:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return real(*args)

    forward_loss.label_smoothed_nll = failing


def _slow_translation(seconds_per_line: float, once: bool = False) -> None:
    """Validation's translations take ``seconds_per_line`` per line (all validations, or the first)."""
    from xformer_cli.train import state

    real, done = state.RunState.valid_engine, {"n": 0}

    def slow_engine(self):
        engine = real(self)
        translate = engine.translate_lines  # what validation calls

        def slow(lines, opts):
            if not (once and done["n"]):
                time.sleep(seconds_per_line * len(lines))
            done["n"] += 1
            return translate(lines, opts)

        engine.translate_lines = slow
        return engine

    state.RunState.valid_engine = slow_engine


FAULTS = {"oom_on_call": _oom_on_call, "slow_translation": _slow_translation}


def run_rank(rank: int, world: int, port: int, sets: dict, faults: dict, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    result: dict = {"rank": rank}
    try:
        from helpers import tiny_config
        from xformer_cli.train.trainer import Trainer

        for name, args in faults.get(rank, {}).items():
            FAULTS[name](*args)
        corpus, run_dir = Path(sets.pop("corpus")), Path(sets.pop("run_dir"))
        messages: list[str] = []
        trainer = Trainer(tiny_config(corpus, run_dir, **sets), log=messages.append, progress=False)
        outcome = trainer.run()
        c = trainer.state.counters
        result.update(steps=outcome.steps, stopped=outcome.stopped_because, messages=messages, oom_total=c.oom_total,
                      best_bleu=c.best_bleu, weights=weights_digest(trainer.state.model.state_dict()),
                      positions=trainer.state.model.src_embed.positions.size(0))
    except Exception as exc:  # noqa: BLE001  # reported to the test, which decides
        result.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
    Path(out).write_text(json.dumps(result), encoding="utf-8")


def run_ranks(tmp_path: Path, sets: dict, faults: Optional[dict] = None, world: int = 2,
              deadline_s: float = 240) -> list[dict]:
    """Run ``world`` ranks of a tiny training run (``tiny_config`` with ``sets``; ``corpus`` and
    ``run_dir`` among them) with ``faults`` ({rank: {fault: args}}); every rank's result. A rank
    still running at the deadline fails the test (after killing them all)."""
    context = multiprocessing.get_context("spawn")
    tmp_path.mkdir(parents=True, exist_ok=True)
    port = free_port()
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    procs = [context.Process(target=run_rank, args=(r, world, port, dict(sets), faults or {}, str(outs[r])))
             for r in range(world)]
    for p in procs:
        p.start()
    end = time.time() + deadline_s
    for p in procs:
        p.join(max(0.0, end - time.time()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    if hung:
        pytest.fail(f"ranks {hung} still running after {deadline_s} s: the job hung")
    return [json.loads(o.read_text()) if o.exists() else {"rank": r, "error": f"no result (exit {procs[r].exitcode})"}
            for r, o in enumerate(outs)]
