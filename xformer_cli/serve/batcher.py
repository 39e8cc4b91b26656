"""Micro-batching: the sentences of many callers, one engine call at a time, in one thread.

    batcher = Batcher(lambda texts, options, wanted: engine.translate(texts, **options, wanted=wanted))
    batcher.start()
    result = batcher.submit(["A dog runs."], beam_size=4).result()   # a Translation
    batcher.stop()                                                    # drains, then returns

Callers ``submit`` a list of texts and get a ``concurrent.futures.Future``. One worker
thread (PyTorch is not made for concurrent calls on one model) takes the oldest waiting
job and makes one engine call for every job that decodes the same way (same options), in
arrival order, within ``max_sentences`` texts and ``max_tokens`` estimated tokens. While
the engine runs, new jobs queue up and form the next batch.

How long it waits for company before that call: until as many jobs are queued as the
recent demand (the most, over the last few calls, of a call's jobs plus those queued
when it ended) or a batch is full, or ``max_wait`` seconds after the later of the oldest
job's arrival and the end of the previous call. So one client alone never waits (its
demand is one job, whatever its number of texts), while 32 clients whose answers just
went out are given ``max_wait`` to send their next requests and share one call, instead
of splitting into two half-size batches that take turns (each of which would then find
its own demand met).

A job larger than one call (more than ``max_sentences`` texts or ``max_tokens`` tokens) runs
in parts of at most that size, one part in the queue at a time and each in a call of its own:
when a part is done the next goes to the back of the queue, so one client's long request
takes turns with the others' instead of holding the engine until it is through.

The queue is bounded in texts (``max_queued``): past it, ``submit`` raises ``QueueFull``
and nothing is held. A client that goes away calls ``withdraw``: a job still waiting
leaves the queue at once and never reaches the engine (so does one whose future is
cancelled, and one cancelled after its batch was formed is skipped when that call starts);
one whose engine call is running is marked, and the engine, which asks ``wanted(text
index)`` as it decodes, drops its texts at its next step. ``stop`` refuses new jobs,
finishes every queued one, and ends the worker. A failing engine call fails only its own
jobs (each is retried alone first, so one bad job does not sink the others of its batch);
the worker lives on.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

# (texts, options, wanted) -> one output per text; wanted(i): is text i still wanted?
TranslateFn = Callable[[list[str], dict[str, Any], Callable[[int], bool]], Sequence[str]]


class QueueFull(Exception):
    """The queue holds ``max_queued`` texts already: try again later."""


class Stopped(Exception):
    """The batcher is stopping (or stopped) and takes no new work."""


@dataclass
class Translation:
    """What a job's future resolves to."""

    texts: list[str]  # one output per input text, in order
    wait_s: float  # from submit to the start of its engine call
    decode_s: float  # the engine call (shared with the batch's other jobs)
    batch_texts: int  # texts in that engine call


def estimate_tokens(text: str) -> int:
    """A cheap stand-in for the source length in pieces: words plus eos (subword models
    split a word into one to two pieces on ordinary text; the engine caps its own batches
    by real pieces anyway)."""
    return len(text.split()) + 1


@dataclass(eq=False)  # jobs are compared by identity (deque.remove)
class _Job:
    texts: list[str]  # the part that runs next
    key: tuple  # the decoding options; only equal keys share an engine call
    tokens: int  # of that part
    future: Future
    enqueued: float
    parts: deque = field(default_factory=deque)  # the parts after it: (texts, tokens)
    split: bool = False  # in parts: each runs alone (sharing a call would make the others wait for it)
    withdrawn: bool = False  # its client went away while its engine call ran
    outputs: list = field(default_factory=list)  # the parts done so far
    started: Optional[float] = None  # when its first part's engine call started
    decode_s: float = 0.0
    batch_texts: int = 0

    def waiting_texts(self) -> int:
        """The texts of this job the queue still holds (its next part and the ones after)."""
        return len(self.texts) + sum(len(texts) for texts, _ in self.parts)


