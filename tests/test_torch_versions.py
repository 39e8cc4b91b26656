"""The guards that keep xformer working on the oldest torch pyproject.toml allows (2.4).

Each newer torch API the package uses is found by feature detection, with a fallback for the
torch that lacks it; these tests take the API away (or put back the old spelling) on
whatever torch is installed and check that the fallback does the job. The whole suite also
ran on a real torch 2.4.1 (docs/benchmarks/platforms.md, "torch versions").
"""

from __future__ import annotations

import codecs
import types

import pytest
import torch
import torch._dynamo
import torch._weights_only_unpickler as weights_only_unpickler

from xformer_cli.checkpoint_file import allow_bytes_in_safe_loads, load_checkpoint, safe_load_reads_bytes, save_checkpoint
from xformer_cli.errors import XformerError
from xformer_cli.train import forward_loss
from xformer_cli.train.forward_loss import compiled, raise_recompile_limits

NEW_LIMIT_NAMES = ("recompile_limit", "accumulated_recompile_limit")
OLD_LIMIT_NAMES = ("cache_size_limit", "accumulated_cache_size_limit")


def _loss(src, tgt_in, tgt_out, packing=None):
    return (src.float() - tgt_out.float()).square().sum()


def test_recompile_limits_are_raised_under_torch_2_4s_names(monkeypatch):
    """torch before 2.7 calls the limits cache_size_limit / accumulated_cache_size_limit
    (defaults 8 and 256 in 2.4) and has no recompile_limit: reading that name was an
    AttributeError before any training step."""
    old_config = types.SimpleNamespace(cache_size_limit=8, accumulated_cache_size_limit=256)
    monkeypatch.setattr(torch._dynamo, "config", old_config)
    raise_recompile_limits(120)
    assert old_config.cache_size_limit == 121
    assert old_config.accumulated_cache_size_limit == 4 * 121
    assert not any(hasattr(old_config, name) for name in NEW_LIMIT_NAMES)  # nothing invented


def test_a_higher_limit_the_user_set_under_the_old_name_is_kept(monkeypatch):
    old_config = types.SimpleNamespace(cache_size_limit=500, accumulated_cache_size_limit=10_000)
    monkeypatch.setattr(torch._dynamo, "config", old_config)
    raise_recompile_limits(12)
    assert (old_config.cache_size_limit, old_config.accumulated_cache_size_limit) == (500, 10_000)


def test_a_torch_with_neither_name_still_compiles(monkeypatch):
    """Should a later torch drop both spellings, compiling goes on with torch's own limits
    (more shapes than those run eagerly) instead of failing."""
    config = torch._dynamo.config
    for name in NEW_LIMIT_NAMES + OLD_LIMIT_NAMES:
        monkeypatch.delattr(config, name, raising=False)
    assert not any(hasattr(config, name) for name in NEW_LIMIT_NAMES + OLD_LIMIT_NAMES)
    assert callable(compiled(_loss, torch.device("cpu"), static_shapes=True, shapes=30))


def test_the_installed_torchs_own_limit_is_raised(monkeypatch):
    """On the torch that runs this (2.13 or 2.4 alike): the limit dynamo really reads."""
    config = torch._dynamo.config
    name = forward_loss._first_present(config, forward_loss.RECOMPILE_LIMIT_NAMES)
    total = forward_loss._first_present(config, forward_loss.TOTAL_RECOMPILE_LIMIT_NAMES)
    assert name and total, "this torch has neither spelling of dynamo's recompile limits"
    monkeypatch.setattr(config, name, 8)  # restored after the test
    monkeypatch.setattr(config, total, 256)
    compiled(_loss, torch.device("cpu"), static_shapes=False, shapes=99)
    assert getattr(config, name) == 100
    assert getattr(config, total) == 400


def _unpickler_allowing(monkeypatch: pytest.MonkeyPatch, codecs_encode: bool) -> None:
    """The weights-only unpickler as torch 2.4 (no ``_codecs.encode``, how protocol 2 pickles
    bytes) or 2.5 on (with it) has it, and nothing allowlisted by the user; restored after."""
    allowed = weights_only_unpickler._get_allowed_globals

    def patched():
        base = {key: value for key, value in allowed().items() if key != "_codecs.encode"}
        return {**base, "_codecs.encode": codecs.encode} if codecs_encode else base

    monkeypatch.setattr(weights_only_unpickler, "_get_allowed_globals", patched)
    torch.serialization.clear_safe_globals()  # the fixture restore_user_safe_globals puts them back


@pytest.fixture
def restore_user_safe_globals():
    before = torch.serialization.get_safe_globals()
    yield
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(before)


def test_checkpoints_load_where_the_unpickler_refuses_bytes(monkeypatch, restore_user_safe_globals, tmp_path):
    """Every checkpoint holds its tokenizer's sentencepiece models as bytes: on torch 2.4 all
    of them were 'not a readable xformer checkpoint' until ``_codecs.encode`` was allowed."""
    path = tmp_path / "c.pt"
    save_checkpoint({"model": {"w": torch.ones(2)}, "tokenizer": {"src": b"\x00spm\xff", "tgt": None}}, path)
    _unpickler_allowing(monkeypatch, codecs_encode=False)
    assert not safe_load_reads_bytes()  # the fake refuses as torch 2.4 does
    with pytest.raises(XformerError, match="not a readable xformer checkpoint"):
        load_checkpoint(path)
    allow_bytes_in_safe_loads()
    assert [f"{f.__module__}.{f.__name__}" for f in torch.serialization.get_safe_globals()] == ["_codecs.encode"]
    state = load_checkpoint(path)
    assert state["tokenizer"]["src"] == b"\x00spm\xff"
    assert torch.equal(state["model"]["w"], torch.ones(2))


def test_nothing_is_allowlisted_where_the_unpickler_reads_bytes(monkeypatch, restore_user_safe_globals):
    _unpickler_allowing(monkeypatch, codecs_encode=True)
    assert safe_load_reads_bytes()
    allow_bytes_in_safe_loads()
    assert torch.serialization.get_safe_globals() == []
