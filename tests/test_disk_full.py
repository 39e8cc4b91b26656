"""A full disk is one line naming the file, never a traceback, and loses nothing written before."""

import errno
import shutil
import subprocess
import uuid

import pytest

from xformer_cli.data import cache as cache_module
from xformer_cli.errors import XformerError
from xformer_cli.fileio import disk_full
from xformer_cli.checkpoint_file import load_checkpoint

from helpers import assert_one_line_error, tiny_overrides, write_lines, xformer

# Raise as torch's zip writer does when the disk fills: the OSError, then a RuntimeError
# raised while handling it (the "unexpected pos" second traceback users saw).
DISK_FULL_SAVE = """
import errno, torch
def _full_save(obj, f, *args, **kwargs):
    f.write(b"x" * 64)
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:778] . unexpected pos 64 vs 0")
torch.save = _full_save
"""


def _small_filesystem(path, size_bytes: int) -> bool:
    """Mount a tmpfs of ``size_bytes`` at ``path`` where this machine lets the tests (root)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
                          capture_output=True)
    return done.returncode == 0


def _unmount(path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _tree_bytes(path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.mark.slow
def test_a_full_disk_at_a_checkpoint_is_one_line_and_the_run_resumes(small_corpus, tmp_path):
    run = tmp_path / "run"
    first = xformer("train", "-c", "configs/multi30k.yaml", "--quiet", *tiny_overrides(small_corpus, run),
                    "--set", "train.max_steps=20", "--set", "train.valid_every=20")
    assert first.returncode == 0, first.stderr.decode()
    assert load_checkpoint(run / "last.pt")["step"] == 20
    checkpoint_size = (run / "last.pt").stat().st_size

    full = tmp_path / "full"
    mounted = _small_filesystem(full, _tree_bytes(run) + checkpoint_size // 2)
    try:
        if mounted:  # a real filesystem with room for the run as it is, not for another checkpoint
            shutil.copytree(run, full / "run")
            target, prelude = full / "run", None
        else:  # no mount allowed here: torch.save fails the way it does on a full disk
            target, prelude = run, DISK_FULL_SAVE
        proc = xformer("train", "-c", "configs/multi30k.yaml", "--quiet", *tiny_overrides(small_corpus, target),
                       "--set", "train.max_steps=30", "--set", "train.valid_every=10", python_prelude=prelude)
        assert_one_line_error(proc, "no space left on device", str(target))
        error = proc.stderr.decode().strip().splitlines()[-1]
        assert "unchanged" in error and "free" in error
        assert load_checkpoint(target / "last.pt")["step"] == 20  # the earlier checkpoint still loads
        assert not list(target.glob("*.tmp"))  # no half-written file left behind
        if mounted:
            shutil.copytree(target, tmp_path / "moved")
            target = tmp_path / "moved"
    finally:
        if mounted:
            _unmount(full)
    resumed = xformer("train", "-c", "configs/multi30k.yaml", "--quiet", *tiny_overrides(small_corpus, target),
                      "--set", "train.max_steps=30", "--set", "train.valid_every=10")
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert load_checkpoint(target / "last.pt")["step"] == 30


@pytest.mark.slow
def test_a_full_disk_while_writing_translations_keeps_the_earlier_output(trained_run, tmp_path):
    out = write_lines(tmp_path / "out.de", ["earlier result"])
    prelude = """
import errno, os
_real_fdopen = os.fdopen
class _Full:  # the output file: every write finds the disk full
    def __init__(self, handle): self.handle = handle
    def write(self, text): raise OSError(errno.ENOSPC, "No space left on device")
    def __enter__(self): return self
    def __exit__(self, *exc): self.handle.close()
os.fdopen = lambda *args, **kwargs: _Full(_real_fdopen(*args, **kwargs))
"""
    proc = xformer("translate", "-m", trained_run / "best.pt", "-b", "1", "-o", out, stdin=b"A dog runs.\n",
                   python_prelude=prelude)
    assert_one_line_error(proc, f"could not write {out}", "no space left on device", "previous out.de is unchanged")
    assert out.read_text() == "earlier result\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.de"]


@pytest.mark.slow
def test_a_full_disk_while_building_the_cache_removes_the_partial_build(small_corpus, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_module, "_write_meta", full)
    from xformer_cli.config import load_config
    from xformer_cli.data.prepare import prepare_data

    sets = dict(s.split("=", 1) for s in tiny_overrides(small_corpus, tmp_path / "run")[1::2])
    cfg = load_config("configs/multi30k.yaml", [f"{k}={v}" for k, v in sets.items()])
    with pytest.raises(XformerError, match="no space left on device.*partial cache was removed"):
        prepare_data(cfg, log=lambda _: None)
    assert not [p for p in (tmp_path / "run" / "cache").iterdir() if p.name.startswith(".")]


def test_disk_full_is_recognised_through_exception_chains():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("unexpected pos 64 vs 0")
    except RuntimeError as exc:
        assert disk_full(exc)
    assert not disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not disk_full(RuntimeError(f"something else {uuid.uuid4()}"))
