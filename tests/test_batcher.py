"""xformer serve's micro-batcher alone, with a fake engine: no HTTP, no fastapi needed."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from xformer_cli.serve.batcher import Batcher, QueueFull, Stopped


class Recorder:
    """A fake engine: upper-cases texts and records each call."""

    def __init__(self, delay: float = 0.0, gate: "threading.Event | None" = None):
        self.calls: list[tuple[list[str], dict]] = []
        self.spent: list[float] = []  # seconds inside each call: the batcher's decode_s encloses them
        self.delay, self.gate = delay, gate
        self.entered = threading.Event()

    def __call__(self, texts, options, wanted=None):
        entered = time.monotonic()
        self.calls.append((list(texts), dict(options)))
        self.entered.set()
        try:
            if self.gate is not None:
                assert self.gate.wait(10)
            time.sleep(self.delay)
            if any(text == "boom" for text in texts):
                raise ValueError("the engine failed")
            return [text.upper() for text in texts]
        finally:
            self.spent.append(time.monotonic() - entered)


def test_concurrent_submissions_share_one_engine_call_and_keep_their_order():
    """No wall-clock upper bound (a busy machine is slow, not wrong): max_wait is 10 minutes, so
    a full batch that waited it out would time the results out instead."""
    engine = Recorder(delay=0.2)
    batcher = Batcher(engine, max_wait=600.0, max_sentences=8).start()  # full at 8 texts: goes at once
    jobs = [[f"a{i}", f"b{i}"] for i in range(4)]
    barrier = threading.Barrier(len(jobs))

    def send(texts):
        barrier.wait()
        return batcher.submit(texts, beam_size=4).result(30)

    started = time.monotonic()
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(send, jobs))
    elapsed = time.monotonic() - started
    assert len(engine.calls) == 1 and sorted(engine.calls[0][0]) == sorted(t for job in jobs for t in job)
    assert engine.calls[0][1] == {"beam_size": 4}
    for texts, result in zip(jobs, results):
        assert result.texts == [t.upper() for t in texts]  # each caller gets its own, in order
        assert result.batch_texts == 8
    # decode_s is the one engine call (which sleeps 0.2 s), around the engine's own time; wait_s
    # ends where it starts, both inside the time the callers waited
    assert len({result.decode_s for result in results}) == 1 and results[0].decode_s >= engine.spent[0] >= 0.2
    assert all(0 <= result.wait_s and result.wait_s + result.decode_s <= elapsed for result in results)
    assert batcher.stop(5)
    assert (batcher.batches, batcher.texts_done, batcher.jobs_done) == (1, 8, 4)


def test_batches_respect_caps_and_options_in_arrival_order():
    engine = Recorder()
    batcher = Batcher(engine, max_wait=0.0, max_sentences=3, max_tokens=100)
    futures = [batcher.submit(["one", "two"], beam_size=4), batcher.submit(["three"], beam_size=1),
               batcher.submit(["four"], beam_size=4), batcher.submit(["five", "six"], beam_size=4),
               batcher.submit(["seven"], beam_size=1)]
    batcher.start()  # everything was queued first: batching is decided by the caps alone
    assert [f.result(5).texts for f in futures] == [["ONE", "TWO"], ["THREE"], ["FOUR"], ["FIVE", "SIX"], ["SEVEN"]]
    assert engine.calls == [(["one", "two", "four"], {"beam_size": 4}), (["three", "seven"], {"beam_size": 1}),
                            (["five", "six"], {"beam_size": 4})]
    # the token cap (words + 1 per text) splits batches too
    engine.calls.clear()
    small = Batcher(engine, max_wait=0.0, max_sentences=10, max_tokens=6)
    futures = [small.submit(["a b"]) for _ in range(4)]  # 3 tokens each
    small.start()
    assert all(f.result(5).texts == ["A B"] for f in futures)
    assert [len(texts) for texts, _ in engine.calls] == [2, 2]
    assert batcher.stop(5) and small.stop(5)


def test_a_lone_client_does_not_wait_and_returning_clients_share_a_call():
    engine = Recorder()
    batcher = Batcher(engine, max_wait=0.5, max_sentences=8).start()
    started = time.monotonic()
    batcher.submit(["first"]).result(5)  # no history: waits max_wait for company
    assert time.monotonic() - started >= 0.45
    # From here max_wait is 10 minutes: a client made to wait for company would time out (not a
    # wall-clock bound that a busy machine breaks), and the returning client below always comes in time.
    batcher.max_wait = 600.0
    for texts in (["alone"], ["three", "at", "once"], ["alone"]):  # demand is one job now: served at once
        assert batcher.submit(texts).result(30).texts == [t.upper() for t in texts]

    gate = threading.Event()
    engine.gate = gate
    engine.calls.clear()
    engine.entered = threading.Event()
    running = batcher.submit([f"a{i}" for i in range(8)])  # a full batch goes at once, and blocks
    assert engine.entered.wait(5)
    time.sleep(0.05)
    early = batcher.submit(["b"])  # arrives while the engine is busy
    gate.set()
    running.result(5)
    time.sleep(0.1)  # a client whose answer just came back asks again
    late = batcher.submit(["c"])
    assert early.result(5).texts == ["B"] and late.result(5).texts == ["C"]
    assert [texts for texts, _ in engine.calls] == [[f"a{i}" for i in range(8)], ["b", "c"]]  # one call, not two
    assert batcher.stop(5)


def test_a_full_queue_rejects_and_holds_nothing():
    gate = threading.Event()
    engine = Recorder(gate=gate)
    batcher = Batcher(engine, max_wait=0.0, max_queued=3).start()
    running = batcher.submit(["first"])
    assert engine.entered.wait(5)  # the worker holds "first"; the queue is empty again
    waiting = batcher.submit(["x", "y", "z"])
    assert batcher.queued == 3
    with pytest.raises(QueueFull):
        batcher.submit(["one too many"])
    assert batcher.queued == 3 and batcher.rejected == 1
    gate.set()
    assert running.result(5).texts == ["FIRST"] and waiting.result(5).texts == ["X", "Y", "Z"]
    assert batcher.submit(["again"]).result(5).texts == ["AGAIN"]  # room again
    assert batcher.stop(5)


def test_stop_drains_the_queue_then_refuses_work():
    engine = Recorder(delay=0.02)
    batcher = Batcher(engine, max_wait=0.0, max_sentences=2).start()
    futures = [batcher.submit([f"s{i}"]) for i in range(7)]
    assert batcher.stop(10)
    assert [f.result(0).texts for f in futures] == [[f"S{i}"] for i in range(7)]  # all finished before stop returned
    with pytest.raises(Stopped):
        batcher.submit(["late"])


def test_a_failing_job_fails_alone_and_the_worker_lives_on():
    engine = Recorder()
    batcher = Batcher(engine, max_wait=0.0)
    good, bad, other = batcher.submit(["fine"]), batcher.submit(["boom"]), batcher.submit(["also fine"])
    cancelled = batcher.submit(["never run"])
    assert cancelled.cancel()
    batcher.start()
    assert good.result(5).texts == ["FINE"] and other.result(5).texts == ["ALSO FINE"]
    with pytest.raises(ValueError, match="the engine failed"):
        bad.result(5)
    assert batcher.submit(["after"]).result(5).texts == ["AFTER"]
    assert all("never run" not in texts for texts, _ in engine.calls)
    assert batcher.stop(5)


def test_cancelled_jobs_leave_the_queue_and_never_reach_the_engine():
    gate = threading.Event()
    engine = Recorder(gate=gate)
    batcher = Batcher(engine, max_wait=0.0, max_queued=6).start()
    running = batcher.submit(["held"])  # the engine is busy with it: everything after waits
    assert engine.entered.wait(5)
    gone = [batcher.submit([f"gone {i}", "x"]) for i in range(3)]  # the queue is full: 6 texts
    with pytest.raises(QueueFull):
        batcher.submit(["no room"])
    assert all(future.cancel() for future in gone)  # their clients went away
    assert (batcher.queued, batcher.dropped) == (0, 3)  # their room is free at once
    kept = batcher.submit(["kept"])
    gate.set()
    assert running.result(5).texts == ["HELD"] and kept.result(5).texts == ["KEPT"]
    assert [texts for texts, _ in engine.calls] == [["held"], ["kept"]]  # nobody worked for the gone ones
    assert batcher.stop(5) and batcher.jobs_done == 2



def test_a_job_withdrawn_while_its_call_runs_is_no_longer_wanted_by_the_engine():
    gate = threading.Event()
    asked: list[list[bool]] = []

    def engine(texts, options, wanted):
        assert gate.wait(10)
        asked.append([wanted(i) for i in range(len(texts))])
        return list(texts)

    batcher = Batcher(engine, max_wait=0.0, max_sentences=8)
    stays, leaves = batcher.submit(["a", "b"]), batcher.submit(["c"])
    batcher.start()
    deadline = time.monotonic() + 5
    while not stays.running():  # both are in the engine's call now
        assert time.monotonic() < deadline
        time.sleep(0.01)
    batcher.withdraw(leaves)
    batcher.withdraw(leaves)  # counted once
    gate.set()
    assert stays.result(5).texts == ["a", "b"]
    assert asked == [[True, True, False]]  # the engine was told to drop "c"
    assert (batcher.abandoned, batcher.dropped) == (1, 0)
    queued = batcher.submit(["d"])
    batcher.stop(5)
    assert queued.result(5).texts == ["d"] and batcher.abandoned == 1


def test_withdrawing_a_queued_job_drops_it_before_the_engine():
    engine = Recorder()
    batcher = Batcher(engine, max_wait=0.0)
    gone = batcher.submit(["x"])
    kept = batcher.submit(["y"])
    batcher.withdraw(gone)
    batcher.start()
    assert kept.result(5).texts == ["Y"] and gone.cancelled()
    batcher.stop(5)
    assert engine.calls == [(["y"], {})] and (batcher.dropped, batcher.abandoned) == (1, 0)


def test_a_long_job_runs_in_parts_that_take_turns_with_other_clients():
    """One request of many texts must not hold the engine: its parts go to the back of the queue."""
    gate = threading.Event()
    engine = Recorder(gate=gate, delay=0.05)
    batcher = Batcher(engine, max_wait=0.0, max_sentences=3, max_tokens=100).start()
    long_texts = [f"t{i}" for i in range(10)]
    long = batcher.submit(long_texts)
    assert engine.entered.wait(5)  # its first part is in the engine
    short = batcher.submit(["short one"])
    assert batcher.queued == 7 + 1  # the long job's later parts still count against the queue's bound
    gate.set()
    assert long.result(5).texts == [t.upper() for t in long_texts] and short.result(5).texts == ["SHORT ONE"]
    assert [texts for texts, _ in engine.calls] == [long_texts[:3], ["short one"], long_texts[3:6], long_texts[6:9],
                                                    long_texts[9:]]
    result = long.result()
    assert result.batch_texts == 3 and batcher.queued == 0
    # decode_s adds up the job's four calls (each encloses the engine's own time, 0.05 s and more),
    # not just its last; the short job's is its one call
    assert result.decode_s >= sum(engine.spent[i] for i in (0, 2, 3, 4)) >= 0.2
    assert short.result().decode_s >= engine.spent[1]
    assert (batcher.jobs_done, batcher.texts_done, batcher.batches) == (2, 11, 5)
    tokens = Batcher(engine, max_wait=0.0, max_sentences=64, max_tokens=6)
    assert [texts for texts, _ in tokens._parts(["a b", "c d", "e f g h i j k", "l"])] == [
        ["a b", "c d"], ["e f g h i j k"], ["l"]]  # 3 + 3 tokens; one text over the cap alone
    assert batcher.stop(5)


def test_a_long_job_withdrawn_between_its_parts_runs_no_more_of_them():
    in_x, release_x = threading.Event(), threading.Event()
    calls: list[list[str]] = []

    def engine(texts, options, wanted):
        calls.append(list(texts))
        if texts == ["x"]:  # the long job's second part waits in the queue meanwhile
            in_x.set()
            assert release_x.wait(10)
        return list(texts)

    batcher = Batcher(engine, max_wait=0.0, max_sentences=2, max_tokens=100)
    long, other = batcher.submit(["a", "b", "c", "d", "e"]), batcher.submit(["x"])
    batcher.start()
    assert in_x.wait(5)
    batcher.withdraw(long)  # its client went away between its parts
    release_x.set()
    assert other.result(5).texts == ["x"]
    assert batcher.stop(5) and batcher.queued == 0 and batcher.abandoned == 1
    assert calls == [["a", "b"], ["x"]]  # nothing after the part that ran


def test_a_part_of_a_long_job_runs_alone_so_a_short_job_does_not_wait_for_it():
    gate = threading.Event()
    engine = Recorder(gate=gate)
    batcher = Batcher(engine, max_wait=0.0, max_sentences=4, max_tokens=100).start()
    long = batcher.submit(["a", "b", "c", "d", "e"])  # parts of 4 and 1
    assert engine.entered.wait(5)
    short = batcher.submit(["s"])  # would fit beside the last part (2 of 4 texts), but does not share its call
    gate.set()
    assert long.result(5).texts == ["A", "B", "C", "D", "E"] and short.result(5).texts == ["S"]
    assert [texts for texts, _ in engine.calls] == [["a", "b", "c", "d"], ["s"], ["e"]]
    assert batcher.stop(5)
