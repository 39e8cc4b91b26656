import itertools

import pytest
import torch

from xformer_cli.decode.search import beam_search, greedy_search, length_penalty
from xformer_cli.model.transformer import ModelConfig, Transformer

BOS, EOS = 2, 3


def random_model(vocab=12, seed=0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, d_ff=64, n_heads=4, encoder_layers=2, decoder_layers=2, dropout=0.0)
    model = Transformer(cfg, src_vocab=vocab).eval()
    with torch.no_grad():  # sharpen the output distribution so outputs are not all the same token
        model.generator.weight.mul_(4.0)
    return model


def test_beam_size_one_equals_greedy():
    model = random_model()
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0], [4, 3, 0, 0, 0]])
    greedy = greedy_search(model, src, BOS, EOS, max_len_a=1.0, max_len_b=5)
    beam = beam_search(model, src, BOS, EOS, beam_size=1, alpha=0.0, max_len_a=1.0, max_len_b=5)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]
    for g, b in zip(greedy, beam):
        assert g.logprob == pytest.approx(b[0].logprob, abs=1e-4)


def test_greedy_scores_like_beam_size_one():
    """``Hypothesis.score`` means one thing for every search: the log-probability over GNMT's
    length penalty at the options' alpha. Greedy search used to store the plain sum, so a
    beam-1 and a greedy translation of the same sentence scored differently."""
    from xformer_cli.decode.options import SearchOptions
    from xformer_cli.decode.search import search_batch

    model = random_model(vocab=20, seed=1)
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0], [11, 12, 13, 3, 0]])
    for alpha in (0.0, 0.6, 1.5):
        greedy = search_batch(model, src, SearchOptions(beam_size=1, length_penalty=alpha, max_len_b=6))
        beam = beam_search(model, src, BOS, EOS, beam_size=1, alpha=alpha, max_len_a=1.0, max_len_b=6)
        assert [g[0].tokens for g in greedy] == [b[0].tokens for b in beam]
        assert [g[0].score for g in greedy] == pytest.approx([b[0].score for b in beam], abs=1e-4)
        for (hyp,) in greedy:
            assert hyp.score == pytest.approx(hyp.logprob / length_penalty(len(hyp.tokens) + 1, alpha))
    assert any(len(g[0].tokens) > 1 for g in greedy) and any(g[0].score != g[0].logprob for g in greedy)


def sequence_logprob(model, src, tokens) -> float:
    tgt = torch.tensor([[BOS] + tokens])
    lprobs = torch.log_softmax(model(src, tgt), dim=-1)[0]
    return sum(lprobs[i, t].item() for i, t in enumerate(tokens + [EOS]))


def test_beam_search_finds_the_exhaustive_best_on_a_tiny_vocabulary():
    """A beam wider than every possible output (1 + 3 + 9 + 27 of length <= 3) makes beam search exact
    (min_len 0: the empty output is a candidate too)."""
    vocab = 6  # tokens 4 and 5 are words; 0-3 are pad/unk/bos/eos
    model = random_model(vocab=vocab, seed=4)
    src = torch.tensor([[4, 5, 3]])
    beam = beam_search(model, src, BOS, EOS, beam_size=64, alpha=0.0, max_len_a=0.0, max_len_b=3, min_len=0)[0][0]
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
    assert len(greedy_search(model, src, BOS, EOS, max_len_a=0.5, max_len_b=1)[0].tokens) <= 3


def eos_eager(model: Transformer, boost: float = 50.0) -> Transformer:
    """The model, but with eos made the runaway favourite at every step."""
    step = model.decode_step

    def decode_step(*args):
        logits = step(*args)
        logits[:, EOS] += boost
        return logits

    model.decode_step = decode_step
    return model


