import os

import pytest
import torch

from xformer_cli.errors import XformerError
from xformer_cli.checkpoint_file import VERSION, load_checkpoint, save_checkpoint, upgrade_checkpoint


def test_round_trip_with_plain_data(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint({"model": {"w": torch.ones(2)}, "config": {"a": 1}, "tokenizer": {"src": b"xy", "tgt": None}}, path)
    state = load_checkpoint(path)
    assert state["tokenizer"]["src"] == b"xy" and state["config"] == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left


def test_truncated_checkpoint_is_a_one_line_error(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint({"model": {"w": torch.randn(1000)}}, path)
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(XformerError, match="not a readable xformer checkpoint") as info:
        load_checkpoint(path)
    assert "\n" not in str(info.value)


def test_foreign_files_are_refused(tmp_path):
    other = tmp_path / "other.pt"
    torch.save({"state_dict": {}}, other)
    with pytest.raises(XformerError, match="is not an xformer checkpoint"):
        load_checkpoint(other)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(XformerError, match="not a readable"):
        load_checkpoint(text)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_checkpoint_cannot_run_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    torch.save({"format": "xformer-checkpoint", "version": 1, "x": _Exploit()}, path, pickle_protocol=2)
    with pytest.raises(XformerError):
        load_checkpoint(path)
    assert not (tmp_path / "pwned").exists()


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint({"step": 1}, path)

    def broken_save(obj, handle, *a, **k):
        handle.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError):
        save_checkpoint({"step": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_a_checkpoint_from_a_newer_xformer_is_a_one_line_error(tmp_path):
    path = tmp_path / "future.pt"
    torch.save({"format": "xformer-checkpoint", "version": VERSION + 1, "model": {}}, path)
    with pytest.raises(XformerError, match=f"future.pt: checkpoint version {VERSION + 1} is not supported") as info:
        load_checkpoint(path)
    assert "\n" not in str(info.value)


def test_the_upgrade_fills_what_version_1_training_checkpoints_may_lack():
    rng = {"torch": torch.ByteTensor([1, 2, 3])}
    old = {"format": "xformer-checkpoint", "version": 1, "optimizer": {}, "rng": rng, "step": 3}
    state = upgrade_checkpoint(old)
    assert state["version"] == VERSION == 3
    assert state["scaler"] == {} and state["nonfinite_total"] == 0 and state["oom_total"] == 0
    assert state["log_window"] == {"loss_sum": 0.0, "good_tokens": 0.0}
    assert len(state["rng"]["ranks"]) == 1 and torch.equal(state["rng"]["ranks"][0]["torch"], rng["torch"])
    assert "ranks" not in state["rng"]["ranks"][0]
    # What a checkpoint has is kept; one without training state (average.pt) gains nothing.
    kept = upgrade_checkpoint({"version": 1, "optimizer": {}, "rng": {"torch": rng["torch"], "ranks": ["r0", "r1"]},
                               "nonfinite_total": 4, "log_window": {"loss_sum": 2.0, "good_tokens": 9.0}})
    assert kept["nonfinite_total"] == 4 and kept["rng"]["ranks"] == ["r0", "r1"] and kept["log_window"]["loss_sum"] == 2.0
    assert upgrade_checkpoint({"model": {}}) == {"model": {}, "version": VERSION}
    # Version 2 had everything but the count of out-of-memory skips.
    v2 = upgrade_checkpoint({"version": 2, "optimizer": {}, "rng": {"torch": rng["torch"], "ranks": ["r0"]},
                             "nonfinite_total": 1})
    assert v2["oom_total"] == 0 and v2["nonfinite_total"] == 1


def test_resume_compares_the_files_a_run_reads_not_how_their_paths_are_spelt(tmp_path, monkeypatch):
    """A run started with ../data/train resumes with /abs/data/train (the same files), and with
    another test set or cache folder (neither builds the model nor orders its batches); another
    train or valid corpus, or another pair's corpus, is still refused."""
    from xformer_cli.config import load_config
    from xformer_cli.train.run_checkpoints import resume_mismatch

    (tmp_path / "data").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")

    def config(*sets: str) -> dict:
        return load_config(None, ["data.train.prefix=../data/train", "data.valid.prefix=../data/valid",
                                         "data.test.prefix=../data/test", *sets]).to_dict()

    saved = config()
    absolute = str(tmp_path / "data")
    assert resume_mismatch(saved, config(f"data.train.prefix={absolute}/train",
                                         f"data.valid.prefix={absolute}/./valid")) is None
    assert resume_mismatch(saved, config("data.test.prefix=../data/test2016", "data.cache_dir=elsewhere")) is None
    assert resume_mismatch(saved, config("data.train.prefix=../data/train2")) == "data.train"
    assert resume_mismatch(saved, config("data.valid.prefix=../data/valid2")) == "data.valid"
    pairs = "data.pairs=[en-de, {src_lang: en, tgt_lang: fr, train: [{prefix: ../data/fr}]}]"
    moved = f"data.pairs=[en-de, {{src_lang: en, tgt_lang: fr, train: [{{prefix: {absolute}/fr}}]}}]"
    other = "data.pairs=[en-de, {src_lang: en, tgt_lang: fr, train: [{prefix: ../data/fr2}]}]"
    assert resume_mismatch(config(pairs), config(moved)) is None
    assert resume_mismatch(config(pairs), config(other)) == "data.pairs"


def test_an_average_takes_the_step_its_checkpoints_record_not_their_names(tmp_path):
    """last.pt and best.pt name no step (checkpoint_step reads 0 for them): the average is at
    the newest step the checkpoints themselves hold, whatever they are called."""
    from xformer_cli.config import Config
    from xformer_cli.train.average import average_checkpoints

    config = Config().to_dict()
    for name, step in (("best.pt", 30), ("last.pt", 40), ("checkpoint_20.pt", 20)):
        save_checkpoint({"config": config, "tokenizer": {"spm": b"t"}, "model": {"w": torch.full((2,), float(step))},
                         "step": step}, tmp_path / name)
    averaged = average_checkpoints([tmp_path / "best.pt", tmp_path / "last.pt"], tmp_path / "out" / "average.pt")
    assert averaged["step"] == 40 and load_checkpoint(tmp_path / "out" / "average.pt")["step"] == 40
    # a step checkpoint's name and its record agree; the record wins where they would not
    assert average_checkpoints([tmp_path / "checkpoint_20.pt", tmp_path / "best.pt"], tmp_path / "a2.pt")["step"] == 30
