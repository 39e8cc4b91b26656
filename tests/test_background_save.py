"""Checkpoints written once under several names, and in the background while training goes on."""

import errno
import os
import threading

import pytest
import torch

from xformer_cli import checkpoint_file
from xformer_cli.checkpoint_file import load_checkpoint, save_checkpoint
from xformer_cli.errors import XformerError
from xformer_cli.train import background_save
from xformer_cli.train.background_save import CheckpointWriter, host_copy, writes_in_background

from helpers import losses, quiet, tiny_config


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((4, 3), float(value))}, "optimizer": {"state": {0: {"exp_avg": torch.ones(2) * value}}},
            "step": int(value)}


def test_one_write_gives_every_name_the_same_file(tmp_path):
    last, kept, best = tmp_path / "last.pt", tmp_path / "checkpoint_5.pt", tmp_path / "best.pt"
    save_checkpoint(_state(5), last, also=[kept, best])
    assert last.stat().st_ino == kept.stat().st_ino == best.stat().st_ino  # hard links: one write
    save_checkpoint(_state(6), last, also=[tmp_path / "checkpoint_6.pt"])
    assert load_checkpoint(kept)["step"] == 5 and load_checkpoint(best)["step"] == 5  # the old names keep theirs
    assert load_checkpoint(last)["step"] == 6 and last.stat().st_ino != kept.stat().st_ino
    assert not list(tmp_path.glob(".*tmp"))


def test_without_hard_links_the_other_names_are_copies(tmp_path, monkeypatch):
    def no_links(source, target):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    save_checkpoint(_state(3), tmp_path / "last.pt", also=[tmp_path / "best.pt"])
    assert (tmp_path / "last.pt").stat().st_ino != (tmp_path / "best.pt").stat().st_ino
    assert torch.equal(load_checkpoint(tmp_path / "best.pt")["model"]["w"], torch.full((4, 3), 3.0))


def test_the_background_write_holds_the_state_of_its_step(tmp_path, monkeypatch):
    """The weights change in place right after a save (the next optimizer step); the file
    written later by the thread still holds the saved step's values, and pruning runs after it."""
    release, order = threading.Event(), []
    real = background_save.save_checkpoint

    def slow_save(state, path, also=()):
        release.wait(10)
        real(state, path, also)
        order.append("written")

    monkeypatch.setattr(background_save, "save_checkpoint", slow_save)
    writer = CheckpointWriter(background=True)
    live = _state(1)
    writer.write(live, tmp_path / "last.pt", [tmp_path / "checkpoint_1.pt"], then=lambda: order.append("pruned"))
    assert writer.busy and not (tmp_path / "last.pt").exists()  # training goes on meanwhile
    live["model"]["w"].add_(100.0)
    live["optimizer"]["state"][0]["exp_avg"].mul_(0.0)
    release.set()
    writer.wait()
    saved = load_checkpoint(tmp_path / "checkpoint_1.pt")
    assert torch.equal(saved["model"]["w"], torch.full((4, 3), 1.0))
    assert torch.equal(saved["optimizer"]["state"][0]["exp_avg"], torch.ones(2))
    assert order == ["written", "pruned"]


def test_a_failed_background_write_is_raised_at_the_next_save_or_the_end(tmp_path, monkeypatch):
    def full_disk(payload, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    save_checkpoint(_state(1), tmp_path / "last.pt")
    monkeypatch.setattr(checkpoint_file, "_atomic_save", full_disk)
    writer = CheckpointWriter(background=True)
    writer.write(_state(2), tmp_path / "last.pt")
    with pytest.raises(XformerError, match="no space left on device.*previous last.pt there is unchanged"):
        writer.write(_state(3), tmp_path / "last.pt")
    writer.wait()  # the error was handed over once; nothing is in flight
    monkeypatch.undo()
    writer.write(_state(4), tmp_path / "last.pt")
    writer.wait()
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 4


def test_host_copies_are_independent_and_only_accelerators_write_in_background():
    live = {"a": [torch.zeros(2), (torch.ones(1), 3)], "b": "text"}
    copy = host_copy(live)
    live["a"][0].add_(1.0)
    assert torch.equal(copy["a"][0], torch.zeros(2)) and copy["a"][1][1] == 3 and copy["b"] == "text"
    assert isinstance(copy["a"][1], tuple)
    assert not writes_in_background(torch.device("cpu"))
    assert writes_in_background(torch.device("cuda", 0)) and writes_in_background(torch.device("mps"))


@pytest.mark.slow
def test_a_run_saving_in_the_background_writes_what_an_inline_run_writes(small_corpus, tmp_path, monkeypatch):
    """The trainer's saves through the background writer (as on a GPU): the same losses, the
    same last.pt weights, the kept checkpoints pruned to train.keep_checkpoints, and a resume
    from them that continues exactly."""
    from xformer_cli.train import trainer as trainer_module
    from xformer_cli.train.trainer import train

    sets = {"train.max_steps": 12, "train.save_every": 2, "train.keep_checkpoints": 3, "train.average_last": 0}
    train(tiny_config(small_corpus, tmp_path / "inline", **sets), log=quiet, progress=False)
    monkeypatch.setattr(trainer_module, "writes_in_background", lambda device: True)
    train(tiny_config(small_corpus, tmp_path / "bg", **{**sets, "train.max_steps": 7}), log=quiet, progress=False)
    train(tiny_config(small_corpus, tmp_path / "bg", **sets), log=quiet, progress=False)  # resumes at 7
    assert losses(tmp_path / "bg") == pytest.approx(losses(tmp_path / "inline"), abs=1e-5)
    a, b = (load_checkpoint(tmp_path / run / "last.pt") for run in ("inline", "bg"))
    assert a["step"] == b["step"] == 12
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert sorted(p.name for p in (tmp_path / "bg").glob("checkpoint_*.pt")) == \
        sorted(p.name for p in (tmp_path / "inline").glob("checkpoint_*.pt"))
    assert len(list((tmp_path / "bg").glob("checkpoint_*.pt"))) == 3
