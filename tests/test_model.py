import math

import pytest
import torch
import torch.nn.functional as F

from xformer_cli.config import load_config
from xformer_cli.model.transformer import ModelConfig, MultiHeadAttention, Transformer, sinusoidal_positions


def tiny(tgt_vocab: int = 0, **kw) -> Transformer:
    cfg = dict(d_model=32, d_ff=64, n_heads=4, encoder_layers=2, decoder_layers=2, dropout=0.0)
    cfg.update(kw)
    return Transformer(ModelConfig(**cfg), src_vocab=50, tgt_vocab=tgt_vocab).eval()


def test_attention_equals_naive_softmax_formula():
    torch.manual_seed(1)
    attn = MultiHeadAttention(d_model=16, n_heads=4, dropout=0.0).eval()
    q_in, kv_in = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 4:] = False  # second sentence: last 3 keys are padding
    out = attn(q_in, kv_in, mask=mask)

    def heads(x):
        return x.view(2, -1, 4, 4).transpose(1, 2)

    q = heads(attn.q_proj(q_in))
    k, v = (heads(t) for t in attn.kv_proj(kv_in).chunk(2, dim=-1))
    scores = q @ k.transpose(-1, -2) / math.sqrt(4)
    scores = scores.masked_fill(~mask, float("-inf"))
    naive = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(2, 5, 16)
    torch.testing.assert_close(out, attn.out_proj(naive), atol=1e-5, rtol=1e-5)


def test_padding_mask_marks_real_tokens():
    model = tiny()
    src = torch.tensor([[5, 6, 7], [5, 0, 0]])
    mask = model.padding_mask(src)
    assert mask.shape == (2, 1, 1, 3)
    assert mask[1, 0, 0].tolist() == [True, False, False]


def test_padding_does_not_change_the_encoding():
    model = tiny()
    short = torch.tensor([[5, 6, 7]])
    padded = torch.tensor([[5, 6, 7, 0, 0]])
    torch.testing.assert_close(model.encode(short), model.encode(padded)[:, :3], atol=1e-5, rtol=1e-5)


def test_decoder_is_causal():
    """Changing a later target token must not change earlier outputs."""
    model = tiny()
    src = torch.tensor([[5, 6, 7, 8]])
    a = torch.tensor([[2, 9, 10, 11, 12]])
    b = a.clone()
    b[0, 3:] = torch.tensor([30, 31])
    la, lb = model(src, a), model(src, b)
    torch.testing.assert_close(la[:, :3], lb[:, :3])
    assert not torch.allclose(la[:, 3:], lb[:, 3:])


@pytest.mark.parametrize("pre_norm", [False, True])
def test_incremental_decoding_matches_full_decoder(pre_norm):
    model = tiny(pre_norm=pre_norm)
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    tgt = torch.tensor([[2, 11, 12, 13], [2, 14, 15, 16]])
    full = F.log_softmax(model(src, tgt), dim=-1)
    src_mask = model.padding_mask(src)
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    for t in range(tgt.size(1)):
        with torch.no_grad():  # as search runs it (the plain attention path for few queries)
            step = F.log_softmax(model.decode_step(tgt[:, t : t + 1], memory, src_mask, cache), dim=-1)
        torch.testing.assert_close(step, full[:, t], atol=1e-5, rtol=1e-5)


def test_plain_attention_of_decoding_steps_equals_sdpa():
    from xformer_cli.model.transformer import attention

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 5, 8), torch.randn(3, 4, 7, 8), torch.randn(3, 4, 7, 8)
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3, [True] * 2 + [False] * 5])[:, None, None, :]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with torch.no_grad():
        torch.testing.assert_close(attention(q, k, v, mask), expected, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(attention(q[:, :, :1], k, v), F.scaled_dot_product_attention(q[:, :, :1], k, v),
                                   atol=1e-6, rtol=1e-5)


def test_sinusoidal_values():
    pe = sinusoidal_positions(50, 8)
    pos, i = 7, 1  # dimension 2i = 2 is sin, 2i+1 = 3 is cos
    angle = pos / 10000 ** (2 * i / 8)
    assert pe[pos, 2].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert pe[pos, 3].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert pe[0, 0::2].abs().max().item() == 0.0 and torch.all(pe[0, 1::2] == 1.0)


def test_embeddings_are_tied_three_ways_with_a_joint_vocabulary():
    model = tiny()
    w = model.src_embed.tokens.weight
    assert model.tgt_embed.tokens.weight is w and model.generator.weight is w
    separate = tiny(tgt_vocab=60)
    assert separate.tgt_embed.tokens.weight is not separate.src_embed.tokens.weight
    assert separate.generator.weight is separate.tgt_embed.tokens.weight
    assert separate.generator.out_features == 60


def _paper_model_parameters(config_name: str) -> int:
    cfg = load_config(f"configs/{config_name}")
    with torch.device("meta"):  # count without allocating hundreds of MB
        model = Transformer(cfg.model, src_vocab=37000)
    return model.count_parameters()


def test_paper_base_has_about_65M_parameters():
    assert _paper_model_parameters("wmt14-en-de-base.yaml") == pytest.approx(65e6, rel=0.04)


def test_paper_big_has_about_213M_parameters():
    assert _paper_model_parameters("wmt14-en-de-big.yaml") == pytest.approx(213e6, rel=0.02)


def test_the_same_seed_builds_the_same_untied_embeddings():
    """Initialisation walks the embeddings in a fixed order (a set's order followed object ids)."""
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, tie_embeddings=False)
    built = []
    for _ in range(8):  # kept alive, so each model's modules have other ids
        torch.manual_seed(3)
        built.append(Transformer(cfg, src_vocab=40, tgt_vocab=50, pad_id=0))
    for model in built[1:]:
        for a, b in zip(built[0].state_dict().values(), model.state_dict().values()):
            assert torch.equal(a, b)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_cudas_training_path_turns_each_mask_additive_once_and_computes_the_same(packed):
    """On CUDA's path, training hands attention the additive masks SDPA would make from the
    boolean ones at every layer, made once per forward: the same logits, bit for bit, without the
    per-layer conversion (its ``where``)."""
    from xformer_cli.model.linear import plain_products
    from xformer_cli.model.transformer import Packing
    from xformer_cli.train.opcount import count_ops

    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=16, d_ff=32, n_heads=2, encoder_layers=2, decoder_layers=2, dropout=0.0),
                        src_vocab=30).train()
    src = torch.tensor([[5, 6, 7, 8, 9, 0], [5, 6, 7, 0, 0, 0]])
    tgt = torch.tensor([[2, 5, 6, 7, 0], [2, 8, 9, 0, 0]])
    packing = Packing(torch.tensor([[1, 1, 1, 2, 2, 0], [1, 1, 1, 0, 0, 0]]), torch.tensor([[1, 1, 2, 2, 0], [1, 1, 1, 0, 0]]),
                      torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 0, 0, 0]]), torch.tensor([[0, 1, 0, 1, 0], [0, 1, 2, 0, 0]]))
    run = lambda: model(src, tgt, packing if packed else None)  # noqa: E731
    with plain_products():
        ours, ops = run(), count_ops(run).ops
        model._sdpa_masks = lambda *masks: masks  # the boolean masks, converted by SDPA in each layer
        theirs, their_ops = run(), count_ops(run).ops
    assert torch.equal(ours, theirs)
    layers_with_a_mask = 2 + 2 + (2 if packed else 0)  # encoder, encoder-decoder, and the packed decoder's own
    assert their_ops["where"] == layers_with_a_mask and "where" not in ops
    assert sum(ops.values()) < sum(their_ops.values())
