"""Atomic writes: the data and the rename reach the disk (fsync), and a failed write keeps
what was there."""

import errno
import os
from pathlib import Path

import pytest
import torch

from xformer_cli import fileio
from xformer_cli.errors import XformerError
from xformer_cli.checkpoint_file import load_checkpoint, save_checkpoint
from xformer_cli.fileio import atomic_directory, atomic_file
from xformer_cli.textio import write_lines

from helpers import FsyncSpy


@pytest.fixture
def fsyncs(monkeypatch):
    return FsyncSpy(monkeypatch)


def test_an_output_file_is_fsynced_then_renamed_then_its_directory_fsynced(tmp_path, fsyncs):
    tmp_path = tmp_path.resolve()  # as /proc names it
    out = tmp_path / "out.de"
    write_lines(["ein Hund", "zwei Katzen"], out)
    assert out.read_text() == "ein Hund\nzwei Katzen\n"
    (temp, _), (directory, names) = fsyncs.calls
    assert temp.parent == tmp_path and temp.name.startswith(".out.de.") and temp.name.endswith(".tmp")
    assert directory == tmp_path and names == ["out.de"]  # the rename had happened: it is what gets synced


def test_a_checkpoint_is_fsynced_before_and_after_its_rename(tmp_path, fsyncs):
    tmp_path = tmp_path.resolve()  # as /proc names it
    path = tmp_path / "last.pt"
    save_checkpoint({"step": 7, "weights": torch.ones(3)}, path)
    assert load_checkpoint(path)["step"] == 7
    (temp, _), (directory, names) = fsyncs.calls
    assert temp.parent == tmp_path and temp.name.startswith(".last.pt.")
    assert directory == tmp_path and names == ["last.pt"]


def test_a_directory_is_fsynced_whole_before_it_replaces_the_old_one(tmp_path, fsyncs):
    tmp_path = tmp_path.resolve()  # as /proc names it
    target = tmp_path / "model"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with atomic_directory(target) as staging:
        (staging / "sub").mkdir()
        (staging / "sub" / "weights.bin").write_bytes(b"\x00" * 10)
        (staging / "config.json").write_text("{}")
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "sub"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # neither the staging nor the old one is left
    synced = fsyncs.paths()
    assert {p.relative_to(staging).as_posix() for p in synced[:-1]} == {"sub/weights.bin", "sub", "config.json", "."}
    assert synced[-2] == staging  # the staging directory after everything in it
    assert fsyncs.calls[-1] == (tmp_path, ["model"])  # and its parent after the rename


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "result.txt"
    path.write_text("earlier\n")
    with pytest.raises(ValueError):
        with atomic_file(path, "w", encoding="utf-8") as handle:
            handle.write("half of the new")
            raise ValueError("failed midway")
    assert path.read_text() == "earlier\n"
    assert [p.name for p in tmp_path.iterdir()] == ["result.txt"]


def test_a_failed_fsync_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "result.bin"
    path.write_bytes(b"earlier")

    def broken(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="Input/output"):
        with atomic_file(path) as handle:
            handle.write(b"new content")
    assert path.read_bytes() == b"earlier"
    assert [p.name for p in tmp_path.iterdir()] == ["result.bin"]


def test_a_failed_directory_write_keeps_the_previous_directory(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "weights.bin").write_bytes(b"good")
    with pytest.raises(OSError):
        with atomic_directory(target) as staging:
            (staging / "weights.bin").write_bytes(b"ha")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert [p.name for p in target.iterdir()] == ["weights.bin"] and (target / "weights.bin").read_bytes() == b"good"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_directory_that_must_not_be_replaced_is_kept_and_the_staging_removed(tmp_path):
    target = tmp_path / "cache"
    target.mkdir()
    (target / "meta.json").write_text("theirs")
    with pytest.raises(FileExistsError):
        with atomic_directory(target, staging_name=".cache.building-1", replace=False) as staging:
            assert staging == tmp_path / ".cache.building-1"
            (staging / "meta.json").write_text("ours")
    assert (target / "meta.json").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["cache"]


