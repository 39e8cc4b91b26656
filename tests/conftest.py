"""Fixtures only; the functions tests share are in helpers.py.

Two tiers: ``python -m pytest -m "not slow"`` runs the unit tests, which read no corpus, train
nothing and start no process; the ``slow`` ones do. A test that reads the corpus and is not
marked slow, or that runs the CLI or another process itself, fails before its fixtures run, so
the unit tier keeps running on a fresh machine."""

import inspect
from pathlib import Path

import pytest
import torch

from helpers import data_root, head, tiny_overrides, write_lines, xformer
from multi30k_files import cache_root, multi30k_or_fail


def _starts_a_process(item: pytest.Item) -> bool:
    """The test's own code runs the CLI or another process (what its fixtures do is not seen)."""
    try:
        source = inspect.getsource(item.function)
    except (AttributeError, OSError, TypeError):
        return False
    return any(call in source for call in ("xformer(", "subprocess.", "Popen(", "ServerProcess("))


def _untiered(item: pytest.Item) -> bool:
    """Reads the corpus or starts a process, and is not marked slow."""
    return item.get_closest_marker("slow") is None and (
        "multi30k" in getattr(item, "fixturenames", ()) or _starts_a_process(item))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fails such a test before its fixtures run (so before it reads anything). A failure per test,
    not a refusal at collection: under pytest-xdist the workers collect, and a worker's
    UsageError reaches the user as an internal error without its message."""
    if _untiered(item):
        pytest.fail("not marked slow, but reads the corpus or starts a process", pytrace=False)


@pytest.fixture(scope="session")
def multi30k() -> Path:
    """Multi30k's text files: $XFORMER_DATA/multi30k, else written once from the Hub copy."""
    return multi30k_or_fail(data_root() / "multi30k", cache_root() / "multi30k")


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """The tests' tensors are tiny: a second torch thread adds synchronisation, and on a busy
    machine it spins far more than it computes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def small_corpus(multi30k, tmp_path_factory):
    """A 3000-pair slice of Multi30k train plus 100 lines of valid/test."""
    root = tmp_path_factory.mktemp("m30k")
    for split, n in (("train", 3000), ("valid", 100), ("test2016", 100)):
        for lang in ("en", "de"):
            write_lines(root / f"{split}.{lang}", head(multi30k / f"{split}.{lang}", n))
    return root


@pytest.fixture(scope="session")
def trained_run(small_corpus, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    proc = xformer("train", "--config", "configs/multi30k.yaml", "--quiet", *tiny_overrides(small_corpus, run_dir))
    assert proc.returncode == 0, proc.stderr.decode()
    return run_dir
