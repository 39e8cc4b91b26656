import itertools

import pytest
import torch

from xformer_cli.decode.search import beam_search, greedy_search, length_penalty
from xformer_cli.model.transformer import ModelConfig, Transformer

BOS, EOS = 2, 3


def random_model(vocab=12, seed=0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, d_model=32, d_ff=64, n_heads=4, encoder_layers=2, decoder_layers=2, dropout=0.0)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # sharpen the output distribution so outputs are not all the same token
        model.generator.weight.mul_(4.0)
    return model


def test_beam_size_one_equals_greedy():
    model = random_model()
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0], [4, 3, 0, 0, 0]])
    greedy = greedy_search(model, src, BOS, EOS, 1.0, 5)
    beam = beam_search(model, src, BOS, EOS, beam_size=1, alpha=0.0, max_len_a=1.0, max_len_b=5)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]
    for g, b in zip(greedy, beam):
        assert g.logprob == pytest.approx(b[0].logprob, abs=1e-4)


def sequence_logprob(model, src, tokens) -> float:
    tgt = torch.tensor([[BOS] + tokens])
    lprobs = torch.log_softmax(model(src, tgt), dim=-1)[0]
    return sum(lprobs[i, t].item() for i, t in enumerate(tokens + [EOS]))


def test_beam_search_finds_the_exhaustive_best_on_a_tiny_vocabulary():
    """A beam wider than every possible output (1 + 3 + 9 + 27 of length <= 3) makes beam search exact."""
    vocab = 6  # tokens 4 and 5 are words; 0-3 are pad/unk/bos/eos
    model = random_model(vocab=vocab, seed=4)
    src = torch.tensor([[4, 5, 3]])
    beam = beam_search(model, src, BOS, EOS, beam_size=64, alpha=0.0, max_len_a=0.0, max_len_b=3)[0][0]
    words = [1, 4, 5]
    candidates = [list(seq) for n in range(0, 4) for seq in itertools.product(words, repeat=n)]
    best = max(candidates, key=lambda seq: sequence_logprob(model, src, seq))
    assert beam.tokens == best
    assert beam.logprob == pytest.approx(sequence_logprob(model, src, best), abs=1e-4)


def test_a_sentence_decodes_the_same_alone_and_in_a_batch():
    model = random_model(vocab=20, seed=2)
    sentences = [[5, 6, 7, 8, 9, 10, 3], [11, 12, 3], [13, 14, 15, 16, 3]]
    width = max(map(len, sentences))
    batch = torch.tensor([s + [0] * (width - len(s)) for s in sentences])
    together = beam_search(model, batch, BOS, EOS, beam_size=3, alpha=0.6, max_len_a=1.0, max_len_b=4)
    for i, s in enumerate(sentences):
        alone = beam_search(model, torch.tensor([s]), BOS, EOS, beam_size=3, alpha=0.6, max_len_a=1.0, max_len_b=4)
        assert alone[0][0].tokens == together[i][0].tokens
        assert alone[0][0].score == pytest.approx(together[i][0].score, abs=1e-4)


def test_outputs_respect_the_maximum_length_and_nbest_is_sorted():
    model = random_model(vocab=20, seed=5)
    src = torch.tensor([[5, 6, 7, 3]])  # 4 source tokens -> at most 0.5 * 4 + 1 = 3
    hyps = beam_search(model, src, BOS, EOS, beam_size=4, alpha=0.6, max_len_a=0.5, max_len_b=1, nbest=4)[0]
    assert all(len(h.tokens) <= 3 for h in hyps)
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    assert all(h.score == pytest.approx(h.logprob / length_penalty(len(h.tokens) + 1, 0.6)) for h in hyps)
    assert len(greedy_search(model, src, BOS, EOS, 0.5, 1)[0].tokens) <= 3
