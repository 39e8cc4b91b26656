"""model/linear.py: the padded bf16 Linear (CPU) and the cached half weights (CUDA) compute what autocast's F.linear computes."""

import pytest
import torch
import torch.nn.functional as F

from xformer_cli.model.linear import HalfWeightCache, Linear, plain_products
from xformer_cli.model.transformer import ModelConfig, Transformer


def test_padded_bf16_linear_matches_f_linear_forward_and_backward():
    torch.manual_seed(0)
    layer = Linear(32, 48)
    x = torch.randn(5, 13, 32, requires_grad=True)  # 65 rows: not a multiple of 64, so padded
    g = torch.randn(5, 13, 48)
    with torch.autocast("cpu", torch.bfloat16):
        ours = layer(x)
    (ours.float() * g).sum().backward()
    got = (x.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone())
    x.grad = layer.weight.grad = layer.bias.grad = None
    with torch.autocast("cpu", torch.bfloat16):
        reference = F.linear(x, layer.weight, layer.bias)
    (reference.float() * g).sum().backward()
    assert ours.dtype == torch.bfloat16 and ours.shape == (5, 13, 48)
    torch.testing.assert_close(ours.float(), reference.float(), atol=2e-2, rtol=2e-2)
    for mine, theirs in zip(got, (x.grad, layer.weight.grad, layer.bias.grad)):
        # both round to bf16, in different orders: within 1% of the gradient's scale
        torch.testing.assert_close(mine, theirs, atol=1e-2 * theirs.abs().max().item(), rtol=0)
        assert mine.dtype == torch.float32  # fp32 master weights get fp32 gradients


def test_the_feed_forward_pads_its_rows_once_and_computes_what_autocast_computes():
    """bf16 training on a CPU: the FFN's two products run on one padded copy of the rows (a
    multiple of 64, no pad-and-copy per product), and outputs and gradients are autocast's."""
    from xformer_cli.model.transformer import FeedForward

    torch.manual_seed(0)
    ffn = FeedForward(32, 96, activation_dropout=0.0)
    x = torch.randn(5, 13, 32, requires_grad=True)  # 65 rows
    g = torch.randn(5, 13, 32)
    seen = []
    hooks = [m.register_forward_pre_hook(lambda _m, args: seen.append(tuple(args[0].shape))) for m in (ffn.w1, ffn.w2)]
    with torch.autocast("cpu", torch.bfloat16):
        ours = ffn(x)
    for h in hooks:
        h.remove()
    (ours.float() * g).sum().backward()
    got = [t.grad.clone() for t in (x, ffn.w1.weight, ffn.w1.bias, ffn.w2.weight, ffn.w2.bias)]
    assert seen == [(128, 32), (128, 96)]  # both products on the padded height
    for t in (x, ffn.w1.weight, ffn.w1.bias, ffn.w2.weight, ffn.w2.bias):
        t.grad = None
    with torch.autocast("cpu", torch.bfloat16):
        hidden = F.relu(F.linear(x, ffn.w1.weight, ffn.w1.bias))
        reference = F.linear(hidden, ffn.w2.weight, ffn.w2.bias)
    (reference.float() * g).sum().backward()
    assert ours.dtype == torch.bfloat16 and ours.shape == (5, 13, 32)
    torch.testing.assert_close(ours.float(), reference.float(), atol=2e-2, rtol=2e-2)
    for mine, t in zip(got, (x, ffn.w1.weight, ffn.w1.bias, ffn.w2.weight, ffn.w2.bias)):
        torch.testing.assert_close(mine, t.grad, atol=1e-2 * t.grad.abs().max().item(), rtol=0)
        assert mine.dtype == torch.float32


