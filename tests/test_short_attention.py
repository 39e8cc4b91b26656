"""CPU training attention on few keys (model/short_attention.py): SDPA's values and gradients,
and the rule that picks it."""

import pytest
import torch
import torch.nn.functional as F

from xformer_cli.model.linear import plain_products
from xformer_cli.model.short_attention import SHORT_KEYS, short_attention
from xformer_cli.model import transformer
from xformer_cli.model.transformer import attention


def _qkv(queries: int, keys: int, dtype=torch.float32):
    torch.manual_seed(0)
    shapes = ((3, 4, queries, 16), (3, 4, keys, 16), (3, 4, keys, 16))
    return [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes]


def _padding_mask(keys: int, per_query: int = 1) -> torch.Tensor:
    lengths = torch.tensor([keys, keys - 3, 2])
    return (torch.arange(keys)[None, :] < lengths[:, None])[:, None, None, :].expand(3, 1, per_query, keys)


def _values_and_grads(fn, q, k, v):
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    return out, grads


@pytest.mark.parametrize("case", ["encoder", "decoder", "cross", "per-query mask"])
def test_short_attention_gives_sdpas_values_and_gradients(case):
    queries, keys = (9, 12) if case == "cross" else (9, 9)
    q, k, v = _qkv(queries, keys)
    causal = case == "decoder"
    mask = None if causal else _padding_mask(keys, queries if case == "per-query mask" else 1)
    if case == "per-query mask":
        mask = mask.clone()
        mask[0, 0, 3, 5:] = False  # one query sees fewer keys than the others
    torch.manual_seed(1)
    theirs = _values_and_grads(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=mask, is_causal=causal), q, k, v)
    torch.manual_seed(1)
    ours = _values_and_grads(lambda a, b, c: short_attention(a, b, c, mask, causal), q, k, v)
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=1e-5)
    for mine, sdpa in zip(ours[1], theirs[1]):
        torch.testing.assert_close(mine, sdpa, atol=1e-5, rtol=1e-5)


def test_short_attention_passes_gradcheck():
    q, k, v = _qkv(5, 6, torch.float64)
    mask = _padding_mask(6)
    assert torch.autograd.gradcheck(lambda a, b, c: short_attention(a, b, c, mask), (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: short_attention(a, b, c, None, True), _qkv(6, 6, torch.float64))


def _short_calls(monkeypatch, q, k, v, **kwargs) -> int:
    calls = []

    def counted(*args, **kw):
        calls.append(args)
        return short_attention(*args, **kw)

    monkeypatch.setattr(transformer, "short_attention", counted)
    out = attention(q, k, v, **kwargs)
    if torch.is_grad_enabled():
        out.sum().backward()
    return len(calls)


def test_cpu_training_takes_the_short_path_on_few_keys_only(monkeypatch):
    few = _qkv(SHORT_KEYS, SHORT_KEYS)
    many = _qkv(SHORT_KEYS + 1, SHORT_KEYS + 1)
    assert _short_calls(monkeypatch, *few, causal=True) == 1
    assert _short_calls(monkeypatch, *few, mask=_padding_mask(SHORT_KEYS)) == 1
    assert _short_calls(monkeypatch, *many, causal=True) == 0  # past the measured crossover the tiled kernel wins
    assert _short_calls(monkeypatch, *few, causal=True, dropout=0.1) == 0  # dropout on the weights: SDPA's
    with plain_products():  # the code path CUDA takes keeps its fused kernel
        assert _short_calls(monkeypatch, *few, causal=True) == 0
    with torch.no_grad():  # validation and decoding: as before
        assert _short_calls(monkeypatch, *few, causal=True) == 0


def test_bf16_training_attention_stays_in_fp32_on_the_short_path():
    q, k, v = _qkv(7, 7, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention(q, k, v, causal=True)
    assert out.dtype == torch.float32
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
