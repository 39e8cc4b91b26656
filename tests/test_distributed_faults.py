"""Data-parallel training when something goes wrong on one rank: two gloo processes with a
fault injected (tests/ddp_workers.py), each test bounded by a deadline that fails it rather
than hanging, and by a short train.dist_timeout_minutes."""

import pytest

from ddp_workers import run_ranks
from xformer_cli.checkpoint_file import load_checkpoint

pytestmark = pytest.mark.slow  # each starts two training processes on Multi30k

COMMON = {"train.max_steps": 4, "train.valid_every": 100, "model.dropout": 0.0, "train.threads": 1,
          "train.update_freq": 1, "train.dist_timeout_minutes": 1.0}


def _ok(results: list[dict]) -> list[dict]:
    for r in results:
        assert "error" not in r, f"rank {r['rank']}: {r['error']}\n{r.get('traceback', '')}"
    return results


def test_an_out_of_memory_batch_on_one_rank_is_skipped_by_every_rank_together(small_corpus, tmp_path):
    """Rank 1 runs out of memory in its second forward: every rank skips that update (none
    waits in a gradient all-reduce the other never joins), then both train on, alike."""
    sets = {**COMMON, "corpus": small_corpus, "run_dir": tmp_path / "run"}
    results = _ok(run_ranks(tmp_path, sets, faults={1: {"oom_on_call": (2,)}}))
    assert [r["steps"] for r in results] == [4, 4]
    assert [r["oom_total"] for r in results] == [1, 1]  # both counted the skipped update
    assert results[0]["weights"] == results[1]["weights"]  # and hold the same weights after it
    assert any("a rank ran out of memory; 1 update(s) skipped on every rank" in m for m in results[0]["messages"])
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert state["oom_total"] == 1
    assert all(int(s["step"]) == 3 for s in state["optimizer"]["state"].values())  # 3 of 4 updates applied


def test_validation_is_shared_so_no_rank_waits_past_the_collective_timeout(small_corpus, tmp_path):
    """Validation's translations take 1 s a line; 8 lines on one rank would keep the other
    waiting 8 s, past a 6-second collective timeout. Each rank translates its 4 lines at the
    same time, so nobody waits that long, and the score is the whole set's."""
    sets = {**COMMON, "train.valid_every": 2, "data.valid_max_sentences": 8, "train.dist_timeout_minutes": 0.1,
            "corpus": small_corpus, "run_dir": tmp_path / "run"}
    slow = {"slow_translation": (1.0,)}
    results = _ok(run_ranks(tmp_path, sets, faults={0: slow, 1: slow}))
    assert [r["steps"] for r in results] == [4, 4]
    assert results[0]["best_bleu"] == results[1]["best_bleu"] is not None
    single = _ok(run_ranks(tmp_path / "one", {**sets, "run_dir": tmp_path / "single", "train.update_freq": 2}, world=1))
    assert single[0]["best_bleu"] == pytest.approx(results[0]["best_bleu"])  # the whole set, not a share


def test_a_rank_stuck_past_the_timeout_stops_the_run_with_one_line_instead_of_hanging(small_corpus, tmp_path):
    """Rank 0's first validation stalls for 12 s; rank 1 waits 3 s (the timeout) and stops,
    naming the wait and the setting: the job ends, it does not hang."""
    sets = {**COMMON, "train.valid_every": 2, "data.valid_max_sentences": 2, "train.dist_timeout_minutes": 0.05,
            "corpus": small_corpus, "run_dir": tmp_path / "run"}
    results = run_ranks(tmp_path, sets, faults={0: {"slow_translation": (12.0, True)}}, deadline_s=120)
    error = results[1].get("error", "")
    assert error.startswith("XformerError: rank 1: waited more than train.dist_timeout_minutes (0.05)"), results[1]
    assert "\n" not in error
    assert "error" in results[0]  # rank 0 found its peer gone (torchrun would have ended it already)


def test_ranks_grow_their_position_tables_apart_and_nothing_is_broadcast(small_corpus, tmp_path):
    """model.max_positions 8: whichever rank first meets a longer batch grows its sinusoid table,
    so the ranks' tables differ in size. Buffers are not broadcast (DDP would send rank 0's
    table to a rank expecting another size), and training equals one process accumulating
    both ranks' batches."""
    sets = {**COMMON, "model.max_positions": 8, "corpus": small_corpus, "run_dir": tmp_path / "ddp"}
    results = _ok(run_ranks(tmp_path, sets))
    assert results[0]["weights"] == results[1]["weights"]
    single = _ok(run_ranks(tmp_path / "one", {**sets, "run_dir": tmp_path / "single", "train.update_freq": 2}, world=1))
    assert all(r["positions"] > 8 for r in results)
    one, two = load_checkpoint(tmp_path / "single" / "last.pt"), load_checkpoint(tmp_path / "ddp" / "last.pt")
    import torch

    for key, value in one["model"].items():
        torch.testing.assert_close(two["model"][key], value, atol=2e-5, rtol=1e-4)
    assert single[0]["steps"] == 4