def test_a_full_disk_is_one_line_naming_the_file_and_what_is_safe(tmp_path):
    path = tmp_path / "out.txt"
    with pytest.raises(XformerError) as info:
        with fileio.writing(path, needed=3 << 20, intact="the previous out.txt is unchanged"):
            raise RuntimeError("write failed") from OSError(errno.ENOSPC, "No space left on device")
    message = str(info.value)
    assert message.startswith(f"could not write {path}: no space left on device (")
    assert "free, about 3.0 MiB needed); the previous out.txt is unchanged" in message
    with pytest.raises(OSError, match="Permission"):  # anything else passes through as it was
        with fileio.writing(path):
            raise OSError(errno.EACCES, "Permission denied")


def test_input_that_is_not_utf8_is_refused_naming_file_and_line_unless_replacing(tmp_path):
    from xformer_cli.textio import iter_lines

    source = tmp_path / "in.en"
    source.write_bytes(b"A man.\r\nA caf\xe9 here.\nTwo dogs.")
    lines = iter_lines(source)
    assert next(lines) == "A man."  # lines before the bad one are read as they come
    with pytest.raises(XformerError, match=r"in\.en:2: invalid UTF-8 .* at byte 5\); fix the input"):
        next(lines)
    assert list(iter_lines(source, replace_invalid=True)) == ["A man.", "A caf\ufffd here.", "Two dogs."]


def test_a_folder_that_cannot_be_made_is_one_line_naming_what_was_to_go_there(tmp_path):
    (tmp_path / "file").write_text("a file where a folder should be")
    blocked = tmp_path / "file" / "out"
    in_the_way = "a file stands in its path"
    with pytest.raises(XformerError, match=rf"^data.cache_dir: cannot make the folder .*file/out: {in_the_way}$"):
        fileio.make_folder(blocked, "data.cache_dir")
    with pytest.raises(XformerError, match=rf"^.*file/out/a.pt: cannot make the folder .*file/out: {in_the_way}$"):
        save_checkpoint({"step": 1}, blocked / "a.pt")  # xformer average -o, a run's checkpoints
    with pytest.raises(XformerError, match=r"^.*file/out/export: cannot make the folder"):
        with atomic_directory(blocked / "export"):  # xformer export -o
            pytest.fail("wrote into a folder that cannot exist")
    (tmp_path / "taken").write_text("a file with the folder's name")
    with pytest.raises(XformerError, match=r"cannot make the folder .*taken: a file has that name$"):
        fileio.make_folder(tmp_path / "taken")


def test_a_tokenizer_whose_write_failed_is_trained_again_not_reused(tmp_path, monkeypatch):
    """Its models are written whole or not at all, and settings.json (which lets a run reuse
    them) goes first and comes back last: a run that dies while writing leaves nothing reused."""
    from helpers import ROOT
    from xformer_cli.config import load_config
    from xformer_cli.data.prepare import check_inputs

    english = [f"A man with {n} dogs runs in the park number {n}." for n in range(80)]
    german = [f"Ein Mann mit {n} Hunden läuft im Park Nummer {n}." for n in range(80)]
    for split in ("train", "valid", "test"):
        write_lines(english, tmp_path / f"{split}.en")
        write_lines(german, tmp_path / f"{split}.de")
    sets = [f"data.{split}.prefix={tmp_path}/{split}" for split in ("train", "valid", "test")]
    sets += [f"run_dir={tmp_path}/run", "tokenizer.vocab_size=120"]
    said: list[str] = []

    def inputs(*more: str):
        return check_inputs(load_config(ROOT / "configs" / "multi30k.yaml", sets + list(more)), said.append)

    first = inputs()
    first.plan.save(first.tokenizer)
    folder = tmp_path / "run" / "tokenizer"
    kept = (folder / "joint.model").read_bytes()
    other = inputs("tokenizer.vocab_size=110")  # settings changed: trained again, then saved over the old
    monkeypatch.setattr(fileio.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "killed")))
    with pytest.raises(OSError):
        other.plan.save(other.tokenizer)
    monkeypatch.undo()
    assert (folder / "joint.model").read_bytes() == kept and not (folder / "settings.json").exists()
    said.clear()
    inputs()  # the first settings again: nothing says the files there are theirs
    assert any(line.startswith("tokenizer: trained") for line in said), said