def test_min_len_keeps_eos_back_and_the_default_never_gives_an_empty_output():
    model = eos_eager(random_model(vocab=20, seed=3))
    src = torch.tensor([[5, 6, 7, 8, 9, 3], [11, 12, 3, 0, 0, 0]])
    assert [h.tokens for h in greedy_search(model, src, BOS, EOS, max_len_a=1.0, max_len_b=6, min_len=0)] == [[], []]
    assert all(len(h.tokens) == 1 for h in greedy_search(model, src, BOS, EOS, max_len_a=1.0, max_len_b=6))  # default min_len=1
    assert all(len(h.tokens) == 3 for h in greedy_search(model, src, BOS, EOS, max_len_a=1.0, max_len_b=6, min_len=3))
    assert [h[0].tokens for h in beam_search(model, src, BOS, EOS, beam_size=3, alpha=0.6, max_len_a=1.0, max_len_b=6, min_len=0)] == [[], []]
    for hyps in beam_search(model, src, BOS, EOS, beam_size=3, alpha=0.6, max_len_a=1.0, max_len_b=6, nbest=3, min_len=2):
        assert all(len(h.tokens) >= 2 for h in hyps) and len(hyps) == 3


def test_early_stopping_keeps_the_search_exact_for_the_nbest_asked_for():
    """Stopping once ``nbest`` finished hypotheses beat every live beam's bound gives the
    same best output as searching on until all K hypotheses are settled (nbest=K)."""
    for seed in range(6):
        model = random_model(vocab=24, seed=seed)
        src = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 3], [12, 13, 3, 0, 0, 0, 0, 0], [14, 15, 16, 17, 3, 0, 0, 0]])
        for alpha in (0.0, 0.6, 1.0):
            one = beam_search(model, src, BOS, EOS, beam_size=4, alpha=alpha, max_len_a=1.5, max_len_b=4, nbest=1)
            settled = beam_search(model, src, BOS, EOS, beam_size=4, alpha=alpha, max_len_a=1.5, max_len_b=4, nbest=4)
            assert [h[0].tokens for h in one] == [h[0].tokens for h in settled]
            assert [h[0].score for h in one] == pytest.approx([h[0].score for h in settled], abs=1e-6)


def test_cached_and_uncached_decoding_give_identical_outputs_and_scores():
    model = random_model(vocab=20, seed=7)
    src = torch.tensor([[5, 6, 7, 8, 9, 3], [11, 12, 3, 0, 0, 0], [13, 14, 15, 3, 0, 0]])
    for cached, uncached in (
        (greedy_search(model, src, BOS, EOS, max_len_a=1.0, max_len_b=6), greedy_search(model, src, BOS, EOS, max_len_a=1.0, max_len_b=6, use_cache=False)),
        ([h[0] for h in beam_search(model, src, BOS, EOS, beam_size=4, alpha=0.6, max_len_a=1.0, max_len_b=6)],
         [h[0] for h in beam_search(model, src, BOS, EOS, beam_size=4, alpha=0.6, max_len_a=1.0, max_len_b=6, use_cache=False)]),
    ):
        assert [h.tokens for h in cached] == [h.tokens for h in uncached]
        assert [h.score for h in cached] == pytest.approx([h.score for h in uncached], abs=1e-4)
    assert any(len(h.tokens) >= 3 for h in cached)  # long enough for the cache to matter


def test_sampling_is_seeded_and_draws_only_from_the_top_k():
    model = random_model(vocab=20, seed=3)
    src = torch.tensor([[5, 6, 7, 8, 3]] * 8)

    def draw(seed, topk, temperature=1.0):
        gen = torch.Generator().manual_seed(seed)
        return [h.tokens for h in greedy_search(model, src, BOS, EOS, max_len_a=1.0, max_len_b=6, sampling_topk=topk,
                                                temperature=temperature, generator=gen)]

    assert draw(1, -1) == draw(1, -1)  # reproducible
    assert len({tuple(t) for t in draw(1, -1, temperature=2.0)}) > 1  # and actually random
    # top-1 sampling is greedy search
    assert draw(5, 1) == [h.tokens for h in greedy_search(model, src, BOS, EOS, max_len_a=1.0, max_len_b=6)]