class Batcher:
    def __init__(
        self,
        translate: TranslateFn,
        *,
        max_wait: float = 0.01,
        max_sentences: int = 64,
        max_tokens: int = 4096,
        max_queued: int = 1024,
        count_tokens: Callable[[str], int] = estimate_tokens,
        name: str = "xformer-batcher",
    ):
        if max_wait < 0 or max_sentences < 1 or max_tokens < 1 or max_queued < 1:
            raise ValueError("max_wait must be >= 0; max_sentences, max_tokens and max_queued >= 1")
        self._translate = translate
        self.max_wait = max_wait
        self.max_sentences = max_sentences
        self.max_tokens = max_tokens
        self.max_queued = max_queued
        self._count_tokens = count_tokens
        self._jobs: deque[_Job] = deque()
        self._queued = 0  # texts in _jobs
        self._cond = threading.Condition()
        self._stopping = False
        self._demand: deque[int] = deque(maxlen=4)  # jobs per call plus jobs left queued, recent calls
        self._last_end = 0.0  # when the previous engine call ended
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        # counters, for /health and the benchmark
        self.batches = 0
        self.texts_done = 0
        self.jobs_done = 0
        self.rejected = 0
        self.dropped = 0  # jobs cancelled while queued (their clients went away)
        self.abandoned = 0  # jobs withdrawn while their engine call ran
        self._running: list[_Job] = []  # the jobs of the engine call under way

    # -- the callers' side --------------------------------------------------------------------

    def start(self) -> "Batcher":
        self._thread.start()
        return self

    def submit(self, texts: Sequence[str], **options: Any) -> "Future[Translation]":
        """Queue ``texts`` for one engine call with ``options``; raises ``QueueFull`` or ``Stopped``."""
        texts = list(texts)
        parts = deque(self._parts(texts))
        first, tokens = parts.popleft()
        job = _Job(first, tuple(sorted(options.items())), tokens, Future(), time.monotonic(), parts, bool(parts))
        with self._cond:
            if self._stopping:
                raise Stopped("the server is shutting down")
            if self._queued + len(texts) > self.max_queued:
                self.rejected += 1
                raise QueueFull(f"{self._queued} texts are waiting already (at most {self.max_queued})")
            self._jobs.append(job)
            self._queued += len(texts)
            self._cond.notify()
        job.future.add_done_callback(lambda future: self._drop_if_cancelled(job))
        return job.future

    def _parts(self, texts: list[str]) -> list[tuple[list[str], int]]:
        """``texts`` cut, in order, into parts of at most one call's texts and tokens (a text
        over the token cap alone is a part of its own); no texts: one empty part."""
        parts: list[tuple[list[str], int]] = [([], 0)]
        for text in texts:
            part, tokens = parts[-1]
            cost = self._count_tokens(text)
            if part and (len(part) >= self.max_sentences or tokens + cost > self.max_tokens):
                parts.append(([], 0))
                part, tokens = parts[-1]
            part.append(text)
            parts[-1] = (part, tokens + cost)
        return parts

    def _drop_if_cancelled(self, job: _Job) -> None:
        """A cancelled job that still waits leaves the queue now: it frees its room, and no
        batch waits for it or carries it."""
        if not job.future.cancelled():
            return
        with self._cond:
            if job in self._jobs:
                self._jobs.remove(job)
                self._queued -= job.waiting_texts()
                self.dropped += 1
                self._cond.notify_all()

    def withdraw(self, future: Future) -> None:
        """The caller of ``future`` went away: its job leaves the queue, or, when its engine
        call is already running, the engine stops decoding its texts."""
        if future.cancel():
            return  # still queued: _drop_if_cancelled took it out
        with self._cond:
            for job in self._running:
                if job.future is future and not job.withdrawn:
                    job.withdrawn = True
                    self.abandoned += 1
            for job in list(self._jobs):  # a part of a long job waiting its next turn
                if job.future is future:
                    self._jobs.remove(job)
                    self._queued -= job.waiting_texts()
                    self.abandoned += 1
                    job.future.set_exception(Stopped("withdrawn"))  # nobody reads it: the caller left
                    self._cond.notify_all()

    @property
    def queued(self) -> int:
        """Texts waiting for the engine (not counting the batch it is running)."""
        return self._queued

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self, timeout: Optional[float] = None) -> bool:
        """Take no new jobs, finish the queued ones, end the worker; True once it has ended."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the worker ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._run_batch(batch)
            finally:
                with self._cond:
                    self._running = []

    def _run_batch(self, batch: list[_Job]) -> None:
        # skip cancelled ones (a later part's job is running already)
        live = [job for job in batch if job.started is not None or job.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            self._finish(live)
        except BaseException as exc:  # noqa: BLE001 - a worker that dies would hang every caller
            if len(live) == 1:
                self._fail(live[0], exc)
                return
            for job in live:  # find the culprit: each job alone
                try:
                    self._finish([job])
                except BaseException as alone:  # noqa: BLE001
                    self._fail(job, alone)

    def _fail(self, job: _Job, exc: BaseException) -> None:
        """A job whose part failed fails whole: its later parts leave the queue's count."""
        with self._cond:
            self._drop_parts(job)
            self._cond.notify_all()
        job.future.set_exception(exc)

    def _drop_parts(self, job: _Job) -> None:
        """The parts of ``job`` still to run leave the queue's count (the lock held)."""
        self._queued -= sum(len(texts) for texts, _ in job.parts)
        job.parts.clear()

    def _finish(self, jobs: list[_Job]) -> None:
        texts = [text for job in jobs for text in job.texts]
        owners = [job for job in jobs for _ in job.texts]
        start = time.monotonic()
        out = list(self._translate(texts, dict(jobs[0].key), lambda i: not owners[i].withdrawn))
        took = time.monotonic() - start
        if len(out) != len(texts):
            raise RuntimeError(f"the engine returned {len(out)} translations for {len(texts)} texts")
        self._last_end = start + took
        self._demand.append(len(jobs) + len(self._jobs))
        self.batches += 1
        self.texts_done += len(texts)
        at = 0
        for job in jobs:
            n = len(job.texts)
            job.outputs += out[at:at + n]
            job.started = start if job.started is None else job.started
            job.decode_s, job.batch_texts = job.decode_s + took, max(job.batch_texts, len(texts))
            at += n
            self._next_part_or_done(job)

    def _next_part_or_done(self, job: _Job) -> None:
        """A job with parts left goes to the back of the queue with the next one; else its
        future gets every part's translations."""
        with self._cond:
            if job.parts and not job.withdrawn:
                job.texts, job.tokens = job.parts.popleft()
                self._jobs.append(job)
                self._cond.notify_all()
                return
            self._drop_parts(job)  # withdrawn: the rest is dropped
        self.jobs_done += 1
        job.future.set_result(Translation(job.outputs, job.started - job.enqueued, job.decode_s, job.batch_texts))

    def _next_batch(self) -> Optional[list[_Job]]:
        """The next jobs to run together, out of the queue; None once stopping and drained."""
        with self._cond:
            first = None
            while first is None or not self._jobs or self._jobs[0] is not first:  # again if it was cancelled
                while not self._jobs and not self._stopping:
                    self._cond.wait()
                if not self._jobs:
                    return None
                first = self._jobs[0]
                self._wait_for_company(first)
            batch, kept = [], deque()
            texts = tokens = 0
            for job in self._jobs:
                fits = not batch or (texts + len(job.texts) <= self.max_sentences
                                     and tokens + job.tokens <= self.max_tokens
                                     and not first.split and not job.split)
                if job.key == first.key and fits:
                    batch.append(job)
                    texts += len(job.texts)
                    tokens += job.tokens
                else:
                    kept.append(job)
            self._jobs = kept
            self._queued -= texts
            self._running = batch  # from now on withdraw() marks these instead of cancelling
            return batch

    def _wait_for_company(self, first: _Job) -> None:
        """Wait (the lock held by the caller) until the batch of ``first`` is worth running,
        or ``first`` left the queue."""
        # no history yet: wait for a full batch (the first request of a server's life may wait max_wait)
        target = max(self._demand, default=self.max_sentences)
        deadline = max(first.enqueued, self._last_end) + self.max_wait
        while not self._stopping and not self._ready(first.key, target) and self._jobs and self._jobs[0] is first:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)

    def _ready(self, key: tuple, target: int) -> bool:
        """Whether the queue holds ``target`` jobs decoded like ``key``, or a full batch."""
        jobs = texts = tokens = 0
        for job in self._jobs:
            if job.key == key:
                jobs += 1
                texts += len(job.texts)
                tokens += job.tokens
                if jobs >= target or texts >= self.max_sentences or tokens >= self.max_tokens:
                    return True
        return False