def test_a_pipe_or_device_output_is_written_into_and_stays_what_it_was(tmp_path):
    """-o /dev/null, /dev/stdout or a FIFO: a rename over it replaced the node with a regular file
    (as root, /dev/null itself)."""
    import stat
    import threading

    fifo, link = tmp_path / "fifo", tmp_path / "link"
    os.mkfifo(fifo)
    link.symlink_to(fifo)  # as /dev/stdout is a link to the process's own descriptor
    for target in (fifo, link):
        received = []
        reader = threading.Thread(target=lambda: received.append(fifo.read_text(encoding="utf-8")), daemon=True)
        reader.start()
        write_lines(["Ein Hund.", "Eine Katze."], target)
        reader.join(10)
        assert received == ["Ein Hund.\nEine Katze.\n"] and stat.S_ISFIFO(fifo.stat().st_mode)
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link"]


def test_dev_stdout_on_a_pipe_is_written_into():
    """``-o /dev/stdout | next-command``: /dev/stdout links to /proc/self/fd/1, whose target on a
    pipe reads 'pipe:[N]', no path at all; resolving it first refused the run ('cannot write
    /proc/.../pipe:[N]'). A pipe's descriptor link here stands for it."""
    read_end, write_end = os.pipe()
    try:
        write_lines(["Ein Hund."], Path(f"/proc/self/fd/{write_end}"))
        assert os.read(read_end, 100) == "Ein Hund.\n".encode()
    finally:
        os.close(read_end)
        os.close(write_end)


def _read_only(monkeypatch, folder: Path) -> None:
    """``folder`` as on a read-only mount (tests may run as root, whom permissions do not stop)."""
    real_access, real_mkstemp, real_mkdtemp = os.access, fileio.tempfile.mkstemp, fileio.tempfile.mkdtemp

    def refused(make):
        def call(*args, dir=None, **kw):
            if dir is not None and Path(dir) == folder:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(folder / ".x.tmp"))
            return make(*args, dir=dir, **kw)
        return call

    monkeypatch.setattr(fileio.os, "access", lambda p, mode: False if Path(p) == folder else real_access(p, mode))
    monkeypatch.setattr(fileio.tempfile, "mkstemp", refused(real_mkstemp))
    monkeypatch.setattr(fileio.tempfile, "mkdtemp", refused(real_mkdtemp))


def test_a_folder_nothing_can_be_written_in_is_one_line_naming_the_path(tmp_path, monkeypatch):
    """A read-only disk or a folder without permission: one line naming the file asked for (not
    the temporary beside it), said before any work where a command checks its outputs first."""
    from xformer_cli.cli.common import check_output
    from xformer_cli.plots import check_png_path

    locked = tmp_path / "locked"
    locked.mkdir()
    _read_only(monkeypatch, locked)
    assert fileio.unwritable_folder(locked) is not None and fileio.unwritable_folder(tmp_path) is None
    with pytest.raises(XformerError, match=rf"^cannot write {locked / 'out.txt'}: Read-only file system$"):
        with atomic_file(locked / "out.txt", "w") as handle:
            handle.write("never")
    with pytest.raises(XformerError, match=rf"^cannot write {locked / 'export'}: Read-only file system$"):
        with atomic_directory(locked / "export"):
            pass
    with pytest.raises(XformerError, match=r"^cannot write --output .*out\.de: "):
        check_output(locked / "out.de", [])
    with pytest.raises(XformerError, match=r"^cannot write .*plot\.png: "):
        check_png_path(locked / "plot.png")
    check_output(tmp_path / "out.de", [])  # a writable folder passes
    assert list(locked.iterdir()) == []


def test_a_command_output_file_is_replaced_only_when_asked(tmp_path):
    target = tmp_path / "avg.pt"
    assert fileio.new_output_file(target, force=False) == target  # nothing there yet
    target.write_bytes(b"a checkpoint")
    with pytest.raises(XformerError, match=r"avg\.pt exists \(use --force to replace it\)"):
        fileio.new_output_file(target, force=False)
    assert fileio.new_output_file(target, force=True) == target and target.read_bytes() == b"a checkpoint"
    with pytest.raises(XformerError, match="is a directory"):
        fileio.new_output_file(tmp_path, force=True)