def test_an_ensemble_of_one_model_twice_decodes_like_the_model():
    from xformer_cli.decode.ensemble import Ensemble

    model = random_model(vocab=20, seed=9)
    src = torch.tensor([[5, 6, 7, 8, 9, 3], [11, 12, 3, 0, 0, 0]])
    alone = beam_search(model, src, BOS, EOS, beam_size=3, alpha=0.6, max_len_a=1.0, max_len_b=5)
    twice = beam_search(Ensemble([model, model]), src, BOS, EOS, beam_size=3, alpha=0.6, max_len_a=1.0, max_len_b=5)
    assert [h[0].tokens for h in alone] == [h[0].tokens for h in twice]
    assert [h[0].score for h in alone] == pytest.approx([h[0].score for h in twice], abs=1e-4)
    # Two different models: each step is the renormalised mean of their log-probabilities.
    other = random_model(vocab=20, seed=10)
    pair = Ensemble([model, other])
    mask = model.padding_mask(src)
    bos = torch.full((2, 1), BOS)

    def lprobs(m):
        return torch.log_softmax(m.decode_step(bos, m.encode(src, mask), mask, m.new_cache()), -1)

    step = torch.log_softmax(pair.decode_step(bos, pair.encode(src, mask), mask, pair.new_cache()), -1)
    expected = torch.log_softmax((lprobs(model) + lprobs(other)) / 2, -1)
    assert torch.allclose(step, expected, atol=1e-5)


def test_token_batches_respect_both_caps_and_cover_every_sentence():
    from xformer_cli.data.batching import token_batches

    lengths = [3, 50, 7, 7, 0, 12, 400, 5]
    order = sorted((i for i, n in enumerate(lengths) if n), key=lambda i: lengths[i])
    batches = token_batches(lengths, order, max_sentences=3, max_slots=60)
    assert [i for b in batches for i in b] == order  # in order, each once
    for b in batches:
        assert len(b) <= 3
        assert len(b) == 1 or len(b) * (max(lengths[i] for i in b) + 1) <= 60  # an over-long one goes alone


class StepCounter:
    """Wraps a model's decode_step to count the decoder steps a search takes."""

    def __init__(self, model):
        self.steps, self.inner = 0, model.decode_step
        model.decode_step = self

    def __call__(self, *args, **kwargs):
        self.steps += 1
        return self.inner(*args, **kwargs)


@pytest.mark.parametrize("beam", [1, 4])
def test_a_sentence_no_longer_wanted_leaves_the_search_and_the_others_are_unchanged(beam):
    model = random_model()
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0], [4, 3, 0, 0, 0]])
    search = (lambda **kw: [[h] if h else [] for h in greedy_search(model, src, BOS, EOS, max_len_a=2.0, max_len_b=20,
                                                                    min_len=30, **kw)]) if beam == 1 else (
        lambda **kw: beam_search(model, src, BOS, EOS, beam_size=beam, alpha=0.6, max_len_a=2.0, max_len_b=20,
                                 min_len=30, **kw))  # min_len: every sentence runs to its limit
    full = search()
    counter = StepCounter(model)
    asked = []

    def wanted(row):  # row 1's client leaves after the third step
        asked.append(row)
        return row != 1 or counter.steps < 3

    partial = search(wanted=wanted)
    assert partial[1] == [] and set(asked) == {0, 1, 2}
    for row in (0, 2):
        assert [h.tokens for h in partial[row]] == [h.tokens for h in full[row]]
    nobody = StepCounter(model)
    assert search(wanted=lambda row: nobody.steps < 2) == [[], [], []]
    assert nobody.steps == 2  # everyone left: the search stopped at once, not at the length limit (30 steps)


def test_translator_leaves_out_lines_no_longer_wanted():
    from helpers import untrained_translator

    translator, lines = untrained_translator()
    opts = translator.options()
    full = translator.search(lines[:5], opts)
    asked: list[int] = []
    part = translator.search(lines[:5], opts, wanted=lambda i: asked.append(i) or i != 3)
    assert part[3] == [] and set(asked) == set(range(5))
    assert [[h.tokens for h in hyps] for i, hyps in enumerate(part) if i != 3] == \
        [[h.tokens for h in hyps] for i, hyps in enumerate(full) if i != 3]
    counter = StepCounter(translator.model)
    assert translator.search(lines[:5], opts, wanted=lambda i: False) == [[]] * 5
    assert counter.steps == 0  # no batch was even started
