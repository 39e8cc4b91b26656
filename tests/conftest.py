import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    """The shared corpora: $XFORMER_DATA, else ../shared/data beside the checkout."""
    return Path(os.environ.get("XFORMER_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def multi30k() -> Path:
    path = data_root() / "multi30k"
    if not (path / "train.en").is_file():
        pytest.fail(f"Multi30k not found at {path}; set XFORMER_DATA to the folder holding multi30k/")
    return path


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


def write_lines(path: Path, lines) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def head(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return [next(handle).rstrip("\n") for _ in range(n)]