def _tiny_stack(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(Linear(16, 32), torch.nn.ReLU(), Linear(32, 8, bias=False))


def _train_step(model, optimizer, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    out.float().square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out.detach(), grads


def test_cached_half_weights_train_as_autocast_and_refresh_after_each_step():
    """Outputs, input and weight gradients exactly autocast's; a bias's gradient is summed
    straight into fp32, so it is autocast's before autocast rounds it to bf16."""
    x = torch.randn(3, 5, 16)
    plain, cached = _tiny_stack(), _tiny_stack()
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-2)
    cached_opt = torch.optim.Adam(cached.parameters(), lr=1e-2)
    cache = HalfWeightCache(cached, cached_opt)
    with plain_products():  # the reference: autocast's casts and F.linear, as on CUDA
        for _ in range(3):  # the weights move every step: a stale copy would show
            plain.load_state_dict(cached.state_dict())
            want, want_grads = _train_step(plain, plain_opt, x)
            got, got_grads = _train_step(cached, cached_opt, x)
            assert got.dtype == want.dtype == torch.bfloat16
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            for (name, _), g, w in zip(cached.named_parameters(), got_grads, want_grads):
                assert g.dtype == torch.float32
                if name.endswith("bias"):
                    assert not torch.equal(g, w)  # not rounded to bf16 on the way ...
                    torch.testing.assert_close(g.bfloat16().float(), w, rtol=2**-8, atol=0)  # ... else the same
                else:
                    torch.testing.assert_close(g, w, rtol=0, atol=0)
        assert all(p.dtype == torch.float32 for p in cached.parameters())  # fp32 masters
    assert cache.halves[0].dtype == torch.bfloat16


@pytest.mark.parametrize("memory_rows", [0, 11], ids=["self-attention", "encoder-decoder"])
def test_cached_half_weights_give_self_attention_one_product_for_q_k_and_v(memory_rows):
    """The cache stacks q_proj's and kv_proj's copies: self-attention runs one product (and one
    cast of its input), encoder-decoder attention each projection on its rows of the stack; both
    compute what autocast's separate products compute, to bf16's rounding."""
    from xformer_cli.model.transformer import MultiHeadAttention
    from xformer_cli.train.opcount import count_ops

    torch.manual_seed(5)
    attn = MultiHeadAttention(32, 4, dropout=0.0)
    query = torch.randn(3, 7, 32, requires_grad=True)
    memory = torch.randn(3, memory_rows, 32, requires_grad=True) if memory_rows else None
    g = torch.randn(3, 7, 32)
    with plain_products():
        reference, expected = _attention_and_grads(attn, query, memory, None, memory is None, g)
        plain_ops = count_ops(lambda: _attention_and_grads(attn, query, memory, None, memory is None, g)).ops
        cache = HalfWeightCache(attn, torch.optim.SGD(attn.parameters(), lr=0.1))
        ours, got = _attention_and_grads(attn, query, memory, None, memory is None, g)
        ops = count_ops(lambda: _attention_and_grads(attn, query, memory, None, memory is None, g)).ops
    q_half, kv_half = cache.half_of[id(attn.q_proj.weight)], cache.half_of[id(attn.kv_proj.weight)]
    assert kv_half.data_ptr() == q_half.data_ptr() + q_half.numel() * q_half.element_size()  # one buffer
    torch.testing.assert_close(ours.float(), reference.float(), atol=2e-2, rtol=2e-2)
    for mine, theirs in zip(got, expected):
        assert mine.dtype == torch.float32
        torch.testing.assert_close(mine, theirs, atol=1e-2 * theirs.abs().max().item(), rtol=0)
    products = lambda counted: counted["addmm"] + counted["mm"]  # noqa: E731
    if memory is None:  # q and kv: forward 2 -> 1 products, backward 4 -> 2; the input cast once, its gradient once
        assert products(ops) == products(plain_ops) - 3
        assert ops["_to_copy"] < plain_ops["_to_copy"]
    else:
        assert products(ops) == products(plain_ops)


def test_cached_half_weights_follow_a_loaded_state_and_leave_inference_alone():
    model = _tiny_stack()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cache = HalfWeightCache(model, optimizer)
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x).sum().backward()
    model.load_state_dict(_tiny_stack(seed=1).state_dict())
    assert cache.stale
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    torch.testing.assert_close(cache.halves[0], model[0].weight.detach().bfloat16(), rtol=0, atol=0)
    with torch.no_grad():
        assert not cache.applies(x)
    cache.detach()
    assert model[0].half_cache is None


def test_cached_half_weights_cast_no_weight_per_micro_batch():
    from xformer_cli.train.opcount import count_ops

    model = _tiny_stack()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16)

    def two_micro_batches_and_a_step():
        for _ in range(2):  # autocast casts each weight once per autocast region, i.e. per micro-batch
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            out.float().sum().backward()
        optimizer.step()

    with plain_products():
        plain = count_ops(two_micro_batches_and_a_step).ops
        HalfWeightCache(model, optimizer)
        cached = count_ops(two_micro_batches_and_a_step).ops
    # w1, b1, w2 no longer cast per micro-batch, nor b1's gradient (summed straight into fp32)
    assert cached["_to_copy"] == plain["_to_copy"] - 2 * 3 - 2
    assert cached["_foreach_copy_"] == 1  # ... but copied once per optimizer step


def test_the_half_weight_cache_is_for_cuda_autocast_in_bf16_and_fp16_alike():
    from xformer_cli.train.forward_loss import attach_half_weights, forced_half_weights, wants_half_weights

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert wants_half_weights(cuda, "bf16", False) and wants_half_weights(cuda, "fp16", False)  # 8.0+ and 7.x cards
    assert not wants_half_weights(cuda, "fp32", False) and not wants_half_weights(cuda, "bf16", True)
    assert not wants_half_weights(cpu, "bf16", False)
    model = Transformer(ModelConfig(d_model=16, d_ff=32, n_heads=2, encoder_layers=1, decoder_layers=1), src_vocab=30)
    optimizer = torch.optim.Adam(model.parameters())
    with forced_half_weights(True):
        assert attach_half_weights(model, optimizer, cpu, "fp16", False).dtype == torch.float16
        assert attach_half_weights(model, optimizer, cpu, "bf16", False).dtype == torch.bfloat16


def _attention_and_grads(attn, query, memory, mask, causal, g):
    for t in (query, memory, *attn.parameters()):
        if t is not None:
            t.grad = None
    with torch.autocast("cpu", torch.bfloat16):
        out = attn(query, memory, mask=mask, causal=causal)
    (out.float() * g).sum().backward()
    grads = [t.grad.clone() for t in (query, memory, *attn.parameters()) if t is not None]
    return out, grads


@pytest.mark.parametrize("kind", ["self, causal", "self, padding mask", "encoder-decoder"])
def test_bf16_training_attention_on_padded_rows_computes_what_the_plain_path_computes(kind):
    """bf16 training on a CPU: q, k, v of self-attention in one product on rows padded once, the
    heads straight into the output projection's padded rows; outputs and gradients as the
    per-projection path (plain_products) computes them."""
    from xformer_cli.model.transformer import MultiHeadAttention

    torch.manual_seed(3)
    attn = MultiHeadAttention(32, 4, dropout=0.0)
    query = torch.randn(5, 13, 32, requires_grad=True)  # 65 rows
    memory = torch.randn(5, 11, 32, requires_grad=True) if kind == "encoder-decoder" else None
    keys = 11 if memory is not None else 13
    mask = None if kind == "self, causal" else (torch.arange(keys) < torch.tensor([keys, 9, 5, keys, 7])[:, None])[:, None, None, :]
    g = torch.randn(5, 13, 32)
    seen = []
    hooks = [m.register_forward_pre_hook(lambda _m, args: seen.append(args[0].size(0))) for m in (attn.q_proj, attn.kv_proj, attn.out_proj)]
    ours, got = _attention_and_grads(attn, query, memory, mask, kind == "self, causal", g)
    for h in hooks:
        h.remove()
    assert seen and all(rows % 64 == 0 for rows in seen)  # every product the modules run sees padded rows
    with plain_products():
        reference, expected = _attention_and_grads(attn, query, memory, mask, kind == "self, causal", g)
    assert ours.dtype == torch.bfloat16 and ours.shape == (5, 13, 32)
    torch.testing.assert_close(ours.float(), reference.float(), atol=2e-2, rtol=2e-2)
    for mine, theirs in zip(got, expected):
        torch.testing.assert_close(mine, theirs, atol=1e-2 * theirs.abs().max().item(), rtol=0)
        assert mine.dtype == torch.float32


def test_a_transformer_trains_with_the_half_weight_cache_as_with_autocasts_casts():
    """Every path at once (encoder and decoder self-attention from the stacked copies,
    encoder-decoder attention, the FFN, the tied output layer): a few Adam steps of a tiny
    Transformer under the cache track the same steps under autocast's own casts."""
    cfg = ModelConfig(d_model=32, d_ff=64, n_heads=4, encoder_layers=2, decoder_layers=2, dropout=0.0)
    src = torch.randint(4, 50, (6, 9))
    tgt = torch.randint(4, 50, (6, 8))

    def run(cached: bool) -> tuple[list[float], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = Transformer(cfg, src_vocab=50)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        if cached:
            HalfWeightCache(model, optimizer)
        seen, first_grads = [], []
        for _ in range(4):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(src, tgt[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten())
            loss.backward()
            first_grads = first_grads or [p.grad.clone() for p in model.parameters()]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            seen.append(loss.item())
        return seen, first_grads

    with plain_products():
        (plain, plain_grads), (cached, cached_grads) = run(False), run(True)
    assert plain[-1] < plain[0] - 0.1  # it learns
    for p, c in zip(plain, cached):
        assert abs(p - c) < 2e-2 * abs(p)
    for want, got in zip(plain_grads, cached_grads):  # each weight's gradient, to bf16's rounding
        torch.testing.assert_close(got, want, atol=2e-2 * want.abs().max().item(), rtol=0)
